from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import decode_image

from autotune.pipelines.unet.data import default_data_dir, ensure_data, make_data, parse_size, scan_folder
from autotune.core.errors import ConfigError, DataError

SIZE = (160, 120)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("synth") / "set", 4, SIZE, seed=0)


def _bytes(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_deterministic_for_a_seed(synth: Path, tmp_path: Path) -> None:
    again = make_data(tmp_path / "again", 4, SIZE, seed=0)
    other = make_data(tmp_path / "other", 4, SIZE, seed=1)
    assert _bytes(synth) == _bytes(again)
    a, b = _bytes(synth), _bytes(other)
    assert a["images/00000.jpg"] != b["images/00000.jpg"]
    assert a["masks/00000.png"] != b["masks/00000.png"]


def test_layout_and_readme(synth: Path) -> None:
    assert sorted(p.name for p in (synth / "images").iterdir()) == [f"{i:05d}.jpg" for i in range(4)]
    assert sorted(p.name for p in (synth / "masks").iterdir()) == [f"{i:05d}.png" for i in range(4)]
    readme = (synth / "README.txt").read_text()
    assert "n: 4" in readme and "size: 160x120" in readme and "seed: 0" in readme


# torchvision 0.29 deprecates its image codecs in favour of torchcodec; they still work.
@pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")
def test_images_decode_with_torchvision(synth: Path) -> None:
    for img, mask in scan_folder(synth):
        x = decode_image(str(img))
        assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 120, 160)
        m = decode_image(str(mask))
        assert tuple(m.shape) == (1, 120, 160)


def test_masks_binary_with_a_person(synth: Path) -> None:
    for _, mask in scan_folder(synth):
        m = Image.open(mask)
        assert m.mode == "L" and m.size == SIZE
        a = np.asarray(m)
        assert set(np.unique(a).tolist()) <= {0, 255}
        assert 0.03 < (a == 255).mean() < 0.60


def test_person_pixels_differ_from_background(synth: Path) -> None:
    # A sanity check that the mask marks something drawn in the photo, not random pixels.
    img, mask = scan_folder(synth)[0]
    x = np.asarray(Image.open(img), dtype=np.float32)
    m = np.asarray(Image.open(mask)) == 255
    assert np.abs(x[m].mean(0) - x[~m].mean(0)).max() > 10


def test_refuses_non_empty_dir_and_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "set"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        make_data(out, 2, (64, 64))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_fills_an_empty_existing_dir_without_leftovers(tmp_path: Path) -> None:
    out = tmp_path / "set"
    out.mkdir()
    make_data(out, 2, (64, 64))
    assert len(scan_folder(out)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_failure_midway_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.pipelines.unet.data as data

    calls = {"n": 0}
    real = data._sample

    def flaky(seed: int, size: tuple[int, int]) -> tuple[Image.Image, Image.Image]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk on fire")
        return real(seed, size)

    monkeypatch.setattr(data, "_sample", flaky)
    with pytest.raises(RuntimeError):
        make_data(tmp_path / "set", 3, (64, 64))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("n, size", [(0, (64, 64)), (-1, (64, 64)), (2, (63, 64)), (2, (64, 10))])
def test_make_data_validates(tmp_path: Path, n: int, size: tuple[int, int]) -> None:
    with pytest.raises(ConfigError):
        make_data(tmp_path / "set", n, size)
    assert not (tmp_path / "set").exists()


def test_scan_folder_pairs(tmp_path: Path) -> None:
    d = tmp_path / "real"
    (d / "images").mkdir(parents=True)
    (d / "masks").mkdir()
    for stem, ext in [("b", ".png"), ("a", ".jpg"), ("c", ".JPEG")]:
        (d / "images" / f"{stem}{ext}").write_bytes(b"x")
        (d / "masks" / f"{stem}.png").write_bytes(b"x")
    (d / "images" / "notes.txt").write_text("ignored")
    pairs = scan_folder(d)
    assert [(i.name, m.name) for i, m in pairs] == [("a.jpg", "a.png"), ("b.png", "b.png"), ("c.JPEG", "c.png")]


def _folder(tmp_path: Path, images: list[str], masks: list[str]) -> Path:
    d = tmp_path / "real"
    (d / "images").mkdir(parents=True)
    (d / "masks").mkdir()
    for s in images:
        (d / "images" / f"{s}.jpg").write_bytes(b"x")
    for s in masks:
        (d / "masks" / f"{s}.png").write_bytes(b"x")
    return d


def test_scan_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist") as e:
        scan_folder(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("sub", ["images", "masks"])
def test_scan_missing_subfolder(tmp_path: Path, sub: str) -> None:
    d = _folder(tmp_path, ["a"], ["a"])
    for p in (d / sub).iterdir():
        p.unlink()
    (d / sub).rmdir()
    with pytest.raises(DataError, match=f"no {sub}/"):
        scan_folder(d)


def test_scan_empty(tmp_path: Path) -> None:
    d = _folder(tmp_path, [], [])
    with pytest.raises(DataError, match="no images") as e:
        scan_folder(d)
    assert str(d) in str(e.value)


def test_scan_unmatched_mask(tmp_path: Path) -> None:
    d = _folder(tmp_path, ["a"], ["a", "b", "c", "d", "e"])
    with pytest.raises(DataError) as e:
        scan_folder(d)
    msg = str(e.value)
    assert "4 mask(s) without an image" in msg and "b, c, d, ..." in msg and "e" not in msg.split("(")[-1]
    assert str(d) in msg and "\n" not in msg


def test_scan_unmatched_image(tmp_path: Path) -> None:
    d = _folder(tmp_path, ["a", "zz"], ["a"])
    with pytest.raises(DataError, match=r"1 image\(s\) without a mask .*\(zz\)"):
        scan_folder(d)


def test_scan_duplicate_stem(tmp_path: Path) -> None:
    d = _folder(tmp_path, ["a"], ["a"])
    (d / "images" / "a.png").write_bytes(b"x")
    with pytest.raises(DataError, match="share the name"):
        scan_folder(d)


@pytest.mark.parametrize("text, want", [("640x480", (640, 480)), (" 64X32 ", (64, 32)), ("1x1", (1, 1))])
def test_parse_size_good(text: str, want: tuple[int, int]) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "640", "640x", "x480", "640x480x3", "axb", "0x10", "-5x10", "6.4x4"])
def test_parse_size_bad(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_size(text)
    assert "\n" not in str(e.value)


def test_default_and_ensure_data(tmp_path: Path) -> None:
    d = default_data_dir(tmp_path, 2, (64, 80), 3)
    assert d == tmp_path / "synthetic-2-64x80-s3"
    assert not d.exists()
    assert ensure_data(tmp_path, 2, (64, 80), 3) == d
    first = _bytes(d)
    assert len(scan_folder(d)) == 2
    # A second call reuses the folder rather than regenerating (or refusing).
    assert ensure_data(tmp_path, 2, (64, 80), 3) == d
    assert _bytes(d) == first

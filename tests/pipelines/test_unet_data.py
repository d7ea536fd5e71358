from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import decode_image

from autotune.pipelines.unet.data import (
    default_data_dir,
    ensure_data,
    make_data,
    parse_size,
    scan_folder,
    screen_pairs,
    validate_folder,
)
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


# --- validate_folder: every pair decoded once, up front ------------------------------------------


def _stat_and_bytes(d: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(d)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def six(tmp_path: Path) -> Path:
    return make_data(tmp_path / "six", n=6, size=(96, 64))


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not an image at all" * 4)


def _truncate(path: Path, n: int = 10) -> None:
    path.write_bytes(path.read_bytes()[:n])


def test_validate_good_folder_returns_every_pair_with_progress(six: Path) -> None:
    calls: list[tuple[int, int]] = []
    before = _stat_and_bytes(six)
    pairs = validate_folder(six, progress=lambda done, total: calls.append((done, total)))
    assert pairs == scan_folder(six) and len(pairs) == 6
    assert [c[0] for c in calls] == [1, 2, 3, 4, 5, 6] and {c[1] for c in calls} == {6}
    assert _stat_and_bytes(six) == before


def test_validate_names_each_bad_file_and_the_count(six: Path) -> None:
    _garbage(six / "images" / "00001.jpg")
    _truncate(six / "masks" / "00004.png")
    before = _stat_and_bytes(six)
    with pytest.raises(DataError) as e:
        validate_folder(six)
    msg = str(e.value)
    assert "2 of 6" in msg and "images/00001.jpg (" in msg and "masks/00004.png (" in msg
    assert "00000" not in msg and str(six) in msg and "--skip-bad-data" in msg and "\n" not in msg
    assert ".cpp" not in msg  # torchvision's source location is trimmed off the reason
    assert _stat_and_bytes(six) == before  # reads only


def test_validate_skip_bad_returns_the_good_pairs(six: Path) -> None:
    _garbage(six / "images" / "00001.jpg")
    _truncate(six / "masks" / "00004.png")
    before = _stat_and_bytes(six)
    good = validate_folder(six, skip_bad=True)
    assert [i.stem for i, _ in good] == ["00000", "00002", "00003", "00005"]
    assert _stat_and_bytes(six) == before


def test_validate_names_five_of_many(tmp_path: Path) -> None:
    d = make_data(tmp_path / "nine", n=9, size=(64, 64))
    for i in range(7):
        _garbage(d / "images" / f"{i:05d}.jpg")
    with pytest.raises(DataError) as e:
        validate_folder(d)
    msg = str(e.value)
    assert "7 of 9" in msg and "and 2 more" in msg
    assert [f"images/{i:05d}.jpg" in msg for i in range(7)] == [True] * 5 + [False] * 2


def test_validate_catches_a_cut_off_jpeg_and_a_size_mismatch(six: Path) -> None:
    image = six / "images" / "00002.jpg"
    image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])  # an interrupted download
    Image.new("L", (80, 64)).save(six / "masks" / "00003.png")
    with pytest.raises(DataError) as e:
        validate_folder(six)
    msg = str(e.value)
    assert "2 of 6" in msg and "images/00002.jpg" in msg
    assert "images/00003.jpg (image is 96x64 but its mask is 80x64)" in msg


def test_screen_pairs_drops_what_validation_drops(six: Path) -> None:
    # The cheap header check a trial runs under --skip-bad-data: the common kinds of bad file.
    _garbage(six / "images" / "00001.jpg")
    _truncate(six / "masks" / "00004.png")
    image = six / "images" / "00002.jpg"
    image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])
    Image.new("L", (80, 64)).save(six / "masks" / "00003.png")
    good, bad = screen_pairs(scan_folder(six))
    assert good == validate_folder(six, skip_bad=True) and len(good) == 2
    assert sorted(p.name for p, _ in bad) == ["00001.jpg", "00002.jpg", "00003.jpg", "00004.png"]
    assert all(str(six) not in reason for _, reason in bad)


def test_dataset_names_the_bad_file(six: Path) -> None:
    from autotune.core.errors import DataItemError
    from autotune.pipelines.unet.pipeline import SegmentationFolder

    _garbage(six / "images" / "00001.jpg")
    ds = SegmentationFolder(scan_folder(six), 64, root=six)
    x, y = ds[0]
    assert tuple(x.shape) == (3, 64, 64) and tuple(y.shape) == (1, 64, 64)
    with pytest.raises(DataItemError) as e:
        ds[1]
    assert e.value.path == "images/00001.jpg" and e.value.index == 1
    assert (
        str(e.value) == f"cannot load images/00001.jpg in data folder {six} (Unsupported image file); fix or remove it"
    )


def test_unet_validate_data_hook(six: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.core.config import TrialConfig
    from autotune.pipelines import SKIP_BAD_DATA_ENV, load_pipeline, validate_data

    pipeline = load_pipeline(TrialConfig(image_size=64, data_dir=str(six)))
    assert validate_data(pipeline, skip_bad=False, progress=None) is None
    _garbage(six / "images" / "00001.jpg")
    _truncate(six / "masks" / "00004.png")
    with pytest.raises(DataError, match="2 of 6"):
        validate_data(pipeline, skip_bad=False, progress=None)
    assert validate_data(pipeline, skip_bad=True, progress=None) == "data: dropped 2 undecodable image/mask pairs of 6"
    assert len(pipeline.build_dataset()) == 4  # type: ignore[arg-type]
    # A trial rebuilds the pipeline from its config: the environment variable makes it drop them too.
    fresh = load_pipeline(TrialConfig(image_size=64, data_dir=str(six)))
    assert len(fresh.build_dataset()) == 6  # type: ignore[arg-type]
    monkeypatch.setenv(SKIP_BAD_DATA_ENV, "1")
    ds = fresh.build_dataset()
    assert len(ds) == 4 and all(ds[i][0].shape == (3, 64, 64) for i in range(4))  # type: ignore[arg-type]


def test_validate_data_without_the_hook_is_a_no_op() -> None:
    from autotune.pipelines import validate_data

    class Bare:
        pass

    assert validate_data(Bare(), skip_bad=False, progress=None) is None  # type: ignore[arg-type]


def test_a_long_path_leaves_no_part_of_itself_in_the_reason(tmp_path: Path) -> None:
    # The reason is cut to one short sentence; the path PIL quotes in it must go first, however long.
    deep = make_data(tmp_path / ("d" * 120) / "six", n=2, size=(96, 64))
    _garbage(deep / "masks" / "00001.png")
    _, bad = screen_pairs(scan_folder(deep))
    assert [(p.name, reason) for p, reason in bad] == [("00001.png", "cannot identify image file")]

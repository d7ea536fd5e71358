"""Datasets on disk: a synthetic person-segmentation set, and reading a real image/mask folder.

Layout (both kinds): DIR/images/<stem>.{jpg,jpeg,png} and DIR/masks/<stem>.png, mask mode "L" with
0 = background and 255 = person. The synthetic set exists so that a search can run with no data at
all while still paying the real costs: JPEG decoding, PNG masks, file opens.
"""

from __future__ import annotations

import colorsys
import os
import re
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw

from autotune.core.errors import ConfigError, DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MIN_SIDE = 64
SYNTHETIC_PREFIX = "synthetic-"
JPEG_QUALITY = 90


def parse_size(text: str) -> tuple[int, int]:
    """'640x480' -> (640, 480), width first like every image tool prints it."""
    parts = str(text).strip().lower().split("x")
    try:
        if len(parts) != 2:
            raise ValueError
        w, h = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError(f"size must look like WIDTHxHEIGHT (e.g. 640x480), got {text!r}") from None
    if w < 1 or h < 1:
        raise ConfigError(f"size must have positive width and height, got {text!r}")
    return w, h


# ---------------------------------------------------------------------------------------------
# synthetic images


def _rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
    return int(r * 255), int(g * 255), int(b * 255)


def _muted(rng: np.random.Generator) -> tuple[int, int, int]:
    # Backgrounds and clutter stay low-saturation, so colour is a (noisy) cue the model can learn.
    return _rgb(rng.random(), rng.uniform(0.0, 0.35), rng.uniform(0.25, 0.9))


def _smooth(
    rng: np.random.Generator, grid: tuple[int, int], size: tuple[int, int], scale: float, channels: int = 3
) -> np.ndarray:
    """A random low-res field upsampled bicubically: cheap, smooth variation at any size."""
    small = rng.uniform(-scale, scale, size=(grid[1], grid[0], channels)).astype(np.float32)
    chans = [
        np.asarray(Image.fromarray(small[..., c], mode="F").resize(size, Image.Resampling.BICUBIC))
        for c in range(channels)
    ]
    return np.stack(chans, axis=-1)


def _background(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    w, h = size
    base = np.array(_muted(rng), dtype=np.float32)
    # Mostly brightness gradients (shared by all channels) with a milder tint: like lit rooms, and
    # less saturated than people's clothes, which keeps the task learnable.
    light = _smooth(rng, (3, 3), size, 50.0, channels=1)
    field = (
        base + light + _smooth(rng, (3, 3), size, 30.0) + _smooth(rng, (max(2, w // 40), max(2, h // 40)), size, 15.0)
    )
    return Image.fromarray(np.clip(field, 0, 255).astype(np.uint8), mode="RGB")


def _clutter(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: tuple[int, int]) -> None:
    w, h = size
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = rng.uniform(-0.1 * w, w), rng.uniform(-0.1 * h, h)
        x1, y1 = x0 + rng.uniform(0.05, 0.4) * w, y0 + rng.uniform(0.05, 0.4) * h
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.rectangle((x0, y0, x1, y1), fill=_muted(rng))
        elif kind == 1:
            draw.ellipse((x0, y0, x1, y1), fill=_muted(rng))
        else:
            draw.line((x0, y0, x1, y1), fill=_muted(rng), width=max(1, int(rng.uniform(0.005, 0.03) * w)))


def _person(draws: list[ImageDraw.ImageDraw], rng: np.random.Generator, size: tuple[int, int]) -> None:
    """One stick-ish figure, drawn identically on the photo and on the mask (so the mask is exact)."""
    w, h = size
    ph = rng.uniform(0.55, 0.92) * min(h, 1.5 * w)  # person height; fits portrait and landscape frames
    cx = rng.uniform(0.25, 0.75) * w
    top = rng.uniform(0.02 * h, max(0.02 * h, 0.98 * h - ph))
    skin = _rgb(rng.uniform(0.02, 0.1), rng.uniform(0.3, 0.6), rng.uniform(0.45, 0.95))
    shirt = _rgb(rng.random(), rng.uniform(0.6, 1.0), rng.uniform(0.5, 1.0))
    trousers = _rgb(rng.random(), rng.uniform(0.5, 1.0), rng.uniform(0.3, 0.8))
    head_r = 0.085 * ph
    neck_y = top + 2 * head_r
    torso_w, torso_h = 0.26 * ph, 0.36 * ph
    hip_y = neck_y + torso_h
    limb = max(2, int(0.07 * ph))
    legs = [(cx + s * torso_w * 0.25, cx + s * rng.uniform(0.05, 0.2) * ph) for s in (-1, 1)]
    arms = [
        (cx + s * torso_w * 0.5, cx + s * rng.uniform(0.15, 0.3) * ph, neck_y + rng.uniform(0.15, 0.45) * ph)
        for s in (-1, 1)
    ]
    for d, is_mask in zip(draws, (False, True)):

        def fill(c: tuple[int, int, int], is_mask: bool = is_mask) -> int | tuple[int, int, int]:
            return 255 if is_mask else c

        for hx, fx in legs:
            d.line((hx, hip_y - limb, fx, top + ph - limb / 2), fill=fill(trousers), width=limb)
            d.ellipse((fx - limb / 2, top + ph - limb, fx + limb / 2, top + ph), fill=fill(trousers))
        for sx, hx, hy in arms:
            d.line((sx, neck_y + limb, hx, hy), fill=fill(shirt), width=int(limb * 0.8))
            d.ellipse((hx - limb / 2, hy - limb / 2, hx + limb / 2, hy + limb / 2), fill=fill(skin))
        d.rounded_rectangle((cx - torso_w / 2, neck_y, cx + torso_w / 2, hip_y), radius=torso_w / 4, fill=fill(shirt))
        d.ellipse((cx - head_r * 0.85, top, cx + head_r * 0.85, neck_y), fill=fill(skin))


def _sample(seed: int, size: tuple[int, int]) -> tuple[Image.Image, Image.Image]:
    rng = np.random.default_rng(seed)
    img = _background(rng, size)
    mask = Image.new("L", size, 0)
    draw, mdraw = ImageDraw.Draw(img), ImageDraw.Draw(mask)
    _clutter(draw, rng, size)
    for _ in range(int(rng.integers(1, 3))):
        _person([draw, mdraw], rng, size)
    # Sensor noise last, over people too, so edges are not perfectly clean; int16 keeps it cheap.
    noise = rng.integers(-12, 13, size=(size[1], size[0], 3), dtype=np.int16)
    arr = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(arr, mode="RGB"), mask


def make_data(out_dir: str | os.PathLike[str], n: int, size: tuple[int, int] = (640, 480), seed: int = 0) -> Path:
    """Write n synthetic (photo, mask) pairs to out_dir; same bytes for the same (n, size, seed)."""
    out = Path(out_dir)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"number of images must be an integer >= 1, got {n!r}")
    w, h = (int(v) for v in size)
    if w < MIN_SIDE or h < MIN_SIDE:
        raise ConfigError(f"image size must be at least {MIN_SIDE}x{MIN_SIDE}, got {w}x{h}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"refusing to write synthetic data into {out}: it already exists and is not empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename at the end, so a crash never leaves a half-written set
    # that a later run would mistake for a complete one.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "images").mkdir()
        (tmp / "masks").mkdir()
        for i in range(n):
            img, mask = _sample(seed + i, (w, h))
            img.save(tmp / "images" / f"{i:05d}.jpg", quality=JPEG_QUALITY)
            mask.save(tmp / "masks" / f"{i:05d}.png")
        (tmp / "README.txt").write_text(
            "autotune synthetic person segmentation\n"
            f"n: {n}\nsize: {w}x{h}\nseed: {seed}\n"
            "images/NNNNN.jpg RGB JPEG; masks/NNNNN.png mode L, 0 background, 255 person\n"
        )
        try:
            os.replace(tmp, out)  # replaces an empty dir atomically; fails if someone filled it meanwhile
        except OSError as e:
            raise DataError(f"could not move synthetic data into {out}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---------------------------------------------------------------------------------------------
# real folders


def _by_stem(folder: Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        # Skip hidden files (macOS "._x.jpg" sidecars) and anything that is not an image.
        if p.name.startswith(".") or p.suffix.lower() not in suffixes or not p.is_file():
            continue
        if p.stem in found:
            raise DataError(f"{folder}: two files share the name {p.stem!r} ({found[p.stem].name}, {p.name})")
        found[p.stem] = p
    return found


def _unmatched(kind: str, stems: set[str], folder: Path) -> str:
    shown = ", ".join(sorted(stems)[:3]) + (", ..." if len(stems) > 3 else "")
    return f"{folder}: {len(stems)} {kind} ({shown})"


def scan_folder(data_dir: str | os.PathLike[str]) -> list[tuple[Path, Path]]:
    """Pair DIR/images/<stem>.{jpg,jpeg,png} with DIR/masks/<stem>.png, sorted by stem."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist")
    for sub in ("images", "masks"):
        if not (root / sub).is_dir():
            raise DataError(f"data folder {root} has no {sub}/ subfolder (expected images/ and masks/)")
    images = _by_stem(root / "images", IMAGE_SUFFIXES)
    masks = _by_stem(root / "masks", (".png",))
    if not images:
        raise DataError(f"data folder {root} has no images in images/ (*.jpg, *.jpeg, *.png)")
    no_mask, no_image = set(images) - set(masks), set(masks) - set(images)
    if no_mask:
        raise DataError(_unmatched("image(s) without a mask in masks/", no_mask, root))
    if no_image:
        raise DataError(_unmatched("mask(s) without an image in images/", no_image, root))
    return [(images[s], masks[s]) for s in sorted(images)]


# ---------------------------------------------------------------------------------------------
# checking every file decodes

Pair = tuple[Path, Path]
Progress = Callable[[int, int], None]
# Decoding is C code that releases the GIL: a few threads overlap file reads and decodes, and
# unlike processes they need no pickling and start instantly.
CHECK_THREADS = 4
SHOWN_BAD = 5
_CPP_LOCATION = re.compile(r"^.*?\.(?:cpp|cc|h|hpp):\d+, ")


def decode_reason(e: BaseException, path: Path | None = None) -> str:
    """A decoder's exception as a short reason: torchvision's messages start with a C++ source
    location and run to several sentences; the first sentence is the one that says what is wrong.
    PIL quotes the file's `path`, which is named beside the reason already: cut before shortening,
    so a long path cannot leave half of itself in the reason."""
    text = str(e).strip().replace(f" '{path}'", "") if path is not None else str(e).strip()
    if not text:
        return type(e).__name__
    text = _CPP_LOCATION.sub("", text.splitlines()[0])
    return text.split(". ")[0].rstrip(".")[:120]


def _check_all(
    pairs: list[Pair], check: Callable[[Path, Path], tuple[Path, str] | None], progress: Progress | None
) -> list[tuple[Path, str] | None]:
    """check(image, mask) for every pair on a few threads; its verdicts in the pairs' order."""
    verdicts: list[tuple[Path, str] | None] = [None] * len(pairs)
    done = 0
    with ThreadPoolExecutor(max_workers=min(CHECK_THREADS, os.cpu_count() or 1, len(pairs) or 1)) as pool:
        futures = {pool.submit(check, image, mask): i for i, (image, mask) in enumerate(pairs)}
        for future in as_completed(futures):
            verdicts[futures[future]] = future.result()
            done += 1
            if progress is not None:
                progress(done, len(pairs))
    return verdicts


def _decodes(image: Path, mask: Path) -> tuple[Path, str] | None:
    from autotune.pipelines.unet.pipeline import (  # lazy: torch (make-data needs none), and a cycle: it imports this
        BadPairFile,
        decode_pair,
    )

    try:
        decode_pair(image, mask)
    except BadPairFile as e:
        return e.path, e.reason
    return None


def validate_folder(
    data_dir: str | os.PathLike[str], *, skip_bad: bool = False, progress: Progress | None = None
) -> list[Pair]:
    """Decode every image/mask pair once, exactly as training will (same decoder, same modes, sizes
    must match), so one bad file is named up front instead of failing every trial. Returns the
    pairs that decode; a DataError naming the bad ones unless skip_bad. Reads only: nothing in the
    folder is written or changed."""
    root = Path(data_dir)
    pairs = scan_folder(root)
    with warnings.catch_warnings():  # torchvision 0.29's decoder deprecation, once per file otherwise
        warnings.filterwarnings("ignore", message="The image decoding", category=DeprecationWarning)
        verdicts = _check_all(pairs, _decodes, progress)
    bad = [v for v in verdicts if v is not None]
    if bad and not skip_bad:
        shown = ", ".join(f"{_relative(path, root)} ({reason})" for path, reason in bad[:SHOWN_BAD])
        more = f", and {len(bad) - SHOWN_BAD} more" if len(bad) > SHOWN_BAD else ""
        raise DataError(
            f"data {root}: {len(bad)} of {len(pairs)} image/mask pairs cannot be decoded: {shown}{more}; "
            "fix or remove them, or pass --skip-bad-data"
        )
    return [pair for pair, verdict in zip(pairs, verdicts) if verdict is None]


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _ends_like_jpeg(path: Path, window: int = 65536) -> bool:
    # A JPEG ends with the EOI marker (FF D9), possibly followed by a camera's trailer; entropy-coded
    # data never contains FF D9, so its absence near the end means a cut-off file (an interrupted
    # download), which PIL's verify() does not notice.
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - window))
        return b"\xff\xd9" in f.read()


def _headers_ok(image: Path, mask: Path) -> tuple[Path, str] | None:
    sizes = []
    for path in (image, mask):
        try:
            with Image.open(path) as im:
                sizes.append(im.size)
                im.verify()
            if im.format == "JPEG" and not _ends_like_jpeg(path):
                return path, "truncated JPEG"
        except Exception as e:  # PIL raises a zoo of types for a bad file; MemoryError is not one
            if isinstance(e, MemoryError):
                raise
            return path, decode_reason(e, path)
    if sizes[0] != sizes[1]:
        return image, f"image is {sizes[0][0]}x{sizes[0][1]} but its mask is {sizes[1][0]}x{sizes[1][1]}"
    return None


def screen_pairs(pairs: list[Pair]) -> tuple[list[Pair], list[tuple[Path, str]]]:
    """A cheap check of every pair (headers, checksums, sizes; no decoding), for trial processes to
    drop the files validate_folder(skip_bad=True) dropped up front: (good pairs, bad files)."""
    verdicts = _check_all(pairs, _headers_ok, None)
    return (
        [pair for pair, verdict in zip(pairs, verdicts) if verdict is None],
        [verdict for verdict in verdicts if verdict is not None],
    )


def default_data_dir(root: str | os.PathLike[str], n: int, size: tuple[int, int], seed: int) -> Path:
    """Where the synthetic set for these parameters lives; the name makes it reusable across runs."""
    w, h = size
    return Path(root) / f"{SYNTHETIC_PREFIX}{n}-{w}x{h}-s{seed}"


def ensure_data(root: str | os.PathLike[str], n: int, size: tuple[int, int], seed: int) -> Path:
    """The synthetic set for these parameters, generated on first use."""
    out = default_data_dir(root, n, size, seed)
    if out.is_dir() and any(out.iterdir()):
        return out  # the rename in make_data is atomic, so an existing folder is a complete one
    try:
        return make_data(out, n, size, seed)
    except DataError:
        # Another process (say, two trials starting together) may have won the race: fine.
        if out.is_dir() and any(out.iterdir()):
            return out
        raise


# The set every command uses when no --data is given: 256 photos at 640x480, seed 0.
DEFAULT_SET = {"n": 256, "size": (640, 480), "seed": 0}


def default_data(studies_dir: str | os.PathLike[str]) -> Path:
    """The default synthetic set under `studies_dir/data`, generated on first use (deterministic,
    so any machine regenerates the identical files)."""
    return ensure_data(Path(studies_dir) / "data", **DEFAULT_SET).resolve()  # type: ignore[arg-type]

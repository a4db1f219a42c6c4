"""A set of real photographs for the image-protocol tests and benchmarks, made from photographs that ship inside
installed wheels (nothing downloaded, nothing committed): matplotlib's ``grace_hopper.jpg``, scikit-learn's
``china.jpg`` and ``flower.jpg``, scikit-image's sample photographs (the last two in ``.venv-clients``, where
scripts/clients_env.sh installs them).

Each source is re-encoded as a JPEG (quality 90) at ImageNet's typical sizes and aspect ratios (500x375, 375x500,
500x333, 333x500, 400x400) and a few over 1,500 px, plus ImageNet's oddities: a CMYK JPEG, a greyscale JPEG, a PNG
named ``.JPEG`` and a JPEG whose EXIF says to rotate it (the reference loaders do not: neither does shiftbench).
Deterministic: the same files every time.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from PIL import Image

SIZES = ((500, 375), (375, 500), (500, 333), (333, 500), (400, 400), (1600, 1200), (1200, 1600))
# The sample photographs of the clients environment (scikit-learn's and scikit-image's), by module and file.
CLIENT_PHOTOS = {
    "sklearn.datasets": ("images/china.jpg", "images/flower.jpg"),
    "skimage.data": ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
                     "motorcycle_left.png", "retina.jpg", "camera.png"),
}  # fmt: skip
EXIF_ORIENTATION = 0x0112


def source_photos(clients_python: Path) -> list[Path]:
    """The sample photographs of both environments (matplotlib's from this one)."""
    import matplotlib

    found = [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"]
    code = "import importlib, os\n" + "".join(
        f"print(os.path.dirname(importlib.import_module({module!r}).__file__))\n" for module in CLIENT_PHOTOS
    )
    done = subprocess.run([str(clients_python), "-c", code], capture_output=True, text=True, check=True, timeout=120)
    for folder, names in zip(done.stdout.split(), CLIENT_PHOTOS.values(), strict=True):
        found += [Path(folder) / name for name in names]
    return found


def make_photos(clients_python: Path, out: Path, *, per_source: int = 2) -> list[Path]:
    """Write the set into ``out`` (``per_source`` sizes of each source photograph, then the oddities); its paths."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sources = source_photos(clients_python)
    for k, source in enumerate(sources):
        with Image.open(source) as opened:
            image = opened.convert("RGB")
        for n in range(per_source):
            size = SIZES[(k * per_source + n) % len(SIZES)]
            path = out / f"{source.stem}_{size[0]}x{size[1]}.JPEG"
            image.resize(size, Image.Resampling.LANCZOS).save(path, "JPEG", quality=90)
            written.append(path)
    written += _oddities(sources, out)
    return written


def write_variants(photos: list[Path], targets: list[Path], quality: int) -> None:
    """Each target a JPEG of another photograph in turn, a different crop of it (up to an eighth off each side), every
    other one flipped: many files from a few photographs, none the same (a seeded draw: the same files every time)."""
    rng = random.Random(0)
    for k, target in enumerate(targets):
        with Image.open(photos[k % len(photos)]) as opened:
            image = opened.convert("RGB")
        w, h = image.size
        box = (rng.randrange(w // 8), rng.randrange(h // 8), w - rng.randrange(w // 8), h - rng.randrange(h // 8))
        image = image.crop(box)
        if k % 2:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        target.parent.mkdir(parents=True, exist_ok=True)
        image.save(target, "JPEG", quality=quality)


def _oddities(sources: list[Path], out: Path) -> list[Path]:
    with Image.open(sources[0]) as opened:
        base = opened.convert("RGB").resize((500, 375), Image.Resampling.LANCZOS)
    cmyk, grey, png, rotated = (
        out / f"{name}.JPEG" for name in ("cmyk", "greyscale", "png_named_jpeg", "exif_rotated")
    )
    base.convert("CMYK").save(cmyk, "JPEG", quality=90)
    base.convert("L").save(grey, "JPEG", quality=90)
    base.save(png, "PNG")
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6  # rotate 90 degrees clockwise to display
    base.save(rotated, "JPEG", quality=90, exif=exif.tobytes())
    return [cmyk, grey, png, rotated]


def bad_files(out: Path) -> dict[str, Path]:
    """Files a run must refuse in one line naming them: truncated, empty, not an image, 1x1, a decompression bomb."""
    out.mkdir(parents=True, exist_ok=True)
    whole = out / "whole.JPEG"
    Image.new("RGB", (500, 375), (120, 60, 30)).save(whole, "JPEG", quality=90)
    files = {
        "truncated": out / "truncated.JPEG",
        "empty": out / "empty.JPEG",
        "not_an_image": out / "not_an_image.JPEG",
        "one_pixel": out / "one_pixel.JPEG",
        "bomb": out / "bomb.png",
    }
    files["truncated"].write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    files["empty"].write_bytes(b"")
    files["not_an_image"].write_text("id,label\n1,2\n")
    Image.new("RGB", (1, 1), (1, 2, 3)).save(files["one_pixel"], "JPEG")
    Image.new("1", (30_000, 30_000)).save(files["bomb"], "PNG", optimize=True)  # a few hundred KB on disk
    return files

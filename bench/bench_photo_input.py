"""The training input path under the BREEDS preset (robustness_imagenet at 224) on real photographs, side by side
with what a user would otherwise write, in one run.

    .venv/bin/python bench/bench_photo_input.py [--images 512] [--batch 64] [--rounds 3] [--record PATH]

Photographs: tests/real_photos.py's set (sample photographs of installed wheels, re-encoded at ImageNet's sizes),
each used several times as a different crop so that ``--images`` files sit in an ImageFolder layout (two classes).
Every contender produces the same thing, a float batch of ``--batch`` training images at 224 with the reference's
augmentation (crop, flip, jitter, lighting), and is timed over whole epochs after a warm-up epoch (steady state);
images/s per core divides by the cores it used (``os.sched_getaffinity``):

- ``torchvision``: ``ImageFolder`` + ``DataLoader(num_workers=cores, persistent_workers=True)`` with the robustness
  library's ``TRAIN_TRANSFORMS_IMAGENET`` (run in .venv-clients, where torchvision and robustness are): float
  batches (its workers run ToTensor and Lighting; robustness normalises inside the model, on the GPU);
- ``files``: shiftbench's path from the JPEG files (``decode: files``: worker processes decode, crop and jitter each
  image): uint8 batches and each image's lighting draws, what the training job sends to the device (which adds the
  lighting and normalises); ``+normalised``: the same with the lighting and normalisation done here, on the CPU, as a
  run without a GPU does;
- ``prepared``: from a prepared copy at the photographs' own resolution (``decode: prepared``, the same pixels);
- ``prepared-256``: from a prepared copy with the shorter side at most 256 (``prepared_side: 256``);
- ``floor``: reading the prepared copy at 256 and cutting the centre 224 square, nothing decoded or resampled: the
  most any path from that copy can deliver here.

The preparations' seconds per 10,000 images and bytes per image are recorded beside.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import records  # noqa: E402

from shiftbench.erm import photo_pixels as pt  # noqa: E402
from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.data import normalize  # noqa: E402
from shiftbench.erm.photos import PhotoBatches, Prepare  # noqa: E402
from tests.real_photos import make_photos  # noqa: E402

CLIENTS_PYTHON = PROJECT / ".venv-clients" / "bin" / "python"
BASELINE = r"""
import json, os, sys, time
import torch
from torchvision import datasets
from robustness.data_augmentation import TRAIN_TRANSFORMS_IMAGENET
root, batch, epochs, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
loader = torch.utils.data.DataLoader(
    datasets.ImageFolder(root, transform=TRAIN_TRANSFORMS_IMAGENET), batch_size=batch, shuffle=True,
    num_workers=workers, persistent_workers=True, drop_last=True,
)
rates = []
for epoch in range(epochs + 1):  # the first epoch warms the workers up
    seen, started = 0, time.perf_counter()
    for x, _ in loader:
        seen += x.shape[0]
    if epoch:
        rates.append(seen / (time.perf_counter() - started))
print(json.dumps(rates))
"""


def _images(photos: list[Path], root: Path, n: int) -> list[Path]:
    """``n`` JPEGs at ImageNet's sizes in two class folders, each a different crop (every other one flipped)."""
    rng, written = random.Random(0), []
    for k in range(n):
        with Image.open(photos[k % len(photos)]) as opened:
            image = opened.convert("RGB")
        w, h = image.size
        box = (rng.randrange(w // 8), rng.randrange(h // 8), w - rng.randrange(w // 8), h - rng.randrange(h // 8))
        image = image.crop(box)
        if k % 2:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        path = root / f"class{k % 2}" / f"{k:05d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, "JPEG", quality=90)
        written.append(path)
    return written


def _ours(
    paths: list[Path], config: dict[str, object], prepared: Path, batch: int, epochs: int, *, on_cpu: bool
) -> tuple[list[float], PhotoBatches]:
    """Batches as the training job takes them: uint8 and the lighting draws (normalised on the device), or with
    ``on_cpu`` normalised here too (a run on CPU)."""
    protocol = {"transforms": "robustness_imagenet", "normalization": "robustness_custom_imagenet", "image_size": 224}
    cfg = TrainConfig.from_mapping({**protocol, "cache": "off", **config})
    rows = np.arange(len(paths))
    where = Prepare(prepared, {"bench": "photo_input"}, rows, cfg.prepared_side, print)
    batches = PhotoBatches(paths, cfg, torch.device("cpu"), rows, where if cfg.decode == "prepared" else None)
    generator, rates = torch.Generator().manual_seed(0), []
    for epoch in range(epochs + 1):
        order = torch.randperm(len(paths), generator=generator)
        seen, started = 0, time.perf_counter()
        for start in range(0, len(paths) - batch + 1, batch):
            pixels, alphas = batches.train(order[start : start + batch], generator)
            if on_cpu:
                normalize(pixels, channels_last=False, kind="breeds", lighting=alphas)
            seen += batch
        if epoch:
            rates.append(seen / (time.perf_counter() - started))
    return rates, batches


def _floor(batches: PhotoBatches, batch: int, epochs: int) -> list[float]:
    assert batches.store is not None
    store, rates = batches.store, []
    n = len(store.index)
    for epoch in range(epochs + 1):
        seen, started = 0, time.perf_counter()
        for start in range(0, n - batch + 1, batch):
            arrays = list(batches.pool.map(lambda k: pt.to_array(pt.center_crop(store.image(k), 224)),
                                           range(start, start + batch)))  # fmt: skip
            torch.from_numpy(np.stack(arrays))
            seen += batch
        if epoch:
            rates.append(seen / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="epochs timed after the warm-up epoch")
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = _images(make_photos(CLIENTS_PYTHON, root / "photos"), root / "folder", args.images)
        files_kib = statistics.mean(p.stat().st_size for p in paths) / 1024
        done = subprocess.run([str(CLIENTS_PYTHON), "-c", BASELINE, str(root / "folder"), str(args.batch),
                               str(args.rounds), str(cores)], capture_output=True, text=True, check=True)  # fmt: skip
        rates = {"torchvision": json.loads(done.stdout)}
        prepared: dict[str, dict[str, object]] = {}
        for name, config in (("files", {}), ("prepared", {"decode": "prepared"}),
                             ("prepared-256", {"decode": "prepared", "prepared_side": 256})):  # fmt: skip
            for on_cpu in (False, True):
                label = f"{name}+normalised" if on_cpu else name
                rates[label], batches = _ours(paths, {**config, "decode_workers": cores}, root / "prepared",
                                              args.batch, args.rounds, on_cpu=on_cpu)  # fmt: skip
            if batches.store is not None:
                prepared[name] = json.loads((batches.store.folder / "prepared.json").read_text())
        rates["floor"] = _floor(batches, args.batch, args.rounds)
    for name, runs in rates.items():
        recording.run(contender=name, images_per_s=runs)
    baseline = statistics.median(rates["torchvision"])
    figures = {}
    for name, runs in rates.items():
        median = statistics.median(runs)
        figures[name] = records.median_figure(
            [r / cores for r in runs], "images/s per core", 0, f"{name}, {cores} cores"
        )
        figures[f"{name}_ratio"] = {"what": f"{name} / torchvision", "figure": f"{median / baseline:.2f}x",
                                    "median": median / baseline}  # fmt: skip
        print(f"{name:<14} {median:8.1f} images/s ({median / cores:7.1f} per core) {median / baseline:5.2f}x")
    for name, facts in prepared.items():
        per_image = int(facts["bytes"]) / int(facts["images"])  # type: ignore[call-overload]
        per_10k = float(facts["seconds"]) / int(facts["images"]) * 10_000  # type: ignore[arg-type]
        figures[f"{name}_preparation"] = {
            "what": f"preparing the {name} copy: seconds per 10,000 images and bytes per image",
            "figure": f"{per_10k:.0f} s per 10,000 images, {per_image / 1024:.0f} KiB an image "
            f"(ImageNet's 1,281,167: {per_10k * 128.1167 / 3600:.1f} h on these {cores} cores, "
            f"{per_image * 1_281_167 / 2**30:.0f} GiB)",
            "median": per_10k,
        }
        print(f"{name} preparation: {figures[f'{name}_preparation']['figure']}")
    figures["files_kib"] = {
        "what": "mean size of the JPEG files",
        "figure": f"{files_kib:.0f} KiB",
        "median": files_kib,
    }
    recording.save(
        "the training input path (BREEDS preset, robustness_imagenet at 224) against ImageFolder + DataLoader",
        figures,
        notes=f"{args.images} real-photo JPEGs at ImageNet's sizes (tests/real_photos.py), batch {args.batch}, "
        f"{args.rounds} timed epochs after one warm-up each, {cores} cores",
    )


if __name__ == "__main__":
    main()

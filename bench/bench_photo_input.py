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
  most any path from that copy can deliver here;
- ``dali``: NVIDIA DALI's CPU-only pipeline (``device_id=None``, every operator on the CPU, ``num_threads=cores``)
  over the same folder: ``readers.file``, ``decoders.image_random_crop`` (area 0.08-1, aspect 3/4-4/3, 10
  attempts), ``resize`` to 224x224, brightness, contrast (about the crop's mean grey) and saturation 0.9-1.1, then
  ``crop_mirror_normalize`` for the flip, the float CHW layout and the lighting (mean -255 x each image's PCA offset,
  std 255): float batches like ``torchvision``'s. Where it departs from the reference is in its figure's text: its
  own linear resampling, a fixed jitter order, the fallback crop's position, a shuffle buffer;
- ``ffcv``: FFCV's writer makes a .beton of raw pixels at ``max_resolution=256`` (FFCV caps the longer side,
  prepared-256 the shorter: smaller images), then its ``Loader`` (``OrderOption.RANDOM``, ``num_workers=cores``):
  ``RandomResizedCropRGBImageDecoder(224)``, ``RandomHorizontalFlip``, ``RandomBrightness``/``Contrast``/
  ``Saturation(0.1, p=1)``, ``ToTensor``, ``ToTorchImage``, float, and the lighting as a ``ModuleWrapper``: float
  batches; the .beton's writing is recorded as its preparation.

``dali`` and ``ffcv`` run, like ``torchvision``, as a subprocess in an environment of their own (their wheels pin
other numpy/torch versions than this one's): ``$SHIFTBENCH_DALI_PYTHON`` / ``$SHIFTBENCH_FFCV_PYTHON``, else
``.venv-dali/bin/python`` / ``.venv-ffcv/bin/python`` in the repository, which ``scripts/bench_loaders_env.sh
[DALI_VENV] [FFCV_VENV]`` makes (nvidia-dali-cuda120 2.4.0 + numpy; ffcv 1.0.2 + Pillow, compiled against
libturbojpeg and OpenCV from apt). Without that Python, or when the pipeline fails, the contender is not run and its
figure says why (the error's last line) instead of a number. On a 2-core machine without a GPU both ran (DALI 2.4.0
in CPU-only mode; ffcv 1.0.2 built from its sdist in about a minute, needing Pillow added by hand).

The preparations' seconds per 10,000 images and bytes per image are recorded beside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import records  # noqa: E402

from shiftbench.erm import photo_pixels as pt  # noqa: E402
from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.data import normalize  # noqa: E402
from shiftbench.erm.photos import PhotoBatches, Prepare  # noqa: E402
from shiftbench.erm.protocols import PCA_EIGVAL, PCA_EIGVEC  # noqa: E402
from tests.real_photos import make_photos, write_variants  # noqa: E402

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

# NVIDIA DALI, every operator on the CPU. The robustness library's Lighting adds each image's PCA offset to the
# [0, 1] pixels: crop_mirror_normalize's (x - mean) / std with mean = -255 * offset and std = 255 is that.
DALI = r"""
import json, sys, time
import numpy as np
import nvidia.dali
from nvidia.dali import fn, pipeline_def, types
root, batch, epochs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
images = int(sys.argv[5])
eigval, eigvec = json.loads(sys.argv[6]), json.loads(sys.argv[7])

@pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=0)
def train():
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True)
    x = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                      random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
    x = fn.resize(x, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR, antialias=True)
    x = fn.brightness(x, brightness=fn.random.uniform(range=[0.9, 1.1]))
    mean = fn.reductions.mean(fn.cast(x, dtype=types.FLOAT), axes=[0, 1])
    grey = mean[0] * 0.299 + mean[1] * 0.587 + mean[2] * 0.114
    x = fn.contrast(x, contrast=fn.random.uniform(range=[0.9, 1.1]), contrast_center=grey)
    x = fn.saturation(x, saturation=fn.random.uniform(range=[0.9, 1.1]))
    alphas = fn.random.normal(shape=[3], stddev=0.05) * types.Constant(np.array(eigval, np.float32))
    offset = fn.stack(*[alphas[0] * row[0] + alphas[1] * row[1] + alphas[2] * row[2] for row in eigvec])
    x = fn.crop_mirror_normalize(x, mirror=fn.random.coin_flip(), mean=offset * -255.0, std=255.0,
                                 output_layout="CHW", dtype=types.FLOAT)
    return x, labels

pipe = train()
pipe.build()
rates = []
for epoch in range(epochs + 1):  # the first epoch warms the pipeline up
    seen, started = 0, time.perf_counter()
    for _ in range(images // batch):  # the reader runs on across epochs: an epoch is this many batches
        x, _ = pipe.run()
        seen += np.asarray(x.as_tensor()).shape[0]
    if epoch:
        rates.append(seen / (time.perf_counter() - started))
print(json.dumps({"rates": rates, "version": nvidia.dali.__version__}))
"""
# FFCV: a .beton of raw pixels, then its Loader; the lighting (FFCV has none) as a torch module on each batch.
FFCV = r"""
import importlib.metadata, json, os, sys, time
from pathlib import Path
import torch
from PIL import Image
from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import (Convert, ModuleWrapper, RandomBrightness, RandomContrast, RandomHorizontalFlip,
                             RandomSaturation, ToTensor, ToTorchImage)
from ffcv.writer import DatasetWriter
root, batch, epochs, workers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
beton = sys.argv[5]
eigval, eigvec = torch.tensor(json.loads(sys.argv[6])), torch.tensor(json.loads(sys.argv[7]))
torch.set_num_threads(1)

class Folder:  # ImageFolder's (image, class) pairs, without torchvision
    def __init__(self, root):
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(p, k) for k, c in enumerate(classes) for p in sorted((root / c).iterdir())]
    def __len__(self):
        return len(self.items)
    def __getitem__(self, k):
        with Image.open(self.items[k][0]) as image:
            return image.convert("RGB"), self.items[k][1]

class Lighting(torch.nn.Module):  # [0, 255] floats to [0, 1] plus each image's PCA offset
    def forward(self, x):
        alphas = torch.randn(x.shape[0], 3) * 0.05
        return x.div_(255).add_((eigvec * (alphas * eigval).unsqueeze(1)).sum(2)[:, :, None, None])

folder = Folder(root)
started = time.perf_counter()
fields = {"image": RGBImageField(write_mode="raw", max_resolution=256), "label": IntField()}
DatasetWriter(beton, fields, num_workers=workers).from_indexed_dataset(folder)
written = time.perf_counter() - started
image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), RandomBrightness(0.1, p=1.0),
         RandomContrast(0.1, p=1.0), RandomSaturation(0.1, p=1.0), ToTensor(), ToTorchImage(channels_last=False),
         Convert(torch.float32), ModuleWrapper(Lighting())]
loader = Loader(beton, batch_size=batch, num_workers=workers, order=OrderOption.RANDOM, seed=0, drop_last=True,
                pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
rates = []
for epoch in range(epochs + 1):  # the first epoch compiles the pipeline and warms it up
    seen, started = 0, time.perf_counter()
    for x, _ in loader:
        seen += x.shape[0]
    if epoch:
        rates.append(seen / (time.perf_counter() - started))
print(json.dumps({"rates": rates, "version": importlib.metadata.version("ffcv"), "seconds": written,
                  "bytes": os.path.getsize(beton), "images": len(folder)}))
"""
# What each does of the reference augmentation (RandomResizedCrop(224), RandomHorizontalFlip, ColorJitter 0.1 x 3 in
# a random order per image, ToTensor, Lighting 0.05). DALI's was checked against Pillow and torchvision on this set's
# photographs: its decoded pixels equal Pillow's, its jitters with fixed factors are within one grey level of
# Pillow's ImageEnhance, its crops' mean area, aspect and fallback rate (2,000 draws) are get_params'. FFCV's is
# from reading its code (ffcv 1.0.2: fields/rgb_image.py, transforms/color_jitter.py, libffcv.cpp).
LOADERS = {
    "dali": (
        "SHIFTBENCH_DALI_PYTHON",
        ".venv-dali",
        DALI,
        "DALI {version}, CPU only, {cores} threads: crop as RandomResizedCrop's (area 0.08-1, aspect 3/4-4/3, 10 "
        "attempts; the fallback 4:3 crop is placed at random, torchvision centres it); resized to 224x224 by DALI's "
        "linear filter with antialiasing, not Pillow's bilinear (on a photograph: 0.14 grey levels apart on average, "
        "at most 9); flip; brightness, contrast (about the crop's mean grey, as Pillow; DALI's default is mid-grey) "
        "and saturation 0.9-1.1 always in that order, rounded to uint8 after each (torchvision draws a random order "
        "per image); the PCA lighting added to the [0, 1] floats (CHW); draws from DALI's generator (seed 0); the "
        "reader shuffles through a buffer instead of a permutation per epoch",
    ),
    "ffcv": (
        "SHIFTBENCH_FFCV_PYTHON",
        ".venv-ffcv",
        FFCV,
        "ffcv {version}, {cores} workers: from a .beton of raw pixels at max_resolution 256, which caps the longer "
        "side (prepared-256 caps the shorter: a 500x375 photograph is kept at 256x192, not 341x256); "
        "RandomResizedCropRGBImageDecoder(224) (torchvision's crop algorithm); both resizes by OpenCV's "
        "INTER_AREA, not Pillow's bilinear; flip; brightness, contrast (about the mean grey) and "
        "saturation 0.9-1.1, each always applied (p=1), always in that order, truncated to uint8 after each "
        "(torchvision: a random order, rounded); the PCA lighting added by a torch module on each float batch "
        "(FFCV has none); draws from numpy's and torch's generators",
    ),
}


def _loader(name: str, root: Path, work: Path, batch: int, epochs: int, cores: int) -> dict[str, object]:
    """A fast loader's runs in its own environment, as ``{"rates": [...], ...}``, or ``{"reason": ...}``: why it
    was not run (no such Python, or the pipeline's error, its last line)."""
    variable, venv, code, _ = LOADERS[name]
    python = Path(os.environ.get(variable) or PROJECT / venv / "bin" / "python")
    if not python.exists():
        return {"reason": f"no {python} (scripts/bench_loaders_env.sh makes it; or set {variable})"}
    pca = [json.dumps(PCA_EIGVAL), json.dumps([list(row) for row in PCA_EIGVEC])]
    where = str(work / f"{name}.beton") if name == "ffcv" else str(len(list(root.glob("*/*"))))
    try:
        done = subprocess.run([str(python), "-c", code, str(root), str(batch), str(epochs), str(cores), where, *pca],
                              capture_output=True, text=True, timeout=3600)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"reason": f"{python}: no result within an hour"}
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if done.returncode != 0 or not done.stdout.strip():
        return {"reason": f"{python} exited {done.returncode}: {lines[-1].strip() if lines else 'no output'}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _images(photos: list[Path], root: Path, n: int) -> list[Path]:
    """``n`` JPEGs at ImageNet's sizes in two class folders, each a different crop (every other one flipped)."""
    paths = [root / f"class{k % 2}" / f"{k:05d}.JPEG" for k in range(n)]
    write_variants(photos, paths, quality=90)
    return paths


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
                normalize(pixels, channels_last=False, kind="robustness_custom_imagenet", lighting=alphas)
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
        loaders = {name: _loader(name, root / "folder", root, args.batch, args.rounds, cores) for name in LOADERS}
        for name, result in loaders.items():
            if "rates" in result:
                rates[name] = result["rates"]  # type: ignore[assignment]
            else:
                print(f"{name:<14} not run: {result['reason']}")
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
        what = f"{name}, {cores} cores"
        if name in LOADERS:
            what += ": " + LOADERS[name][3].format(version=loaders[name].get("version"), cores=cores)
        figures[name] = records.median_figure([r / cores for r in runs], "images/s per core", 0, what)
        figures[f"{name}_ratio"] = {"what": f"{name} / torchvision", "figure": f"{median / baseline:.2f}x",
                                    "median": median / baseline}  # fmt: skip
        print(f"{name:<14} {median:8.1f} images/s ({median / cores:7.1f} per core) {median / baseline:5.2f}x")
    for name, result in loaders.items():
        if "reason" in result:
            figures[name] = {"what": f"{name}, {cores} cores: not run", "figure": f"not run: {result['reason']}",
                             "reason": result["reason"]}  # fmt: skip
    if "seconds" in loaders["ffcv"]:
        prepared["ffcv"] = loaders["ffcv"]
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

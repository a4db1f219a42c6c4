"""Should shiftbench adopt torchvision? Its models, transforms and JPEG decoding beside ours, measured.

Needs a venv with torchvision (the repo venv's CPU torch 2.13 cannot load it, docs/sources.md), e.g.:

    python3.11 -m venv /work/tv-venv
    /work/tv-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 \\
        numpy pillow pyarrow pydantic pydantic-settings pyyaml
    PYTHONPATH=. /work/tv-venv/bin/python bench/bench_torchvision.py --out bench/results/torchvision.json

Measured side by side in one process (same torch, ``torch.set_num_threads(2)``, medians of
``--repeats`` runs after one warm-up, alternatives interleaved so drift hits both):

- models: state-dict keys/shapes of ``build_model("resnet18"|"resnet50")`` vs torchvision's, output
  and gradient differences once torchvision's random weights are loaded into ours, and the
  train-mode forward+backward time of a batch;
- augmentation: DomainBed's training transform as torchvision v2 per image (DomainBed's way), v2 on
  the whole batch (one random draw for all images), and ``shiftbench.erm.augment.augment("domainbed")``;
- decoding: JPEG -> RGB -> square resize with Pillow (``shiftbench.splits.split_dataset.decode``) vs
  ``torchvision.io.decode_jpeg`` + ``v2.functional.resize(antialias=True)``, and their pixel agreement.

``--write-snapshot PATH`` writes torchvision's ResNet state-dict shapes for
tests/test_torchvision_parity.py, which checks our models against it without torchvision.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402
from torchvision.io import ImageReadMode, decode_jpeg, read_file  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as tvf  # noqa: E402

from shiftbench.erm import augment as sb_augment  # noqa: E402
from shiftbench.erm.models import build_model  # noqa: E402
from shiftbench.splits import split_dataset as sb_data  # noqa: E402

RESNETS = ("resnet18", "resnet50")
Timed = dict[str, Any]


def timed(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timed]:
    """Median wall time of each function; one warm-up each, then the functions take turns."""
    for fn in fns.values():
        fn()
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            tick = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - tick)
    return {
        name: {"median_s": statistics.median(r), "min_s": min(r), "runs_s": [round(t, 5) for t in r]}
        for name, r in runs.items()
    }


def natural(n: int, h: int, w: int, seed: int) -> torch.Tensor:
    """uint8 ``[n, 3, h, w]`` that compresses and resamples like photos: smooth blobs plus grain."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, h // 24 + 2, w // 24 + 2, generator=g)
    x = nn.functional.interpolate(low, size=(h, w), mode="bicubic", align_corners=False)
    x = x + 0.04 * torch.randn(n, 3, h, w, generator=g)
    return x.clamp(0, 1).mul(255).round().to(torch.uint8)


def tv_resnet(name: str) -> nn.Module:
    model: nn.Module = getattr(torchvision.models, name)(weights=None, num_classes=1000)
    return model


def shapes(model: nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def write_snapshot(path: Path) -> None:
    """torchvision's ResNet state-dict keys and shapes (in order) for the test without torchvision."""
    snapshot = {
        "generated_by": "bench/bench_torchvision.py --write-snapshot",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "num_classes": 1000,
        "models": {name: shapes(tv_resnet(name)) for name in RESNETS},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(snapshot, indent=1)  # one line per key: a diff shows the layer that changed
    text = re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)
    path.write_text(text + "\n")
    print(f"wrote {path}", flush=True)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def model_parity(name: str) -> dict[str, Any]:
    """Keys, shapes and numbers: torchvision's random weights loaded into our model."""
    torch.manual_seed(0)
    tv, ours = tv_resnet(name), build_model(name, num_classes=1000, image_size=224)
    tv_shapes, our_shapes = shapes(tv), shapes(ours)
    row: dict[str, Any] = {
        "keys": len(tv_shapes),
        "same_keys_in_order": list(tv_shapes) == list(our_shapes),
        "same_shapes": tv_shapes == our_shapes,
        "parameters": sum(p.numel() for p in tv.parameters()),
    }
    ours.load_state_dict(tv.state_dict(), strict=True)
    tv.eval(), ours.eval()
    for batch, size in ((4, 224), (8, 64)):
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            a, b = tv(x), ours(x)
        row[f"eval_max_abs_diff_{batch}x{size}"] = _max_diff(a, b)
        row[f"eval_max_abs_logit_{batch}x{size}"] = float(a.abs().max())
    # Freshly initialised BatchNorms are all alike (1, 0, mean 0, var 1): a swapped BN would go
    # unnoticed, so perturb every BN tensor and compare again.
    g = torch.Generator().manual_seed(1)
    for module in tv.modules():
        if isinstance(module, nn.BatchNorm2d):
            c = module.num_features
            module.weight.data.copy_(0.5 + torch.rand(c, generator=g))
            module.bias.data.copy_(0.1 * torch.randn(c, generator=g))
            module.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            module.running_var.copy_(0.5 + torch.rand(c, generator=g))
    ours.load_state_dict(tv.state_dict(), strict=True)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        row["eval_perturbed_bn_max_abs_diff_4x224"] = _max_diff(tv(x), ours(x))
    # Train mode: batch statistics, then every gradient.
    tv.train(), ours.train()
    x = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 1000, (8,), generator=torch.Generator().manual_seed(4))
    outputs = []
    for model in (tv, ours):
        model.zero_grad(set_to_none=True)
        out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        outputs.append(out.detach())
    row["train_output_max_abs_diff_8x64"] = _max_diff(*outputs)
    tv_grads = dict(tv.named_parameters())
    row["train_grad_max_abs_diff_8x64"] = max(
        _max_diff(p.grad, tv_grads[k].grad)  # type: ignore[arg-type]
        for k, p in ours.named_parameters()
    )
    return row


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()

    return run


def model_speed(name: str, repeats: int) -> list[dict[str, Any]]:
    """Train-mode forward + backward (cross-entropy, no optimiser step) of one batch, ours vs torchvision."""
    rows = []
    for batch, size in ((32, 64), (8, 224)):
        torch.manual_seed(0)
        tv = tv_resnet(name).train()
        ours = build_model(name, num_classes=1000, image_size=size).train()
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, 1000, (batch,))

        result = timed({"shiftbench": train_step(ours, x, y), "torchvision": train_step(tv, x, y)}, repeats)
        rows.append(
            {
                "model": name,
                "batch": batch,
                "size": size,
                **{f"{k}_s": v["median_s"] for k, v in result.items()},
                **{f"{k}_min_s": v["min_s"] for k, v in result.items()},
                "torchvision_over_shiftbench": result["torchvision"]["median_s"] / result["shiftbench"]["median_s"],
                "torchvision_over_shiftbench_min": result["torchvision"]["min_s"] / result["shiftbench"]["min_s"],
                "runs": result,
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "runs"}), flush=True)
    return rows


def domainbed_v2(size: int) -> v2.Compose:
    """DomainBed's training transform (its datasets.py) in torchvision v2, on uint8 tensors."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=(0.7, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(0.3, 0.3, 0.3, 0.3),
            v2.RandomGrayscale(p=0.1),
        ]
    )


def augmentation(batch_size: int, size: int, repeats: int) -> dict[str, Any]:
    """Per-image v2, whole-batch v2 and shiftbench's batched version on one uint8 batch."""
    batch = natural(batch_size, size, size, seed=size)
    transform = domainbed_v2(size)
    generator = torch.Generator().manual_seed(0)
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "v2_per_image": lambda: torch.stack([transform(image) for image in batch]),
        "v2_whole_batch": lambda: transform(batch),
        "shiftbench_batched": lambda: sb_augment.augment(batch, "domainbed", generator),
    }
    result = timed(fns, repeats)  # type: ignore[arg-type]
    row: dict[str, Any] = {"batch": batch_size, "size": size}
    for name, r in result.items():
        row[f"{name}_ms"] = 1000 * r["median_s"]
        row[f"{name}_min_ms"] = 1000 * r["min_s"]
        row[f"{name}_images_per_s"] = batch_size / r["median_s"]
    # Per-image randomness: the same image repeated B times gives how many distinct outputs?
    row["copies"] = batch_size
    same = batch[:1].expand(batch_size, -1, -1, -1).contiguous()
    for name, fn in (
        ("v2_per_image", lambda: torch.stack([transform(image) for image in same])),
        ("v2_whole_batch", lambda: transform(same)),
        ("shiftbench_batched", lambda: sb_augment.augment(same, "domainbed", generator)),
    ):
        out = fn()
        row[f"{name}_distinct_outputs"] = len({bytes(o.numpy().tobytes()) for o in out})
        # How far the transform moves pixels on average (0-255), over 5 draws: similar strength?
        change = [float((f.float() - batch.float()).abs().mean()) for f in (fns[name]() for _ in range(5))]
        row[f"{name}_mean_abs_change"] = statistics.mean(change)
    row["runs"] = result
    print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    return row


def make_jpegs(directory: Path, count: int, seed: int) -> list[Path]:
    """``count`` 500x375 photo-like JPEGs (Pillow, quality 90)."""
    paths = []
    for start in range(0, count, 50):
        chunk = natural(min(50, count - start), 375, 500, seed=seed + start)
        for offset, image in enumerate(chunk):
            path = directory / f"{start + offset:05d}.jpg"
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(path, quality=90)
            paths.append(path)
    return paths


def pillow_decode_only(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def pillow_draft(path: Path, size: int) -> np.ndarray:
    """Not in shiftbench: Pillow's JPEG draft mode (DCT scaling by 1/2..1/8 while decoding), then resize."""
    with Image.open(path) as image:
        image.draft("RGB", (size, size))
        rgb = image.convert("RGB")
        return np.array(rgb.resize((size, size), Image.Resampling.BILINEAR), dtype=np.uint8).transpose(2, 0, 1)


def tv_decode(paths: list[Path], size: int | None) -> list[torch.Tensor]:
    raw = [read_file(str(p)) for p in paths]
    images = decode_jpeg(raw, mode=ImageReadMode.RGB)
    if size is None:
        return images  # type: ignore[return-value]
    return [tvf.resize(image, [size, size], antialias=True) for image in images]


def halves(paths: list[Path]) -> list[list[Path]]:
    middle = len(paths) // 2
    return [paths[:middle], paths[middle:]]


def decode_fns(paths: list[Path], size: int, pool: ThreadPoolExecutor) -> dict[str, Callable[[], object]]:
    def one(path: Path) -> np.ndarray:
        return sb_data.decode(path, size)

    def tv_half(part: list[Path]) -> list[torch.Tensor]:
        return tv_decode(part, size)

    return {
        "pillow_sequential": lambda: [one(p) for p in paths],
        "pillow_2_threads": lambda: list(pool.map(one, paths)),
        "torchvision_sequential": lambda: tv_half(paths),
        "torchvision_2_threads": lambda: [t for part in pool.map(tv_half, halves(paths)) for t in part],
        "pillow_draft_sequential": lambda: [pillow_draft(p, size) for p in paths],
    }


def decoding(count: int, repeats: int) -> dict[str, Any]:
    """Pillow (shiftbench's decode) vs torchvision.io, sequential and on 2 threads (as ImageCache)."""
    with tempfile.TemporaryDirectory(prefix="bench_tv_jpeg_") as tmp:
        paths = make_jpegs(Path(tmp), count, seed=7)
        nbytes = sum(p.stat().st_size for p in paths)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decode_jpeg([read_file(str(paths[0]))])
        deprecation = sorted({str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)})
        warnings.simplefilter("ignore", DeprecationWarning)
        pool = ThreadPoolExecutor(max_workers=2)
        result: dict[str, Any] = {
            "images": count,
            "source_size": "500x375",
            "jpeg_quality": 90,
            "mean_file_kib": nbytes / count / 1024,
            "torchvision_io_deprecation": deprecation,
            "rows": [],
        }
        # Decode only, no resize: where do the two decoders differ?
        only = timed(
            {
                "pillow": lambda: [pillow_decode_only(p) for p in paths],
                "torchvision": lambda: tv_decode(paths, None),
            },
            repeats,
        )
        a = np.stack([pillow_decode_only(p) for p in paths]).astype(np.int16)
        b = np.stack([t.permute(1, 2, 0).numpy() for t in tv_decode(paths, None)]).astype(np.int16)
        result["decode_only"] = {
            "pillow_ms_per_image": 1000 * only["pillow"]["median_s"] / count,
            "torchvision_ms_per_image": 1000 * only["torchvision"]["median_s"] / count,
            "pillow_min_ms_per_image": 1000 * only["pillow"]["min_s"] / count,
            "torchvision_min_ms_per_image": 1000 * only["torchvision"]["min_s"] / count,
            "mean_abs_diff": float(np.abs(a - b).mean()),
            "max_abs_diff": int(np.abs(a - b).max()),
            "runs": only,
        }
        print(json.dumps({k: v for k, v in result["decode_only"].items() if k != "runs"}), flush=True)
        for size in (64, 224):
            fns = decode_fns(paths, size, pool)
            runs = timed(fns, repeats)
            row: dict[str, Any] = {"size": size}
            for name, r in runs.items():
                row[f"{name}_ms_per_image"] = 1000 * r["median_s"] / count
                row[f"{name}_min_ms_per_image"] = 1000 * r["min_s"] / count
                row[f"{name}_images_per_s"] = count / r["median_s"]
            pil = np.stack([sb_data.decode(p, size) for p in paths]).astype(np.int16)
            tvo = torch.stack(tv_decode(paths, size)).numpy().astype(np.int16)
            draft = np.stack([pillow_draft(p, size) for p in paths]).astype(np.int16)
            row["pillow_vs_torchvision_mean_abs_diff"] = float(np.abs(pil - tvo).mean())
            row["pillow_vs_torchvision_max_abs_diff"] = int(np.abs(pil - tvo).max())
            row["pillow_vs_torchvision_share_off_by_more_than_2"] = float((np.abs(pil - tvo) > 2).mean())
            row["pillow_vs_pillow_draft_mean_abs_diff"] = float(np.abs(pil - draft).mean())
            row["runs"] = runs
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        pool.shutdown()
    return result


def import_times(repeats: int) -> dict[str, Any]:
    """Fresh-interpreter import time of torch alone and with torchvision (this venv)."""
    out = {}
    for name, code in (("torch", "import torch"), ("torch_torchvision_v2", "import torch, torchvision.transforms.v2")):
        runs = []
        for _ in range(repeats):
            tick = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            runs.append(time.perf_counter() - tick)
        out[name] = {"median_s": statistics.median(runs), "runs_s": [round(t, 3) for t in runs]}
    return out


def machine() -> dict[str, Any]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout),
        "cpu_model": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the measurements here (JSON)")
    parser.add_argument("--write-snapshot", type=Path, help="write torchvision's ResNet state-dict shapes here")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (>= 5)")
    parser.add_argument("--images", type=int, default=500, help="JPEGs to decode")
    args = parser.parse_args()
    if args.out is None and args.write_snapshot is None:
        parser.error("give --out and/or --write-snapshot")
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    torch.set_num_threads(2)
    if args.write_snapshot is not None:
        write_snapshot(args.write_snapshot)
    if args.out is None:
        return
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": machine(),
        "repeats": args.repeats,
        "import_s": import_times(args.repeats),
    }
    print(json.dumps(results), flush=True)
    # The machine may be shared: the load around each section tells whether its timings are clean.
    load: dict[str, list[float]] = {"start": [round(v, 2) for v in os.getloadavg()]}
    results["load_average_1_5_15_min"] = load
    results["model_parity"] = {name: model_parity(name) for name in RESNETS}
    print(json.dumps(results["model_parity"]), flush=True)
    results["model_speed"] = [row for name in RESNETS for row in model_speed(name, args.repeats)]
    load["after_model_speed"] = [round(v, 2) for v in os.getloadavg()]
    results["augmentation"] = {
        "note": "v2_whole_batch draws ONE crop/flip/jitter/greyscale for the whole batch (v2 samples its "
        "parameters once per call), so it is not per-image augmentation; the others draw per image.",
        "rows": [augmentation(32, 224, args.repeats), augmentation(128, 64, args.repeats)],
    }
    load["after_augmentation"] = [round(v, 2) for v in os.getloadavg()]
    results["decoding"] = decoding(args.images, args.repeats)
    load["end"] = [round(v, 2) for v in os.getloadavg()]
    results["total_s"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    methods = ("v2_per_image", "v2_whole_batch", "shiftbench_batched")
    decoders = ("pillow_sequential", "pillow_2_threads", "torchvision_sequential", "torchvision_2_threads")
    speed_cols = ["model", "batch", "size", "shiftbench_s", "torchvision_s", "shiftbench_min_s", "torchvision_min_s"]
    aug_cols = ["batch", "size", "copies"] + [f"{n}_{c}" for n in methods for c in ("ms", "min_ms", "distinct_outputs")]
    dec_cols = ["size"] + [f"{n}_ms_per_image" for n in (*decoders, "pillow_draft_sequential")]
    dec_cols += ["pillow_vs_torchvision_mean_abs_diff"]
    print(_table(results["model_speed"], speed_cols))
    print(_table(results["augmentation"]["rows"], aug_cols))
    print(_table(results["decoding"]["rows"], dec_cols))
    print(f"wrote {args.out} in {results['total_s']:.0f} s")


if __name__ == "__main__":
    main()

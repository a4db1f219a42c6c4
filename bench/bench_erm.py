"""ERM training throughput (images/s), not correctness: results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_erm.py [--sizes 64 224] [--device auto] [--iterations 12]

For ResNet-18 at each input size, three measurements on the same device, same batch size:

- (a) the job as users run it: :func:`shiftbench.erm.train.train` on a published sprites split
  (PNG files -> the uint8 cache -> gather, normalise, forward, backward, step), steady-state
  images/s as the job reports it (warm-up iterations and evaluation excluded);
- (b) the compute-bound ceiling: the same model and optimiser on one random uint8 batch already
  on the device (normalise, forward, backward, step);
- (c) the naive baseline: a plain ``DataLoader`` over the per-item Pillow dataset (2 workers),
  batches moved to the device, then the same step.

Reported: the median of the per-iteration throughputs after warm-up, and (a)/(b), (c)/(b). The
sprites are 64x64; at 224 they are decoded and resized once into the cache (a) or per item (c).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import polars as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from shiftbench import building  # noqa: E402
from shiftbench.conds.family import CASE, CONDS  # noqa: E402
from shiftbench.conds.specs import load_specs  # noqa: E402
from shiftbench.erm import launch  # noqa: E402
from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.data import SplitDataset, normalize, read_split  # noqa: E402
from shiftbench.erm.models import build_model  # noqa: E402
from shiftbench.erm.train import resolve_device, train  # noqa: E402
from shiftbench.family import Target  # noqa: E402
from shiftbench.images import image_paths  # noqa: E402
from shiftbench.publishing import check_version, publish_staged  # noqa: E402
from shiftbench.settings import Settings  # noqa: E402
from shiftbench.store import Store  # noqa: E402

WARMUP = 3


def _batch_size(size: int, device: torch.device) -> int:
    return 128 if size <= 96 or device.type == "cuda" else 32


def _step_fn(model: nn.Module, device: torch.device, channels_last: bool, bf16: bool) -> Any:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch: torch.Tensor, y: torch.Tensor) -> None:
        x = normalize(batch, channels_last=channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ceiling(size: int, batch: int, iterations: int, device: torch.device) -> float:
    cuda = device.type == "cuda"
    model = build_model("resnet18", 3, size).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step = _step_fn(model, device, cuda, cuda)
    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
    y = torch.randint(0, 3, (batch,), device=device)
    rates = []
    for i in range(WARMUP + iterations):
        _sync(device)
        tick = time.perf_counter()
        step(x, y)
        _sync(device)
        if i >= WARMUP:
            rates.append(batch / (time.perf_counter() - tick))
    return statistics.median(rates)


def naive(split_dir: Path, image_root: Path, size: int, batch: int, iterations: int, device: torch.device) -> float:
    table = read_split(split_dir)
    paths = image_paths(table.example_ids, image_root, "images/{}.png")
    dataset = SplitDataset(table, paths, table.indices("train"), size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=2, drop_last=True)
    cuda = device.type == "cuda"
    model = build_model("resnet18", 3, size).to(device)
    step = _step_fn(model, device, False, cuda)
    rates: list[float] = []
    done = 0
    while done < WARMUP + iterations:
        tick = time.perf_counter()
        for x, y, _ in loader:
            step(x.to(device), y.to(device))
            _sync(device)
            if done >= WARMUP:
                rates.append(batch / (time.perf_counter() - tick))
            done += 1
            if done >= WARMUP + iterations:
                break
            tick = time.perf_counter()
    return statistics.median(rates)


def job(split_dir: Path, image_root: Path, size: int, batch: int, iterations: int, device: torch.device) -> float:
    config = TrainConfig.from_mapping(
        {
            "model": "resnet18",
            "image_size": size,
            "batch_size": batch,
            "max_iters": 5 + iterations,
            "eval_every": 10_000,
            "selection": "last",
            "device": str(device),
            "cache": "on",
        }
    )
    table = read_split(split_dir)
    paths = image_paths(table.example_ids, image_root, "images/{}.png")
    with tempfile.TemporaryDirectory() as out:
        result = train(table, paths, config, Path(out), log=lambda _: None)
    assert result.train_images_per_s is not None
    return result.train_images_per_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as home:
        settings = Settings.from_env({"SHIFTBENCH_HOME": home, "SHIFTBENCH_SPRITES_PER_COMBINATION": "20"})
        specs = load_specs()
        spec = specs.cases["sprites-uniform"].with_overrides({"train_size": 500})
        inputs = building.build_inputs(settings, CONDS)
        staged = CASE.stage(settings, Target("sprites-uniform", spec, {"train_size": 500}), inputs)
        check_version(Store(settings.store_dir), staged)
        publish_staged(settings, staged)
        # Only the training split, so the job's final evaluation stays short at 224 on a CPU.
        examples = pl.read_parquet(staged.table_path("examples")).filter(pl.col("split") == "train")
        split_dir = Path(home) / "train_only"
        split_dir.mkdir()
        examples.write_parquet(split_dir / "examples.parquet")
        image_root = launch.published_split(settings, "sprites-uniform").manifest["origin"]["image_root"]
        rows = []
        for size in args.sizes:
            batch = _batch_size(size, device)
            a = job(split_dir, Path(image_root), size, batch, args.iterations, device)
            b = ceiling(size, batch, args.iterations, device)
            c = naive(split_dir, Path(image_root), size, batch, args.iterations, device)
            row = {
                "size": size,
                "batch": batch,
                "job": a,
                "ceiling": b,
                "naive": c,
                "a_over_b": a / b,
                "c_over_b": c / b,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device)
                if device.type == "cuda"
                else platform.processor() or "cpu",
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

"""ERM training throughput (images/s) against the hardware's limit: results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_erm.py                       # build the data here, measure here
    .venv/bin/python bench/bench_erm.py --prepare DIR         # only build the data (polars, duckdb)
    python3 bench/bench_erm.py --data DIR --device cuda       # measure where only torch is (a GPU box)
    ... [--record bench/figures/erm_throughput.json]          # also keep the rows (bench/records.py)

For ResNet-18 (Adam) at each input size and batch, on one device, side by side in one process:

- ``job``: :func:`shiftbench.erm.train.train` as users run it on a published sprites split (PNG files ->
  the uint8 cache -> gather, augment, normalise, forward, backward, step), steady-state images/s as the
  job reports it (warm-up and evaluation excluded), with its default step (``auto``: a CUDA graph on a
  GPU, :mod:`shiftbench.erm.step`) and with ``step: eager``;
- ``step_eager``: the bare step on one random uint8 batch already on the device, launched op by op;
- ``step_graph``: the same bare step captured in a CUDA graph (fused Adam, learning rate on the device)
  and replayed: the limit a job can reach on this device (GPU only);
- ``step_compiled``: the bare step with the model under ``torch.compile(mode="reduce-overhead")``
  (cudagraph trees for forward and backward, the optimizer eager; GPU only, ``--compile``);
- ``naive``: a plain ``DataLoader`` over the per-item Pillow dataset (2 workers), then the eager step.

Reported: medians of per-iteration throughputs after warm-up, and job / step_graph (the issue-28 goal:
>= 0.75 at 64x64 batch 128, >= 0.9 at 224x224 batch 128). The sprites are 64x64; at 224 they are
resized once into the cache (job) or per item (naive).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)
import torch  # noqa: E402
from torch import nn  # noqa: E402

from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.data import normalize  # noqa: E402
from shiftbench.erm.models import build_model  # noqa: E402
from shiftbench.erm.train import resolve_device, train  # noqa: E402
from shiftbench.splits.images import image_paths  # noqa: E402
from shiftbench.splits.split_dataset import SplitDataset  # noqa: E402
from shiftbench.splits.split_table import read_split  # noqa: E402

WARMUP = 3
TEMPLATE = "images/{}.png"


def prepare(out: Path, per_combination: int = 20, train_size: int = 500) -> None:
    """The sprites-uniform case's training split and its images in ``out`` (portable: carry it to a GPU)."""
    import shutil

    import polars as pl

    from shiftbench.conds.family import CASE, CONDS
    from shiftbench.conds.specs import load_specs
    from shiftbench.config.settings import Settings
    from shiftbench.families import benchmark_builds
    from shiftbench.families.family import Target
    from shiftbench.splits import published as splits
    from shiftbench.store import Store
    from shiftbench.warehouse.publishing import check_version, publish_staged

    with tempfile.TemporaryDirectory() as home:
        env = {"SHIFTBENCH_HOME": home, "SHIFTBENCH_SPRITES_PER_COMBINATION": str(per_combination)}
        settings = Settings.from_env(env)
        spec = load_specs().cases["sprites-uniform"].with_overrides({"train_size": train_size})
        staged = CASE.stage(settings, Target("sprites-uniform", spec, {"train_size": train_size}),
                            benchmark_builds.build_inputs(settings, CONDS))  # fmt: skip
        check_version(Store(settings.store_dir), staged)
        publish_staged(settings, staged)
        # Only the training split, so the job's final evaluation stays short at 224 on a CPU.
        examples = pl.read_parquet(staged.table_path("examples")).filter(pl.col("split") == "train")
        out.mkdir(parents=True, exist_ok=True)
        examples.write_parquet(out / "examples.parquet")
        root = Path(splits.published_split(settings, "sprites-uniform").manifest["origin"]["image_root"])
        root = root if root.is_absolute() else settings.home / root  # manifests record roots inside the warehouse
        (out / "images").mkdir(exist_ok=True)
        for example_id in examples["example_id"]:
            shutil.copy2(root / TEMPLATE.format(example_id), out / TEMPLATE.format(example_id))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_rate(step: Callable[[], None], batch: int, iterations: int, device: torch.device) -> float:
    rates = []
    for i in range(WARMUP + iterations):
        _sync(device)
        tick = time.perf_counter()
        step()
        _sync(device)
        if i >= WARMUP:
            rates.append(batch / (time.perf_counter() - tick))
    return statistics.median(rates)


def _bare_step(size: int, batch: int, device: torch.device, *, fused: bool, compiled: bool = False) -> Any:
    """The step on one static random batch: normalise, forward (bf16 on a GPU), loss, backward, Adam."""
    cuda = device.type == "cuda"
    model = build_model("resnet18", 3, size).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    forward = torch.compile(model, mode="reduce-overhead") if compiled else model
    lr: Any = torch.tensor(1e-3, device=device) if fused else 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)
    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
    y = torch.randint(0, 3, (batch,), device=device)

    def step(zero: bool = True) -> None:
        inputs = normalize(x, channels_last=cuda)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda, cache_enabled=not fused):
            loss = nn.functional.cross_entropy(forward(inputs).float(), y)
        if zero:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, optimizer


def step_eager(size: int, batch: int, iterations: int, device: torch.device) -> float:
    step, _ = _bare_step(size, batch, device, fused=False)
    return _median_rate(step, batch, iterations, device)


def step_graph(size: int, batch: int, iterations: int, device: torch.device) -> float:
    """PyTorch's whole-network capture: warm up on a side stream, capture once, replay."""
    step, optimizer = _bare_step(size, batch, device, fused=True)
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step(zero=False)
    return _median_rate(graph.replay, batch, iterations, device)


def step_compiled(size: int, batch: int, iterations: int, device: torch.device) -> float:
    step, _ = _bare_step(size, batch, device, fused=False, compiled=True)
    for _ in range(3):  # compile and record the cudagraph trees before timing
        step()
    return _median_rate(step, batch, iterations, device)


def naive(data: Path, size: int, batch: int, iterations: int, device: torch.device) -> float:
    """A DataLoader decoding per item (2 workers), each batch moved to the device, then the eager step."""
    table = read_split(data)
    dataset = SplitDataset(table, image_paths(table.example_ids, data, TEMPLATE), table.indices("train"), size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=2, drop_last=True)
    model = build_model("resnet18", 3, size).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches: Any = iter(())

    def one() -> None:
        nonlocal batches
        item = next(batches, None)
        if item is None:
            batches = iter(loader)
            item = next(batches)
        x, y = item[0].to(device), item[1].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = nn.functional.cross_entropy(model(normalize(x, channels_last=False)).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return _median_rate(one, batch, iterations, device)


def job(data: Path, size: int, batch: int, iterations: int, device: torch.device, step: str) -> tuple[float, str]:
    config = TrainConfig.from_mapping(
        {"model": "resnet18", "image_size": size, "batch_size": batch, "max_iters": 5 + iterations,
         "eval_every": 10_000, "selection": "last", "device": str(device), "cache": "on", "step": step}
    )  # fmt: skip
    table = read_split(data)
    with tempfile.TemporaryDirectory() as out:
        result = train(table, image_paths(table.example_ids, data, TEMPLATE), config, Path(out), log=lambda _: None)
    assert result.train_images_per_s is not None
    return result.train_images_per_s, result.step


def measure(data: Path, size: int, batch: int, iterations: int, device: torch.device, compiled: bool) -> dict:
    cuda = device.type == "cuda"
    row: dict[str, Any] = {"size": size, "batch": batch}
    row["job"], row["job_step"] = job(data, size, batch, iterations, device, "auto")
    row["job_eager"], _ = job(data, size, batch, iterations, device, "eager")
    row["step_eager"] = step_eager(size, batch, iterations, device)
    row["step_graph"] = step_graph(size, batch, iterations, device) if cuda else None
    row["step_compiled"] = step_compiled(size, batch, iterations, device) if cuda and compiled else None
    row["naive"] = naive(data, size, batch, iterations, device)
    limit = row["step_graph"] or row["step_eager"]
    row["job_over_limit"] = row["job"] / limit
    row["naive_over_limit"] = row["naive"] / limit
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 224])
    parser.add_argument("--batches", type=int, nargs="+", help="default: 128 512 on a GPU; 128 (32 at 224) on CPU")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action="store_true", help="also torch.compile(mode='reduce-overhead')")
    parser.add_argument("--prepare", type=Path, help="only write the data into this folder")
    parser.add_argument("--data", type=Path, help="data written by --prepare (default: made now)")
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    if args.prepare:
        prepare(args.prepare)
        return
    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data
        if data is None:
            data = Path(scratch) / "data"
            prepare(data)
        rows = []
        for size in args.sizes:
            batches = args.batches or ([128, 512] if device.type == "cuda" else [128 if size <= 96 else 32])
            for batch in batches:
                rows.append(measure(data, size, batch, args.iterations, device, args.compile))
                print(json.dumps(rows[-1]), flush=True)
                recording.run(**rows[-1])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    info = {"device": name, "threads": torch.get_num_threads(), "torch": torch.__version__}
    print(json.dumps({**info, "python": platform.python_version(), "rows": rows}, indent=2))
    recording.save(f"ResNet-18 training throughput on {name}, {args.iterations} iterations", _figures(rows))


def _figures(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row's images/s (medians of per-iteration throughputs) and its ratios to the device's limit."""
    figures: dict[str, dict[str, Any]] = {}
    for row in rows:
        at = f"{row['size']}x{row['size']}.batch{row['batch']}"
        for name in ("job", "job_eager", "step_eager", "step_graph", "step_compiled", "naive"):
            if row[name] is not None:
                rate = f"{row[name]:,.0f}" if row[name] >= 100 else f"{row[name]:.1f}"  # 196; 16.1
                figures[f"{at}.{name}"] = {"what": name, "figure": f"{rate} images/s", "value": row[name]}
        for name in ("job_over_limit", "naive_over_limit"):
            figures[f"{at}.{name}"] = {"what": name, "figure": f"{row[name]:.2f}", "value": row[name]}
    return figures


if __name__ == "__main__":
    main()

"""What ``track_conflicts`` costs: the paper's setup (MetaShift §4.3: 26 training subsets x 50 images, 48 evaluation
subsets), the same run tracked and untracked, side by side in one process: results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_conflicts.py                      # build the split here, measure here (CPU)
    .venv/bin/python bench/bench_conflicts.py --prepare DIR        # only build it (polars, duckdb): carry DIR
    python3 bench/bench_conflicts.py --data DIR --device cuda      # measure where only torch is (a GPU box)
    ... [--record bench/figures/conflicts.json]                    # also keep the rows (bench/records.py)

The split is the shipped ``metashift-conflicts`` task built on the embedded generated scene sample
(``metashift-conflicts@generated``) with its generated stand-in images; the run is the ``quick`` preset's
(``small_cnn``, 32x32, batch 128, Adam, flips and quarter turns) for ``--iterations`` steps. Reported per round: the
job's ``train_s`` (the training loop, the tracking included) and ``total_s``; medians over rounds, tracked over
untracked. The floor: a step's evaluation is a forward pass over every evaluation image (624 here), a training step
a forward and backward pass over 128, about three forward passes' work each: at least 1 + 624 / (3 x 128) = 2.6x
the untracked step in arithmetic, less where the evaluation's larger, channels-last batches run faster.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)
import torch  # noqa: E402

from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.train import train  # noqa: E402
from shiftbench.scoring.training_conflicts import subset_descriptor  # noqa: E402
from shiftbench.splits.images import image_paths  # noqa: E402
from shiftbench.splits.split_table import read_split  # noqa: E402

TASK = "metashift-conflicts"
QUICK = {"model": "small_cnn", "image_size": 32, "batch_size": 128, "optimizer": "adam", "lr": 1e-3,
         "eval_every": 100, "patience": 0, "augment": "flip_rot90", "checkpoint_every": 0}  # fmt: skip


def prepare(out: Path) -> None:
    """The conflicts split (its version folder) and its stand-in images in ``out`` (portable: carry it)."""
    from shiftbench.config.settings import Settings
    from shiftbench.splits import published as splits

    with tempfile.TemporaryDirectory() as home:
        env = {"SHIFTBENCH_HOME": home, "PATH": str(Path(sys.executable).parent)}
        shiftbench = str(Path(sys.executable).parent / "shiftbench")
        listed = subprocess.run([shiftbench, "build", "metashift", "--list"], env=env, capture_output=True, text=True)
        name = next(line.split()[0] for line in listed.stdout.splitlines() if line.startswith(TASK))
        subprocess.run([shiftbench, "build", "metashift", "--benchmark", name], env=env, check=True)
        settings = Settings.from_env({"SHIFTBENCH_HOME": home})
        split = splits.published_split(settings, name)
        images = splits.split_images(settings, split, "standin")
        shutil.copytree(split.path, out / "split", ignore=shutil.ignore_patterns("files"))
        (out / "images").mkdir(parents=True, exist_ok=True)
        for example_id in split.examples["example_id"]:
            shutil.copy2(images.root / images.template.format(example_id), out / "images" / f"{example_id}.png")
        (out / "images.json").write_text(json.dumps({"template": "{}.png", "benchmark": name}))


def measure(
    data: Path, device: str, iterations: int, rounds: int, every: list[int], recording: records.Recording
) -> dict[str, Any]:
    table = read_split(data / "split")
    descriptor = subset_descriptor(json.loads((data / "split" / "manifest.json").read_text()), table.benchmark)
    paths = image_paths(table.example_ids, data / "images", "{}.png")
    labels = {"untracked": {}, **{f"tracked_every_{k}": {"track_conflicts": True, "track_every": k} for k in every}}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    for round_ in range(rounds):
        for label, tracking in labels.items():
            config = TrainConfig.from_mapping({**QUICK, "max_iters": iterations, "device": device, **tracking})
            with tempfile.TemporaryDirectory() as out:
                tick = time.perf_counter()
                result = train(table, paths, config, Path(out), lambda _line: None, subsets=descriptor)
                wall = time.perf_counter() - tick
            runs[label].append({"wall_s": wall, **result.timings})
            recording.run(round=round_ + 1, run=label, wall_s=wall, **result.timings)
            print(f"round {round_ + 1} {label}: {wall:.1f} s ({result.timings})", flush=True)
    medians = {label: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for label, rows in runs.items()}
    n_eval = sum(1 for s in table.splits.tolist() if s in descriptor.evaluation_splits)
    return {
        "benchmark": table.benchmark,
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "iterations": iterations,
        "rounds": rounds,
        "evaluation_images": n_eval,
        "training_subsets": len(descriptor.training),
        "evaluation_subsets": len(
            {
                (s, d)
                for s, d in zip(table.splits.tolist(), table.decoded("group"), strict=True)
                if s in descriptor.evaluation_splits
            }
        ),
        "runs": runs,
        "medians": medians,
        **{f"ratio_train_s.{label}": medians[label]["train_s"] / medians["untracked"]["train_s"] for label in runs},
        "machine": platform.processor() or platform.machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", type=Path, help="only write the split and its images into this folder")
    parser.add_argument("--data", type=Path, help="data written by --prepare (default: made now)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--track-every", type=int, nargs="+", default=[1], help="tracked runs, one per value")
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    if args.prepare is not None:
        prepare(args.prepare)
        return
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data
        if data is None:
            data = Path(scratch)
            prepare(data)
        result = measure(data, args.device, args.iterations, args.rounds, args.track_every, recording)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    runs = result["runs"]
    figures = {
        f"{label}.train_s": records.median_figure([r["train_s"] for r in rows], "s", 1, f"{label}: train_s")
        for label, rows in runs.items()
    }
    for label, rows in runs.items():
        if label != "untracked":  # per round, over the untracked run of the same round
            ratios = [t["train_s"] / u["train_s"] for t, u in zip(rows, runs["untracked"], strict=True)]
            figures[f"{label}.ratio"] = records.median_figure(ratios, "x", 2, f"{label} train_s over untracked")
    what = (
        f"track_conflicts on {result['benchmark']} ({result['training_subsets']} training subsets, "
        f"{result['evaluation_subsets']} evaluation subsets, {result['evaluation_images']} evaluation images), "
        f"quick preset for {result['iterations']} steps on {result['device']}, torch {result['torch']}"
    )
    recording.save(what, figures)


if __name__ == "__main__":
    main()

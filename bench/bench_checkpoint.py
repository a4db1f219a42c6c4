"""Checkpoint overhead of a training run (shiftbench.erm.resume): results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_checkpoint.py [--preset quick] [--repeats 3] [--every 0 100] \
        [--record bench/figures/checkpoint.json]

Trains the preset on a published sprites split (40 images per combination) through the job
(:func:`shiftbench.erm.job.run_job`, as ``shiftbench train`` runs it) once per ``--every`` value, alternating,
``--repeats`` times, and reports per value the median wall time of the job, the seconds spent writing
checkpoints (each :meth:`Checkpoints.save` timed), the number written and the checkpoint file's size.
``checkpoint_every: 0`` writes none (only a stop would): the baseline. Overhead = median wall with checkpoints /
median wall without - 1, and, less noisy on a shared machine, checkpoint seconds / wall.
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

import records  # noqa: E402  (bench/, the script's folder, is on the path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, nargs="+", default=[0, 100])
    parser.add_argument("--threads", type=int, default=1)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)

    import torch

    from shiftbench.erm import launch, resume
    from shiftbench.erm.job import run_job
    from tests.conftest import small_sprites_home

    saves: list[tuple[float, int]] = []
    original = resume.Checkpoints.save

    def timed(self: resume.Checkpoints, state: dict[str, Any], iteration: int) -> int:
        started = time.perf_counter()
        size = original(self, state, iteration)
        saves.append((time.perf_counter() - started, size))
        return size

    resume.Checkpoints.save = timed  # type: ignore[method-assign]
    home = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    settings = small_sprites_home(home, "sprites-uniform")
    rows: dict[int, list[dict[str, float]]] = {every: [] for every in args.every}
    for repeat in range(args.repeats):
        for every in args.every:
            overrides = {"checkpoint_every": every, "threads": args.threads, "device": "cpu"}
            plan = launch.plan_run(settings, "sprites-uniform", preset=args.preset, seed=0, overrides=overrides)
            saves.clear()
            started = time.perf_counter()
            summary = run_job(plan.job(home / f"out-{every}-{repeat}"), log=lambda _: None)
            wall = time.perf_counter() - started
            rows[every].append({
                "wall_s": wall, "train_s": summary["timings"]["train_s"], "checkpoints": len(saves),
                "checkpoint_s": sum(s for s, _ in saves), "bytes": max((b for _, b in saves), default=0),
            })  # fmt: skip
            print(json.dumps({"every": every, "repeat": repeat, **rows[every][-1]}), flush=True)
            recording.run(every=every, repeat=repeat, **rows[every][-1])
    base = statistics.median(r["wall_s"] for r in rows[args.every[0]])
    report = {"preset": args.preset, "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    figures: dict[str, dict[str, Any]] = {}
    for every, found in rows.items():
        wall = statistics.median(r["wall_s"] for r in found)
        spent = statistics.median(r["checkpoint_s"] for r in found)
        report[f"every={every}"] = {
            "median_wall_s": round(wall, 2), "vs_baseline": round(wall / base - 1, 4),
            "median_checkpoint_s": round(spent, 3), "checkpoint_share": round(spent / wall, 4),
            "checkpoints": found[0]["checkpoints"], "checkpoint_bytes": found[0]["bytes"],
        }  # fmt: skip
        figures[f"every={every}.wall"] = records.median_figure([r["wall_s"] for r in found], "s", 1, "the job's wall")
        figures[f"every={every}.share"] = {
            "what": "median seconds writing checkpoints / median wall", "figure": f"{100 * spent / wall:.2f} %",
            "value": spent / wall, "checkpoint_s": [r["checkpoint_s"] for r in found],
        }  # fmt: skip
    print(json.dumps(report, indent=1))
    recording.save(
        f"checkpoint overhead of the {args.preset} preset on sprites-uniform, threads={args.threads}", figures
    )


if __name__ == "__main__":
    main()

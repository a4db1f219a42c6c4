"""What ``shiftbench.load_split`` costs, and the time from it to the first training batch (BENCHMARKS.md).

    SHIFTBENCH_HOME=warehouse .venv/bin/python bench/bench_load_split.py entity13 sprites-uniform [--runs 5] \
        [--record bench/figures/load_split.json]

Each round runs in a fresh process (imports included, as a researcher's script pays them): load_split +
``examples``; then ``dataset("train")`` and the first batch of 128 from a ``DataLoader`` (2 workers).
Medians over the rounds; a split without images reports only the first figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import records

ROUND = r"""
import json, sys, time
t0 = time.perf_counter()
import shiftbench
split = shiftbench.load_split(sys.argv[1])
n = split.examples.height
t1 = time.perf_counter()
out = {"examples": n, "load_s": t1 - t0}
try:
    import torch
    loader = torch.utils.data.DataLoader(split.dataset("train"), batch_size=128, shuffle=True, num_workers=2)
    next(iter(loader))
    out["first_batch_s"] = time.perf_counter() - t0
except Exception as exc:
    out["first_batch"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("benchmarks", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    figures = {}
    for name in args.benchmarks:
        rounds = [json.loads(subprocess.run([sys.executable, "-c", ROUND, name], capture_output=True, text=True,
                                            check=True).stdout) for _ in range(args.runs)]  # fmt: skip
        for number, measured in enumerate(rounds):
            recording.run(benchmark=name, round=number, **measured)
        figures[f"{name}.load"] = records.median_figure([r["load_s"] for r in rounds], "s", 2, "load_split + examples")
        if "first_batch_s" in rounds[0]:
            figures[f"{name}.first_batch"] = records.median_figure(
                [r["first_batch_s"] for r in rounds], "s", 2, "to the first batch of 128"
            )
        row = {"benchmark": name, "examples": rounds[0]["examples"],
               "load_s": statistics.median(r["load_s"] for r in rounds)}  # fmt: skip
        if "first_batch_s" in rounds[0]:
            row["first_batch_s"] = statistics.median(r["first_batch_s"] for r in rounds)
        else:
            row["first_batch"] = rounds[0]["first_batch"]
        print(json.dumps(row), flush=True)
    recording.save("shiftbench.load_split(NAME).examples, and to the first batch; each round a fresh process", figures)


if __name__ == "__main__":
    main()

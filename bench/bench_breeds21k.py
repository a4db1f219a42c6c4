"""BREEDS on ImageNet-21k: building every task of one level, and the hierarchy step alone (issue 40's figures).

    .venv/bin/python bench/bench_breeds21k.py [--levels 5 7] [--rounds 3] [--record bench/figures/breeds21k.json]

Per level, the spec ``level<L>@in21k`` (ImageNet-21k's classes, superclasses at level L with at least 4
subclasses, N = 4) and its ``-good``, ``-bad``, ``-nosplit`` variants are built by ``shiftbench build breeds``
in a fresh process and a fresh ``SHIFTBENCH_HOME`` each round ("cold": WordNet parsed from Debian's files, the
21k hierarchy calibrated, four versions staged, checked, published, their cards and Croissant files written),
then once more in the same home ("warm": the cached inputs read back). Wall time and the child's peak RSS
(``getrusage(RUSAGE_CHILDREN)``, reset by running each build from its own helper process). The hierarchy step
alone is :func:`shiftbench.breeds.imagenet21k.calibrated_hierarchy` in-process on the cached WordNet, without
its cache. Goals: the level's four tasks < 30 s and < 2 GiB; the hierarchy step < 5 s.
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
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)

VARIANTS = ("", "-good", "-bad", "-nosplit")


def _spec(directory: Path, level: int) -> Path:
    path = directory / "specs.yaml"
    path.write_text(
        f"family: breeds\nbenchmarks:\n  level{level}:\n    classes: in21k\n    level: {level}\n    n_subclasses: 4\n"
        "variants:\n  good: {split: good}\n  bad: {split: bad}\n  nosplit: {split: none}\n"
    )
    return path


def _build(home: Path, specs: Path, level: int) -> dict[str, Any]:
    """One CLI build of the level's four tasks in a child; its wall time, peak RSS and published count."""
    shiftbench = str(Path(sys.executable).parent / "shiftbench")
    args = [shiftbench, "build", "breeds"]
    for variant in VARIANTS:
        args += ["--benchmark", f"level{level}{variant}@in21k"]
    env = {**os.environ, "SHIFTBENCH_HOME": str(home), "SHIFTBENCH_BREEDS_SPECS": str(specs)}
    # A helper process runs the build, so RUSAGE_CHILDREN's maximum is this build's alone.
    probe = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter(); done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20\n"
        "print(json.dumps({'rc': done.returncode, 'wall_s': wall, 'peak_gib': rss, 'out': done.stdout[-600:],"
        " 'err': done.stderr[-600:]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"build failed: {result['err']}")
    published = [line for line in result["out"].splitlines() if "published in" in line]
    result["published"] = published[-1].strip() if published else ""
    superclasses = [line for line in result["out"].splitlines() if "superclasses" in line]
    result["superclasses"] = superclasses[0].split(",")[1].strip() if superclasses else ""
    del result["out"], result["err"]
    return result


def _hierarchy_step(home: Path) -> float:
    """The 21k hierarchy input built from the cached WordNet, its own cache left out."""
    from shiftbench.breeds import imagenet21k
    from shiftbench.config.settings import Settings
    from shiftbench.families.benchmark_builds import build_inputs
    from shiftbench.families.registry import family

    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home)})
    wordnet = build_inputs(settings, family("breeds"), ["sources/imagenet_hierarchy"])["sources/imagenet_hierarchy"]
    fresh = Settings.from_env({"SHIFTBENCH_HOME": tempfile.mkdtemp(dir=home)})  # an empty cache
    started = time.perf_counter()
    imagenet21k.calibrated_hierarchy(fresh, wordnet)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 7])
    parser.add_argument("--rounds", type=int, default=3)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels:
            specs = _spec(Path(tmp), level)
            cold, warm, peaks = [], [], []
            for round_ in range(args.rounds):
                home = Path(tmp) / f"home-{level}-{round_}"
                first = _build(home, specs, level)
                again = _build(home, specs, level)
                cold.append(first["wall_s"])
                warm.append(again["wall_s"])
                peaks.append(max(first["peak_gib"], again["peak_gib"]))
                recording.run(level=level, round=round_ + 1, cold=first, warm=again)
                print(
                    f"level {level} round {round_ + 1}: cold {first['wall_s']:.1f} s, warm {again['wall_s']:.1f} s, "
                    f"peak {first['peak_gib']:.2f} GiB, {first['superclasses']}; {first['published']}",
                    flush=True,
                )
            figures[f"level{level}.cold_s"] = records.median_figure(cold, "s", 1, f"level {level}: four tasks, cold")
            figures[f"level{level}.warm_s"] = records.median_figure(warm, "s", 1, f"level {level}: four tasks, warm")
            figures[f"level{level}.peak_gib"] = records.median_figure(peaks, "GiB", 2, f"level {level}: peak RSS")
        steps = [_hierarchy_step(Path(tmp) / f"home-{args.levels[0]}-0") for _ in range(args.rounds)]
        figures["hierarchy_s"] = records.median_figure(steps, "s", 2, "the 21k hierarchy step alone")
    for key, figure in figures.items():
        print(f"{key}: {figure['figure']} (median of {len(figure['runs'])}: {statistics.median(figure['runs']):.3f})")
    recording.save("BREEDS on ImageNet-21k: every task of one level (four variants), CLI end to end", figures)


if __name__ == "__main__":
    main()

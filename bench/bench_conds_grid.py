"""The ConDS grid's wall time: 34 sprites cases x seeds (x the preset's lr grid), packed vs one by one.

    .venv/bin/python bench/bench_conds_grid.py prepare DIR [--preset conds_controlled] [--seeds 0 1 2]
    python3 bench/bench_conds_grid.py run DIR --parallel 1 4 [--device cuda]      # torch + pyarrow only
    .venv/bin/python bench/bench_conds_grid.py cli [--cases 4] [--preset quick] [--parallel 2]
    ... run|cli ... --record bench/figures/conds_grid.json                         # also keep the runs

``prepare`` builds the 34 sprites cases here and writes, into DIR (about 26 MB: carry it to a GPU box),
each case's split tables, the images, and ``grid.json``: one resolved job per (case, seed). ``run`` trains
every job with the lean ``python -m shiftbench.erm.job``, K at a time for each K given, one process per
run, and reports the wall time, each K's speed-up over K = 1, and whether every run's metrics agree
between the Ks (exactly on CPU; on a GPU within the nondeterminism of its kernels). ``cli`` measures what
users run on this machine: ``shiftbench train CASES --seeds 0 --parallel K`` (Dagster runs, publishing)
against the same runs one by one with every core each, and one by one with the packed runs' threads
(same versions expected).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)

TEMPLATE = "images/{}.png"


def prepare(out: Path, preset: str, seeds: list[int], per_combination: int) -> None:
    import shutil

    import pyarrow.parquet as pq

    from shiftbench.config.settings import Settings
    from shiftbench.erm.launch import plan_run
    from shiftbench.pipelines.cli import main

    with tempfile.TemporaryDirectory() as home:
        os.environ.update({"SHIFTBENCH_HOME": home, "SHIFTBENCH_SPRITES_PER_COMBINATION": str(per_combination)})
        settings = Settings.from_env()
        cases = _sprites_cases(settings)
        assert main(["build", "conds", *[a for c in cases for a in ("--benchmark", c)]]) == 0
        jobs = []
        for case in cases:
            for seed in seeds:
                plan = plan_run(settings, case, preset=preset, seed=seed)
                split = out / "splits" / case
                split.mkdir(parents=True, exist_ok=True)
                for table in plan.split_dir.glob("*.parquet"):
                    shutil.copy2(table, split / table.name)
                for example_id in pq.read_table(split / "examples.parquet").column("example_id").to_pylist():
                    target = out / TEMPLATE.format(example_id)
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(plan.images.root / plan.images.template.format(example_id), target)
                jobs.append({"case": case, "seed": seed, "run": plan.run, "config": plan.config})
    (out / "grid.json").write_text(json.dumps({"preset": preset, "jobs": jobs}, indent=1), "utf-8")
    print(f"{len(jobs)} jobs over {len(cases)} cases in {out}")


def _sprites_cases(settings: Any) -> list[str]:
    from shiftbench.families import registry

    return [name for name in registry.family("conds").kind("case").specs(settings) if name.startswith("sprites-")]


def run(data: Path, parallels: list[int], device: str | None, limit: int | None, recording: records.Recording) -> None:
    grid = json.loads((data / "grid.json").read_text("utf-8"))
    jobs = grid["jobs"][:limit] if limit else grid["jobs"]
    results: dict[int, dict[str, Any]] = {}
    # On CPU every K runs with the threads of the most packed K: the bytes depend on the thread count.
    threads = max(1, (os.cpu_count() or 1) // max(parallels))
    for parallel in parallels:
        with tempfile.TemporaryDirectory() as scratch:
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=parallel) as pool:
                done = list(pool.map(_one, [(data, Path(scratch), job, device, threads) for job in jobs]))
            wall = time.perf_counter() - started
        results[parallel] = {"wall_s": wall, "runs": {d["run"]: d for d in done}}
        for d in done:
            recording.run(parallel=parallel, **d)
        failed = [d["run"] for d in done if d["exit_code"] != 0]
        print(json.dumps({"parallel": parallel, "runs": len(jobs), "wall_s": round(wall, 1), "failed": failed}))
    base = results[parallels[0]]
    figures: dict[str, dict[str, Any]] = {}
    for parallel, result in results.items():
        same = all(result["runs"][r]["metrics"] == base["runs"][r]["metrics"] for r in base["runs"])
        speedup = base["wall_s"] / result["wall_s"]
        print(json.dumps({"parallel": parallel, "speedup_over_first": round(speedup, 2), "same_metrics": same}))
        wall = result["wall_s"]
        at = f"{len(jobs)} runs, {parallel} at a time"
        figures[f"parallel={parallel}"] = {"what": at, "figure": f"{wall / 60:.1f} min", "value": wall}
        figures[f"parallel={parallel}.speedup"] = {
            "what": f"{at}, over {parallels[0]} at a time", "figure": f"{speedup:.2f}x", "value": speedup,
            "same_metrics": same,
        }  # fmt: skip
    accuracy = [d["metrics"].get("test/acc_avg") for d in base["runs"].values()]
    measured = [a for a in accuracy if a is not None]
    mean = sum(measured) / max(1, len(measured))
    print(json.dumps({"preset": grid["preset"], "mean_test_acc": mean}))
    figures["mean_test_acc"] = {"what": "mean test acc_avg", "figure": f"{mean:.3f}", "value": mean}
    recording.save(f"the ConDS grid ({grid['preset']}), one lean job process per run, K at a time", figures)


def _one(item: tuple[Path, Path, dict[str, Any], str | None, int]) -> dict[str, Any]:
    import pyarrow.parquet as pq

    data, scratch, job, device, threads = item
    config = dict(job["config"])
    if device:
        config["device"] = device
    if device == "cpu" or (device is None and not Path("/dev/nvidiactl").exists()):
        config["threads"] = threads
    out = scratch / job["run"]
    description = {"split_dir": str(data / "splits" / job["case"]), "image_root": str(data),
                   "path_template": TEMPLATE, "config": config, "out_dir": str(out)}  # fmt: skip
    out.mkdir(parents=True)
    (out / "job.json").write_text(json.dumps(description), "utf-8")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shiftbench.erm.job", str(out / "job.json")],
                          capture_output=True, text=True, cwd=PROJECT, check=False)  # fmt: skip
    metrics: dict[str, float] = {}
    if done.returncode == 0:
        table = pq.read_table(out / "metrics.parquet").to_pylist()
        metrics = {f"{r['eval_split']}/{r['metric']}": r["value"] for r in table if r["group"] is None}
    return {"run": job["run"], "exit_code": done.returncode, "seconds": time.perf_counter() - started,
            "metrics": metrics, "error": done.stderr.strip().splitlines()[-1:] if done.returncode else []}  # fmt: skip


def cli(cases: int, preset: str, parallel: int, sets: list[str], recording: records.Recording) -> None:
    """The CLI sweep on this machine: packed, one by one (all cores), one by one (the packed threads)."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SHIFTBENCH_HOME": home}
        shiftbench = [sys.executable, "-m", "shiftbench.pipelines.cli"]
        from shiftbench.config.settings import Settings

        os.environ["SHIFTBENCH_HOME"] = home
        names = _sprites_cases(Settings.from_env())[:cases]
        subprocess.run([*shiftbench, "build", "conds", *[a for c in names for a in ("--benchmark", c)]],
                       env=env, check=True, capture_output=True, cwd=PROJECT)  # fmt: skip
        extra = [a for item in sets for a in ("--set", item)]
        threads = max(1, (os.cpu_count() or 1) // parallel)
        rows = {}
        for label, options in (
            ("packed", ["--parallel", str(parallel)]),
            ("one_by_one_all_cores", ["--parallel", "1", "--set", f"threads={os.cpu_count()}"]),
            ("one_by_one_packed_threads", ["--parallel", "1", "--set", f"threads={threads}"]),
        ):
            started = time.perf_counter()
            command = [*shiftbench, "train", *names, "--seeds", "0", "--preset", preset, "--device", "cpu"]
            done = subprocess.run([*command, *extra, *options], env=env, capture_output=True, text=True, cwd=PROJECT)
            wall = time.perf_counter() - started
            versions = dict(re.findall(r"\] (\S+) version (\S+) \(", done.stdout))
            rows[label] = {"wall_s": round(wall, 1), "exit_code": done.returncode, "versions": versions}
            recording.run(mode=label, wall_s=wall, exit_code=done.returncode, versions=versions)
            print(json.dumps({"mode": label, "wall_s": round(wall, 1), "runs": len(versions)}), flush=True)
        same = rows["packed"]["versions"] == rows["one_by_one_packed_threads"]["versions"]
        speedup = rows["one_by_one_all_cores"]["wall_s"] / rows["packed"]["wall_s"]
        print(json.dumps({"cases": len(names), "preset": preset, "parallel": parallel, "threads_packed": threads,
                          "packed_over_one_by_one_all_cores": round(speedup, 2),
                          "same_versions_as_one_by_one_with_the_packed_threads": same}))  # fmt: skip
        figures = {
            "packed": records.median_figure([rows["packed"]["wall_s"]], "s", 1, f"packed, {parallel} at a time"),
            "one_by_one": records.median_figure([rows["one_by_one_all_cores"]["wall_s"]], "s", 1, "one by one"),
            "one_by_one_packed_threads": records.median_figure(
                [rows["one_by_one_packed_threads"]["wall_s"]], "s", 1, f"one by one, {threads} thread(s) each"
            ),
            "speedup": {"what": "packed vs one by one with every core", "figure": f"{speedup:.2f}x", "value": speedup},
            "same_versions": {"what": "packed and one by one with the packed threads", "figure": str(same)},
        }
        recording.save(
            f"{len(names)} sprites cases x seed 0 with {preset} through the CLI, packed vs one by one", figures
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--preset", default="conds_controlled")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--per-combination", type=int, default=100)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("--parallel", type=int, nargs="+", default=[1, 4])
    r.add_argument("--device")
    r.add_argument("--limit", type=int, help="only the first N jobs")
    c = sub.add_parser("cli")
    c.add_argument("--cases", type=int, default=4)
    c.add_argument("--preset", default="quick")
    c.add_argument("--parallel", type=int, default=2)
    c.add_argument("--set", action="append", default=[])
    for measuring in (r, c):
        records.add_argument(measuring)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.dir, args.preset, args.seeds, args.per_combination)
    elif args.command == "run":
        run(args.dir, args.parallel, args.device, args.limit, records.start(args.record))
    else:
        cli(args.cases, args.preset, args.parallel, args.set, records.start(args.record))


if __name__ == "__main__":
    main()

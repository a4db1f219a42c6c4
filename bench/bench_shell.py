"""The Dagster shell's cost on top of the library, measured side by side with an older checkout.

    python bench/bench_shell.py [--runs 3] [--before PATH] [--skip-backfill]

``--before`` is a checkout of an earlier commit (``git worktree add /tmp/before <commit>``); it runs
with this project's virtualenv and the same fixtures, so both columns share machine, data and
libraries. Measured, each as the median of ``--runs`` repetitions:

- ``import``: ``import shiftbench.pipelines.definitions`` in a fresh interpreter (what every run process and
  the CLI pay first).
- ``breeds_16`` / ``breeds_1``: ``shiftbench build breeds`` (the 16 benchmarks) and ``shiftbench build
  --benchmark living17``, both warm (everything built once before), as wall time of the command;
  with the number of Dagster runs each made.
- ``conds_cli`` / ``conds_library``: the 34 sprites cases in a fresh warehouse (images already
  generated, shared by every home) through the CLI, and through the library without Dagster
  (``shiftbench.families.benchmark_builds.build``; only the new checkout has it).
- ``backfill_68``: ``dagster dev`` (daemon, default run launcher and queue), then a backfill of the
  68 ConDS partitions (sprites and the CelebA fixture) launched over GraphQL, from launch until the
  backfill is done, with the number of runs it made.

Results go to ``bench/results/shell.json``; BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
FIXTURES = PROJECT.parent / "shared" / "fixtures"
PYTHON = sys.executable


def median_of(runs: int, fn: Callable[[], float]) -> dict[str, Any]:
    values = [fn() for _ in range(runs)]
    return {"median_s": round(statistics.median(values), 3), "runs_s": [round(v, 3) for v in values]}


class Checkout:
    def __init__(self, name: str, root: Path, work: Path, shared_cache: Path) -> None:
        self.name, self.root, self.work, self.shared_cache = name, root, work, shared_cache

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "DAGSTER_"))}
        base["PYTHONPATH"] = str(self.root)  # this checkout's packages before the installed ones
        return {
            **base,
            "SHIFTBENCH_HOME": str(home),
            "DAGSTER_HOME": str(home / "dagster_home"),
            "SHIFTBENCH_OFFLINE": "1",
            "SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(FIXTURES / "breeds" / "modified"),
            **extra,
        }

    def home(self, label: str) -> Path:
        """A fresh warehouse sharing the slow caches (WordNet through nltk, generated sprites)."""
        home = self.work / f"{self.name}-{label}-{time.monotonic_ns()}"
        (home / "cache").mkdir(parents=True)
        (home / "dagster_home").mkdir()
        (home / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
        for name in ("wordnet", "nltk_data", "sprites"):
            (self.shared_cache / name).mkdir(parents=True, exist_ok=True)
            (home / "cache" / name).symlink_to(self.shared_cache / name)
        return home

    def cli(self, env: dict[str, str], *args: str) -> float:
        started = time.perf_counter()
        proc = subprocess.run(
            [PYTHON, "-m", "shiftbench.pipelines.cli", *args], cwd=self.root, env=env, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: shiftbench {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        return elapsed

    def python(self, env: dict[str, str], code: str) -> str:
        proc = subprocess.run([PYTHON, "-c", code], cwd=self.root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: {proc.stderr[-3000:]}")
        return proc.stdout.strip()


def runs_count(checkout: Checkout, env: dict[str, str]) -> int:
    code = "import dagster as dg; print(dg.DagsterInstance.get().get_runs_count())"
    return int(checkout.python(env, code).splitlines()[-1])


def measure_import(checkout: Checkout, runs: int) -> dict[str, Any]:
    env = checkout.env(checkout.home("import"))
    code = (
        "import time; t = time.perf_counter(); import shiftbench.pipelines.definitions; print(time.perf_counter() - t)"
    )
    result = median_of(runs, lambda: float(checkout.python(env, code).splitlines()[-1]))
    torch = checkout.python(env, "import sys, shiftbench.pipelines.definitions; print('torch' in sys.modules)")
    return {**result, "imports_torch": torch.splitlines()[-1] == "True"}


def measure_breeds(checkout: Checkout, runs: int) -> dict[str, Any]:
    env = checkout.env(checkout.home("breeds"))
    cold = checkout.cli(env, "build", "breeds")
    before = runs_count(checkout, env)
    all16 = median_of(runs, lambda: checkout.cli(env, "build", "breeds"))
    runs16 = (runs_count(checkout, env) - before) / runs
    before = runs_count(checkout, env)
    one = median_of(runs, lambda: checkout.cli(env, "build", "--benchmark", "living17"))
    runs1 = (runs_count(checkout, env) - before) / runs
    return {
        "cold_16_s": round(cold, 3),
        "warm_16": {**all16, "dagster_runs": runs16},
        "warm_1": {**one, "dagster_runs": runs1},
        "ratio_16_over_1": round(all16["median_s"] / one["median_s"], 2),
    }


def measure_conds(checkout: Checkout, runs: int, library: bool) -> dict[str, Any]:
    checkout.cli(checkout.env(checkout.home("conds-warm")), "build", "conds", "--benchmark", "sprites-uniform")
    cli = median_of(runs, lambda: checkout.cli(checkout.env(checkout.home("conds")), "build", "conds"))
    result: dict[str, Any] = {"cli_34": cli}
    if library:
        code = (
            "import time; from shiftbench.config.settings import Settings\n"
            "from shiftbench.families import benchmark_builds, variants\n"
            "from shiftbench.conds.family import CASE, CONDS\n"
            "t = time.perf_counter(); s = Settings.from_env()\n"
            "targets = [(CASE, t) for t in variants.targets(s, CASE).values()]\n"
            "out = benchmark_builds.build(s, CONDS, targets); assert all(o.publication for o in out), len(out)\n"
            "print(time.perf_counter() - t)"
        )
        lib = median_of(
            runs, lambda: float(checkout.python(checkout.env(checkout.home("conds-lib")), code).splitlines()[-1])
        )
        result["library_34"] = lib
        result["ratio_cli_over_library"] = round(cli["median_s"] / lib["median_s"], 2)
    return result


def _graphql(port: int, query: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def measure_backfill(checkout: Checkout, partitions_of: str) -> dict[str, Any]:
    celeba = checkout.work / "celeba"
    celeba.mkdir(exist_ok=True)
    if not (celeba / "list_attr_celeba.txt").exists():
        shutil.copy(FIXTURES / "celeba" / "list_attr_celeba_first20000.txt", celeba / "list_attr_celeba.txt")
    home = checkout.home("backfill")
    env = checkout.env(home, SHIFTBENCH_CELEBA_DIR=str(celeba))
    # The inputs (attribute tables) first, as a user would have them: two cases through the CLI.
    checkout.cli(env, "build", "conds", "--benchmark", "sprites-uniform", "--benchmark", "celeba-uniform")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen(
        [PYTHON, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)],
        cwd=checkout.root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        names: list[str] = []
        deadline = time.monotonic() + 240
        key = json.dumps(["conds", partitions_of])
        query = f"{{ assetNodeOrError(assetKey: {{path: {key}}}) {{ ... on AssetNode {{ partitionKeys }} }} }}"
        while time.monotonic() < deadline and len(names) < 68:
            time.sleep(2)
            try:
                names = _graphql(port, query)["data"]["assetNodeOrError"]["partitionKeys"] or []
            except (OSError, KeyError, TypeError):
                continue
        if len(names) < 68:
            raise RuntimeError(f"{checkout.name}: only {len(names)} ConDS partitions after 240 s")
        before = runs_count(checkout, env)
        selection = '[{path: ["conds", "staged_case"]}, {path: ["conds", "case"]}]'
        mutation = (
            "mutation { launchPartitionBackfill(backfillParams: {assetSelection: " + selection
            + ", partitionNames: " + json.dumps(names) + "}) { __typename ... on LaunchBackfillSuccess { backfillId }"
            " ... on PythonError { message } } }"
        )  # fmt: skip
        started = time.perf_counter()
        launched = _graphql(port, mutation)["data"]["launchPartitionBackfill"]
        if "backfillId" not in launched:
            raise RuntimeError(f"{checkout.name}: {launched}")
        backfill = json.dumps(launched["backfillId"])
        status_query = (
            f"{{ partitionBackfillOrError(backfillId: {backfill}) {{ ... on PartitionBackfill {{ status }} }} }}"
        )
        status = "REQUESTED"
        while status not in {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}:
            time.sleep(1)
            status = _graphql(port, status_query)["data"]["partitionBackfillOrError"]["status"]
            if time.perf_counter() - started > 1800:
                raise RuntimeError(f"{checkout.name}: backfill not done after 30 minutes")
        elapsed = time.perf_counter() - started
        return {"wall_s": round(elapsed, 1), "status": status, "dagster_runs": runs_count(checkout, env) - before}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--skip-backfill", action="store_true")
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "shell.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shiftbench-bench-shell-"))
    shared = work / "shared-cache"
    checkouts = [Checkout("after", PROJECT, work, shared)]
    if args.before:
        checkouts.insert(0, Checkout("before", args.before.resolve(), work, shared))
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "runs": args.runs,
    }
    for checkout in checkouts:
        new = checkout.name == "after"
        print(f"[{checkout.name}] {checkout.root}", flush=True)
        part: dict[str, Any] = {"import": measure_import(checkout, args.runs)}
        print(f"  import {part['import']}", flush=True)
        part["breeds"] = measure_breeds(checkout, args.runs)
        print(f"  breeds {part['breeds']}", flush=True)
        part["conds"] = measure_conds(checkout, args.runs, library=new)
        print(f"  conds {part['conds']}", flush=True)
        if not args.skip_backfill:
            part["backfill_68"] = measure_backfill(checkout, "staged_case")
            print(f"  backfill {part['backfill_68']}", flush=True)
        results[checkout.name] = part
    shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

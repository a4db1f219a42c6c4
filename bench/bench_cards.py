"""What real defaults, shift magnitudes, cards and Croissant files cost, side by side with an older checkout.

    python bench/bench_cards.py --before PATH [--runs 3]

``--before`` is a checkout of the commit before (``git worktree add /tmp/before d0a534b``), which had
no shift_magnitudes table, no card, no Croissant file and needed the BREEDS files for the published
hierarchy. Each build runs the CLI end to end (Dagster run, contracts, publish, catalog) in a new
home, with this project's virtualenv and a warm WordNet and sprites cache (shared by symlink, as every
real home has them after its first build), alternating before/after, medians of ``--runs``:

- ``breeds``: ``shiftbench build breeds`` (16 benchmarks); before and after on the release's files
  (``SHIFTBENCH_BREEDS_HIERARCHY_DIR``), and after on the new default (WordNet + the shipped edits,
  checked against the release's content fingerprint): same versions.
- ``metashift``: ``shiftbench build metashift`` (2 collections, 7 tasks; after: the attribute collection
  from the shipped annotations, before: from the generated sample).
- ``conds``: ``shiftbench build conds`` (34 sprites cases).
- ``documents``: in-process, the time to write one version's card and Croissant file
  (``shiftbench.warehouse.cards.documents``), over every version of the last ``after`` home: median and max.

Results go to ``bench/results/cards.json``; BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
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
FIXTURES = PROJECT.parent / "shared" / "fixtures"
RELEASE = {"SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(FIXTURES / "breeds" / "modified")}
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "breeds_release_files": (["build", "breeds"], RELEASE),
    "breeds_default": (["build", "breeds"], {}),
    "metashift": (["build", "metashift"], {}),
    "conds": (["build", "conds"], {}),
}


def cli_build(checkout: Path, args: list[str], env_extra: dict[str, str], warm: Path) -> tuple[float, Path]:
    """One CLI build in a new home whose WordNet and sprites caches are the warm ones."""
    home = Path(tempfile.mkdtemp(prefix="bench-cards-"))
    (home / "cache").mkdir()
    for name in ("wordnet", "nltk_data", "sprites"):
        (warm / name).mkdir(parents=True, exist_ok=True)
        (home / "cache" / name).symlink_to(warm / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIFTBENCH_") and k != "DAGSTER_HOME"} | {
        "SHIFTBENCH_HOME": str(home),
        "SHIFTBENCH_OFFLINE": "1",
        "DAGSTER_HOME": str(home / "dagster_home"),
        "PYTHONPATH": str(checkout),
        **env_extra,
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "shiftbench.pipelines.cli", *args], cwd=checkout, env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return elapsed, home


def documents_cost(homes: list[Path]) -> dict[str, Any]:
    """Re-make every version's card and Croissant file in process, timing each."""
    sys.path.insert(0, str(PROJECT))
    import polars as pl

    from shiftbench.store import Store
    from shiftbench.warehouse import cards

    timings = []
    found = [(home, info) for home in homes for info in Store(home / "store").log.versions()]
    for home, info in found:
        staged = Store(home / "store").layout.staged(info.family, info.benchmark, info.version)
        manifest = staged.manifest()
        tables = {t: pl.read_parquet(staged.table_path(t)) for t in staged.tables}
        info_card = cards.CardInfo("bench", "what shifts", ("licence",), "citation")
        started = time.perf_counter()
        made = cards.documents(
            cards.Version(info.benchmark, info.version, manifest, tables, manifest["tables"], [], info_card)
        )
        timings.append(time.perf_counter() - started)
        assert set(made) == {"card.md", "croissant.json"}
    return {
        "versions": len(timings),
        "median_ms": round(1000 * statistics.median(timings), 2),
        "max_ms": round(1000 * max(timings), 2),
        "total_s": round(sum(timings), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    warm = Path(tempfile.mkdtemp(prefix="bench-cards-warm-"))
    cli_build(PROJECT, ["build", "breeds"], RELEASE, warm)  # fills the WordNet cache
    cli_build(PROJECT, ["build", "conds"], {}, warm)  # and the sprites
    results: dict[str, Any] = {}
    kept: dict[str, Path] = {}  # the last "after" home of each case, for the documents timing
    for case, (cli_args, env_extra) in CASES.items():
        sides = {"after": PROJECT} | ({"before": args.before} if case != "breeds_default" else {})
        runs: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.runs):
            for side, checkout in sides.items():
                elapsed, home = cli_build(checkout, cli_args, env_extra, warm)
                runs[side].append(round(elapsed, 2))
                if side == "after" and case != "breeds_release_files":
                    if case in kept:
                        shutil.rmtree(kept[case], ignore_errors=True)
                    kept[case] = home
                else:
                    shutil.rmtree(home, ignore_errors=True)
        results[case] = {side: {"median_s": statistics.median(v), "runs_s": v} for side, v in runs.items()}
        print(case, {side: r["median_s"] for side, r in results[case].items()}, flush=True)
    results["documents"] = documents_cost(list(kept.values()))
    print("documents", results["documents"])
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": f"python bench/bench_cards.py --before {args.before} --runs {args.runs}",
        "results": results,
    }
    target = PROJECT / "bench" / "results" / "cards.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

"""BREEDS benchmarks (speed, not correctness): results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_breeds.py [--runs 5] [--skip-fake-imagenet]

1. build_all: all 16 BREEDS variants, (a) through the CLI (Dagster jobs, as users run it) into
   a fresh home, (b) the library path alone (build tables, stage, check contracts, publish).
2. rebuild: the same CLI build again with unchanged inputs (no new version, no data written).
3. examples_1.33M: a fake ImageNet root (1000 class folders, 1,281,167 empty training files;
   names only, as the real listing never opens images): listing time, then building and
   writing one benchmark whose examples table holds all 1,331,167 images.

Each timing is the median of --runs runs (min and max shown too).
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
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from shiftbench.breeds.family import BENCHMARK, BREEDS, CALIBRATED, IMAGES  # noqa: E402
from shiftbench.breeds.specs import BreedsSpec  # noqa: E402
from shiftbench.config.settings import Settings  # noqa: E402
from shiftbench.families import benchmark_builds, variants  # noqa: E402
from shiftbench.sources.imagenet import imagenet_classes, list_train_images  # noqa: E402
from shiftbench.warehouse.publishing import stage_check_publish  # noqa: E402

BREEDS_FIXTURE = PROJECT.parent / "shared" / "fixtures" / "breeds" / "modified"
# ILSVRC-2012 has 732 to 1300 training images per class, 1,281,167 in all; spread them the same way.
TRAIN_IMAGES = 1_281_167


def timed(fn: Callable[[], Any], runs: int, setup: Callable[[], None] | None = None) -> dict[str, float]:
    times = []
    for _ in range(runs):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": runs}


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIFTBENCH_")}
    env.update({"SHIFTBENCH_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"), "SHIFTBENCH_OFFLINE": "1"})
    env.update(extra)
    return env


def cli_build(env: dict[str, str]) -> None:
    subprocess.run(
        [str(PROJECT / ".venv" / "bin" / "shiftbench"), "build", "breeds"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def share_wordnet_cache(home: Path, cache: Path) -> None:
    (home / "cache").mkdir(parents=True, exist_ok=True)
    for name in ("wordnet", "nltk_data"):
        (cache / name).mkdir(parents=True, exist_ok=True)
        link = home / "cache" / name
        if not link.exists():
            link.symlink_to(cache / name)


def make_fake_imagenet(root: Path) -> int:
    classes = imagenet_classes()["wnid"].to_list()
    base, extra = divmod(TRAIN_IMAGES, len(classes))
    total = 0
    for i, wnid in enumerate(classes):
        folder = root / "train" / wnid
        folder.mkdir(parents=True, exist_ok=True)
        count = base + (1 if i < extra else 0)
        for j in range(count):
            (folder / f"{wnid}_{j}.JPEG").touch()
        total += count
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-fake-imagenet", action="store_true")
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "breeds.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shiftbench-bench-"))
    cache = work / "shared-cache"
    hierarchy_env = {"SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(BREEDS_FIXTURE)} if BREEDS_FIXTURE.is_dir() else {}
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "hierarchy": "BREEDS fixture" if hierarchy_env else "WordNet default calibration",
    }

    # Warm the WordNet cache once (reading it through nltk takes ~10 s and is cached for good).
    warm = work / "warm"
    share_wordnet_cache(warm, cache)
    benchmark_builds.build_inputs(Settings.from_env(env_for(warm)), BREEDS, ["sources/imagenet_hierarchy"])

    counter = iter(range(10_000))
    homes: list[Path] = []

    def fresh_home() -> None:
        home = work / f"home{next(counter)}"
        share_wordnet_cache(home, cache)
        homes.append(home)

    results["build_all_cli"] = timed(lambda: cli_build(env_for(homes[-1], **hierarchy_env)), args.runs, fresh_home)
    last = homes[-1]
    results["rebuild_unchanged_cli"] = timed(lambda: cli_build(env_for(last, **hierarchy_env)), args.runs)
    files_before = sorted(p for p in (last / "store").rglob("*.parquet"))
    cli_build(env_for(last, **hierarchy_env))
    assert sorted(p for p in (last / "store").rglob("*.parquet")) == files_before

    def library_all() -> None:
        settings = Settings.from_env(env_for(homes[-1], **hierarchy_env))
        targets = [(BENCHMARK, t) for t in variants.targets(settings, BENCHMARK).values()]
        outcomes = benchmark_builds.build(settings, BREEDS, targets)
        assert all(o.publication is not None for o in outcomes)

    results["build_all_library"] = timed(library_all, args.runs, fresh_home)

    if not args.skip_fake_imagenet:
        fake = work / "imagenet"
        start = time.perf_counter()
        n_train = make_fake_imagenet(fake)
        results["fake_imagenet"] = {"train_files": n_train, "create_s": time.perf_counter() - start}
        wnids = imagenet_classes()["wnid"].to_list()
        results["list_train_1.28M"] = timed(lambda: list_train_images(fake, wnids), args.runs)

        def examples_all() -> None:
            # WordNet calibration reaches all 1000 classes: level 0 (the root), all classes, no split.
            settings = Settings.from_env(env_for(homes[-1], SHIFTBENCH_IMAGENET_DIR=str(fake)))
            inputs = benchmark_builds.build_inputs(settings, BREEDS)
            cal, im = inputs[CALIBRATED.name], inputs[IMAGES.name]
            spec = BreedsSpec(name="all1000", level=0, n_subclasses=1000, split="none", seed=0)
            import polars as pl

            from shiftbench.breeds.build import build_tables
            from shiftbench.breeds.calibrated import CalibratedHierarchy

            tables = build_tables(
                spec,
                CalibratedHierarchy.load(cal.path),
                pl.read_parquet(im.path / "images.parquet"),
                {"images": im.meta["kind"], "images_sha256": im.fingerprint},
            )
            assert tables["examples"].height == TRAIN_IMAGES + 50_000
            stage_check_publish(settings, "breeds", "all1000", tables, {})

        results["examples_1.33M_end_to_end"] = timed(examples_all, args.runs, fresh_home)
        shutil.rmtree(fake, ignore_errors=True)

    shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

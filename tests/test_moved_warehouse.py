"""A warehouse works after ``mv`` (issue 37, "Done when"). Built as scripts/main.sh builds it, small: a BREEDS
benchmark (the user's hierarchy files and spec, outside the warehouse), a MetaShift task on the generated scene
sample, a ConDS sprites case whose images are generated into the warehouse's cache, and a quick run on stand-in
images. Then ``mv`` to another folder, the old path made a file (nothing can be read or written there), and used
where it is now: ``sql``, ``check``, a partial Dagster selection (the case alone, its input from the build before
the move), ``export`` of the case (imagefolder, hf), ``train`` on its generated images, ``load_split`` and
``Split.evaluate``, and rebuilds that publish nothing new."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.store import Store

from .conftest import TEST_CACHE, TOY_CLASSES, toy_edges

BREEDS = "toy"  # level 1 of the toy hierarchy over twelve real ImageNet classes
CASE = "sc-moved"  # sprites-sc-object_color, 20 images per combination, 150 training examples
TASK = "dg-moved@generated"  # cat-dog-dg-cabinet-bed@generated, 40 training and 20 test images
FAST = {"max_iters": 4, "eval_every": 2}


def _user_files(folder: Path) -> dict[str, str]:
    """The BREEDS hierarchy and spec a user keeps outside the warehouse (they stay where they are)."""
    hierarchy = folder / "hierarchy"
    hierarchy.mkdir(parents=True)
    nodes = sorted({n for edge in toy_edges() for n in edge})
    (hierarchy / "class_hierarchy.txt").write_text("".join(f"{p} {c}\n" for p, c in toy_edges()))
    (hierarchy / "node_names.txt").write_text("".join(f"{n}\tname of {n}\n" for n in nodes))
    (hierarchy / "dataset_class_info.json").write_text(json.dumps([[i, w, w] for i, w in enumerate(TOY_CLASSES)]))
    specs = folder / "specs.yaml"
    specs.write_text(f"family: breeds\nbenchmarks:\n  {BREEDS}:\n    level: 1\n    n_subclasses: 4\n")
    return {"SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(hierarchy), "SHIFTBENCH_BREEDS_SPECS": str(specs)}


def _point_at(home: Path, user: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The CLI's environment as scripts/main.sh sets it, for the warehouse at ``home``."""
    for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
        monkeypatch.delenv(key)
    environment = {
        "SHIFTBENCH_HOME": str(home),
        "SHIFTBENCH_OFFLINE": "1",
        "SHIFTBENCH_SPRITES_PER_COMBINATION": "20",
        "DAGSTER_HOME": str(home / "dagster_home"),
        **user,
    }
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    return Settings.from_env()


def _build_before_the_move(settings: Settings) -> None:
    from shiftbench.erm import launch

    settings.cache_dir.mkdir(parents=True)  # WordNet's parse, shared with the other tests (content-addressed)
    for name in ("wordnet", "nltk_data"):
        (TEST_CACHE / name).mkdir(parents=True, exist_ok=True)
        (settings.cache_dir / name).symlink_to(TEST_CACHE / name)
    assert main(["build", "breeds", "--benchmark", BREEDS]) == 0
    small_task = ["--set", "train_size=40", "--set", "test_size=20", "--name", TASK]
    assert main(["build", "metashift", "--benchmark", "cat-dog-dg-cabinet-bed@generated", *small_task]) == 0
    small_case = ["--set", "train_size=150", "--name", CASE]
    assert main(["build", "conds", "--benchmark", "sprites-sc-object_color", *small_case]) == 0
    plan = launch.plan_run(settings, TASK, preset="smoke", overrides=FAST)  # generated scenes: stand-in images
    launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=lambda _: None)


def _published(home: Path) -> dict[str, list[str]]:
    """Every benchmark's published versions, oldest first."""
    found: dict[str, list[str]] = {}
    for info in Store(home / "store").log.versions():
        found.setdefault(info.benchmark, []).append(info.version)
    return found


def _materialize_the_case_alone(settings: Settings) -> list[str]:
    """The case's staged and publish assets only, one partition, on the warehouse's own Dagster instance: the
    attribute tables are read from their materialization recorded before the move."""
    import dagster as dg

    from shiftbench.families import registry
    from shiftbench.pipelines.cli import dagster_instance
    from shiftbench.pipelines.definitions import build_definitions

    kind = registry.family("conds").kind("case")
    instance = dagster_instance(settings)
    job = build_definitions().resolve_job_def(kind.qualified)
    try:
        result = job.execute_in_process(
            instance=instance,
            tags={"dagster/asset_partition_range_start": CASE, "dagster/asset_partition_range_end": CASE},
            run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
            asset_selection=[dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))],
            raise_on_error=False,
        )
        assert result.success, _errors(result)
        events = result.get_asset_materialization_events()
        return sorted(e.asset_key.to_user_string() for e in events if e.asset_key is not None)
    finally:
        instance.dispose()


def _errors(result: Any) -> list[str]:
    """What made the run's steps fail: each error's cause (the line a user reads), else the error."""
    errors = [event.event_specific_data.error for event in result.all_events if event.is_step_failure]
    return [str((error.cause or error).message) for error in errors]


@pytest.mark.slow
def test_a_moved_warehouse_works_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    user = _user_files(tmp_path / "user")
    old = tmp_path / "project" / "warehouse"
    _build_before_the_move(_point_at(old, user, monkeypatch))
    published = _published(old)
    assert {BREEDS, TASK, CASE} < set(published) and len(published) == 4, published  # and the stand-in run
    sprites = list((old / "cache" / "sprites").iterdir())
    assert sprites and not any(p.is_symlink() for p in sprites)  # the case's images are in the warehouse

    new = tmp_path / "elsewhere" / "moved"
    new.parent.mkdir()
    subprocess.run(["mv", str(old), str(new)], check=True)
    old.write_text("moved away: nothing may read or write here\n")
    settings = _point_at(new, user, monkeypatch)
    capsys.readouterr()

    assert main(["sql", f"SELECT count(*) AS n_case FROM examples WHERE benchmark = '{CASE}'", "--csv"]) == 0
    n_examples = pl.read_parquet(next(new.glob(f"store/conds/{CASE}/versions/*/examples.parquet"))).height
    assert capsys.readouterr().out.split() == ["n_case", str(n_examples)]
    assert main(["check"]) == 0, capsys.readouterr()

    # A partial selection: the case alone, its input read from the materialization recorded before the move.
    assert _materialize_the_case_alone(settings) == ["conds/case", "conds/staged_case"]

    for layout in ("imagefolder", "hf"):
        assert main(["export", CASE, str(tmp_path / layout), "--layout", layout]) == 0, capsys.readouterr()
    assert len(list((tmp_path / "imagefolder").rglob("*.png"))) == n_examples
    hf = pl.concat([pl.read_parquet(p) for p in (tmp_path / "hf" / "data").glob("*.parquet")])
    assert hf.height == n_examples

    fast = [item for key, value in FAST.items() for item in ("--set", f"{key}={value}")]
    assert main(["train", CASE, "--preset", "smoke", *fast]) == 0, capsys.readouterr()
    assert f"images sprites ({new}/cache/sprites/" in capsys.readouterr().out

    import shiftbench

    split = shiftbench.load_split(CASE, home=new)
    test = split.examples.filter(pl.col("split") == "test")
    metrics = split.evaluate(np.zeros(test.height, dtype=np.int64), "test")
    assert metrics.filter(pl.col("metric") == "acc_avg").height == 1
    image, _, _ = split.dataset("test")[0]
    assert tuple(image.shape) == (3, 64, 64)

    before = _published(new)
    for family, benchmark in (("breeds", BREEDS), ("conds", CASE)):
        assert main(["build", family, "--benchmark", benchmark]) == 0, capsys.readouterr()
    assert _published(new) == before
    assert old.read_text().startswith("moved away")  # nothing wrote at the old path


def test_image_roots_inside_the_warehouse_are_recorded_relative_to_it_and_older_ones_still_resolve(
    tmp_path: Path,
) -> None:
    """A root inside the warehouse is relative to it, one outside absolute; an older manifest's absolute root is
    read as written while it exists, and at the same place in this warehouse's cache once it is gone."""
    from shiftbench.splits.images import image_block, resolve_images

    built, moved = tmp_path / "built", tmp_path / "moved"
    inside = image_block("sprites", "images/{}.png", built / "cache" / "sprites" / "k", home=built)
    assert inside == {
        "source": "sprites", "template": "images/{}.png", "root": "cache/sprites/k", "root_setting": None,
        "root_base": "home",
    }  # fmt: skip
    outside = image_block("celeba", "img_align_celeba/{}", tmp_path / "celeba", "celeba_dir", home=built)
    assert outside["root"] == str(tmp_path / "celeba") and "root_base" not in outside
    older = {**inside, "root": str(built / "cache" / "sprites" / "k")}  # written before roots were relative
    del older["root_base"]
    here = Settings.from_env({"SHIFTBENCH_HOME": str(moved)})
    assert resolve_images(here, {"images": inside}).root == moved / "cache" / "sprites" / "k"
    assert resolve_images(here, {"images": outside}).root == tmp_path / "celeba"
    assert resolve_images(here, {"images": older}).root == built / "cache" / "sprites" / "k"  # as written
    (moved / "cache" / "sprites" / "k").mkdir(parents=True)  # the warehouse moved: the same folder, here
    assert resolve_images(here, {"images": older}).root == moved / "cache" / "sprites" / "k"
    (built / "cache" / "sprites" / "k").mkdir(parents=True)  # still there (a copy): read as written
    assert resolve_images(here, {"images": older}).root == built / "cache" / "sprites" / "k"


def test_a_cache_record_is_found_in_the_warehouse_where_it_is_now(tmp_path: Path) -> None:
    """Relative records resolve in this warehouse; an older absolute record that is gone is found at the same
    place in this warehouse's cache; one that still exists, or has no copy here, is kept as recorded."""
    from shiftbench.runtime.cache import find_cached, home_record

    built, home = tmp_path / "built", tmp_path / "moved"
    artifact = home / "cache" / "conds_attributes" / "abc"
    artifact.mkdir(parents=True)
    assert home_record(artifact, home) == "cache/conds_attributes/abc"
    assert home_record(tmp_path / "user" / "table.csv", home) == str(tmp_path / "user" / "table.csv")
    assert find_cached("cache/conds_attributes/abc", home, home / "cache") == artifact
    gone = built / "cache" / "conds_attributes" / "abc"
    assert find_cached(str(gone), home, home / "cache") == artifact
    assert (
        find_cached(str(built / "cache" / "sprites" / "k"), home, home / "cache") == built / "cache" / "sprites" / "k"
    )
    gone.mkdir(parents=True)
    assert find_cached(str(gone), home, home / "cache") == gone

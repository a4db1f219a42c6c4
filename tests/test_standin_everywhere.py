"""One result of each kind on images that are not a dataset's real ones, looked for everywhere results appear.

A warehouse with the ConDS case ``sprites-uniform`` (its own images: generated sprites) and the MetaShift task
``dg-small@generated`` (the generated scene sample: no images but stand-ins). On it: an ERM run on the sprites and
one on stand-ins, both trained through the CLI's Dagster run (the UI's partitions), and predictions scored with
``shiftbench eval`` on each split. Every surface must keep them apart and say whose images each is on
(shiftbench/scoring/provenance.py): the default leaderboard (stand-ins left out, said so), ``--include-standin`` (there,
labelled), the catalog's views, the runs' Dagster metadata and tags, the cards, the analyses, and the words the main
job prints around its leaderboard (scripts/main.sh, run here line by line).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.families import analysis, registry
from shiftbench.families.registry import analyses
from shiftbench.pipelines.cli import main
from shiftbench.scoring import provenance
from shiftbench.splits import published as splits
from shiftbench.store import Store

from .conftest import PROJECT, publish_all, small_sprites_home

CASE = "sprites-uniform"
SC = "sprites-sc-object_color"  # its id_val lacks many of the 81 cells (no counterexamples there)
TASK = "dg-small@generated"  # cat-dog-dg-cabinet-bed@generated, 40 training and 20 test images
FAST = ["--preset", "smoke", "--set", "max_iters=2", "--set", "eval_every=2", "--in-process"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("everywhere")
    home = root / "home"
    settings = small_sprites_home(home, CASE, SC)  # a copy of the run's build of the two cases
    task = registry.family("metashift").kind("task")
    registry.register_variant(
        settings, task, TASK, "cat-dog-dg-cabinet-bed@generated", {"train_size": 40, "test_size": 20}
    )
    publish_all(settings, "metashift/task", [TASK])
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            if key.startswith("SHIFTBENCH_"):
                patch.delenv(key)
        patch.setenv("SHIFTBENCH_HOME", str(home))
        patch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "40")
        patch.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        # Trained through the CLI's Dagster run: seed 0 on the sprites, seed 1 on stand-ins (two partitions).
        assert main(["train", CASE, "--seed", "0", *FAST]) == 0
        assert main(["train", CASE, "--seed", "1", "--image-root", "standin", *FAST]) == 0
        for benchmark in (CASE, TASK):  # an oracle's predictions, scored on each split
            examples = splits.published_split(settings, benchmark).examples
            path = root / f"{benchmark}.parquet"
            examples.select("example_id", pl.col("y").alias("y_pred")).write_parquet(path)
            assert main(["eval", benchmark, str(path), "--method", "oracle"]) == 0
        yield settings


@pytest.fixture
def cli(warehouse: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("DAGSTER_HOME", str(warehouse.home.parent / "dagster_home"))
    return warehouse


def _query(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        return con.execute(sql).fetchall()


def _rows(out: str) -> list[list[str]]:
    """A text leaderboard's rows, split on whitespace (the empty setting of scored predictions collapses)."""
    return [line.split() for line in out.split("\n\n")[0].splitlines()]


def _labelled(out: str) -> set[tuple[str, str, str]]:
    """(benchmark, method, images) of every row of a text leaderboard."""
    return {(r[0], r[1], next(x for x in r if x in provenance.IMAGES)) for r in _rows(out)[1:]}


def test_the_default_leaderboard_leaves_standins_out_and_says_so(
    cli: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["leaderboard"]) == 0
    captured = capsys.readouterr()
    assert _rows(captured.out)[0] == [
        "benchmark", "method", "setting", "selection", "grouping", "images", "test/acc_avg", "test/acc_wg",
    ]  # fmt: skip
    assert _labelled(captured.out) == {(CASE, "erm", "generated"), (CASE, "oracle", "generated")}
    assert TASK not in captured.out and "standin" not in captured.out and "real" not in captured.out.split()
    assert captured.out.splitlines()[-1].startswith("images 'generated': the split's own images are generated")
    # Two rows left out: the stand-in run, and the oracle on the task whose only images are stand-ins.
    assert captured.err.strip() == "2 row(s) on stand-in images left out: --include-standin shows them, labelled"


def test_include_standin_shows_them_labelled(cli: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["leaderboard", "--include-standin"]) == 0
    captured = capsys.readouterr()
    assert _labelled(captured.out) == {
        (CASE, "erm", "generated"),
        (CASE, "erm", "standin"),
        (CASE, "oracle", "generated"),
        (TASK, "oracle", "standin"),
    }
    legends = captured.out.split("\n\n")[1].splitlines()
    assert [line.split(":")[0] for line in legends] == ["images 'generated'", "images 'standin'"]
    assert "say nothing about the real images" in legends[1] and captured.err == ""


def test_the_catalog_views_label_every_result(cli: Settings) -> None:
    results = _query(cli, "SELECT DISTINCT benchmark, method, image_source, images, data_tag FROM results ORDER BY ALL")
    assert results == [
        (TASK, "oracle", "standin", "standin", "generated"),  # scored on the split's stand-ins: eval_runs says so
        (CASE, "erm", "sprites", "generated", None),
        (CASE, "erm", "standin", "standin", None),
        (CASE, "oracle", "sprites", "generated", None),
    ]
    board = "SELECT DISTINCT benchmark, images FROM {} ORDER BY ALL"
    assert _query(cli, board.format("leaderboard")) == [(CASE, "generated")]
    assert _query(cli, board.format("leaderboard_with_standins")) == [
        (TASK, "standin"),
        (CASE, "generated"),
        (CASE, "standin"),
    ]
    assert _query(cli, "SELECT run, image_source FROM eval_runs ORDER BY 1") == [
        (f"{TASK}.oracle.seed0", "standin"),
        (f"{CASE}.oracle.seed0", "sprites"),
    ]
    # The catalog's macro and the library's rule say the same for every image source and tag.
    sources = [None, "", "imagenet", "gqa", "celeba", "sprites", "user", "standin", "unrecorded"]
    pairs = list(itertools.product(sources, [None, "generated", "partial"]))
    values = ", ".join(f"({'NULL' if s is None else repr(s)}, {'NULL' if t is None else repr(t)})" for s, t in pairs)
    got = _query(cli, f"SELECT s, t, shiftbench_images(s, t) FROM (VALUES {values}) AS v(s, t)")
    assert got == [(s, t, provenance.images_of(s, t)) for s, t in pairs]


def test_the_runs_ui_metadata_tags_and_cards_say_whose_images(cli: Settings) -> None:
    import dagster as dg

    from shiftbench.assets.erm import IMAGES_TAG, baseline_keys
    from shiftbench.pipelines.cli.common import dagster_instance

    kind = registry.family("conds").kind("case")
    staged_key, publish_key = baseline_keys(kind)
    instance = dagster_instance(cli)
    seen = {}
    for seed, images in (("0", "generated"), ("1", "standin")):
        partition = dg.MultiPartitionKey({"benchmark": CASE, "seed": seed})
        for key in (staged_key, publish_key):
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
            ).records
            materialization = records[0].event_log_entry.asset_materialization
            assert materialization is not None
            metadata = {k: v.value for k, v in materialization.metadata.items()}
            assert next(iter(metadata)) == "images"  # the first thing the UI lists
            assert metadata["images"] == f"{images}: {provenance.MEANINGS[images]}"
            assert (materialization.tags or {}).get(IMAGES_TAG) == images
        seen[images] = metadata
    assert seen["standin"]["image_source"] == "standin" and seen["generated"]["image_source"] == "sprites"
    assert seen["generated"]["grouping"] == "acc_wg over the split's own groups"

    store = Store(cli.store_dir)
    cards = {}
    for run, family in [(str(seen[i]["run"]), "erm") for i in seen] + [(f"{TASK}.oracle.seed0", "eval")]:
        latest = store.log.latest(run)
        assert latest is not None
        cards[run] = (store.layout.staged(family, run, latest.version).path / "files" / "card.md").read_text()
    generated, standin, scored = cards.values()
    assert "(generated images)" in generated.splitlines()[2] and "stand-in" not in generated
    assert "(stand-in images)" in standin.splitlines()[2] and "not the split's own images" in standin
    assert "(stand-in images)" in scored.splitlines()[2] and "whose only images are generated stand-in" in scored
    assert "acc_wg) is over the split's own groups" in scored


def test_the_analyses_label_them(cli: Settings) -> None:
    shifts = analysis.compute(cli, analyses()["conds-accuracy-by-shift"])
    assert sorted(set(shifts.select("method", "image_source").rows())) == [
        ("erm", "sprites"),
        ("erm", "standin"),
        ("oracle", "sprites"),
    ]
    note = analysis.provenance(shifts)
    assert "learners marked [stand-in images]" in note and "generated images (the ConDS sprites)" in note
    distance = analysis.compute(cli, analyses()["metashift-accuracy-vs-distance"])
    assert distance.select("task", "method", "image_source").unique().rows() == [(TASK, "oracle", "standin")]
    assert analysis.provenance(distance).startswith("stand-in images only")


def _main_job_leaderboard(script: Path) -> list[tuple[str, list[str]]]:
    """The header the main job echoes before each leaderboard command, and the command's arguments."""
    lines = script.read_text("utf-8").splitlines()
    found = []
    for index, line in enumerate(lines):
        if line.startswith(".venv/bin/shiftbench leaderboard"):
            header = re.fullmatch(r'echo "(.*)"', lines[index - 1])
            assert header is not None, lines[index - 1]
            found.append((header.group(1), shlex.split(line)[1:]))
    return found


def test_the_main_job_never_calls_generated_or_standin_results_real(
    cli: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """scripts/main.sh's leaderboard lines, run on this warehouse: the header and the command's own legend."""
    board = _main_job_leaderboard(PROJECT / "scripts" / "main.sh")
    assert [args.count("--include-standin") for _, args in board] == [0, 1]
    for header, args in board:
        assert args[0] == "leaderboard" and main(args) == 0
        out = capsys.readouterr().out
        assert "real" not in header  # every row here is on generated images or stand-ins, and says so
        assert {images for _, _, images in _labelled(out)} <= {"generated", "standin"} and "'real'" not in out
        assert "column images" in header or "images standin" in header
        legends = out.split("\n\n")[1]
        assert "images 'generated': the split's own images are generated" in legends
        assert ("images 'standin'" in legends) == ("--include-standin" in args)


def test_the_training_summary_explains_an_empty_worst_group(cli: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """The printed acc_wg says over how many groups it was computed where some have no example (the spurious case's
    id_val lacks many of its cells); the run's Dagster metadata holds the same words."""
    import dagster as dg

    from shiftbench.assets.erm import baseline_keys
    from shiftbench.pipelines.cli.common import dagster_instance

    examples = splits.published_split(cli, SC).examples
    present = examples.filter(pl.col("split") == "id_val")["group"].n_unique()
    groups = examples["group"].n_unique()
    assert 0 < present < groups
    assert main(["train", SC, "--seed", "0", *FAST]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("id_val/acc_wg"))
    note = re.fullmatch(r"\s*id_val/acc_wg\s+[01]\.\d{4} \((.*)\)", line)
    assert note is not None, line
    assert note.group(1).startswith(f"worst of {present} groups with examples, ")
    assert note.group(1).endswith(f"; {groups - present} of {groups} have none in id_val")
    _, publish_key = baseline_keys(registry.family("conds").kind("case"))
    partition = dg.MultiPartitionKey({"benchmark": SC, "seed": "0"})
    records = (
        dagster_instance(cli)
        .fetch_materializations(dg.AssetRecordsFilter(asset_key=publish_key, asset_partitions=[partition]), limit=1)
        .records
    )
    materialization = records[0].event_log_entry.asset_materialization
    assert materialization is not None and materialization.metadata["worst_group/id_val"].value == note.group(1)


def test_scores_of_unrecorded_images_are_labelled_and_left_out(
    cli: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scoring whose split records no image source (as every scoring did before eval_runs.image_source) is
    ``unrecorded``: never in the default leaderboard, said so, labelled with --include-standin (in a copy of the
    warehouse: the other tests count its rows)."""
    import shiftbench.results.scored_predictions as scored

    home = tmp_path / "home"
    shutil.copytree(cli.home, home, symlinks=True)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    monkeypatch.setattr(scored, "split_image_source", lambda manifest: None)
    examples = splits.published_split(cli, CASE).examples
    examples.select("example_id", pl.lit(0).alias("y_pred")).write_parquet(tmp_path / "zeros.parquet")
    assert main(["eval", CASE, str(tmp_path / "zeros.parquet"), "--method", "zeros"]) == 0
    assert "  images unrecorded: no image source recorded" in capsys.readouterr().out
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home)})
    query = "SELECT DISTINCT image_source, images FROM results WHERE method = 'zeros'"
    assert _query(settings, query) == [("unrecorded", "unrecorded")]
    assert main(["leaderboard"]) == 0
    captured = capsys.readouterr()
    assert " zeros " not in captured.out
    assert captured.err.strip() == (
        "3 row(s) left out (2 on stand-in images, 1 of unrecorded images): --include-standin shows them, labelled"
    )
    assert main(["leaderboard", "--include-standin"]) == 0
    out = capsys.readouterr().out
    assert (CASE, "zeros", "unrecorded") in _labelled(out) and "images 'unrecorded': no image source recorded" in out

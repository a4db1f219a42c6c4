"""The papers' analyses: each query against hand-computed values on a small catalog, then the ConDS
analysis end to end (scored predictions -> `shiftbench analyse` -> a published, checked version with its
plot and view) and through its Dagster asset, whose materialization carries the plot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest
from shiftbench.pipelines.cli import main

from shiftbench.breeds.figures import source_vs_target
from shiftbench.conds.figures import conds_grid_vs_paper
from shiftbench.metashift.figures import accuracy_vs_distance, subpopulation_table
from shiftbench.registry import analyses
from shiftbench.settings import Settings
from shiftbench.store import Store

CASES = ("sprites-uniform", "sprites-sc-object_color")
PNG = b"\x89PNG\r\n\x1a\n"


def _run(query: str, tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    con = duckdb.connect()
    for name, frame in tables.items():
        con.register(name, frame.to_arrow())
    return con.sql(query).pl()


def _board(
    rows: list[tuple[str, str, str | None, str, int, float, float | None]], image_source: str = "sprites"
) -> pl.DataFrame:
    """Rows of ``leaderboard_with_standins`` (what the analyses read); scored predictions have no setting (their
    split's own grouping) and carry the split's image source; ``data_tag`` is the name's @TAG, as the view computes
    it."""
    return pl.DataFrame(
        [
            {"benchmark": b, "data_tag": b.split("@")[1] if "@" in b else None, "split_version": "v1", "method": m,
             "setting": s, "image_source": image_source, "eval_split": e,
             "metric": "acc_avg", "n_seeds": n, "mean": mean, "std": std}
            for b, m, s, e, n, mean, std in rows
        ],
        schema_overrides={"setting": pl.String, "std": pl.Float64, "data_tag": pl.String},
    )  # fmt: skip


def test_metashift_accuracy_vs_distance_joins_each_task_with_its_distance() -> None:
    tasks = pl.DataFrame(
        {
            "benchmark": ["cat-dog-a", "cat-dog-b"], "version": ["v1", "v1"], "task_kind": ["dg", "dg"],
            "classes": [["cat", "dog"], ["cat", "dog"]], "distance_class": ["dog", "dog"], "distance": [0.4, 0.9],
            "paper_distance": [0.44, None],
        }
    )  # fmt: skip
    board = _board(
        [
            ("cat-dog-a", "erm", "domainbed.resnet18", "test", 3, 0.8, 0.01),
            ("cat-dog-a", "erm", "domainbed.resnet18", "id_val", 3, 0.95, 0.01),  # not OOD: left out
            ("cat-dog-b", "erm", "domainbed.resnet18", "test", 3, 0.6, 0.02),
            ("cat-dog-b", "mine", None, "test", 1, 0.7, None),
            ("other", "erm", "x", "test", 1, 0.1, None),  # not a MetaShift task
        ]
    )
    tables = {"leaderboard_with_standins": board, "metashift_tasks": tasks}
    got = _run(analyses()["metashift-accuracy-vs-distance"].sql(), tables)
    assert got.select("task", "distance", "method", "setting", "acc_mean").rows() == [
        ("cat-dog-a", 0.4, "erm", "domainbed.resnet18", 0.8),
        ("cat-dog-b", 0.9, "erm", "domainbed.resnet18", 0.6),
        ("cat-dog-b", 0.9, "mine", "", 0.7),
    ]
    assert set(got["classes"]) == {"cat,dog"}
    assert accuracy_vs_distance(got, "t")[:8] == PNG


def test_breeds_source_vs_target_prefers_id_test_and_divides() -> None:
    benchmarks = pl.DataFrame({"benchmark": ["living17", "entity13", "sprites"], "family": ["breeds"] * 2 + ["conds"]})
    board = _board(
        [
            ("living17", "erm", "breeds.resnet18", "id_val", 2, 0.9, 0.0),
            ("living17", "erm", "breeds.resnet18", "id_test", 2, 0.8, 0.0),
            ("living17", "erm", "breeds.resnet18", "test", 2, 0.4, 0.0),
            ("entity13", "groupdro", "s", "id_val", 1, 0.5, None),
            ("entity13", "groupdro", "s", "test", 1, 0.45, None),
            ("sprites", "erm", "s", "id_val", 1, 0.9, None),
            ("sprites", "erm", "s", "test", 1, 0.3, None),
        ]
    )
    bounds = _board([("living17", "erm", "breeds.resnet18", "test", 2, v, 0.0) for v in (0.45, 0.56, 0.3, 0.9)])
    metrics = [
        "acc_relative_low:id_test",
        "acc_relative_high:id_test",
        "acc_relative_low:id_val",
        "acc_relative_high:id_val",
    ]
    board = pl.concat([board, bounds.with_columns(metric=pl.Series(metrics))])
    tables = {"leaderboard_with_standins": board, "benchmarks": benchmarks}
    got = _run(analyses()["breeds-source-vs-target"].sql(), tables)
    rows = {r["task"]: r for r in got.iter_rows(named=True)}
    assert set(rows) == {"living17", "entity13"}
    assert rows["living17"]["source_split"] == "id_test" and rows["living17"]["relative_acc"] == pytest.approx(0.5)
    assert rows["entity13"]["source_split"] == "id_val" and rows["entity13"]["relative_acc"] == pytest.approx(0.9)
    # The interval of the source split the ratio used (id_test's, not id_val's); none where the runs measured none.
    assert (rows["living17"]["relative_low"], rows["living17"]["relative_high"]) == (0.45, 0.56)
    assert rows["entity13"]["relative_low"] is None
    assert source_vs_target(got, "t")[:8] == PNG


def test_the_conds_grid_matches_learners_to_the_paper_s_rows_and_averages_cases() -> None:
    """A ResNet-18 trained from scratch without augmentation is the paper's ResNet18 row (controlled column:
    sprites); a case counts once (its mean over seeds); the breakdowns by shift count and SC are means over
    the cases they name; scored predictions get no paper row; the paper's rows not run here are listed for
    the categories with results only."""
    cases = pl.DataFrame(
        {"benchmark": ["u", "sc", "sc-ldd", "ldd"], "version": ["v1"] * 4, "dataset": ["sprites"] * 4,
         "shift_kind": ["uniform", "sc", "sc+ldd", "ldd"]}
    )  # fmt: skip
    board = _board(
        [
            ("u", "erm", "conds_controlled.resnet18", "test", 3, 0.9, 0.01),
            ("sc", "erm", "conds_controlled.resnet18", "test", 3, 0.4, 0.01),
            ("sc-ldd", "erm", "conds_controlled.resnet18", "test", 3, 0.3, 0.01),
            ("ldd", "erm", "conds_controlled.resnet18", "test", 2, 0.8, 0.01),
            ("ldd", "erm", "conds_controlled.resnet18", "id_val", 2, 0.99, 0.01),
            ("u", "mine", None, "test", 1, 0.5, None),
        ]
    )
    runs = pl.DataFrame(
        {"benchmark": ["u", "sc"], "run": ["u.conds_controlled.resnet18.seed0", "sc.conds_controlled.resnet18.seed2"],
         "family": ["conds"] * 2, "method": ["erm"] * 2, "model": ["resnet18"] * 2, "image_source": ["sprites"] * 2,
         "config": ['{"augment": "none", "init_checkpoint": null}'] * 2}
    )  # fmt: skip
    tables = {"leaderboard_with_standins": board, "conds_cases": cases, "erm_runs": runs}
    got = _run(analyses()["conds-grid-vs-paper"].sql(), tables)
    rows = {(r["method"], r["paper_row"]): r for r in got.iter_rows(named=True)}
    ours = rows[("erm", "ResNet18")]
    assert (ours["dataset"], ours["category"], ours["setting"]) == (
        "sprites",
        "controlled",
        "conds_controlled.resnet18",
    )
    assert ours["n_cases"] == 4 and ours["n_seeds_min"] == 2
    assert ours["acc_mean"] == pytest.approx((0.9 + 0.4 + 0.3 + 0.8) / 4)
    assert ours["paper_acc"] == pytest.approx(0.6243)
    assert ours["acc_minus_paper"] == pytest.approx(0.6 - 0.6243)
    assert (ours["acc_0_shifts"], ours["acc_2_shifts"], ours["acc_3_shifts"]) == (0.9, 0.3, None)
    assert ours["acc_1_shift"] == pytest.approx(0.6)  # sc and ldd
    assert ours["acc_with_sc"] == pytest.approx(0.35) and ours["acc_without_sc"] == pytest.approx(0.8)
    scored = rows[("mine", "")]
    assert scored["paper_acc"] is None and scored["model"] is None and scored["acc_mean"] == 0.5
    paper_only = {key[1] for key, r in rows.items() if r["n_cases"] == 0}
    assert "AugMix" in paper_only and "ResNet18, pre-trained" in paper_only and "ResNet18" not in paper_only
    assert {r["category"] for r in rows.values()} == {"controlled"}
    assert conds_grid_vs_paper(got, "t")[:8] == PNG


@pytest.mark.slow
def test_conds_analysis_from_scored_predictions_through_the_cli_and_dagster(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = cli_env()
    for case in CASES:
        assert main(["build", "conds", "--benchmark", case]) == 0
    assert main(["analyse", "conds-accuracy-by-shift"]) == 0
    assert "no results yet" in capsys.readouterr().out
    expected: dict[tuple[str, str], list[float]] = {}
    store = Store(settings.store_dir)
    for case in CASES:
        latest = store.log.latest(case)
        assert latest is not None
        examples = pl.read_parquet(store.layout.staged("conds", case, latest.version).path / "examples.parquet")
        for seed in (0, 1):
            # Right on every test example whose position is a multiple of (seed + 2): a known accuracy per seed.
            rows = np.arange(examples.height)
            wrong = (examples["y"].to_numpy() + 1) % 3
            y_pred = np.where(rows % (seed + 2) == 0, examples["y"].to_numpy(), wrong)
            path = tmp_path / f"{case}-{seed}.parquet"
            pl.DataFrame({"example_id": examples["example_id"], "y_pred": y_pred}).write_parquet(path)
            assert main(["eval", case, str(path), "--method", "every-kth", "--seed", str(seed)]) == 0
            test = (examples["split"] == "test").to_numpy()
            expected.setdefault((case, "every-kth"), []).append(
                float((y_pred == examples["y"].to_numpy())[test].mean())
            )
    capsys.readouterr()
    assert main(["analyse", "conds-accuracy-by-shift"]) == 0
    out = capsys.readouterr().out
    assert "conds-accuracy-by-shift: version" in out and "2 rows" in out
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        got = con.execute(
            "SELECT conds_case, shift_kind, n_shifts, method, n_seeds, acc_mean, acc_std FROM analysis_conds_shifts"
        ).fetchall()
    by_case = {row[0]: row for row in got}
    assert by_case["sprites-uniform"][1:3] == ("uniform", 0)
    assert by_case["sprites-sc-object_color"][1:3] == ("sc", 1)
    for case in CASES:
        values = expected[(case, "every-kth")]
        assert by_case[case][4] == 2
        assert by_case[case][5] == pytest.approx(np.mean(values))
        assert by_case[case][6] == pytest.approx(np.std(values, ddof=1))
    latest = store.log.latest("conds-accuracy-by-shift")
    assert latest is not None
    version = store.layout.staged("analysis", "conds-accuracy-by-shift", latest.version).path
    assert (version / "files" / "accuracy_by_shift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (version / "files" / "card.md").is_file()

    # The asset: the same version (same results -> same content id), the plot on the materialization.
    from shiftbench.pipelines.definitions import build_definitions

    defs = build_definitions()
    key = dg.AssetKey(["analysis", "conds_accuracy_by_shift"])
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.get_subset(asset_selection={key}).execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert result.success
    (event,) = result.asset_materializations_for_node("analysis__conds_accuracy_by_shift")
    assert event.metadata["version"].value == latest.version
    assert str(event.metadata["plot"].value).startswith("![")
    assert event.metadata["rows"].value == 2


def test_metashift_table_2_puts_each_learner_beside_the_papers_row() -> None:
    """Ours (test acc_avg and acc_wg over the split's own groups) joined to the paper's Table 2 by method and p; a
    paper method with no run keeps its row, a method the paper did not run gets NULL paper columns."""
    board = _board(
        [
            ("cat-dog-indoor-outdoor-p12", "erm", "domainbed.resnet18", "test", 2, 0.8, 0.01),
            ("cat-dog-indoor-outdoor-p01", "erm", "domainbed.resnet18", "test", 2, 0.7, 0.02),
            ("cat-dog-indoor-outdoor-p01", "mine", None, "test", 1, 0.75, None),
            ("cat-dog-indoor-outdoor-p01", "erm", "domainbed.resnet18", "id_val", 2, 0.9, 0.0),  # not the test split
            ("cat-dog-dg-x", "erm", "domainbed.resnet18", "test", 1, 0.5, None),  # another task
        ]
    )
    worst = board.filter(pl.col("eval_split") == "test").with_columns(
        metric=pl.lit("acc_wg"), mean=pl.col("mean") - 0.2
    )
    by_object = worst.with_columns(grouping=pl.lit("by-object"), mean=pl.lit(0.0))  # another grouping: left out
    tables = {"leaderboard_with_standins": pl.concat([board, worst]).with_columns(grouping=pl.lit("group"))}
    tables["leaderboard_with_standins"] = pl.concat([tables["leaderboard_with_standins"], by_object])
    got = _run(analyses()["metashift-subpopulation-table"].sql(), tables)
    rows = {(r["minority_percent"], r["method"], r["setting"]): r for r in got.iter_rows(named=True)}
    mine = rows[(12, "erm", "domainbed.resnet18")]
    assert (mine["acc_avg"], mine["acc_wg"], mine["paper_acc_avg"], mine["paper_acc_wg"]) == pytest.approx(
        (0.8, 0.6, 0.840, 0.715)
    )
    assert rows[(1, "erm", "domainbed.resnet18")]["paper_acc_wg"] == pytest.approx(0.562)
    assert rows[(1, "mine", "")]["paper_acc_avg"] is None and rows[(1, "mine", "")]["acc_avg"] == pytest.approx(0.75)
    cdann = rows[(6, "cdann", "")]  # the paper's, no run here
    assert cdann["acc_avg"] is None and cdann["paper_acc_avg"] == pytest.approx(0.810)
    assert cdann["task"] == "cat-dog-indoor-outdoor-p06"
    assert len(got) == 15 + 1  # the paper's 15 cells, one of them without a run of ours in it... plus mine
    assert subpopulation_table(got, "t")[:8] == PNG

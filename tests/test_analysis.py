"""The papers' analyses: each query against hand-computed values on a small catalog, then the ConDS
analysis end to end (scored predictions -> `shiftbench analyse` -> a published, checked version with its
plot and view) and through its Dagster asset, whose materialization carries the plot."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest

from shiftbench.breeds.figures import source_vs_target
from shiftbench.conds.figures import conds_grid_vs_paper
from shiftbench.config.settings import Settings
from shiftbench.families.registry import analyses
from shiftbench.metashift.figures import accuracy_vs_distance, subpopulation_table
from shiftbench.pipelines.cli import main
from shiftbench.store import Store

from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE, small_sprites_home

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
    small_sprites_home(tmp_path / "home", *CASES)  # both cases published (built once per run: a copy)
    settings = cli_env(SHIFTBENCH_HOME=str(tmp_path / "home"), SHIFTBENCH_SPRITES_PER_COMBINATION="40")
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


def _breeds_runs(runs: list[tuple[str, dict[str, Any], dict[str, float]]]) -> dict[str, pl.DataFrame]:
    """The ``results`` (a row per run, split and metric, as the view gives them) and ``erm_runs`` of trained BREEDS runs
    named ``<task>.<setting>.seed<N>[@standin]`` with their config; values keyed ``'<split> <metric>'``. Beside them,
    the first run's results as scored predictions (no erm_runs row) and as a ConDS run's."""
    results, erm_runs = [], []
    for run, config, values in runs:
        task, rest = run.split(".", 1)
        setting = re.sub(r"\.seed[0-9]+(@standin)?$", "", rest)
        image_source = "standin" if run.endswith("@standin") else "imagenet"
        erm_runs.append(
            {"run": run, "version": "r1", "family": "breeds", "model": config["model"], "config": json.dumps(config)}
        )
        for key, value in values.items():
            split, metric = key.split(" ")
            results.append(
                {"benchmark": task, "data_tag": None, "split_version": "v1", "family": "breeds", "method": "erm",
                 "setting": setting, "image_source": image_source, "seed": config["seed"], "run": run, "version": "r1",
                 "eval_split": split, "metric": metric, "value": value}
            )  # fmt: skip
    frame = pl.DataFrame(results, schema_overrides={"data_tag": pl.String, "setting": pl.String})
    first = frame.filter(pl.col("run") == runs[0][0])  # and two results of no trained BREEDS run:
    scored = first.with_columns(method=pl.lit("mine"), setting=pl.lit(None), run=pl.lit(f"{runs[0][0]}.scored"))
    conds = first.with_columns(family=pl.lit("conds"), benchmark=pl.lit("sprites-uniform"), run=pl.lit("conds-run"))
    erm_runs.append({**erm_runs[0], "run": "conds-run", "family": "conds"})
    return {"results": pl.concat([frame, scored, conds]), "erm_runs": pl.DataFrame(erm_runs)}


def _figure_strings(monkeypatch: pytest.MonkeyPatch, draw: Callable[[], bytes]) -> str:
    """Every string of the figure ``draw`` makes (title, labels, legend): what a reader of the PNG reads."""
    from matplotlib.text import Text

    import shiftbench.breeds.figures as figures
    from shiftbench.results.plots import png_bytes

    texts: list[str] = []

    def keep(fig: Any) -> bytes:
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return png_bytes(fig)

    monkeypatch.setattr(figures, "png_bytes", keep)
    assert draw()[:8] == PNG
    return "\n".join(texts)


PLAIN = {"linear_probe": False}
# Trained BREEDS runs (name, config, 'split metric' -> value): ResNet-18 with two seeds, ResNet-50 on stand-ins with no
# id_test, ResNet-18 under three interventions, and two runs neither figure shows.
BREEDS_LEARNERS: list[tuple[str, dict[str, Any], dict[str, float]]] = [
    ("living17.breeds.resnet18.seed0", {"model": "resnet18", "seed": 0, **PLAIN},
     {"id_val acc_avg": 0.95, "id_test acc_avg": 0.8, "test acc_avg": 0.4,
      "test acc_relative_low:id_test": 0.4, "test acc_relative_high:id_test": 0.6}),
    ("living17.breeds.resnet18.seed1", {"model": "resnet18", "seed": 1, **PLAIN},
     {"id_val acc_avg": 0.97, "id_test acc_avg": 0.9, "test acc_avg": 0.5,
      "test acc_relative_low:id_test": 0.5, "test acc_relative_high:id_test": 0.7,
      "test acc_relative_low:id_val": 0.0, "test acc_relative_high:id_val": 0.1}),
    ("living17.breeds.resnet50.seed0@standin", {"model": "resnet50", "seed": 0, **PLAIN},
     {"id_val acc_avg": 0.7, "test acc_avg": 0.56, "test acc_relative_low:id_val": 0.7,
      "test acc_relative_high:id_val": 0.9}),
    ("living17.breeds-aaaa1111.resnet18.seed0",
     {"model": "resnet18", "seed": 0, "intervention": "gaussian_noise", "noise_std": 0.1, **PLAIN},
     {"id_test acc_avg": 0.7, "test acc_avg": 0.42}),
    ("living17.breeds-bbbb2222.resnet18.seed0",
     {"model": "resnet18", "seed": 0, "intervention": "pgd_l2", "pgd_eps": 1.0, "pgd_step_size": 0.8,
      "pgd_steps": 3, **PLAIN},
     {"id_test acc_avg": 0.6, "test acc_avg": 0.39}),
    ("living17.breeds-cccc3333.resnet18.seed0",
     {"model": "resnet18", "seed": 0, "intervention": "random_erasing", "erasing_p": 0.5,
      "erasing_scale": [0.02, 0.33], "erasing_ratio": [0.3, 3.3], **PLAIN},
     {"id_test acc_avg": 0.5, "test acc_avg": 0.4}),
    ("living17.breeds_linear_probe.resnet18.seed0", {"model": "resnet18", "seed": 0, "linear_probe": True},
     {"id_test acc_avg": 0.8, "test acc_avg": 0.7}),  # retrained on the target: not Figure 5's or 6's
    ("living17.breeds-dddd4444.resnet18.seed0",
     {"model": "resnet18", "seed": 0, "search": "breeds", "search_draw": 3, **PLAIN},
     {"id_test acc_avg": 0.99, "test acc_avg": 0.98}),  # a search's run: not an ordinary run
]  # fmt: skip


def test_breeds_figures_5_and_6_average_each_learners_seeds_and_keep_only_ordinary_source_trained_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per learner: source accuracy from id_test (else id_val), target from test, each the mean over seeds, relative
    accuracy their ratio, the interval the mean of the runs' ends against that source split; the architecture from
    erm_runs.model, the intervention and its settings from the config. Left out: linear probes, a search's runs,
    scored predictions (no erm_runs row) and other families' runs; Figure 5 has standard training only."""
    tables = _breeds_runs(BREEDS_LEARNERS)
    figure5 = _run(analyses()["breeds-architectures"].sql(), tables)
    rows = {r["model"]: r for r in figure5.iter_rows(named=True)}
    assert figure5.height == 2 and set(rows) == {"resnet18", "resnet50"} and set(figure5["task"]) == {"living17"}
    mine = rows["resnet18"]
    assert (mine["setting"], mine["n_seeds"], mine["source_split"], mine["image_source"]) == (
        "breeds.resnet18", 2, "id_test", "imagenet"
    )  # fmt: skip
    assert (mine["source_acc"], mine["target_acc"], mine["relative_acc"]) == pytest.approx((0.85, 0.45, 0.45 / 0.85))
    assert (mine["relative_low"], mine["relative_high"]) == pytest.approx((0.45, 0.65))  # id_test's ends, not id_val's
    standin = rows["resnet50"]
    assert (standin["source_split"], standin["image_source"], standin["n_seeds"]) == ("id_val", "standin", 1)
    assert (standin["relative_acc"], standin["relative_low"], standin["relative_high"]) == pytest.approx(
        (0.8, 0.7, 0.9)
    )
    text = _figure_strings(monkeypatch, lambda: analyses()["breeds-architectures"].figure(figure5, "t"))
    assert "erm breeds.resnet50 [stand-in images]" in text and "erm breeds.resnet18 [imagenet images]" in text

    figure6 = _run(analyses()["breeds-interventions"].sql(), tables)
    got = {(r["model"], r["intervention_settings"]): r for r in figure6.iter_rows(named=True)}
    assert figure6.height == len(got) == 5 and set(figure6["task"]) == {"living17"}
    assert set(got) == {
        ("resnet18", "none"),
        ("resnet50", "none"),
        ("resnet18", "gaussian_noise std 0.1"),
        ("resnet18", "pgd_l2 eps 1.0 step 0.8 steps 3"),
        ("resnet18", "random_erasing p 0.5 scale 0.02-0.33 ratio 0.3-3.3"),
    }
    assert {r["intervention"] for r in got.values()} == {"none", "gaussian_noise", "pgd_l2", "random_erasing"}
    assert got[("resnet18", "none")]["relative_acc"] == pytest.approx(mine["relative_acc"])  # Figure 5's learner
    noise = got[("resnet18", "gaussian_noise std 0.1")]
    assert (noise["relative_acc"], noise["relative_low"], noise["setting"]) == (
        pytest.approx(0.6),
        None,
        "breeds-aaaa1111.resnet18",
    )
    assert got[("resnet18", "pgd_l2 eps 1.0 step 0.8 steps 3")]["relative_acc"] == pytest.approx(0.65)
    text = _figure_strings(monkeypatch, lambda: analyses()["breeds-interventions"].figure(figure6, "t"))
    assert "resnet18: pgd_l2 eps 1.0 step 0.8 steps 3 (source 0.60)" in text and "[stand-in images]" in text


RELATIVE_ENDS = [("test", "acc_relative_low:id_test"), ("test", "acc_relative_high:id_test")]
TINY = {"max_iters": 2, "eval_every": 2, "image_size": 16}  # the analyses read what runs published, not how well
# (--set overrides, seed): two architectures trained in the standard way, the MLP with two seeds and under two
# interventions (a one-step attack: the cheapest).
BREEDS_RUNS: tuple[tuple[dict[str, Any], int], ...] = (
    ({}, 0),
    ({}, 1),
    ({"model": "small_cnn"}, 0),
    ({"intervention": "gaussian_noise", "noise_std": 0.1}, 0),
    ({"intervention": "pgd_l2", "pgd_steps": 1}, 0),
)


def _train_breeds_standins(
    cli_env: Callable[..., Settings], tmp_path: Path
) -> tuple[Settings, dict[str, list[dict[tuple[str, str], float]]]]:
    """Living-17 built (from the inputs it reads) on the BREEDS fixture over an ImageNet-style root of empty files
    (listed, never opened), :data:`BREEDS_RUNS` trained on stand-in images and published; their results by setting."""
    from shiftbench.erm import launch
    from shiftbench.families import registry, variants
    from shiftbench.families.benchmark_builds import build_inputs
    from shiftbench.sources.imagenet import imagenet_classes
    from shiftbench.store.contracts import failures
    from shiftbench.warehouse.publishing import check_version, publish_staged

    root = tmp_path / "imagenet"  # listed, never opened: the runs train on stand-ins
    for wnid in imagenet_classes()["wnid"].to_list():
        (root / "train" / wnid).mkdir(parents=True)
        for k in range(3):
            (root / "train" / wnid / f"{wnid}_{k}.JPEG").touch()
    settings = cli_env(SHIFTBENCH_IMAGENET_DIR=str(root), SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE),
                       SHIFTBENCH_IMAGENET_HIERARCHY_DIR=str(IMAGENET_WORDNET_FIXTURE))  # fmt: skip
    family, kind = registry.family("breeds"), registry.family("breeds").kind("benchmark")
    target = variants.resolve(settings, kind, "living17")
    staged = kind.stage(settings, target, build_inputs(settings, family, kind.inputs_needed(settings, [target.spec])))
    assert not failures(check_version(Store(settings.store_dir), staged))
    publish_staged(settings, staged)
    by_setting: dict[str, list[dict[tuple[str, str], float]]] = {}
    for overrides, seed in BREEDS_RUNS:
        values = {**TINY, **overrides}
        plan = launch.plan_run(settings, "living17", preset="smoke", seed=seed, overrides=values, image_root="standin")
        outcome, _ = launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=lambda _: None)
        published = pl.read_parquet(outcome.staged.table_path("erm_results"))
        setting = re.sub(r"\.seed[0-9]+@standin$", "", plan.run.removeprefix("living17."))
        by_setting.setdefault(setting, []).append(
            {(r["eval_split"], r["metric"]): r["value"] for r in published.to_dicts()}
        )
    return settings, by_setting


@pytest.mark.slow
def test_breeds_figures_5_and_6_over_published_standin_runs_match_their_results_by_hand(
    cli_env: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Tiny runs on stand-in images, published (:func:`_train_breeds_standins`); ``shiftbench analyse`` publishes both
    analyses, whose numbers are the published runs' results averaged by hand and whose tables, figures and cards say
    the images are stand-ins."""
    from matplotlib.text import Text

    import shiftbench.breeds.figures as figures
    from shiftbench.results.plots import png_bytes

    settings, by_setting = _train_breeds_standins(cli_env, tmp_path)
    titles: list[str] = []
    labels: list[str] = []

    def keep(fig: Any) -> bytes:
        titles.append(fig._suptitle.get_text())
        labels.extend(t.get_text() for ax in fig.axes for t in ax.findobj(Text))
        return png_bytes(fig)

    monkeypatch.setattr(figures, "png_bytes", keep)
    capsys.readouterr()
    assert main(["analyse", "breeds-architectures", "breeds-interventions"]) == 0
    out = capsys.readouterr().out
    assert "breeds-architectures: version" in out and "breeds-interventions: version" in out
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        figure5 = con.sql("SELECT * FROM analysis_breeds_architectures").pl()
        figure6 = con.sql("SELECT * FROM analysis_breeds_interventions").pl()
    for table in (figure5, figure6):
        assert set(table["image_source"]) == {"standin"} and set(table["source_split"]) == {"id_test"}
        for row in table.iter_rows(named=True):
            runs = by_setting[row["setting"]]
            source, target, low, high = (
                float(np.mean([run[key] for run in runs]))
                for key in [("id_test", "acc_avg"), ("test", "acc_avg"), *RELATIVE_ENDS]
            )
            assert row["n_seeds"] == len(runs)
            got = (row["source_acc"], row["target_acc"], row["relative_acc"], row["relative_low"], row["relative_high"])
            assert got == pytest.approx((source, target, target / source, low, high))
    assert sorted(figure5.select("model", "n_seeds").rows()) == [("mlp", 2), ("small_cnn", 1)]
    assert sorted(figure6.select("model", "intervention_settings").rows()) == [
        ("mlp", "gaussian_noise std 0.1"),
        ("mlp", "none"),
        ("mlp", "pgd_l2 eps 0.5 step 0.4 steps 1"),
        ("small_cnn", "none"),
    ]
    # Stand-ins said everywhere: each figure's title (the provenance note and the marks' key), the cards.
    assert len(titles) == 2 and all("stand-in images only: not results on the datasets' images" in t for t in titles)
    assert "(hollow: stand-in images)" in titles[0] and "(hatched: stand-in images)" in titles[1]
    setting = figure5.filter(pl.col("model") == "small_cnn")["setting"][0]
    assert any(label.startswith(f"erm {setting} [stand-in images]") for label in labels)  # Figure 5's point
    assert any(label.endswith(f"erm {setting} [stand-in images]") for label in labels)  # Figure 6's bar
    store = Store(settings.store_dir)
    for name, figure in (("breeds-architectures", "architectures.png"), ("breeds-interventions", "interventions.png")):
        latest = store.log.latest(name)
        assert latest is not None
        files = store.layout.staged("analysis", name, latest.version).path / "files"
        assert (files / figure).read_bytes()[:8] == PNG
        assert "Provenance: stand-in images only" in (files / "card.md").read_text("utf-8")

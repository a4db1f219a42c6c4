"""Scoring anyone's predictions: every metric against hand-computed values, `shiftbench eval` on a
published split (ConDS subsets, a grouper over metadata fields), bad predictions as one line that record
nothing, and the `results` and `leaderboard` views."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.scoring import metrics as m
from shiftbench.store import Store

from .test_cli import built_once

CASE = "sprites-sc-object_color"


def test_class_metrics_by_hand() -> None:
    y_true = np.array([0, 0, 1, 1, 2])
    y_pred = np.array([0, 1, 1, 1, 0])
    got = {r.metric: r.value for r in m.class_metrics("test", y_true, y_pred, ["a", "b", "c"])}
    assert got["acc_class:a"] == 0.5 and got["acc_class:b"] == 1.0 and got["acc_class:c"] == 0.0
    assert got["acc_balanced"] == pytest.approx(0.5)
    # F1: a: p 1/2, r 1/2 -> 0.5; b: p 2/3, r 1 -> 0.8; c: never predicted, r 0 -> 0.
    assert got["f1_macro"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    # A class neither present nor predicted is left out of both averages; its accuracy is NULL.
    four = {r.metric: r.value for r in m.class_metrics("test", y_true, y_pred, ["a", "b", "c", "d"])}
    assert four["acc_class:d"] is None and four["f1_macro"] == got["f1_macro"]
    assert four["acc_balanced"] == got["acc_balanced"]


def test_expected_calibration_error_by_hand() -> None:
    y_true = np.array([0, 0, 1, 1, 2])
    probabilities = np.array([[0.9, 0.05, 0.05], [0.3, 0.6, 0.1], [0.2, 0.7, 0.1], [0.1, 0.8, 0.1], [0.55, 0.25, 0.2]])
    # Confidences 0.9 (right), 0.6 (wrong), 0.7 (right), 0.8 (right), 0.55 (wrong); 15 bins of width 1/15:
    # 0.6 and 0.55 share bin 8 (acc 0, conf 0.575), the others are alone in theirs.
    expected = 2 / 5 * 0.575 + 1 / 5 * 0.3 + 1 / 5 * 0.2 + 1 / 5 * 0.1
    (ece,) = m.calibration_metrics("test", y_true, probabilities)
    assert ece.metric == "ece" and ece.value == pytest.approx(expected) == pytest.approx(0.35)
    perfect = np.eye(3)[y_true]
    assert m.calibration_metrics("test", y_true, perfect)[0].value == 0.0


def test_subset_accuracy_by_hand() -> None:
    y_true, y_pred = np.array([0, 1, 2, 0]), np.array([0, 2, 2, 1])
    assert m.subset_accuracy("test", "rare", y_true, y_pred, np.array([True, True, False, False])).value == 0.5
    assert m.subset_accuracy("test", "none", y_true, y_pred, np.zeros(4, bool)).value is None


def test_the_worst_group_note_counts_the_groups_with_examples() -> None:
    """acc_wg is the worst non-empty group: the note says of how many, how big the worst is, and how many are empty."""
    from dataclasses import asdict

    from shiftbench.scoring import worst_group

    def results(split: str, groups: list[int]) -> pl.DataFrame:
        y_true, y_pred = np.array([0, 1, 1][: len(groups)]), np.array([0, 0, 1][: len(groups)])
        found = m.split_metrics(split, y_true, y_pred, np.zeros(len(groups)), np.array(groups), ["a", "b", "c", "d"])
        return pl.DataFrame([asdict(r) for r in found], schema={"eval_split": pl.String, "metric": pl.String,
                                                                 "group": pl.String, "value": pl.Float64})  # fmt: skip

    two_empty = results("id_val", [0, 2, 2])  # a: 1 of 1 right, c: 1 of 2 right (the worst), b and d empty
    assert two_empty.filter(pl.col("metric") == "acc_wg").row(0)[2:] == ("c", 0.5)
    assert worst_group.notes(two_empty) == {
        "id_val": "worst of 2 groups with examples, 2 examples in it; 2 of 4 have none in id_val"
    }
    assert worst_group.metadata(two_empty) == {"worst_group/id_val": worst_group.notes(two_empty)["id_val"]}
    assert worst_group.notes(results("test", [3, 2, 1])) == {
        "test": "worst of 3 groups with examples, 1 example in it; 1 of 4 have none in test"
    }
    assert worst_group.note("test", 0, 4, None) == "no group has an example in test"
    assert worst_group.note("test", 4, 4, 1) == ""  # every group has examples: nothing to explain


@pytest.fixture(scope="module")
def _case_published_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("case_published")


@pytest.fixture
def published_case(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str], _case_published_once: Path, tmp_path: Path
) -> Settings:
    """The CLI's home with CASE built and published: built once per module and worker, each test on its own copy of
    the home and the Dagster home."""
    settings = cli_env()

    def build() -> None:
        assert main(["build", "conds", "--benchmark", CASE]) == 0

    built_once(_case_published_once, tmp_path, ("home", "dagster_home"), build)
    capsys.readouterr()
    return settings


def _examples(settings: Settings) -> pl.DataFrame:
    store = Store(settings.store_dir)
    latest = store.log.latest(CASE)
    assert latest is not None
    path = store.layout.staged("conds", CASE, latest.version).path
    return pl.read_parquet(path / "examples.parquet").join(
        pl.read_parquet(path / "conds_examples.parquet").select("example_id", "object_color"), on="example_id"
    )


@pytest.mark.slow
def test_eval_scores_a_spurious_predictor_and_fills_results_and_leaderboard(
    published_case: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = published_case
    examples = _examples(settings)
    # A predictor that reads the colour (the spurious attribute): red -> 0, yellow -> 1, blue -> 2.
    colour = {"red": 0, "yellow": 1, "blue": 2}
    by_colour = pl.col("object_color").replace_strict(colour, return_dtype=pl.Int64)
    spurious = examples.with_columns(by_colour.alias("y_pred"))
    spurious.select("example_id", "y_pred").write_parquet(tmp_path / "spurious.parquet")
    assert main(["eval", CASE, str(tmp_path / "spurious.parquet"), "--method", "colour", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert f"{CASE}.colour.seed0: version" in out
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        got = dict(
            con.execute(
                "SELECT eval_split || '/' || metric, value FROM results WHERE method = 'colour' "
                "AND metric NOT LIKE 'acc_group:%' AND metric NOT LIKE 'count_group:%'"
            ).fetchall()
        )
    for split in ("train", "id_val", "test"):
        part = spurious.filter(pl.col("split") == split)
        accuracy = (part["y"] == part["y_pred"]).mean()
        assert got[f"{split}/acc_avg"] == pytest.approx(accuracy)
        # By hand: the colour rule is right exactly on the aligned examples, wrong on every counterexample.
        aligned = part.filter(by_colour == pl.col("y"))
        assert aligned.height == round(accuracy * part.height)
    assert got["test/acc_subset:sc_counterexample"] == 0.0
    assert got["test/acc_wg"] == 0.0  # a cell of counterexamples
    assert got["test/acc_avg"] == pytest.approx(1 / 3)  # the uniform test split: one colour in three is aligned

    # A second seed of a noisy oracle with probabilities, grouped by colour; the leaderboard aggregates seeds.
    rng = np.random.default_rng(0)
    accuracies = []
    for seed in (1, 2):
        wrong = rng.random(examples.height) < 0.2 * seed
        y_pred = np.where(wrong, (examples["y"].to_numpy() + 1) % 3, examples["y"].to_numpy())
        probabilities = np.full((examples.height, 3), 0.1)
        probabilities[np.arange(examples.height), y_pred] = 0.8
        frame = pl.DataFrame({"example_id": examples["example_id"], "y_pred": y_pred})
        frame = frame.with_columns(*(pl.Series(f"p_{k}", probabilities[:, k]) for k in range(3)))
        frame.write_csv(tmp_path / f"oracle{seed}.csv")
        args = ["eval", CASE, str(tmp_path / f"oracle{seed}.csv"), "--method", "oracle", "--seed", str(seed)]
        assert main([*args, "--group-by", "object_color"]) == 0
        test = examples["split"].to_numpy() == "test"
        accuracies.append(float((y_pred[test] == examples["y"].to_numpy()[test]).mean()))
    capsys.readouterr()
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        row = con.execute(
            "SELECT n_seeds, mean, std, ci_low, ci_high FROM leaderboard "
            "WHERE method = 'oracle' AND eval_split = 'test' AND metric = 'acc_avg'"
        ).fetchone()
        groups = con.execute(
            "SELECT DISTINCT \"group\" FROM results WHERE method = 'oracle' AND metric LIKE 'acc_group:%' ORDER BY 1"
        ).fetchall()
        ece = con.execute(
            "SELECT value FROM results WHERE method = 'oracle' AND seed = 1 AND eval_split = 'test' AND metric = 'ece'"
        ).fetchone()
    mean, std = float(np.mean(accuracies)), float(np.std(accuracies, ddof=1))
    half = 12.706 * std / math.sqrt(2)  # t(0.975, 1)
    assert row == pytest.approx((2, mean, std, mean - half, mean + half))
    assert [g for (g,) in groups] == ["object_color=blue", "object_color=red", "object_color=yellow"]
    assert main(["leaderboard", CASE, "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| benchmark | method | setting | selection | grouping | images | test/acc_avg | test/acc_wg |"
    oracle = next(line for line in lines if "| oracle |" in line)
    assert oracle.startswith(f"| {CASE} | oracle | by-object_color | none | object_color | generated |")
    assert f"| {round(mean, 3)} ± {round(half, 3)} (2) |" in oracle
    assert any(
        line.startswith(f"| {CASE} | colour |  | none | group | generated | 0.333 (1) | 0.0 (1) |") for line in lines
    )
    assert lines[-1].startswith("_images 'generated': the split's own images are generated")
    assert ece is not None and ece[0] == pytest.approx(abs((1 - accuracies[0]) - 0.2), abs=1e-9)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.with_columns(pl.when(pl.col("row") == 3).then(pl.lit("nope.png")).otherwise("example_id")
                                  .alias("example_id")), "row 4: example 'nope.png' is not an example of"),
        (lambda f: f.filter(pl.col("row") != 5), "is covered only in part"),
        (lambda f: f.with_columns(pl.when(pl.col("row") == 2).then(7).otherwise("y_pred").alias("y_pred")),
         "row 3: example"),
        (lambda f: pl.concat([f, f.filter(pl.col("row") == 0)]), "predicted twice (first at row 1)"),
        (lambda f: pl.concat([f, pl.DataFrame({c: [None] for c in f.columns}, schema=f.schema)]),
         ": empty row: no example_id, no y_pred"),
        (lambda f: f.with_columns(pl.when(pl.col("row") == 6).then(0.9).otherwise("p_0").alias("p_0")),
         "row 7: example"),
    ],
    ids=["unknown_id", "missing_example", "label_out_of_range", "duplicate", "empty_row", "probabilities"],
)  # fmt: skip
def test_bad_predictions_are_one_line_and_record_nothing(
    published_case: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[pl.DataFrame], pl.DataFrame],
    message: str,
) -> None:
    settings = published_case
    examples = _examples(settings).filter(pl.col("split") == "test").sort("example_id")
    good = examples.select("example_id", pl.col("y").alias("y_pred"))
    good = good.with_columns(*(pl.lit(1.0 if k == 0 else 0.0).alias(f"p_{k}") for k in range(3)))
    bad = edit(good.with_row_index("row")).drop("row")
    path = tmp_path / "bad.parquet"
    bad.write_parquet(path)
    assert main(["eval", CASE, str(path), "--method", "mine"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and len(err.strip().splitlines()) == 1, err
    assert not (settings.store_dir / "eval").exists()


def test_csv_errors_name_the_line(published_case: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.csv"
    path.write_text("example_id,y_pred\nx.png,0\n")
    assert main(["eval", CASE, str(path), "--method", "mine"]) == 2
    assert f"{path}:2: example 'x.png' is not an example of" in capsys.readouterr().err
    assert main(["eval", CASE, str(path), "--method", "Bad Name"]) == 2
    assert "parameter '--method'" in capsys.readouterr().err
    assert main(["eval", CASE, str(path), "--method", "m", "--group-by", "colour"]) == 2
    capsys.readouterr()
    # A repeated id names the line of the first; a blank line is said to be blank; a folder is said to be one.
    for text, message in [
        (
            "example_id,y_pred\nx.png,0\ny.png,0\nx.png,1\n",
            f"{path}:4: example 'x.png': predicted twice (first at line 2)",
        ),
        ("example_id,y_pred\nx.png,0\n\ny.png,0\n", f"{path}:3: blank line: no example_id, no y_pred"),
        ("example_id,y_pred,p_0\nx.png,0,1\n , ,\n", f"{path}:3: blank line: no example_id, no y_pred"),
    ]:
        path.write_text(text)
        assert main(["eval", CASE, str(path), "--method", "mine"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["eval", CASE, str(tmp_path), "--method", "mine"]) == 2
    assert f"{tmp_path}, parameter 'PREDICTIONS': is a directory, not a predictions file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_grouping_is_a_result_beside_the_first(
    published_case: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scoring the same predictions again with another --group-by publishes a second result (its grouping in its
    name); the first stays latest, untouched; each worst-group figure names its grouping, and the printed acc_wg
    says over how many groups it was computed when some have no example."""
    settings = published_case
    examples = _examples(settings)
    wrong_on_red = pl.when(pl.col("object_color") == "red").then((pl.col("y") + 1) % 3).otherwise(pl.col("y"))
    examples.select("example_id", wrong_on_red.alias("y_pred")).write_parquet(tmp_path / "p.parquet")
    score = ["eval", CASE, str(tmp_path / "p.parquet"), "--method", "mine"]
    assert main(score) == 0
    own = capsys.readouterr().out
    store = Store(settings.store_dir)
    first = store.log.latest(f"{CASE}.mine.seed0")
    assert first is not None and "acc_wg over the split's own groups" in own
    # The printed acc_wg is the worst of the groups with examples, and says how many of all groups have none.
    id_val = examples.filter(pl.col("split") == "id_val")
    n_groups, present = examples["group"].n_unique(), id_val["group"].n_unique()
    assert 0 < present < n_groups  # the full case: many of its 81 cells have no id_val example
    line = next(x for x in own.splitlines() if x.strip().startswith("id_val/acc_wg"))
    assert line.split()[1] == "0.0000"  # a red cell: always wrong
    assert (
        f"worst of {present} groups with examples" in line
        and f"{n_groups - present} of {n_groups} have none in id_val" in line
    )

    assert main([*score, "--group-by", "object_color"]) == 0
    by_colour = capsys.readouterr().out
    assert f"{CASE}.mine.by-object_color.seed0: version" in by_colour and "now latest" in by_colour
    assert "acc_wg over the groups by object_color" in by_colour
    assert "test/acc_wg       0.0000 (object_color=red)" in by_colour  # three colours, all in test: no note
    assert store.log.latest(f"{CASE}.mine.seed0") == first  # the first result is still there, still latest
    assert main([*score, "--group-by", "group"]) == 0  # the split's own groups, named: the first result again
    assert "already latest" in capsys.readouterr().out and store.log.latest(f"{CASE}.mine.seed0") == first
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        rows = con.execute(
            "SELECT run, setting, grouping, \"group\" FROM results WHERE method = 'mine' AND eval_split = 'test' "
            "AND metric = 'acc_wg' ORDER BY run"
        ).fetchall()
    assert [r[:3] for r in rows] == [
        (f"{CASE}.mine.by-object_color.seed0", "by-object_color", "object_color"),
        (f"{CASE}.mine.seed0", None, "group"),
    ]
    assert rows[0][3] == "object_color=red" and rows[1][3].startswith("shape=")
    assert main(["leaderboard", CASE]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert table[0] == [
        "benchmark",
        "method",
        "setting",
        "selection",
        "grouping",
        "images",
        "test/acc_avg",
        "test/acc_wg",
    ]
    # Two rows (the own grouping's setting is empty), one accuracy, each worst-group figure beside its grouping.
    assert table[1][:5] == [CASE, "mine", "none", "group", "generated"] and table[1][5:7] == table[2][6:8]
    assert table[2][:6] == [CASE, "mine", "by-object_color", "none", "object_color", "generated"]
    assert table[1][7:] == table[2][8:] == ["0.0", "(1)"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "benchmark", "images"),
    [("breeds", "living17", "real"), ("metashift", "cat-dog-dg-cabinet-bed@generated", "standin")],
)
def test_eval_on_every_family(
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    family: str,
    benchmark: str,
    images: str,
) -> None:
    settings = cli_env()
    assert main(["build", family, "--benchmark", benchmark]) == 0
    store = Store(settings.store_dir)
    latest = store.log.latest(benchmark)
    assert latest is not None
    examples = pl.read_parquet(store.layout.staged(family, benchmark, latest.version).table_path("examples"))
    # Perfect on the first half of the classes, always class 0 on the rest: per-class accuracy by hand.
    k = int(examples["y"].max()) + 1
    y_pred = pl.when(pl.col("y") < k // 2).then(pl.col("y")).otherwise(0)
    examples.select("example_id", y_pred.alias("y_pred")).write_parquet(tmp_path / "p.parquet")
    capsys.readouterr()
    assert main(["eval", benchmark, str(tmp_path / "p.parquet"), "--method", "half"]) == 0
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        got = {
            (split, metric): value
            for split, metric, value in con.execute(
                "SELECT eval_split, metric, value FROM results WHERE method = 'half' AND metric LIKE 'acc_class:%' "
                "OR method = 'half' AND metric IN ('acc_avg', 'acc_balanced')"
            ).fetchall()
        }
    names = examples.group_by("y").agg(pl.col("y_name").first()).sort("y")["y_name"].to_list()
    for split in examples["split"].unique().to_list():
        part = examples.filter(pl.col("split") == split)
        present = sorted(part["y"].unique().to_list())
        for y in present:
            assert got[(split, f"acc_class:{names[y]}")] == (1.0 if y < k // 2 or y == 0 else 0.0)
        recall = [1.0 if y < k // 2 or y == 0 else 0.0 for y in present]
        assert got[(split, "acc_balanced")] == pytest.approx(sum(recall) / len(recall))
        assert got[(split, "acc_avg")] == pytest.approx(part.filter(pl.col("y") < k // 2).height / part.height)
    # Whose images: the split's (BREEDS: ImageNet's, though not configured here; the generated scene sample: only
    # stand-ins, whatever the predictions were made from), in eval_runs and in the views.
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        recorded = con.execute("SELECT image_source FROM eval_runs WHERE method = 'half'").fetchall()
        labels = con.execute("SELECT DISTINCT image_source, images FROM results WHERE method = 'half'").fetchall()
    source = "imagenet" if family == "breeds" else "standin"
    assert recorded == [(source,)] and labels == [(source, images)]

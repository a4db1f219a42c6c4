"""Provenance in every result: a run on stand-in images is named apart from the run on the split's images
(its own store entry and version lineage), the results views carry ``image_source`` and ``data_tag``, the
leaderboard never averages stand-in seeds with real ones and shows them only when asked, labelled; runs an
older shiftbench published under a real run's name are labelled from ``erm_runs``; the papers' analyses
carry the provenance into their tables and figures, and the ConDS grid names the data on each side."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.erm import launch
from shiftbench.families import analysis
from shiftbench.families.registry import analyses
from shiftbench.pipelines.cli import main
from shiftbench.scoring import provenance
from shiftbench.splits import published as splits
from shiftbench.store import Store

from .conftest import small_sprites_home

CASE = "sprites-uniform"
FAST = {"max_iters": 2, "eval_every": 2}  # what is named and labelled, not how well it learned


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One published sprites case (the generated sprites shared with the other tests' cache) and five runs of
    one protocol: seeds 0 and 1 on its images, seed 0 on stand-ins, and seed 2 on stand-ins published the way
    shiftbench did before runs were named apart (under the real run's name)."""
    settings = small_sprites_home(tmp_path_factory.mktemp("provenance") / "home", CASE)  # the run's build, copied
    for seed, images in ((0, None), (1, None), (0, "standin"), (2, "standin")):
        plan = launch.plan_run(settings, CASE, preset="smoke", seed=seed, overrides=FAST, image_root=images)
        if seed == 2:  # an older shiftbench: the stand-in run under the name of the real run
            plan = dataclasses.replace(plan, run=plan.run.removesuffix("@standin"))
        launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=lambda _: None)
    return settings


def _plan(settings: Settings, seed: int, images: str | None = None) -> launch.RunPlan:
    return launch.plan_run(settings, CASE, preset="smoke", seed=seed, overrides=FAST, image_root=images)


def _query(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.slow
def test_a_standin_run_is_named_apart_and_never_replaces_the_real_run(warehouse: Settings) -> None:
    real, standin = _plan(warehouse, 0), _plan(warehouse, 0, "standin")
    assert standin.images.kind == "standin" and real.images.kind == "sprites"
    assert standin.run == f"{real.run}@standin"  # NAME@TAG, like a benchmark built from other sources
    assert real.run.startswith(f"{CASE}.smoke-") and real.run.endswith(".mlp.seed0")  # real names unchanged
    store = Store(warehouse.store_dir)
    # Two store entries, each with its own lineage: the stand-in run is not a version of the real one.
    assert [v.version for v in store.log.versions(real.run)] != [v.version for v in store.log.versions(standin.run)]
    assert len(store.log.versions(standin.run)) == 1
    runs = dict(_query(warehouse, "SELECT run, image_source FROM erm_runs WHERE seed = 0"))
    assert runs == {real.run: "sprites", standin.run: "standin"}
    cards = {}
    for plan in (real, standin):
        latest = store.log.latest(plan.run)
        assert latest is not None
        cards[plan.images.kind] = (
            store.layout.staged("erm", plan.run, latest.version).path / "files" / "card.md"
        ).read_text()
    assert "(stand-in images)" in cards["standin"] and "not the split's own images" in cards["standin"]
    assert "stand-in" not in cards["sprites"]


@pytest.mark.slow
def test_results_carry_image_source_and_the_leaderboard_never_mixes_them(warehouse: Settings) -> None:
    real = _plan(warehouse, 0)
    setting = real.run[len(CASE) + 1 :].removesuffix(".seed0")
    history = _query(
        warehouse,
        "SELECT run, seed, setting, image_source, data_tag FROM results_history "
        "WHERE eval_split = 'test' AND metric = 'acc_avg' ORDER BY seed, run",
    )
    assert history == [
        (real.run, 0, setting, "sprites", None),
        (f"{real.run}@standin", 0, setting, "standin", None),
        (real.run.replace("seed0", "seed1"), 1, setting, "sprites", None),
        (real.run.replace("seed0", "seed2"), 2, setting, "standin", None),  # an older run: labelled from erm_runs
    ]
    query = "SELECT seed, image_source, value FROM results WHERE eval_split = 'test' AND metric = 'acc_avg'"
    test_acc = {(seed, source): value for seed, source, value in _query(warehouse, query)}
    board = "SELECT image_source, n_seeds, mean FROM {} WHERE eval_split = 'test' AND metric = 'acc_avg' ORDER BY 1"
    real_mean = (test_acc[(0, "sprites")] + test_acc[(1, "sprites")]) / 2
    standin_mean = (test_acc[(0, "standin")] + test_acc[(2, "standin")]) / 2
    assert _query(warehouse, board.format("leaderboard")) == [("sprites", 2, pytest.approx(real_mean))]
    assert _query(warehouse, board.format("leaderboard_with_standins")) == [
        ("sprites", 2, pytest.approx(real_mean)),
        ("standin", 2, pytest.approx(standin_mean)),
    ]


@pytest.mark.slow
def test_the_leaderboard_command_hides_standins_unless_asked_and_labels_them(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    setting = _plan(warehouse, 0).run[len(CASE) + 1 :].removesuffix(".seed0")
    assert main(["leaderboard", CASE]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    header = ["benchmark", "method", "setting", "selection", "grouping", "images", "test/acc_avg", "test/acc_wg"]
    assert lines[0].split() == header
    assert lines[1].split()[:6] == [CASE, "erm", setting, "none", "group", "generated"] and "(2)" in lines[1]
    assert lines[2:] == ["", f"images 'generated': {provenance.MEANINGS['generated']}"]  # the sprites' own images
    assert "standin" not in captured.out
    assert captured.err.strip() == "1 row(s) on stand-in images left out: --include-standin shows them, labelled"

    assert main(["leaderboard", CASE, "--include-standin"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split() == header
    assert [line.split()[5] for line in lines[1:3]] == ["generated", "standin"]
    assert lines[-1].startswith("images 'standin': generated stand-in images") and captured.err == ""

    assert main(["leaderboard", CASE, "--include-standin", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| benchmark | method | setting | selection | grouping | images | test/acc_avg | test/acc_wg |" in out
    assert f"| {CASE} | erm | {setting} | none | group | standin |" in out and "_images 'standin': generated" in out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["leaderboard", "--include-standin=yes"], "ignored explicit argument 'yes'"),
        (["leaderboard", "nope", "--include-standin"], "no published benchmark 'nope'"),
        (["leaderboard", "--include-standin", "--metrics", "acc_avgx"], "unknown metric 'acc_avgx'"),
    ],
    ids=["flag_with_value", "unknown_benchmark", "unknown_metric"],
)
def test_bad_leaderboard_requests_with_the_flag_are_one_line(
    warehouse: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_the_cli_names_a_standin_run_apart(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's path: ``shiftbench train --image-root standin`` publishes under ``...@standin`` (in a copy of
    the warehouse: the other tests count its runs)."""
    home = tmp_path / "home"
    shutil.copytree(warehouse.home, home, symlinks=True)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    train = ["train", CASE, "--preset", "smoke", "--seed", "4", "--image-root", "standin", "--in-process"]
    assert main([*train, "--set", "max_iters=2", "--set", "eval_every=2"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"[train] {CASE}.smoke-" in out and ".mlp.seed4@standin: " in out and "images standin" in out
    assert ".mlp.seed4@standin version " in out and "now latest" in out


@pytest.mark.slow
def test_scored_predictions_carry_their_splits_images_and_are_shown_by_default(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shiftbench eval`` results carry the scored split's image source (the sprites': generated), and are in the
    default leaderboard, labelled (stand-in splits: tests/test_standin_everywhere.py)."""
    home = tmp_path / "home"
    shutil.copytree(warehouse.home, home, symlinks=True)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    examples = splits.published_split(warehouse, CASE).examples
    examples.select("example_id", pl.col("y").alias("y_pred")).write_parquet(tmp_path / "oracle.parquet")
    assert main(["eval", CASE, str(tmp_path / "oracle.parquet"), "--method", "oracle"]) == 0
    capsys.readouterr()
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home)})
    query = "SELECT DISTINCT image_source, images, setting, grouping, data_tag FROM results WHERE method = 'oracle'"
    assert _query(settings, query) == [("sprites", "generated", None, "group", None)]
    assert main(["leaderboard", CASE]) == 0
    oracle = [line.split() for line in capsys.readouterr().out.splitlines() if " oracle " in line]
    assert oracle == [[CASE, "oracle", "none", "group", "generated", "1.0", "(1)", "1.0", "(1)"]]


def _figure_text(module: ModuleType, monkeypatch: pytest.MonkeyPatch, draw: Callable[[], bytes]) -> dict[str, str]:
    """The strings of the figure ``draw`` makes (title, legends, axes): what a reader of the PNG reads."""
    from matplotlib.text import Text

    from shiftbench.results.plots import pyplot

    figures: list[Any] = []
    monkeypatch.setattr(module, "png_bytes", lambda fig: figures.append(fig) or b"")
    draw()
    (fig,) = figures
    legends = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    text = {
        "title": fig._suptitle.get_text() if fig._suptitle else "",
        "legend": "\n".join(legends),
        "all": "\n".join(t.get_text() for t in fig.findobj(Text)),
    }
    pyplot().close(fig)
    return text


@pytest.mark.slow
def test_analyses_over_standin_runs_say_so_in_table_and_figure(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shiftbench.conds.figures as figures

    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    shifts = analyses()["conds-accuracy-by-shift"]
    setting = _plan(warehouse, 0).run[len(CASE) + 1 :].removesuffix(".seed0")
    table = analysis.compute(warehouse, shifts).filter(pl.col("setting") == setting)  # the fixture's runs
    assert table.select("conds_case", "image_source", "n_seeds").sort("image_source").rows() == [
        (CASE, "sprites", 2),
        (CASE, "standin", 2),
    ]
    assert analysis.provenance(table) == (
        "learners marked [stand-in images] trained on generated stand-ins, not the datasets' images; "
        "generated images (the ConDS sprites): results on generated data, not photographs"
    )
    text = _figure_text(figures, monkeypatch, lambda: shifts.figure(table, "t"))
    legend = text["legend"].splitlines()
    assert any(label.endswith("[stand-in images] on sprites") for label in legend)
    assert any(not label.endswith("[stand-in images] on sprites") for label in legend)
    # Published through the CLI: the published figure's title carries the note, the card says it too.
    from shiftbench.results.plots import png_bytes

    titles: list[str] = []
    monkeypatch.setattr(figures, "png_bytes", lambda fig: titles.append(fig._suptitle.get_text()) or png_bytes(fig))
    assert main(["analyse", "conds-accuracy-by-shift"]) == 0
    assert "conds-accuracy-by-shift: version" in capsys.readouterr().out
    (title,) = titles
    note = f"({analysis.provenance(table)})"
    assert title.startswith(f"{shifts.title}\n") and " ".join(title.split()) == f"{shifts.title} {note}"
    latest = Store(warehouse.store_dir).log.latest("conds-accuracy-by-shift")
    assert latest is not None
    card = (
        Store(warehouse.store_dir).layout.staged("analysis", latest.benchmark, latest.version).path
        / "files"
        / "card.md"
    )
    assert "Provenance: learners marked [stand-in images]" in card.read_text("utf-8")
    rows = _query(warehouse, f"SELECT image_source, data_tag FROM analysis_conds_shifts WHERE setting = '{setting}'")
    assert sorted(rows) == [("sprites", None), ("standin", None)]


def _grid(cases: list[tuple[str, str]], image_source: str, model: str = "resnet18") -> pl.DataFrame:
    """The ConDS grid's table over one learner's runs on ``cases`` (benchmark, dataset), as the catalog gives it."""
    board = pl.DataFrame(
        [
            {"benchmark": b, "data_tag": b.split("@")[1] if "@" in b else None, "split_version": "v1", "method": "erm",
             "setting": f"conds_controlled.{model}", "image_source": image_source, "eval_split": "test",
             "metric": "acc_avg", "n_seeds": 3, "mean": 0.5, "std": 0.01}
            for b, _ in cases
        ]
    )  # fmt: skip
    conds_cases = pl.DataFrame(
        {"benchmark": [b for b, _ in cases], "version": ["v1"] * len(cases), "dataset": [d for _, d in cases],
         "shift_kind": ["uniform"] * len(cases)}
    )  # fmt: skip
    runs = pl.DataFrame(
        {"benchmark": [b for b, _ in cases], "family": ["conds"] * len(cases), "method": ["erm"] * len(cases),
         "model": [model] * len(cases), "image_source": [image_source] * len(cases),
         "run": [f"{b}.conds_controlled.{model}.seed0" + ("@standin" if image_source == "standin" else "")
                 for b, _ in cases],
         "config": ['{"augment": "none", "init_checkpoint": null}'] * len(cases)}
    )  # fmt: skip
    con = duckdb.connect()
    for name, frame in {"leaderboard_with_standins": board, "conds_cases": conds_cases, "erm_runs": runs}.items():
        con.register(name, frame.to_arrow())
    return con.sql(analyses()["conds-grid-vs-paper"].sql()).pl()


@pytest.mark.parametrize(
    ("cases", "image_source", "here", "comparison"),
    [
        ([("sprites-uniform", "sprites")], "sprites", "sprites", "different datasets"),
        ([("sprites-uniform", "sprites")], "standin", "sprites", "different datasets"),
        ([("celeba-uniform", "celeba")], "celeba", "CelebA", "one of the paper's datasets"),
        ([("celeba-uniform@partial", "celeba")], "celeba", "CelebA @partial", "different datasets"),
    ],
    ids=["sprites", "sprites_standin", "celeba", "celeba_partial"],
)
def test_the_conds_grid_names_the_data_on_each_side(
    monkeypatch: pytest.MonkeyPatch, cases: list[tuple[str, str]], image_source: str, here: str, comparison: str
) -> None:
    import shiftbench.conds.figures as figures

    table = _grid(cases, image_source)
    (row,) = table.filter(pl.col("n_cases") > 0).to_dicts()
    paper = "dSprites, Shapes3D, SmallNorb" if cases[0][1] == "sprites" else "CelebA, DeepFashion"
    assert (row["dataset"], row["image_source"], row["paper_row"]) == (cases[0][1], image_source, "ResNet18")
    assert (row["paper_datasets"], row["comparison"]) == (paper, comparison)
    assert row["setting"] == "conds_controlled.resnet18"  # the stand-in tag is not part of the setting
    paper_only = table.filter(pl.col("n_cases") == 0)
    assert paper_only.height > 0 and set(paper_only["paper_datasets"]) == {paper}
    assert set(paper_only["comparison"].to_list()) == {None}

    text = _figure_text(figures, monkeypatch, lambda: figures.conds_grid_vs_paper(table, "ConDS grid"))
    if here == "sprites":  # never read as dSprites: the figure says whose sprites they are
        here = "sprites (shiftbench's generated sprites)"
    assert f"here: {here} | the paper: {paper} | " in text["title"]
    if comparison == "different datasets":
        assert "different datasets: not a reproduction of the paper's numbers" in text["title"]
    else:
        assert "CelebA here against the paper's mean over CelebA and DeepFashion" in text["title"]
    assert f"here, mean over cases on: {here}" in text["legend"]
    assert f"the paper (Table 3), mean over: {paper}" in text["legend"]
    short = here.split(" (")[0]
    assert f"ResNet18{' [stand-in images]' if image_source == 'standin' else ''}\non {short}, " in text["all"]
    assert ("[stand-in images]" in text["all"]) == (image_source == "standin")


def test_an_analysis_without_paper_numbers_still_names_its_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner the paper has no row for (the small CNN): bars and the paper's own rows, never one comparison."""
    import shiftbench.conds.figures as figures

    table = _grid([("sprites-uniform", "sprites")], "sprites", model="small_cnn")
    measured = table.filter(pl.col("n_cases") > 0).to_dicts()
    assert [(r["paper_row"], r["paper_datasets"], r["comparison"]) for r in measured] == [("", None, None)]
    text = _figure_text(figures, monkeypatch, lambda: figures.conds_grid_vs_paper(table, "ConDS grid"))
    assert "here: sprites (shiftbench's generated sprites) (no paper number to compare)" in text["title"]
    assert "the paper (Table 3), mean over: dSprites, Shapes3D, SmallNorb" in text["legend"]


def test_provenance_notes_tags_and_standin_only_analyses() -> None:
    frame = pl.DataFrame(
        {"image_source": ["standin", "standin", ""], "data_tag": ["generated", None, None]},
        schema_overrides={"data_tag": pl.String},
    )
    assert analysis.provenance(frame) == (
        "stand-in images only: not results on the datasets' images; splits tagged @generated: not the papers' data"
    )
    real = pl.DataFrame({"image_source": ["gqa", "imagenet", ""], "data_tag": [None, None, None]})
    assert analysis.provenance(real.with_columns(pl.col("data_tag").cast(pl.String))) == ""
    other = pl.DataFrame({"image_source": ["sprites", "unrecorded", None], "data_tag": [None, None, None]})
    assert analysis.provenance(other.with_columns(pl.col("data_tag").cast(pl.String))) == (
        "generated images (the ConDS sprites): results on generated data, not photographs; "
        "scored predictions of unrecorded images"
    )

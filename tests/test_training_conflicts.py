"""Training conflicts (MetaShift §4.3): the regression against numpy's least squares, and a constructed case with
planted conflicts that the tracked run must find (shiftbench.scoring.training_conflicts, shiftbench.erm.conflicts)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image

from shiftbench.config.settings import Settings
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.train import train
from shiftbench.errors import InputError
from shiftbench.scoring.training_conflicts import Subset, SubsetDescriptor, fit_conflicts, subset_descriptor
from shiftbench.splits.split_table import SplitTable


def test_the_regression_is_numpys_least_squares_with_the_sign_turned() -> None:
    rng = np.random.default_rng(3)
    steps, n_train, n_eval = 200, 5, 4
    x = rng.multinomial(32, np.full(n_train, 1 / n_train), size=steps).astype(float)
    beta = rng.normal(size=(n_train, n_eval))
    changes = x @ beta + rng.normal(scale=0.5, size=(steps, n_eval))
    losses = np.vstack([np.zeros(n_eval), np.cumsum(changes, axis=0)])
    fit = fit_conflicts(x, losses)
    expected, *_ = np.linalg.lstsq(x, changes, rcond=None)
    np.testing.assert_allclose(fit.coefficient, -expected, rtol=1e-10, atol=1e-12)
    residual = changes - x @ expected
    sigma2 = (residual**2).sum(axis=0) / (steps - n_train)
    se = np.sqrt(np.outer(np.diag(np.linalg.inv(x.T @ x)), sigma2))
    np.testing.assert_allclose(fit.std_error, se, rtol=1e-8)
    np.testing.assert_allclose(fit.r2, 1 - (residual**2).sum(axis=0) / (changes**2).sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(np.abs(fit.normalized).max(axis=0), 1.0)
    assert np.all(np.sign(fit.normalized) == np.sign(fit.coefficient))
    # Noise-free changes: the planted slopes come back exactly.
    exact = fit_conflicts(x, np.vstack([np.zeros(n_eval), np.cumsum(x @ beta, axis=0)]))
    np.testing.assert_allclose(exact.coefficient, -beta, atol=1e-9)


def test_fewer_steps_than_training_subsets_is_one_line() -> None:
    with pytest.raises(InputError, match="5 tracked intervals cannot separate 6 training subsets"):
        fit_conflicts(np.ones((5, 6)), np.zeros((6, 2)))


def test_a_manifest_without_subsets_is_one_line_naming_the_option() -> None:
    with pytest.raises(
        InputError, match="sprites-uniform carries no subsets to track: its manifest has no 'subsets' descriptor"
    ) as error:
        subset_descriptor({"params": {}}, "sprites-uniform")
    assert error.value.parameter == "track_conflicts"


# -- the constructed case ---------------------------------------------------------------------------------------
# Two classes told apart by a faint bar (vertical: cat, horizontal: dog) on a background. Context A is one red
# background shared by cat(A) and dog(A): a batch rich in cat(A) teaches "red means cat" and raises the loss of
# dog(A), and the other way round. The neutral subsets have a background of random colour per image (nothing to
# learn from it); the out-of-domain subsets have a blue background.
RED, BLUE = (200, 30, 30), (30, 30, 200)
SIZE = 16
BAR = 40
TRAIN = {"cat(A)": RED, "dog(A)": RED, "cat(n1)": None, "dog(n1)": None, "cat(n2)": None, "dog(n2)": None}
OOD = {"cat(B)": BLUE, "dog(B)": BLUE}
N_TRAIN, N_EVAL = 50, 13


def _image(cls: str, background: tuple[int, int, int] | None, rng: np.random.Generator) -> np.ndarray:
    colour = background if background is not None else tuple(int(v) for v in rng.integers(0, 256, 3))
    pixels = np.empty((SIZE, SIZE, 3), np.float64)
    pixels[:] = colour
    pixels += rng.normal(0, 25, pixels.shape)
    if background != RED:  # context A shows no bar: only its red background, shared by cat(A) and dog(A)
        bar = (slice(2, 14), slice(7, 9)) if cls == "cat" else (slice(7, 9), slice(2, 14))
        pixels[bar] += BAR
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _constructed(root: Path) -> tuple[SplitTable, list[Path], SubsetDescriptor]:
    rng = np.random.default_rng(0)
    ids, splits, names, labels = [], [], [], []
    for subset, background in {**TRAIN, **OOD}.items():
        cls = subset.split("(")[0]
        parts = [("train", N_TRAIN), ("id_val", N_EVAL)] if subset in TRAIN else [("test", N_EVAL)]
        for split, n in parts:
            for k in range(n):
                example = f"{subset}-{split}-{k}"
                Image.fromarray(_image(cls, background, rng)).save(root / f"{example}.png")
                ids.append(example)
                splits.append(split)
                names.append(subset)
                labels.append(0 if cls == "cat" else 1)
    order = np.argsort(ids)
    ids = [ids[k] for k in order]
    group_names = sorted(set(names))
    group = np.array([group_names.index(names[k]) for k in order])
    y = np.array([labels[k] for k in order])
    table = SplitTable(
        "constructed", "v1", ids, np.array([splits[k] for k in order]), y, group, group_names, ["cat", "dog"],
        np.stack([group, y], axis=1), ["group", "y"], [group_names, ["0", "1"]],
    )  # fmt: skip
    subsets = [Subset(s, s.split("(")[0], "train", 0) for s in TRAIN] + [
        Subset(s, s.split("(")[0], "ood", 0) for s in OOD
    ]
    descriptor = SubsetDescriptor("group", "train", {"id_val": "in_domain", "test": "out_of_domain"}, tuple(subsets))
    return table, [root / f"{i}.png" for i in ids], descriptor


# Plain SGD: a step's loss change then depends on its own batch only (Adam's moments carry earlier batches into it).
CONFIG = {"model": "mlp", "image_size": SIZE, "batch_size": 32, "max_iters": 150, "eval_every": 50,
          "optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "patience": 0, "device": "cpu", "threads": 1,
          "checkpoint_every": 0}  # fmt: skip


@pytest.fixture(scope="module")
def constructed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SplitTable, list[Path], SubsetDescriptor]:
    return _constructed(tmp_path_factory.mktemp("constructed"))


def _train(constructed: tuple[SplitTable, list[Path], SubsetDescriptor], out: Path, **extra: object):  # type: ignore[no-untyped-def]
    table, paths, descriptor = constructed
    config = TrainConfig.from_mapping({**CONFIG, **extra})
    return train(table, paths, config, out, lambda _line: None, subsets=descriptor)


def test_the_tracked_regression_finds_the_planted_conflicts_and_no_other(
    constructed: tuple[SplitTable, list[Path], SubsetDescriptor], tmp_path: Path
) -> None:
    result = _train(constructed, tmp_path / "a", track_conflicts=True)
    assert result.conflicts is not None
    table = pl.DataFrame(result.conflicts)
    assert table.height == len(TRAIN) * (len(TRAIN) + len(OOD))
    assert set(table["steps"]) == {CONFIG["max_iters"]}
    in_domain = table.filter(pl.col("evaluation_domain") == "in_domain").with_columns(
        t=pl.col("coefficient") / pl.col("std_error")
    )
    pairs = {(r["training_subset"], r["evaluation_subset"]): r for r in in_domain.iter_rows(named=True)}
    planted = [("cat(A)", "dog(A)"), ("dog(A)", "cat(A)")]
    # The planted pairs are the two strongest conflicts of the grid, each the most negative of its column ...
    strongest = in_domain.sort("t").head(2)
    assert sorted(zip(strongest["training_subset"], strongest["evaluation_subset"], strict=True)) == planted
    assert all(pairs[pair]["normalized_coefficient"] == -1.0 and pairs[pair]["t"] < -4 for pair in planted)
    # ... and the neutral subsets neither help nor hurt the context subsets (|t| < 2).
    neutral = in_domain.filter(
        ~pl.col("training_subset").str.contains("A") & pl.col("evaluation_subset").str.contains("A")
    )
    assert neutral.height == 8 and neutral["t"].abs().max() < 2, neutral
    # Deterministic on CPU: a second tracked run gives the same coefficients, bit for bit.
    again = _train(constructed, tmp_path / "b", track_conflicts=True)
    assert again.conflicts == result.conflicts


def test_tracking_leaves_the_weights_as_they_are(
    constructed: tuple[SplitTable, list[Path], SubsetDescriptor], tmp_path: Path
) -> None:
    # A model with batch norm and a run with augmentation: the shadow evaluation touches neither statistics nor
    # generators of the live run.
    extra = {"model": "small_cnn", "optimizer": "adam", "lr": 1e-3, "augment": "flip_rot90", "max_iters": 25}
    tracked = _train(constructed, tmp_path / "tracked", track_conflicts=True, **extra)
    plain = _train(constructed, tmp_path / "plain", **extra)
    assert plain.conflicts is None
    assert tracked.weights_sha256 == plain.weights_sha256
    assert [(m.eval_split, m.metric, m.value) for m in tracked.metrics] == [
        (m.eval_split, m.metric, m.value) for m in plain.metrics
    ]


# -- the command line: bad inputs are one line, exit 2, and publish nothing --------------------------------------
BAD_TRACKING = [
    (["--set", "track_conflicts=true"], "parameter 'track_conflicts': sprites-uniform carries no subsets to track"),
    (
        ["--set", "track_conflicts=true", "--set", "lr_grid=1e-3,1e-4"],
        "parameter 'track_conflicts': tracks one training run: it cannot be combined with a learning-rate grid",
    ),
    (["--set", "track_conflicts=sometimes"], "parameter 'track_conflicts': expected bool, got 'sometimes'"),
]


@pytest.fixture(scope="module")
def sprites_home(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A warehouse with sprites-uniform published: a split without subsets (nothing is ever trained in it)."""
    from .conftest import small_sprites_home

    return small_sprites_home(tmp_path_factory.mktemp("tracking_home"), "sprites-uniform")


@pytest.mark.parametrize(("args", "message"), BAD_TRACKING, ids=["no-subsets", "lr-grid", "not-a-bool"])
def test_track_conflicts_on_a_split_without_subsets_is_one_line(
    args: list[str], message: str, sprites_home: Settings, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from shiftbench.pipelines.cli import main

    settings = sprites_home
    monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
    runs_before = sorted((settings.store_dir).rglob("erm_runs.parquet"))
    assert main(["train", "sprites-uniform", "--preset", "smoke", *args, "--in-process"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted((settings.store_dir).rglob("erm_runs.parquet")) == runs_before == []


def test_the_conflict_zones_query_keeps_strong_measurable_conflicts_with_class_and_context() -> None:
    import duckdb

    from shiftbench.families.registry import analyses
    from shiftbench.metashift.figures import training_conflicts

    rows = [  # (training subset, evaluation subset, domain, coefficient, normalised, standard error)
        ("cat(sofa)", "dog(sofa)", "in_domain", -0.04, -1.0, 0.01),  # strong, measurable, one context
        ("cat(sofa)", "cat(bed)", "in_domain", -0.02, -0.6, 0.005),  # within the class
        ("dog(truck)", "dog(grass)", "out_of_domain", -0.03, -0.9, 0.02),  # strong but t = -1.5: left out
        ("dog(bed)", "cat(sofa)", "in_domain", -0.01, -0.4, 0.001),  # measurable but weak: left out
        ("dog(bed)", "dog(sofa)", "in_domain", 0.05, 1.0, 0.01),  # helps
    ]
    conflicts = pl.DataFrame(
        [
            {"benchmark": "metashift-conflicts@generated", "run": "r", "version": "v", "split_version": "s",
             "training_subset": a, "training_class": a.split("(")[0], "evaluation_subset": b,
             "evaluation_class": b.split("(")[0], "evaluation_domain": d, "coefficient": c,
             "normalized_coefficient": n, "std_error": e}
            for a, b, d, c, n, e in rows
        ]
    )  # fmt: skip
    runs = pl.DataFrame({"run": ["r"], "version": ["v"], "image_source": ["standin"]})
    con = duckdb.connect()
    con.register("erm_training_conflicts", conflicts.to_arrow())
    con.register("erm_runs", runs.to_arrow())
    got = con.sql(analyses()["metashift-training-conflicts"].sql()).pl()
    assert got.select("training_subset", "evaluation_subset", "same_class", "shared_context").rows() == [
        ("cat(sofa)", "dog(sofa)", False, "sofa"),
        ("cat(sofa)", "cat(bed)", True, None),
    ]
    assert set(got["data_tag"]) == {"generated"} and set(got["image_source"]) == {"standin"}
    assert got["t_value"].to_list() == pytest.approx([-4.0, -4.0])
    assert training_conflicts(got, "t")[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tracked_run_on_the_shipped_conflicts_task_publishes_the_table_and_the_heatmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's path: build metashift-conflicts on the embedded generated sample, train with tracking from the
    command line (stand-in images), query the strongest conflicts in DuckDB; untracked, the run is the same run."""
    from shiftbench.erm.launch import CONFLICTS_FIGURE, plan_run
    from shiftbench.pipelines.cli import main
    from shiftbench.store import Store
    from shiftbench.store.contracts import failures
    from shiftbench.warehouse.publishing import check_staged

    monkeypatch.setenv("SHIFTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    assert main(["build", "metashift", "--benchmark", "metashift-conflicts@generated"]) == 0
    capsys.readouterr()
    # Too short to separate 26 training subsets: known from the config, so refused before a step (issue 48).
    short = ["train", "metashift-conflicts@generated", "--preset", "smoke", "--set", "max_iters=20"]
    assert main([*short, "--set", "track_conflicts=true"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: parameter 'max_iters': 20 tracked intervals cannot separate 26 training subsets: train more than 26 "
        "steps (times track_every)\n"
    ), err
    assert not (tmp_path / "home" / "runs").exists()  # nothing trained
    args = ["train", "metashift-conflicts@generated", "--preset", "smoke", "--set", "max_iters=40"]
    assert main([*args, "--set", "eval_every=20", "--set", "track_conflicts=true", "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "Training conflicts: heatmap " in out and "erm_training_conflicts WHERE run = " in out, out
    heatmap = Path(re.search(r"heatmap (\S+)", out).group(1))  # type: ignore[union-attr]
    assert heatmap.name == CONFLICTS_FIGURE and heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = re.search(r"\[train\] (\S+) version (\S+)", out)
    assert run is not None
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(tmp_path / "home")})
    staged = Store(settings.store_dir).layout.staged("erm", run.group(1), run.group(2))
    assert "erm_training_conflicts" in staged.tables
    assert not failures(check_staged(staged))  # every contract, erm_training_conflicts' included
    query = (
        "SELECT count(*) AS cells, count(DISTINCT training_subset) AS rows, count(DISTINCT evaluation_subset) AS "
        f"columns, max(steps) AS steps FROM erm_training_conflicts WHERE run = '{run.group(1)}'"
    )
    assert main(["sql", query, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{26 * 48},26,48,40"
    # The run's page in the UI shows the heatmap (the published asset's materialization metadata).
    import dagster as dg

    with dg.DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        record = instance.fetch_materializations(dg.AssetKey(["erm", "metashift_task_baseline"]), limit=1).records[0]
    assert record.asset_materialization is not None
    shown = record.asset_materialization.metadata["training_conflicts"]
    assert isinstance(shown, dg.MarkdownMetadataValue) and "data:image/png;base64," in shown.value
    history = f"SELECT count(*), count(DISTINCT weights_sha256) FROM erm_runs_history WHERE run = '{run.group(1)}'"
    assert main(["sql", history, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "1,1"
    # Untracked, it is the same run (its name) training the same thing (every setting but the tracking's), so with
    # the same weights (tracking changes none: test_tracking_leaves_the_weights_as_they_are, on train(), which the
    # job hands the subsets only when tracking) and another version (its tables lack erm_training_conflicts).
    values = {"max_iters": 40, "eval_every": 20}
    plain = plan_run(settings, "metashift-conflicts@generated", preset="smoke", overrides=values)
    tracked = plan_run(
        settings, "metashift-conflicts@generated", preset="smoke", overrides={**values, "track_conflicts": True}
    )
    assert tracked.run == plain.run == run.group(1)
    assert {k: v for k, v in tracked.config.items() if k not in ("track_conflicts", "track_every")} == plain.config
    assert (tracked.config["track_conflicts"], tracked.config["track_every"]) == (True, 1)  # after every step


def test_the_lean_job_and_the_gpu_bench_import_nothing_a_plain_torch_image_lacks() -> None:
    """``python -m shiftbench.erm.job`` (and bench/bench_conflicts.py, bench/bench_erm.py) run where only torch,
    numpy, pyarrow and Pillow are installed (a GPU image): polars, duckdb, dagster, pydantic and yaml are blocked."""
    import subprocess
    import sys

    blocked = ("polars", "duckdb", "dagster", "pydantic", "yaml", "networkx", "scipy")
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "sys.path.insert(0, 'bench')\n"
        "import shiftbench.erm.job, bench_conflicts, bench_erm\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


USER_SPEC = """family: metashift
tasks:
  pets-conflicts:
    kind: conflicts
    classes: [cat, dog]
    train_subsets: 8
    ood_subsets: 4
    images_per_subset: 30
    id_eval_share: 0.2
"""


def test_the_figure_4_workflow_on_a_users_own_tag_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/metashift.md's workflow as written: a user's image -> tag table and a conflicts task of their own in a
    spec file, built, trained with tracking (stand-in images), the strongest conflicts and the zones queried."""
    from shiftbench.pipelines.cli import main
    from shiftbench.sources.generated_scenes import generate_scene_tables

    objects, _, _ = generate_scene_tables()
    objects.select("image_id", pl.col("name").alias("tag")).unique().sort("image_id", "tag").write_parquet(
        tmp_path / "tags.parquet"
    )
    (tmp_path / "my_conflicts.yaml").write_text(USER_SPEC)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("SHIFTBENCH_TAGS_TABLE", str(tmp_path / "tags.parquet"))
    monkeypatch.setenv("SHIFTBENCH_METASHIFT_SPECS", str(tmp_path / "my_conflicts.yaml"))
    assert main(["build", "metashift", "--benchmark", "pets-conflicts"]) == 0
    capsys.readouterr()
    train = ["train", "pets-conflicts", "--preset", "smoke", "--image-root", "standin", "--set", "max_iters=30"]
    assert main([*train, "--set", "track_conflicts=true", "--set", "optimizer=sgd", "--set", "momentum=0"]) == 0
    assert "Training conflicts: heatmap" in capsys.readouterr().out
    strongest = (
        "SELECT training_subset, evaluation_subset, evaluation_domain, round(normalized_coefficient, 2) AS normalized "
        "FROM erm_training_conflicts WHERE benchmark = 'pets-conflicts' ORDER BY normalized_coefficient LIMIT 5"
    )
    assert main(["sql", strongest, "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "training_subset,evaluation_subset,evaluation_domain,normalized" and len(lines) == 6
    assert float(lines[1].split(",")[-1]) == -1.0  # the strongest conflict of its column
    assert main(["analyse", "metashift-training-conflicts"]) == 0
    capsys.readouterr()
    zones = "SELECT count(*) FILTER (normalized_coefficient > -0.5 OR t_value > -2) FROM analysis_metashift_conflicts"
    assert main(["sql", zones, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "0"


def test_track_every_closes_intervals_and_an_interrupted_tracked_run_resumes_to_the_same_table(
    constructed: tuple[SplitTable, list[Path], SubsetDescriptor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shiftbench.erm import resume
    from shiftbench.erm.interrupt import TEST_HOOK, Interrupted, stop_requests
    from shiftbench.erm.run import Resumable

    table, paths, descriptor = constructed
    config = TrainConfig.from_mapping({**CONFIG, "max_iters": 40, "track_conflicts": True, "track_every": 3})
    whole = train(table, paths, config, tmp_path / "whole", lambda _line: None, subsets=descriptor)
    assert whole.conflicts is not None
    # 13 intervals of 3 steps and the last step alone: 14 regression rows over the 40 steps.
    assert set(whole.conflicts["intervals"]) == {14} and set(whole.conflicts["steps"]) == {40}
    assert set(whole.conflicts["track_every"]) == {3}

    checkpoints = resume.Checkpoints(tmp_path / "resume", {"run": "constructed"})
    monkeypatch.setenv(TEST_HOOK, "17")  # stopped after step 17: inside an interval (15..18)
    with stop_requests() as stop, pytest.raises(Interrupted):
        train(table, paths, config, tmp_path / "a", lambda _line: None, subsets=descriptor,
              resumable=Resumable(checkpoints, stop, 0, "constructed seed 0"))  # fmt: skip
    monkeypatch.delenv(TEST_HOOK)
    saved = checkpoints.load()
    assert saved is not None and saved[0]["iteration"] == 17
    with stop_requests() as stop:
        again = train(table, paths, config, tmp_path / "a", lambda _line: None, subsets=descriptor,
                      resumable=Resumable(checkpoints, stop, 0, "constructed seed 0", saved[0]))  # fmt: skip
    assert again.resumed_from == 17 and again.weights_sha256 == whole.weights_sha256
    assert again.conflicts == whole.conflicts


def test_track_every_without_tracking_is_one_line() -> None:
    with pytest.raises(InputError, match="applies only with track_conflicts=true") as error:
        TrainConfig.from_mapping({"track_every": 2})
    assert error.value.parameter == "track_every"
    assert "track_every" not in TrainConfig.from_mapping({}).as_dict()  # recorded only when tracking

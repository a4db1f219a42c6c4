"""The Python front door: the README's example runs verbatim, ``evaluate`` gives ``shiftbench eval``'s
numbers, the dataset yields the training job's items, and bad inputs are one InputError naming them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest

import shiftbench
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, StoreError
from shiftbench.pipelines.cli import main

from .conftest import PROJECT, small_sprites_home

CASE = "sprites-sc-object_color"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("api_home")
    small_sprites_home(home, CASE)
    return home


def test_the_readme_s_python_example_runs_verbatim(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (PROJECT / "README.md").read_text("utf-8")
    block = re.search(r"<!-- python-example[^>]*-->\n```python\n(.*?)```\n<!-- end python-example -->", readme, re.S)
    assert block is not None
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    exec(compile(block[1], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith(f"{CASE} ") and "['id_val', 'test', 'train']" in out
    assert "acc_wg" in out and "y=0,object_color=" in out


def _fresh_process_modules(home: Path, then: str) -> list[str]:
    """The modules a researcher's script has imported after ``load_split`` and ``then``, in a fresh process."""
    code = (
        "import json, sys\nimport shiftbench\nsplit = shiftbench.load_split(sys.argv[1], home=sys.argv[2])\n"
        f"assert split.examples.height\n{then}\nprint(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code, CASE, str(home)], capture_output=True, text=True, check=True)
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


# Never imported to read or score a split: training, the typed registry of families and the families' shared build
# code, publishing and the catalog, the contracts (the store verifies files; contracts are for checks).
NOT_FOR_READING = ("shiftbench.erm", "shiftbench.families", "shiftbench.warehouse", "shiftbench.store.contracts")
HEAVY = ("numba", "scipy", "networkx", "pandas", "duckdb", "torch")


@pytest.mark.parametrize(
    ("then", "family_modules"),
    [
        ("", ["shiftbench.breeds.settings", "shiftbench.conds.settings", "shiftbench.metashift.settings"]),
        (
            "test = split.examples.filter(split.examples['split'] == 'test')\n"
            "scores = split.evaluate(test['y'].to_numpy(), 'test', group_by=['y'])\nassert scores.height",
            [
                "shiftbench.breeds.settings",
                "shiftbench.conds.settings",
                "shiftbench.conds.shift_subsets",
                "shiftbench.metashift.settings",
            ],
        ),
    ],
    ids=["load_split", "evaluate"],
)
def test_load_split_and_evaluate_read_down_the_layers_and_import_no_family(
    home: Path, then: str, family_modules: list[str]
) -> None:
    """API -> split reader -> store, in a fresh process as a researcher's script runs: ``load_split(...).examples``
    and ``Split.evaluate`` import of a family only its settings model (the settings validate every family's, small
    pydantic modules) and, to score, the subsets module its registry entry declares (ConDS' ``shift_subsets``:
    polars and numpy): nothing of training, the registry of families, publishing, the catalog or the contracts,
    and none of numba, scipy, networkx, pandas, duckdb or torch (issue 50)."""
    modules = _fresh_process_modules(home, then)
    packages = ("shiftbench.breeds", "shiftbench.metashift", "shiftbench.conds")
    assert [m for m in modules if m.startswith(packages) and m not in packages] == family_modules
    assert [m for m in modules if m.startswith(NOT_FOR_READING)] == []
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []


def test_evaluate_gives_shiftbench_eval_s_numbers(home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    split = shiftbench.load_split(CASE)
    test = split.examples.filter(pl.col("split") == "test")
    y_pred = (test["y"].to_numpy() + (np.arange(test.height) % 3 == 0)) % 3  # a third wrong
    ours = split.evaluate(y_pred, "test", group_by=["y", "object_color"])
    test.select("example_id", pl.Series("y_pred", y_pred)).write_parquet(tmp_path / "p.parquet")
    scored = ["eval", CASE, str(tmp_path / "p.parquet"), "--method", "third-wrong", "--group-by", "y,object_color"]
    assert main(scored) == 0
    with duckdb.connect(str(Settings.from_env().catalog_path), read_only=True) as con:
        cli = con.sql('SELECT eval_split, metric, "group", value FROM eval_results').pl()
    joined = ours.join(cli, on=["eval_split", "metric", "group"], how="full", nulls_equal=True, suffix="_cli")
    assert joined.height == ours.height == cli.height
    assert (joined["value"].fill_null(-1) - joined["value_cli"].fill_null(-1)).abs().max() == 0  # type: ignore[operator]
    assert ours.filter(pl.col("metric") == "acc_avg")["value"][0] == pytest.approx(1 - 270 / 810)


def test_the_dataset_yields_the_training_job_s_items(home: Path) -> None:
    split = shiftbench.load_split(CASE, home=home)
    train = split.dataset("train")
    x, y, metadata = train[0]
    first = split.examples.filter(pl.col("split") == "train").row(0, named=True)
    assert tuple(x.shape) == (3, 64, 64) and int(y) == first["y"] and int(metadata[1]) == first["y"]
    assert len(train) == split.examples.filter(pl.col("split") == "train").height
    half = split.dataset("train", transform=lambda t: t[:, ::2, ::2], image_size=32)
    assert tuple(half[0][0].shape) == (3, 16, 16)
    assert split.version in split.card and split.family == "conds"


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda h: shiftbench.load_split("nope", home=h), "no published benchmark 'nope'"),
        (lambda h: shiftbench.load_split(CASE, "0000000000000000", home=h), "has no version '0000000000000000'"),
        (lambda h: shiftbench.load_split(CASE, home=h).evaluate([0, 1], "test"), "parameter 'y_pred': y_pred must be"),
        (lambda h: shiftbench.load_split(CASE, home=h).evaluate(np.zeros(810), "test"), "integer class indices"),
        (lambda h: shiftbench.load_split(CASE, home=h).evaluate(np.zeros(810, int), "tset"), "no split 'tset'"),
        (lambda h: shiftbench.load_split(CASE, home=h).evaluate(np.zeros(810, int), "test", ["colour"]), "'colour'"),
        (lambda h: shiftbench.load_split(CASE, home=h).dataset("val"), "no split 'val'"),
        # the CLI refuses a label outside 0..K-1; so does the API, never scoring it as a wrong prediction
        (lambda h: _evaluate(h, np.full(810, 3)), "parameter 'y_pred': y_pred[0] = 3 (example"),
        (lambda h: _evaluate(h, np.full(810, -1)), "parameter 'y_pred': y_pred[0] = -1"),
        (lambda h: _evaluate(h, np.full(810, 2**64 - 1, dtype=np.uint64)), "y_pred[0] = 18446744073709551615"),
        (lambda h: _evaluate(h, [0] * 809 + [2**63 + 1]), "y_pred[809] = 9223372036854775809"),
        (lambda h: _evaluate(h, [0] * 809 + [2**70]), "y_pred[809] = 1180591620717411303424"),
        (lambda h: _evaluate(h, np.full(810, 2**32 + 1)), "y_pred[0] = 4294967297 "),
        (lambda h: _evaluate(h, [[0, 1], [0]]), "parameter 'y_pred'"),
        (lambda h: shiftbench.load_split(None, home=h), "parameter 'name': must be a string, got None"),
        (lambda h: shiftbench.load_split(7, home=h), "parameter 'name': must be a string, got 7"),
        (lambda h: shiftbench.load_split("../conds", home=h), "parameter 'name': invalid benchmark name"),
        (lambda h: shiftbench.load_split(CASE, 7, home=h), "parameter 'version': must be a string, got 7"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by=[None]), "parameter 'group_by': every field must"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by="y,,size"), "parameter 'group_by': every field must"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by=""), "parameter 'group_by': every field must"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by=5), "parameter 'group_by': must be a list"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by="y,colour"), "parameter 'group_by': 'colour' is not a"),
        (lambda h: _evaluate(h, np.zeros(810, int), group_by=["y", "colour"]), "parameter 'group_by': 'colour'"),
    ],
)
def test_bad_input_is_one_input_error(home: Path, call: Any, fragment: str) -> None:
    with pytest.raises(InputError, match=re.escape(fragment)):
        call(home)


def _evaluate(home: Path, y_pred: Any, group_by: Any = None) -> pl.DataFrame:
    return shiftbench.load_split(CASE, home=home).evaluate(y_pred, "test", group_by=group_by)


def test_a_comma_string_groups_as_the_cli_s_group_by_never_by_its_characters(home: Path) -> None:
    split = shiftbench.load_split(CASE, home=home)
    y_pred = split.examples.filter(pl.col("split") == "test")["y"].to_numpy()
    listed = split.evaluate(y_pred, "test", group_by=["y", "object_color"])
    assert split.evaluate(y_pred, "test", group_by="y, object_color").equals(listed)
    assert listed.filter(pl.col("metric") == "acc_wg")["group"][0].startswith("y=")


def test_scoring_refuses_a_label_outside_the_classes_whoever_built_the_predictions(home: Path) -> None:
    """The guard sits in :func:`score` itself, under the CLI's file reader and the API's checks."""
    from shiftbench.splits.evaluation import Predictions, score
    from shiftbench.splits.published import published_split

    split = published_split(Settings.from_env({"SHIFTBENCH_HOME": str(home)}), CASE)
    ids = split.examples.filter(pl.col("split") == "test")["example_id"]
    frame = pl.DataFrame({"row": range(ids.len()), "example_id": ids, "y_pred": [0] * (ids.len() - 1) + [3]})
    with pytest.raises(InputError, match=re.escape(f"example {ids[-1]!r}: y_pred 3 is not a class in 0..2")):
        score(split, Predictions(frame, Path("p.parquet")))


@pytest.mark.parametrize("damaged", ["examples.parquet", "conds_examples.parquet", "files/card.md"])
def test_a_version_whose_file_fails_its_checksum_is_not_served(home: Path, tmp_path: Path, damaged: str) -> None:
    """One flipped byte, the size unchanged (what a size check misses): the tables are checked before anything
    is read, the card when it is read."""
    copy = tmp_path / "home"
    shutil.copytree(home, copy)
    target = shiftbench.load_split(CASE, home=copy).path / damaged
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=re.escape(f"{target}: checksum mismatch")):
        assert shiftbench.load_split(CASE, home=copy).card


def test_a_run_trained_with_group_by_reports_the_groups_eval_names_and_they_join(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One Grouper: GroupDRO trained over (y, object_color) reports its per-group metrics over those groups;
    the same model's test predictions scored with ``shiftbench eval --group-by y,object_color`` give the
    same rows, group names and values."""
    import torch

    from shiftbench.erm import launch
    from shiftbench.erm.config import TrainConfig
    from shiftbench.erm.data import Batches, normalize
    from shiftbench.erm.models import build_model
    from shiftbench.splits.images import image_paths
    from shiftbench.splits.split_table import read_split

    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    settings = Settings.from_env()
    overrides = {"group_by": "y,object_color", "method": "groupdro", "max_iters": 20, "eval_every": 10}
    plan = launch.plan_run(settings, CASE, preset="smoke", seed=0, overrides=overrides)
    outcome, summary = launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=print)
    assert summary["training_groups"][0] == "y=0,object_color=blue" and len(summary["training_groups"]) == 9

    config = TrainConfig.from_mapping(plan.config)
    table = read_split(plan.split_dir)
    model = build_model(config.model, table.num_classes, config.image_size)
    model.load_state_dict(torch.load(outcome.staged.path / outcome.staged.manifest()["weights"]["file"]))
    model.eval()
    rows = table.indices("test")
    paths = image_paths(table.example_ids, plan.images.root, plan.images.template)
    images = Batches(paths, config, torch.device("cpu"), np.arange(len(paths)))(torch.from_numpy(rows))
    with torch.inference_mode():
        y_pred = model(normalize(images, channels_last=False, kind=config.normalization)).argmax(1).numpy()
    ids = [table.example_ids[r] for r in rows]
    pl.DataFrame({"example_id": ids, "y_pred": y_pred}).write_parquet(tmp_path / "same.parquet")
    scored = ["eval", CASE, str(tmp_path / "same.parquet"), "--method", "same-model", "--group-by", "y,object_color"]
    assert main(scored) == 0

    def rows_of(table_name: str, key: str) -> dict[tuple[str, str | None], float]:
        with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
            frame = con.sql(
                f"SELECT metric, \"group\", value FROM {table_name} WHERE {key} AND eval_split = 'test' "
                "AND (metric LIKE '%_group:%' OR metric IN ('acc_avg', 'acc_wg', 'count'))"
            ).pl()
        return {(r["metric"], r["group"]): r["value"] for r in frame.iter_rows(named=True)}

    trained = rows_of("erm_results", f"run = '{plan.run}'")
    evaluated = rows_of("eval_results", "method = 'same-model'")
    assert trained.keys() == evaluated.keys() and len(trained) == 3 + 2 * 9
    assert all(trained[k] == pytest.approx(evaluated[k]) for k in trained)

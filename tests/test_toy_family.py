"""A family is one package and one registry line: the test family of ``tests/toy_family`` registers itself and
gets assets, checks, partitions, catalog views, the CLI, cards and an ERM run, with no edit to shared code."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from shiftbench.config.settings import Settings
from shiftbench.families import registry
from shiftbench.store import Store

from .toy_family import TOY

warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")


@pytest.fixture
def toy() -> Iterator[None]:
    registry.register(TOY)  # the one registry line
    try:
        yield
    finally:
        registry.unregister(TOY.name)


def test_its_settings_are_its_own_and_bad_values_name_the_variable(toy: None) -> None:
    from shiftbench.errors import InputError

    from .toy_family import ToySettings

    assert Settings.from_env({"SHIFTBENCH_TOY_PER_CELL": "5"}).of(ToySettings).toy_per_cell == 5
    assert Settings.from_env({}).of(ToySettings).toy_per_cell == 16
    with pytest.raises(InputError, match="SHIFTBENCH_TOY_PER_CELL"):
        Settings.from_env({"SHIFTBENCH_TOY_PER_CELL": "two"}).of(ToySettings)


def test_the_code_location_gives_it_assets_checks_partitions_and_jobs(
    toy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from shiftbench.pipelines.definitions import build_definitions

    monkeypatch.setenv("SHIFTBENCH_TOY_PER_CELL", "6")
    definitions = build_definitions()
    graph = definitions.resolve_asset_graph()
    staged = graph.get(dg.AssetKey(["toy", "staged_split"]))
    assert {c.name for c in staged.check_keys} == {"contract_benchmarks", "contract_examples", "contract_toy_cells"}
    assert isinstance(staged.partitions_def, dg.DynamicPartitionsDefinition)
    assert graph.get(dg.AssetKey(["raw", "toy_generator"])).is_observable
    assert graph.get(dg.AssetKey(["toy", "split"])).parent_keys == {staged.key}
    jobs = {job.name for job in definitions.resolve_all_job_defs()}
    assert {"toy_inputs", "toy_splits"} <= jobs
    resource = definitions.resources["settings"]  # type: ignore[index]
    assert "toy_per_cell" in type(resource).model_fields  # bound to EnvVar("SHIFTBENCH_TOY_PER_CELL") in a run
    settings = type(resource)(toy_per_cell="6").get()
    assert settings.of(TOY.settings).toy_per_cell == 6  # type: ignore[arg-type]


@pytest.mark.slow
def test_build_query_card_and_train_through_the_cli(
    toy: None, cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    settings = cli_env(SHIFTBENCH_TOY_PER_CELL="8")
    assert main(["build", "toy"]) == 0
    out = capsys.readouterr().out
    assert "2 published" in out, out
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        rows = con.sql("SELECT benchmark, n_examples FROM benchmarks WHERE family = 'toy' ORDER BY 1").fetchall()
        assert rows == [("toy-blue", 72), ("toy-red", 72)]
        cells = con.sql("SELECT sum(n) FROM toy_cells WHERE benchmark = 'toy-red' AND split = 'test'").fetchall()
        assert cells == [(24,)]
    latest = Store(settings.store_dir).log.latest("toy-red")
    assert latest is not None
    files = Store(settings.store_dir).layout.staged("toy", "toy-red", latest.version).path / "files"
    assert "Toy split" in (files / "card.md").read_text()
    assert json.loads((files / "croissant.json").read_text())["name"]

    assert main(["train", "toy-red", "--preset", "smoke", "--set", "max_iters=4", "--set", "eval_every=2"]) == 0
    assert "[train] toy-red" in capsys.readouterr().out
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        metrics = con.sql("SELECT DISTINCT eval_split FROM erm_results WHERE benchmark = 'toy-red' ORDER BY 1")
        assert [row[0] for row in metrics.fetchall()] == ["id_val", "test", "train"]


def test_unregistered_it_is_gone(toy: None) -> None:
    registry.unregister(TOY.name)
    try:
        assert "toy" not in registry.names()
        from shiftbench.store.contracts import contracts

        assert "toy_cells" not in contracts()
    finally:
        registry.register(TOY)
    from shiftbench.store.contracts import contracts

    assert "toy_cells" in contracts()


def test_the_package_is_its_only_place(toy: None) -> None:
    """Nothing outside tests/toy_family names the family."""
    project = Path(__file__).parents[1]
    named = [
        str(path.relative_to(project))
        for folder in ("shiftbench", "assets", "pipelines")
        for path in (project / folder).rglob("*")
        if path.is_file() and path.suffix in {".py", ".sql", ".yaml"} and "toy_cells" in path.read_text("utf-8")
    ]
    assert named == []


def test_shared_library_code_names_no_family() -> None:
    """Outside the family packages and the registry (the built-in families' entries), the library says no family's
    name in code (its docstrings and comments may use them as examples) and imports no family package."""
    import ast
    import re

    project = Path(__file__).parents[1]
    names = sorted(registry.names())
    said = re.compile(rf"(?<![a-z])({'|'.join(names)})(?![a-z])")  # conds_cells too
    packages = tuple(f"shiftbench.{name}." for name in names)
    shared = [p for p in (project / "shiftbench").glob("*.py") if p.name != "family_registry.py"]
    for folder in (project / "shiftbench" / "erm", project / "shiftbench" / "exports", project / "assets"):
        shared += folder.glob("*.py")
    found = []
    for path in shared:
        tree = ast.parse(path.read_text("utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            where = f"{path.relative_to(project)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if said.search(node.value):
                    found.append(f"{where}: {node.value[:60]!r}")
            elif isinstance(node, ast.ImportFrom) and f"{node.module}.".startswith(packages):
                found.append(f"{where}: imports {node.module}")
    assert found == []

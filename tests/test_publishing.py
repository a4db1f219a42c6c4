"""Publishing has one owner, :mod:`shiftbench.warehouse.publishing`: stage -> check -> publish -> catalog refresh.

- Read with ``ast``: no module of shiftbench/, assets/ or pipelines/ but the owner (and the store and catalog that
  it drives) stages, records a check, publishes or refreshes the catalog itself; the check is unit-tested on a small
  tree with planted calls, so a check that stopped seeing them would fail here.
- Through the owner's one-call path: a version that breaks a contract is one line naming the rule, nothing is
  published and the previous latest stays latest, in the store and in the catalog; a passing one is published and
  is in the catalog at once.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import ContractViolation
from shiftbench.store import Store
from shiftbench.warehouse.catalog import open_catalog
from shiftbench.warehouse.publishing import stage_check_publish

from .conftest import PROJECT, ToyDir, toy_tables
from .test_structure import _tree, read_sources

# (the part of the store, its method) that only the owner calls; and the catalog refresh it runs after publishing
OWNER_ONLY = {("writer", "stage"), ("checks", "record_check"), ("log", "publish")}
REFRESH = "refresh_and_report"
OWNERS = {"shiftbench.warehouse.publishing", "shiftbench.warehouse.catalog"}  # the catalog defines the refresh


def _owned(module: str) -> bool:
    return module in OWNERS or module == "shiftbench.store" or module.startswith("shiftbench.store.")


def _bypass(call: ast.Call) -> str | None:
    func = call.func
    part = func.value.attr if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) else None
    if isinstance(func, ast.Attribute) and (part, func.attr) in OWNER_ONLY:
        return f"{part}.{func.attr}"
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name if name == REFRESH else None


def owner_bypasses(root: Path) -> list[str]:
    """``path:line: call`` for every call outside the owner that stages, records a check, publishes or refreshes."""
    found = []
    for module, source in sorted(read_sources(root).items()):
        if _owned(module):
            continue
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Call) and (what := _bypass(node)) is not None:
                found.append(f"{source.path.relative_to(root)}:{node.lineno}: {what}")
    return sorted(found)


def test_only_the_publishing_module_stages_publishes_and_refreshes_the_catalog() -> None:
    bypasses = owner_bypasses(PROJECT)
    assert not bypasses, "call shiftbench.warehouse.publishing instead:\n" + "\n".join(bypasses)


def test_a_call_around_the_owner_is_named_with_its_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/warehouse/publishing.py": "def p(store, staged):\n    return store.log.publish(staged)\n",
            "shiftbench/store/__init__.py": "",
            "shiftbench/store/log.py": "def q(self, staged):\n    return self.log.publish(staged)\n",
            "shiftbench/results.py": (
                "from shiftbench.warehouse.catalog import refresh_and_report\n\n\n"
                "def r(store, settings, staged, tables):\n"
                "    staged = Store(settings.store_dir).writer.stage('f', 'b', tables)\n"
                "    store.checks.record_check(staged, True, 1, [])\n"
                "    store.log.publish(staged)\n"
                "    refresh_and_report(settings.catalog_path, settings.store_dir)\n"
                "    store.log.latest('b')  # reading is anyone's\n"
            ),
            "assets/__init__.py": "",
            "assets/x.py": "from shiftbench import catalog\n\n\ndef s():\n    catalog.refresh_and_report(1, 2)\n",
            "pipelines/__init__.py": "",
        },
    )
    assert owner_bypasses(root) == [
        "assets/x.py:5: refresh_and_report",
        "shiftbench/results.py:5: writer.stage",
        "shiftbench/results.py:6: checks.record_check",
        "shiftbench/results.py:7: log.publish",
        "shiftbench/results.py:8: refresh_and_report",
    ]


def _catalog_versions(settings: Settings, benchmark: str) -> list[str]:
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        rows = con.execute("SELECT DISTINCT version FROM examples WHERE benchmark = ?", [benchmark]).fetchall()
    return sorted(str(row[0]) for row in rows)


def test_a_version_that_breaks_a_contract_is_one_line_and_nothing_is_published(
    make_settings: Callable[..., Settings], toy_breeds_dir: ToyDir
) -> None:
    settings = make_settings()
    toy = toy_breeds_dir()
    good = stage_check_publish(settings, "breeds", "toy", toy_tables(toy, seed=0), {})
    assert good.publication.changed_latest and _catalog_versions(settings, "toy") == [good.staged.version]

    tables = toy_tables(toy, seed=1)
    subpopulations = tables["breeds_subpopulations"]
    assert isinstance(subpopulations, pl.DataFrame)
    tables["breeds_subpopulations"] = subpopulations.with_columns(pl.lit("source").alias("domain"))  # no target
    store = Store(settings.store_dir)
    before = sorted(p.name for p in store.layout.versions_dir("breeds", "toy").iterdir())
    with pytest.raises(ContractViolation) as failed:
        stage_check_publish(settings, "breeds", "toy", tables, {})
    message = str(failed.value)
    assert message.startswith("toy breaks its contracts, not published: breeds_subpopulations.") and "\n" not in message
    latest = Store(settings.store_dir).log.latest("toy")
    assert latest is not None and latest.version == good.staged.version
    assert _catalog_versions(settings, "toy") == [good.staged.version]
    staged = sorted(p.name for p in store.layout.versions_dir("breeds", "toy").iterdir())
    assert len(staged) == len(before) + 1  # staged and recorded as failed, never published

    again = stage_check_publish(settings, "breeds", "toy", toy_tables(toy, seed=2), {})
    assert _catalog_versions(settings, "toy") == [again.staged.version]  # the catalog follows at once

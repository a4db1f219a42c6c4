"""The generated reference pages (docs/settings.md, docs/tables.md) match the settings model and the data
contracts: a field or contract changed without rerunning scripts/generate_docs.py fails here, naming the page."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shiftbench.config.settings import Settings, variable

from .conftest import PROJECT


def _generator() -> ModuleType:
    """scripts/generate_docs.py, imported by path (scripts/ is no package)."""
    path = PROJECT / "scripts" / "generate_docs.py"
    spec = importlib.util.spec_from_file_location("generate_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


@pytest.mark.parametrize("page", sorted(str(p) for p in GENERATE.pages()))
def test_the_committed_page_is_what_the_generator_writes(page: str) -> None:
    committed = (PROJECT / page).read_text(encoding="utf-8") if (PROJECT / page).is_file() else None
    expected = GENERATE.pages()[Path(page)]
    assert committed == expected, f"{page} is out of date: run `{GENERATE.COMMAND}` and commit the result"


def test_every_setting_and_every_contract_is_on_its_page() -> None:
    pages = GENERATE.pages()
    settings_page, tables_page = pages[GENERATE.SETTINGS_PAGE], pages[GENERATE.TABLES_PAGE]
    for name in Settings.model_fields:
        assert f"| `{variable(name)}` |" in settings_page
    assert "| `SHIFTBENCH_CHECK_MEMORY` |" in settings_page
    for table in GENERATE.contracts_module.contracts():
        assert f"\n## {table}\n" in tables_page


def test_the_output_is_deterministic() -> None:
    assert GENERATE.pages() == GENERATE.pages()


def test_check_names_the_drifted_page_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    for path, text in GENERATE.pages().items():
        (tmp_path / path).write_text(text, encoding="utf-8")
    monkeypatch.setattr(GENERATE, "PROJECT", tmp_path)
    assert GENERATE.main(["--check"]) == 0
    (tmp_path / GENERATE.TABLES_PAGE).write_text("# Tables\n", encoding="utf-8")
    assert GENERATE.main(["--check"]) == 1
    assert capsys.readouterr().err == f"docs/tables.md is out of date: run `{GENERATE.COMMAND}`\n"
    (tmp_path / GENERATE.SETTINGS_PAGE).unlink()
    assert GENERATE.drifted() == [GENERATE.SETTINGS_PAGE, GENERATE.TABLES_PAGE]
    assert GENERATE.main([]) == 0  # rewrites both
    assert GENERATE.drifted() == []

"""The folders of files the package reads at run time (``sql/``, ``data_contracts/``).

They sit at the repository's top level, where the design card puts them; the wheel maps them into the package
(``shiftbench/sql``, ``shiftbench/data_contracts``: pyproject.toml's ``package-dir``), so an installed copy finds
them inside ``shiftbench`` and a checkout (an editable install, or ``python -m`` from the repository) beside it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # shiftbench/, this file being in shiftbench/config/


def package_folder(name: str) -> Path:
    """``name`` inside the installed package, else at the top level of the checkout the package lives in."""
    inside = PACKAGE_DIR / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / name


SQL_DIR = package_folder("sql")
CONTRACTS_DIR = package_folder("data_contracts")

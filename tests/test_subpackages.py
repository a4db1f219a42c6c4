"""The package root as a map (issue 50): the root holds the front door only (``__init__``, the API, the errors),
the shared code lives in subpackages that each say in their docstring what lives there and what they may import,
and every import statement keeps to it; docs/architecture.md's map names the same subpackages and rules, and
every source path the docs name exists.

Read with ``ast``, like tests/test_structure.py (nothing here imports the project); each check is unit-tested on a
small tree with a planted violation.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from .test_structure import PROJECT, _by_place, _tree, _where, imported, read_sources

FRONT_DOOR = {"__init__.py", "api.py", "errors.py", "py.typed"}
DATA_FOLDERS = {"data"}  # package data, no Python
MAY_IMPORT = re.compile(r"^May import: (?P<names>[\w, ]+)\.$", re.M)
# A family's own package (its specs, settings and build), and the packages above the shared ones: they may import
# any shared subpackage (test_structure: no family imports another, nothing below training imports it).
TOP = {"breeds", "metashift", "conds", "erm", "exports"}


def declared_imports(root: Path) -> dict[str, list[str]]:
    """Each shared subpackage -> the subpackages its docstring says it may import (in its order)."""
    declared: dict[str, list[str]] = {}
    for init in sorted((root / "shiftbench").glob("*/__init__.py")):
        name = init.parent.name
        if name in TOP:
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text("utf-8"))) or ""
        found = MAY_IMPORT.search(docstring)
        declared[name] = [n.strip() for n in found["names"].split(",")] if found else []
    return declared


def undeclared_imports(root: Path) -> list[str]:
    """``file:line: module imports target`` for every import of a shiftbench subpackage (or root module) that the
    importing subpackage's docstring does not allow; a shared subpackage with no ``May import:`` line is named."""
    declared = declared_imports(root)
    sources = read_sources(root, ["shiftbench"])
    found = [f"shiftbench/{name}/__init__.py:1: no 'May import: ...' line" for name, d in declared.items() if not d]
    for source in sources.values():
        parts = source.module.split(".")
        if len(parts) < 2 or parts[1] not in declared:
            continue
        allowed = {parts[1], *declared[parts[1]]}
        for target, node in imported(source, set(sources)):
            target_parts = target.split(".")
            if target_parts[0] != "shiftbench" or len(target_parts) < 2:
                continue
            if target_parts[1] not in allowed:
                found.append(f"{_where(source, node, root)}: {source.module} imports {target}")
    return sorted(set(found), key=_by_place)


def root_modules(root: Path) -> list[str]:
    """What stands in the package root besides the front door and subpackages."""
    package = root / "shiftbench"
    return sorted(
        p.name
        for p in package.iterdir()
        if p.name not in FRONT_DOOR | DATA_FOLDERS
        and p.name != "__pycache__"
        and not (p.is_dir() and (p / "__init__.py").is_file())
    )


def order_of(declared: dict[str, list[str]]) -> list[str]:
    """The subpackages lowest first, as their declarations say (each may import exactly those before it)."""
    return sorted(declared, key=lambda name: len(declared[name]))


def test_the_root_holds_only_the_front_door_and_subpackages() -> None:
    assert root_modules(PROJECT) == []


def test_every_shared_subpackage_imports_only_what_its_docstring_allows() -> None:
    found = undeclared_imports(PROJECT)
    assert not found, "imports a subpackage's docstring does not allow ('May import: ...'):\n" + "\n".join(found)


def test_the_subpackages_form_one_order_each_allowed_what_is_below_it() -> None:
    """Each docstring's list is ``errors`` and every subpackage below it: one order, lowest first, no two at a level."""
    declared = declared_imports(PROJECT)
    order = order_of(declared)
    assert order[0] == "runtime" and order[-1] == "results", order
    for k, name in enumerate(order):
        assert declared[name] == ["errors", *order[:k]], (name, declared[name])


def test_architecture_md_maps_the_same_subpackages_in_the_same_order() -> None:
    text = (PROJECT / "docs" / "architecture.md").read_text("utf-8")
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    mapped = re.findall(r"^\| `shiftbench/(\w+)/` \|", section, re.M)
    assert mapped == order_of(declared_imports(PROJECT)), mapped


def test_every_source_path_the_docs_name_exists() -> None:
    """A path like ``shiftbench/splits/evaluation.py`` in the README or docs/ names a file of this checkout."""
    pattern = re.compile(r"(?<![\w/.])((?:shiftbench|assets|pipelines|tests|scripts|bench)/[\w/]+\.(?:py|sh))\b")
    missing = []
    for doc in [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text("utf-8").splitlines(), 1):
            for path in pattern.findall(line):
                if "<" not in path and not (PROJECT / path).exists():
                    missing.append(f"{doc.relative_to(PROJECT)}:{number}: {path}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_the_old_module_names_import_the_moved_modules_with_a_warning() -> None:
    """One release of grace: ``import shiftbench.settings`` (and the other modules that stood in the root) gives
    the module itself, warned; the training job's imports see no alias."""
    code = (
        "import json, sys, warnings\nwarnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    import shiftbench.settings, shiftbench.catalog\n"
        "    from shiftbench import registry\n"
        "    from shiftbench.splits import published_split\n"
        "import shiftbench.config.settings as settings, shiftbench.splits.published as published\n"
        "import shiftbench.families.registry as typed\n"
        "same = [shiftbench.settings is settings, registry is typed, published_split is published.published_split]\n"
        "kinds = sorted({w.category.__name__ for w in caught})\n"
        "print(json.dumps([*same, settings.__spec__.name, kinds, len(caught)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    same, typed, function, spec, categories, count = json.loads(done.stdout)
    assert same and typed and function and spec == "shiftbench.config.settings"
    assert categories == ["DeprecationWarning"] and count >= 4


# --- the checks catch what they are for ----------------------------------------------------------------------------


def test_an_import_against_a_docstring_and_a_module_in_the_root_are_named(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/errors.py": "",
            "shiftbench/loose.py": "",  # a module in the root
            "shiftbench/low/__init__.py": '"""Low.\n\nMay import: errors.\n"""\n',
            "shiftbench/low/a.py": "from shiftbench.high import b\nfrom shiftbench import errors\nimport json\n",
            "shiftbench/high/__init__.py": '"""High.\n\nMay import: errors, low.\n"""\n',
            "shiftbench/high/b.py": "import shiftbench.low.a\n\n\ndef f():\n    from shiftbench.erm import x\n",
            "shiftbench/quiet/__init__.py": '"""Says nothing of its imports."""\n',
            "shiftbench/erm/__init__.py": "",
        },
    )
    assert root_modules(root) == ["loose.py"]
    assert undeclared_imports(root) == [
        "shiftbench/high/b.py:5: shiftbench.high.b imports shiftbench.erm",
        "shiftbench/low/a.py:1: shiftbench.low.a imports shiftbench.high.b",
        "shiftbench/quiet/__init__.py:1: no 'May import: ...' line",
    ]

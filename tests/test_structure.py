"""Structural checks on the source, read with ``ast`` (nothing here imports the project's modules).

- No import cycle among the modules of shiftbench/, assets/ and pipelines/, counting every import statement:
  module level, inside functions and under ``if TYPE_CHECKING:`` (each is a dependency someone reads).
- Layers: shiftbench (the library) < assets < pipelines (the shell); nothing imports a higher layer, and the
  library does not import Dagster (``dagster_pipes``, the standalone protocol the training job speaks, is not
  Dagster and needs none of it).
- No function over 80 lines and no class over 250, unless a ``# long: why`` comment stands on the line above
  the definition (above its decorators, or right above the ``def`` or ``class``), on its header, or on its first
  body line.
- Training stays on top of the library: no library module outside ``shiftbench/erm/`` imports ``shiftbench.erm``
  (reading a split, scoring predictions and the metrics live below it; the Dagster shell may import it).
- No module writes another module's globals when it is imported: its module-level code (class bodies included)
  neither assigns to nor mutates a name imported from the project, nor calls a function that does so (its own,
  or another project module's that changes its module's globals), so what a function does never depends on what
  was imported before it.

Each check is a function over a source tree, unit-tested below on small trees in ``tmp_path`` with a planted
violation, so a check that stopped seeing violations would fail here rather than pass silently.
"""

from __future__ import annotations

import ast
import functools
import io
import itertools
import re
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
# The source folders and the import names the package gives them (pyproject.toml maps the top-level assets/ and
# pipelines/ into shiftbench), lowest layer first: a layer may import only itself and those below.
IMPORT_NAMES = {"shiftbench": "shiftbench", "assets": "shiftbench.assets", "pipelines": "shiftbench.pipelines"}
LAYERS = tuple(IMPORT_NAMES)
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250
LONG_COMMENT = re.compile(r"long:\s*\S")  # "long:" followed by the reason


@dataclass(frozen=True)
class Source:
    module: str  # dotted name
    path: Path
    is_package: bool  # an __init__.py
    tree: ast.Module
    text: str


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    parts[0] = IMPORT_NAMES.get(parts[0], parts[0])
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _parse(text: str, path: Path) -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's "AST constructor recursion depth mismatch" (SystemError): its
    recursion counter is shared between threads (a CPython bug fixed in later releases), so a thread left by
    another test of the same worker that builds an AST at that moment can fail a parse that is fine."""
    for _ in range(3):
        try:
            return ast.parse(text, str(path))
        except SystemError:
            continue
    return ast.parse(text, str(path))


def read_sources(root: Path, packages: Sequence[str] = LAYERS) -> dict[str, Source]:
    """Every module of ``packages`` under ``root``, parsed, by dotted name (this checkout's parsed once per process:
    the checks only read it; the small trees the checks are tested on change between calls and are read anew)."""
    if root == PROJECT:
        return _project_sources(tuple(packages))
    return _read_sources(root, packages)


@functools.cache
def _project_sources(packages: tuple[str, ...]) -> dict[str, Source]:
    return _read_sources(PROJECT, packages)


def _read_sources(root: Path, packages: Sequence[str]) -> dict[str, Source]:
    sources: dict[str, Source] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            text = path.read_text("utf-8")
            module, is_package = _module_name(path, root)
            sources[module] = Source(module, path, is_package, _parse(text, path), text)
    return sources


def _where(source: Source, node: ast.AST, root: Path) -> str:
    return f"{source.path.relative_to(root)}:{getattr(node, 'lineno', 0)}"


def _absolute(source: Source, module: str | None, level: int) -> str:
    """The module a (possibly relative) ``from`` import names."""
    if level == 0:
        return module or ""
    package = source.module.split(".") if source.is_package else source.module.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imported(source: Source, known: set[str]) -> Iterator[tuple[str, ast.stmt]]:
    """(module, statement) for every import anywhere in the module: ``from X import Y`` is X.Y when that is a
    module in ``known``, else X."""
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(source, node.module, node.level)
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                yield (candidate if candidate in known else base), node


def import_graph(sources: dict[str, Source], root: Path) -> dict[str, dict[str, str]]:
    """Module -> {imported project module: where (the first such import)}."""
    known = set(sources)
    graph: dict[str, dict[str, str]] = {module: {} for module in sources}
    for source in sources.values():
        for target, node in imported(source, known):
            if target in known and target != source.module:
                graph[source.module].setdefault(target, _where(source, node, root))
    return graph


def _strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's components (iterative), each sorted; only those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _cycle_through(graph: dict[str, dict[str, str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, staying inside the component."""
    inside = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if child in inside and child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in its component")  # a component of 2+ modules has one


def import_cycles(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """One line per group of modules that import each other: a cycle, with where each of its imports is."""
    graph = import_graph(read_sources(root, packages), root)
    found = []
    for component in _strongly_connected(graph):
        cycle = _cycle_through(graph, component)
        steps = ", ".join(graph[a][b] for a, b in itertools.pairwise(cycle))
        others = f" (the cycle's group: {', '.join(component)})" if len(component) > len(cycle) - 1 else ""
        found.append(f"{' -> '.join(cycle)} [{steps}]{others}")
    return found


def _layer(module: str, layers: Sequence[str]) -> int | None:
    """The index of the layer a module belongs to (the longest import name it starts with), None if outside."""
    names = [IMPORT_NAMES.get(layer, layer) for layer in layers]
    inside = [k for k, name in enumerate(names) if module == name or module.startswith(name + ".")]
    return max(inside, key=lambda k: len(names[k])) if inside else None


def _forbidden(layer: int, target: str, layers: Sequence[str]) -> bool:
    above = _layer(target, layers)
    if above is not None:
        return above > layer
    top = target.split(".")[0]
    dagster = top == "dagster" or (top.startswith("dagster_") and top != "dagster_pipes")
    return layer == 0 and dagster


def upward_imports(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """``file:line: module imports target`` for every import of a higher layer (or of Dagster in the lowest)."""
    sources = read_sources(root, packages)
    known = set(sources)
    found = []
    for source in sources.values():
        layer = _layer(source.module, packages)
        assert layer is not None, source.module
        for target, node in imported(source, known):
            if _forbidden(layer, target, packages):
                found.append(f"{_where(source, node, root)}: {source.module} imports {target}")
    return sorted(set(found), key=_by_place)


def _by_place(line: str) -> tuple[str, int]:
    path, _, rest = line.partition(":")
    return path, int(rest.split(":")[0].split(" ")[0] or 0)


def _comments(text: str) -> dict[int, str]:
    """Line -> its comment."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string
    return comments


def _explained(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, comments: dict[int, str]) -> bool:
    """A ``long:`` comment above the definition (or its decorators), on its header or on its first body line."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = {first - 1, node.lineno - 1, *range(node.lineno, node.body[0].lineno + 1)}
    return any(LONG_COMMENT.search(comments.get(line, "")) for line in lines)


def long_definitions(
    root: Path,
    packages: Sequence[str] = LAYERS,
    max_function: int = MAX_FUNCTION_LINES,
    max_class: int = MAX_CLASS_LINES,
) -> list[str]:
    """``file:line: kind name: N lines (at most M)`` for every function or class over its limit, unexplained."""
    found = []
    for source in read_sources(root, packages).values():
        comments = _comments(source.text)
        for node in ast.walk(source.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                kind, limit = "function", max_function
            elif isinstance(node, ast.ClassDef):
                kind, limit = "class", max_class
            else:
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > limit and not _explained(node, comments):
                found.append(f"{_where(source, node, root)}: {kind} {node.name}: {size} lines (at most {limit})")
    return sorted(found, key=_by_place)


def erm_imports(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """``file:line: module imports target`` for every import of ``shiftbench.erm`` by a library module outside it."""
    sources = read_sources(root, packages)
    found = []
    for source in sources.values():
        if _layer(source.module, packages) != 0 or source.module.startswith("shiftbench.erm"):
            continue
        for target, node in imported(source, set(sources)):
            if target == "shiftbench.erm" or target.startswith("shiftbench.erm."):
                found.append(f"{_where(source, node, root)}: {source.module} imports {target}")
    return sorted(set(found), key=_by_place)


# Methods that change the object they are called on (a list, dict or set, or a registry).
MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "setdefault", "add", "discard", "remove", "pop", "popitem", "clear"}
    | {"register", "unregister"}
)


def _root(node: ast.expr) -> str | None:
    """The name an attribute or subscript chain starts from (``a`` of ``a.b[c].d``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _at_import(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node that runs when the module is imported: module-level code and class bodies, with definitions'
    decorators and defaults, never a function's (or a lambda's) body."""
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defaults = [d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None]
            yield from _at_import([*node.decorator_list, *defaults])
        elif isinstance(node, ast.ClassDef):
            yield from _at_import([*node.decorator_list, *node.bases, *node.body])
        elif not isinstance(node, ast.Lambda):
            yield node
            yield from _at_import(ast.iter_child_nodes(node))


@dataclass
class _Module:
    source: Source
    project_names: dict[str, str]  # local name -> the project module or module.attribute it was imported as
    modules: set[str]  # those of the names that are modules (called through, never written by a method's name)
    globals: set[str]  # names assigned at module level
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  # module-level functions


def _module(source: Source, known: set[str]) -> _Module:
    names: dict[str, str] = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("shiftbench",):
                    names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "shiftbench"
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(source, node.module, node.level)
            if base.split(".")[0] == "shiftbench":
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}"
    assigned = {
        target.id
        for statement in source.tree.body
        if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign)
        for target in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])
        if isinstance(target, ast.Name)
    }
    functions = {s.name: s for s in source.tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    modules = {name for name, target in names.items() if target in known or target == "shiftbench"}
    return _Module(source, names, modules, assigned - set(names), functions)


def _writes(node: ast.AST, roots: Iterable[str], modules: Iterable[str] = ()) -> bool:
    """Whether ``node`` assigns to, deletes or mutates something reached from one of ``roots`` (a method of a
    mutating name called on it; ``module.register(x)`` is a function call, judged by what the function does)."""
    wanted = set(roots)
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        return any(isinstance(t, ast.Attribute | ast.Subscript) and _root(t) in wanted for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        owner = node.func.value
        return _root(owner) in wanted and not (isinstance(owner, ast.Name) and owner.id in set(modules))
    return False


def _runs(definition: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes a call of ``definition`` runs: its body, without the bodies of the functions it defines."""
    stack: list[ast.AST] = list(definition.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _callee(module: _Module, call: ast.Call) -> tuple[str, str] | None:
    """(project module, function name) a call names: ``f`` of this module or imported, or ``module.f``."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in module.functions:
            return module.source.module, func.id
        target = module.project_names.get(func.id)
        return (target.rpartition(".")[0], target.rpartition(".")[2]) if target else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target = module.project_names.get(func.value.id)
        return (target, func.attr) if target else None
    return None


def _state_writers(modules: dict[str, _Module]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The functions that change their own module's globals, and those that change another module's (each
    directly or through the functions they call), as (module, name)."""
    own: set[tuple[str, str]] = set()
    elsewhere: set[tuple[str, str]] = set()
    changed = True
    while changed:
        changed = False
        for name, module in modules.items():
            for function, definition in module.functions.items():
                key = (name, function)
                local = {a.arg for a in ast.walk(definition.args) if isinstance(a, ast.arg)}
                own_roots = module.globals - local
                body = list(_runs(definition))
                found_own = any(isinstance(n, ast.Global) or _writes(n, own_roots) for n in body)
                calls = [_callee(module, n) for n in body if isinstance(n, ast.Call)]
                found_elsewhere = any(_writes(n, module.project_names, module.modules) for n in body) or any(
                    c is not None and (c in elsewhere or (c[0] != name and c in own)) for c in calls
                )
                found_own = found_own or any(c is not None and c[0] == name and c in own for c in calls)
                if found_own and key not in own:
                    own.add(key)
                    changed = True
                if found_elsewhere and key not in elsewhere:
                    elsewhere.add(key)
                    changed = True
    return own, elsewhere


def import_time_writes(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """``file:line: module ...`` for every write into another project module's globals made at import."""
    sources = read_sources(root, packages)
    modules = {name: _module(source, set(sources)) for name, source in sources.items()}
    own, elsewhere = _state_writers(modules)
    found = []
    for name, module in modules.items():
        for node in _at_import(module.source.tree.body):
            callee = _callee(module, node) if isinstance(node, ast.Call) else None
            if _writes(node, module.project_names, module.modules):
                what = "changes an imported name"
            elif callee is not None and (callee in elsewhere or (callee[0] != name and callee in own)):
                what = f"calls {callee[0]}.{callee[1]}, which changes another module's globals"
            else:
                continue
            found.append(f"{_where(module.source, node, root)}: {name} {what}")
    return sorted(set(found), key=_by_place)


def _family_of(module: str, families: set[str]) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "shiftbench" and parts[1] in families else None


def cross_family_imports(root: Path) -> list[str]:
    """``file:line: module imports target`` for every import of one family's package (a folder of shiftbench/ with a
    ``family.py`` and a ``settings.py``) by another family's: a family reaches shared code, never another family."""
    # A family's package has its family.py and its own settings.py (shiftbench/families/ is the shared code).
    families = {
        path.parent.name
        for path in (root / "shiftbench").glob("*/family.py")
        if (path.parent / "settings.py").is_file()
    }
    sources = read_sources(root, ["shiftbench"])
    known = set(sources)
    found = []
    for source in sources.values():
        mine = _family_of(source.module, families)
        if mine is None:
            continue
        for target, node in imported(source, known):
            theirs = _family_of(target, families)
            if theirs is not None and theirs != mine:
                found.append(f"{_where(source, node, root)}: {source.module} imports {target}")
    return sorted(set(found), key=_by_place)


# --- the checks on this project ------------------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    cycles = import_cycles(PROJECT)
    assert not cycles, "modules that import each other (every import statement counts):\n" + "\n".join(cycles)


def test_nothing_is_imported_from_a_higher_layer() -> None:
    upward = upward_imports(PROJECT)
    assert not upward, f"imports against the layers {' < '.join(LAYERS)} (or of Dagster in shiftbench):\n" + "\n".join(
        upward
    )


def test_no_family_imports_another_family() -> None:
    crossing = cross_family_imports(PROJECT)
    assert not crossing, "move what families share into shared code (shiftbench/):\n" + "\n".join(crossing)


def test_no_long_function_or_class() -> None:
    long = long_definitions(PROJECT)
    assert not long, "split these, or say why not in a '# long: ...' comment above the definition:\n" + "\n".join(long)


def test_nothing_outside_training_imports_it() -> None:
    found = erm_imports(PROJECT)
    assert not found, "the library below training imports shiftbench.erm:\n" + "\n".join(found)


def test_no_module_writes_another_module_s_globals_when_imported() -> None:
    found = import_time_writes(PROJECT)
    assert not found, "import-time writes into other modules (register explicitly instead):\n" + "\n".join(found)


# --- the checks catch what they are for ----------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return root


def test_a_cycle_through_function_level_and_type_checking_imports_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/a.py": "import os\n\n\ndef f():\n    from shiftbench import b\n    return b\n",
            "shiftbench/b.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import shiftbench.c\n",
            "shiftbench/c.py": "from shiftbench.a import f\n",
            "shiftbench/d.py": "from shiftbench import a, c\n",  # imports into the cycle, not part of it
            "assets/__init__.py": "",
            "pipelines/__init__.py": "",
        },
    )
    assert import_cycles(root) == [
        "shiftbench.a -> shiftbench.b -> shiftbench.c -> shiftbench.a "
        "[shiftbench/a.py:5, shiftbench/b.py:4, shiftbench/c.py:1]"
    ]
    (root / "shiftbench/c.py").write_text("import os\n", "utf-8")
    assert import_cycles(root) == []


def test_from_imports_resolve_to_the_submodule_or_the_package(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "from shiftbench.pkg import helper\n",
            "shiftbench/pkg/__init__.py": "from . import sub\nfrom .sub import thing\n",
            "shiftbench/pkg/sub.py": "from .. import pkg\nfrom ..pkg import NAME\nthing = 1\n",
            "shiftbench/other.py": "from shiftbench.pkg import sub, NAME\n",
        },
    )
    graph = import_graph(read_sources(root, ["shiftbench"]), root)
    assert graph["shiftbench"] == {"shiftbench.pkg": "shiftbench/__init__.py:1"}  # helper is no module
    assert graph["shiftbench.pkg"] == {"shiftbench.pkg.sub": "shiftbench/pkg/__init__.py:1"}
    assert graph["shiftbench.pkg.sub"] == {"shiftbench.pkg": "shiftbench/pkg/sub.py:1"}
    assert graph["shiftbench.other"] == {
        "shiftbench.pkg.sub": "shiftbench/other.py:1",
        "shiftbench.pkg": "shiftbench/other.py:1",
    }
    assert import_cycles(root, ["shiftbench"]) == [
        "shiftbench.pkg -> shiftbench.pkg.sub -> shiftbench.pkg [shiftbench/pkg/__init__.py:1, shiftbench/pkg/sub.py:1]"
    ]


def test_every_upward_import_is_named_with_its_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/lib.py": (
                "import dagster\nfrom dagster_pipes import open_dagster_pipes\n\n\n"
                "def f():\n    from shiftbench.assets.x import y\n    import shiftbench.pipelines.cli\n"
            ),
            "assets/__init__.py": "from shiftbench import lib\n",
            "assets/x.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from shiftbench.pipelines import resources\n"
            ),
            "pipelines/__init__.py": "import shiftbench.assets\nimport shiftbench.lib\nimport dagster\n",
            "pipelines/resources.py": "",
        },
    )
    assert upward_imports(root) == [
        "assets/x.py:3: shiftbench.assets.x imports shiftbench.pipelines.resources",
        "shiftbench/lib.py:1: shiftbench.lib imports dagster",
        "shiftbench/lib.py:6: shiftbench.lib imports shiftbench.assets.x",
        "shiftbench/lib.py:7: shiftbench.lib imports shiftbench.pipelines.cli",
    ]


def test_long_functions_and_classes_are_named_unless_explained(tmp_path: Path) -> None:
    body = "".join(f"    x{k} = {k}\n" for k in range(5))  # with its def: 6 lines, over the limit of 5 here
    inner = body.replace("    ", "        ")
    snippets = [  # (source, [(line of the definition in it, what the check says of it)])
        ("def short():\n    pass\n", []),
        (f"def plain():\n{body}", [(1, "function plain: 6 lines (at most 5)")]),
        (f"# long: a table of cases reads best in one place\ndef above():\n{body}", []),
        (f"# long: above the decorators\n@decorated\ndef above_decorators():\n{body}", []),
        (f"@decorated\n# long: between decorator and def\ndef below_decorator():\n{body}", []),
        (f"def on_header(\n    a,  # long: said in the signature\n):\n{body}", []),
        (f"def first_line():  # long: one loop\n{body}", []),
        (f"def body_comment():\n    # long: on the first body line\n{body}", []),
        (f"# long: too far above\n\ndef far():\n{body}", [(3, "function far: 6 lines (at most 5)")]),
        (f"def no_reason():  # long:\n{body}", [(1, "function no_reason: 6 lines (at most 5)")]),
        (
            f'def in_docstring():\n    """long: not a comment"""\n{body}',
            [(1, "function in_docstring: 7 lines (at most 5)")],
        ),
        (f"def too_late():\n{body}    # long: after the body\n", [(1, "function too_late: 6 lines (at most 5)")]),
        (
            f"class Big:\n    def method(self):\n{inner}\n    async def later(self):\n{inner}",
            [
                (1, "class Big: 14 lines (at most 10)"),
                (2, "function method: 6 lines (at most 5)"),
                (9, "function later: 6 lines (at most 5)"),
            ],
        ),
    ]
    text, expected, line = "", [], 1
    for snippet, offenders in snippets:
        expected += [f"shiftbench/m.py:{line + offset - 1}: {what}" for offset, what in offenders]
        text += snippet + "\n\n"
        line += snippet.count("\n") + 2
    root = _tree(tmp_path, {"shiftbench/__init__.py": "", "shiftbench/m.py": text})
    assert long_definitions(root, ["shiftbench"], max_function=5, max_class=10) == expected
    assert len(expected) == 8  # the planted ones, so a check that saw nothing could not pass


@pytest.mark.parametrize(("module", "is_package", "level", "name", "expected"), [
    ("a.b.c", False, 1, None, "a.b"),
    ("a.b.c", False, 2, "x", "a.x"),
    ("a.b", True, 1, "c", "a.b.c"),
    ("a.b", True, 2, None, "a"),
    ("a.b", False, 0, "z.y", "z.y"),
])  # fmt: skip
def test_relative_imports_resolve_from_the_module_s_package(
    module: str, is_package: bool, level: int, name: str | None, expected: str
) -> None:
    source = Source(module, Path("x.py"), is_package, ast.parse(""), "")
    assert _absolute(source, name, level) == expected


def bare_folder_imports(root: Path, packages: Sequence[str] = LAYERS) -> list[str]:
    """``file:line: module imports target`` for every import of a top-level folder by its folder name
    (``assets.x``) instead of its import name (``shiftbench.assets.x``): it works in a checkout, where the folder
    is on ``sys.path``, and fails in the installed wheel."""
    sources = read_sources(root, packages)
    renamed = {folder for folder, name in IMPORT_NAMES.items() if folder != name}
    found = []
    for source in sources.values():
        for target, node in imported(source, set(sources)):
            if target.split(".")[0] in renamed:
                found.append(f"{_where(source, node, root)}: {source.module} imports {target}")
    return sorted(set(found), key=_by_place)


def test_bare_folder_imports_are_named_with_their_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "assets/__init__.py": "",
            "assets/x.py": "import shiftbench\n",
            "pipelines/__init__.py": "from assets.x import y\nfrom shiftbench.assets import x\n",
        },
    )
    assert bare_folder_imports(root) == ["pipelines/__init__.py:1: shiftbench.pipelines imports assets.x"]


def test_top_level_folders_are_imported_by_their_package_name() -> None:
    bare = bare_folder_imports(PROJECT, [*LAYERS, "tests", "bench", "scripts"])
    assert not bare, "import these as shiftbench.assets / shiftbench.pipelines (the wheel has no other):\n" + "\n".join(
        bare
    )


def test_imports_of_training_from_below_it_are_named_with_their_line(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/erm/__init__.py": "",
            "shiftbench/erm/launch.py": "from shiftbench import splits\n",
            "shiftbench/erm/train.py": "from shiftbench.erm import launch\n",  # inside training: fine
            "shiftbench/splits.py": "import os\n\n\ndef f():\n    from shiftbench.erm.launch import x\n",
            "shiftbench/api.py": "from shiftbench import erm\nfrom shiftbench.erm import launch\n",
            "assets/__init__.py": "from shiftbench.erm import launch\n",  # the shell: fine
        },
    )
    assert erm_imports(root, ["shiftbench", "assets"]) == [
        "shiftbench/api.py:1: shiftbench.api imports shiftbench.erm",
        "shiftbench/api.py:2: shiftbench.api imports shiftbench.erm.launch",
        "shiftbench/splits.py:5: shiftbench.splits imports shiftbench.erm.launch",
    ]


def test_import_time_writes_into_other_modules_are_named_with_their_line(tmp_path: Path) -> None:
    store = (
        "FAMILIES = []\n\n\ndef add(x):\n    FAMILIES.append(x)\n\n\n"
        "def reset():\n    global FAMILIES\n    FAMILIES = []\n"
    )
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/store.py": store + "add(0)\n",  # its own globals: fine
            "shiftbench/a.py": "from shiftbench import store\nstore.FAMILIES.append(1)\n",
            "shiftbench/b.py": "import shiftbench.store as s\ns.X = 1\n",
            "shiftbench/c.py": "from shiftbench.store import add\n\nfor i in range(2):\n    add(i)\n",
            "shiftbench/d.py": (  # the registry that registered at import: a loop over its own function
                "from shiftbench import store\n\n\ndef register(x):\n    store.add(x)\n\n\n"
                "for f in (1, 2):\n    register(f)\n"
            ),
            "shiftbench/e.py": (  # nothing runs at import but its own list and a definition
                "from shiftbench import store\nLOCAL = []\nLOCAL.append(1)\n\n\ndef later():\n    store.add(1)\n"
            ),
            "shiftbench/f.py": "import warnings\nwarnings.filterwarnings('ignore')\n",  # not a project module
            "shiftbench/g.py": "from shiftbench import store\n\n\nclass C:\n    store.FAMILIES.clear()\n",
            "shiftbench/h.py": "from shiftbench.store import FAMILIES\nFAMILIES[0] = 1\n",
            "shiftbench/i.py": "from shiftbench import store\nstore.reset()\n",
            "shiftbench/registry.py": "REGISTRY = []\n\n\ndef register(x):\n    REGISTRY.append(x)\n",
            "shiftbench/j.py": "from shiftbench import registry\nregistry.register(object())\n",
            "shiftbench/k.py": "from shiftbench.registry import REGISTRY\nREGISTRY.register(object())\n",
            "shiftbench/l.py": (  # runs nothing at import: the inner function is defined, not called
                "from shiftbench import store\n\n\ndef outer():\n    def inner():\n        store.add(1)\n"
                "    return inner\n\n\nouter()\n"
            ),
        },
    )
    assert import_time_writes(root, ["shiftbench"]) == [
        "shiftbench/a.py:2: shiftbench.a changes an imported name",
        "shiftbench/b.py:2: shiftbench.b changes an imported name",
        "shiftbench/c.py:4: shiftbench.c calls shiftbench.store.add, which changes another module's globals",
        "shiftbench/d.py:9: shiftbench.d calls shiftbench.d.register, which changes another module's globals",
        "shiftbench/g.py:5: shiftbench.g changes an imported name",
        "shiftbench/h.py:2: shiftbench.h changes an imported name",
        "shiftbench/i.py:2: shiftbench.i calls shiftbench.store.reset, which changes another module's globals",
        "shiftbench/j.py:2: shiftbench.j calls shiftbench.registry.register, which changes another module's globals",
        "shiftbench/k.py:2: shiftbench.k changes an imported name",
    ]


# --- no file over 500 lines without a reason (issue 38) -------------------------------------------------------------

MAX_FILE_LINES = 500
FILE_HEAD_LINES = 10  # where a file's ``# long: why`` comment must stand, so a reader meets it first


def long_files(root: Path, packages: Sequence[str] = LAYERS, max_lines: int = MAX_FILE_LINES) -> list[str]:
    """``file: N lines (at most M)`` for every module over the limit without a ``# long: why`` comment in its first
    ``FILE_HEAD_LINES`` lines (a comment, not a docstring: the same rule as a long definition's)."""
    found = []
    for source in read_sources(root, packages).values():
        size = len(source.text.splitlines())
        if size <= max_lines:
            continue
        head = [comment for line, comment in _comments(source.text).items() if line <= FILE_HEAD_LINES]
        if not any(LONG_COMMENT.search(comment) for comment in head):
            found.append(f"{source.path.relative_to(root)}: {size} lines (at most {max_lines})")
    return sorted(found)


def test_no_file_over_500_lines_without_a_reason() -> None:
    long = long_files(PROJECT)
    assert not long, (
        "split these by job, or say why not in a '# long: ...' comment in their first lines:\n" + "\n".join(long)
    )


def test_long_files_are_named_unless_explained(tmp_path: Path) -> None:
    lines = "".join(f"x{k} = {k}\n" for k in range(6))  # 6 lines: over the limit of 5 here
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/short.py": lines[: lines.index("x5")],  # 5 lines: at the limit
            "shiftbench/plain.py": lines,
            "shiftbench/reason.py": "# long: one table of cases reads best in one file\n" + lines,
            "shiftbench/pkg/__init__.py": '"""A package."""\n\n# long: the registry of every rule\n' + lines,
            "shiftbench/no_reason.py": "# long:\n" + lines,
            "shiftbench/in_docstring.py": '"""long: not a comment"""\n' + lines,
            "shiftbench/too_late.py": lines + "y = 1\n" * 5 + "# long: below the first lines\n",
            "assets/__init__.py": "",
            "assets/big.py": lines,
            "pipelines/__init__.py": lines,
        },
    )
    assert long_files(root, max_lines=5) == [
        "assets/big.py: 6 lines (at most 5)",
        "pipelines/__init__.py: 6 lines (at most 5)",
        "shiftbench/in_docstring.py: 7 lines (at most 5)",
        "shiftbench/no_reason.py: 7 lines (at most 5)",
        "shiftbench/plain.py: 6 lines (at most 5)",
        "shiftbench/too_late.py: 12 lines (at most 5)",
    ]


def test_an_import_of_another_familys_package_is_named(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "shiftbench/__init__.py": "",
            "shiftbench/spec_model.py": "",
            "shiftbench/alpha/__init__.py": "",
            "shiftbench/alpha/family.py": "from shiftbench.alpha import specs\nfrom shiftbench import spec_model\n",
            "shiftbench/alpha/specs.py": "def f():\n    from shiftbench.beta.specs import at_least\n",
            "shiftbench/beta/__init__.py": "",
            "shiftbench/beta/family.py": "import shiftbench.alpha\n",
            "shiftbench/beta/specs.py": "",
            "shiftbench/alpha/settings.py": "",
            "shiftbench/beta/settings.py": "",
            "shiftbench/shared/__init__.py": "",
            "shiftbench/shared/family.py": "from shiftbench.alpha import specs\n",  # no settings.py: shared code
            "shiftbench/registry.py": "from shiftbench.alpha.family import A\nfrom shiftbench.beta.family import B\n",
            "shiftbench/helpers/__init__.py": "from shiftbench.alpha import specs\n",  # no family.py: not a family
        },
    )
    assert cross_family_imports(root) == [
        "shiftbench/alpha/specs.py:2: shiftbench.alpha.specs imports shiftbench.beta.specs",
        "shiftbench/beta/family.py:1: shiftbench.beta.family imports shiftbench.alpha",
    ]


def test_the_command_starts_no_thread_before_it_knows_its_command() -> None:
    """``shiftbench train`` holds its stop signals from its first line (shiftbench.erm.interrupt.held_stops): a thread
    that exists before (polars and DuckDB start theirs when imported or first used) would take a SIGTERM and end the
    command without a checkpoint. So importing the command and parsing its arguments starts none, which also keeps
    ``shiftbench --help`` quick."""
    import subprocess
    import sys

    code = (
        "import os\n"
        "from shiftbench.pipelines.cli.app import build_parser\n"
        "build_parser().parse_args(['train', 'x'])\n"
        "print(len(os.listdir('/proc/self/task')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1", "a module imported by the command starts threads (polars, duckdb, torch?)"

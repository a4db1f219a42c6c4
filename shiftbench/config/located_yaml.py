"""YAML files read as YAML 1.2, every mapping remembering the line of each key, so that an error names the file,
the line and the setting: spec files (:mod:`shiftbench.specs.spec_model`), ``--set`` values, Slurm and Kubernetes
settings.

Scalars follow YAML 1.2's core schema (PyYAML implements 1.1): ``010`` is ten, ``1:20`` is a
string, and only ``true``/``false`` are booleans, so ``--set seed=1:20`` can never become 80.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from shiftbench.errors import InputError, shown


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and the line of every mapping key."""


def _core_schema_resolvers() -> dict[Any, Any]:
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag not in _RETYPED]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for tag, pattern, firsts in reversed(_CORE_SCHEMA):  # first listed = first tried
        for first in firsts:
            resolvers.setdefault(first, []).insert(0, (tag, re.compile(pattern, re.X)))
    return resolvers


_RETYPED = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"}
_CORE_SCHEMA = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
]
_Yaml12Loader.yaml_implicit_resolvers = _core_schema_resolvers()


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 16) if text.startswith("0x") else int(text)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


class Located(dict[Any, Any]):
    """A YAML mapping that remembers the line of each of its keys (1-based)."""

    lines: dict[Any, int]


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Located:
    _refuse_repeated_keys(node)
    loader.flatten_mapping(node)
    mapping = Located()
    mapping.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = key_node.start_mark.line + 1
    return mapping


def _refuse_repeated_keys(node: yaml.MappingNode) -> None:
    """A key written twice in one mapping: YAML keeps the second silently; a spec file must not (merge keys, ``<<``,
    may still be overridden: that is what they are for)."""
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {shown(key_node.value)} is given twice (lines {seen[key_node.value]} and {line})",
                key_node.start_mark,
            )
        seen[key_node.value] = line


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def parse_yaml(text: str, source: str | Path) -> Any:
    """YAML 1.2 scalars; mappings are :class:`Located`; a syntax error names the file and line."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"invalid YAML: {problem}", path=source, line=mark.line + 1 if mark else None) from None


def parse_value(text: str) -> Any:
    """A ``--set KEY=VALUE`` or launchpad value as a YAML 1.2 scalar (``3``, ``0.2``, ``null``, ``a,b``)."""
    try:
        value = yaml.load(text, Loader=_Yaml12Loader)
    except yaml.YAMLError:
        return text
    return text if isinstance(value, dict | list) else value


def format_value(value: Any) -> str:
    """A scalar back as the YAML text :func:`parse_value` reads (launchpad config carries text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def line_of(data: Any, *path: Any) -> int | None:
    """The line of the deepest key of ``path`` that a :class:`Located` mapping recorded."""
    line = None
    for key in path:
        if not isinstance(data, dict):
            break
        if isinstance(data, Located) and key in data.lines:
            line = data.lines[key]
        data = data.get(key)
    return line


def validation_error(exc: ValidationError, data: Any, path: Path) -> InputError:
    """A settings file's first validation error as one line: the file, the line of the setting and its dotted name
    (``resources.gpus``); keys may be snake_case or camelCase (Kubernetes manifests)."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        message = "unknown setting"
    else:
        message = str(error["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
        if error["type"] not in ("value_error", "missing") and "input" in error:
            message = f"{message}, got {shown(error['input'])}"
    more = len(exc.errors()) - 1
    if more:
        message = f"{message} (and {more} more)"
    return InputError(message, path=path, line=_validation_line(data, error["loc"]), parameter=".".join(loc) or None)


def _validation_line(data: Any, loc: tuple[int | str, ...]) -> int | None:
    """The line of the deepest key of ``loc`` in the parsed file (snake_case or camelCase keys)."""
    line = None
    for part in loc:
        if isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
            if isinstance(data, Located) and data.lines:
                line = min(data.lines.values())  # the item's first key
            continue
        if not isinstance(data, dict):
            break
        key = next((k for k in (part, to_camel(str(part))) if k in data), None)
        if key is None:
            break
        if isinstance(data, Located) and key in data.lines:
            line = data.lines[key]
        data = data[key]
    return line

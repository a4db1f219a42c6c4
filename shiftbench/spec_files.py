"""Benchmark spec files (YAML) as typed pydantic models, for every family.

Each family ships ``shiftbench/specs/<family>.yaml`` and accepts one extra file of the same format
(``SHIFTBENCH_<FAMILY>_SPECS``). Specs are frozen pydantic models (:class:`Spec`) validated
strictly; an error names the file, the line and the parameter. An extra file may add benchmarks
but never redefine a shipped one: a name defined twice is an error naming both files.

Scalars follow YAML 1.2's core schema (PyYAML implements 1.1): ``010`` is ten, ``1:20`` is a
string, and only ``true``/``false`` are booleans, so ``--set seed=1:20`` can never become 80.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from shiftbench.errors import InputError
from shiftbench.store import benchmark_name_problem
from shiftbench.textio import read_text

T = TypeVar("T")
S = TypeVar("S", bound=BaseModel)


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
                f"key {key_node.value!r} is given twice (lines {seen[key_node.value]} and {line})",
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


def spec_document(
    text: str, source: str | Path, sections: Mapping[str, type], *, family: str | None = None
) -> dict[str, Any]:
    """The top-level mapping of a spec file: ``family: <family>`` (when given) and known sections only.

    An unknown or misspelt section would otherwise be ignored without a word (a user's benchmarks
    silently missing); a section of the wrong shape would fail later with a Python error.
    """
    data = parse_yaml(text, source)
    if data is None and family is None:
        return {}
    if not isinstance(data, dict) or (family is not None and data.get("family") != family):
        expected = f"family: {family} and " if family is not None else ""
        raise InputError(f"expected a mapping with {expected}sections {', '.join(sections)}", path=source)
    for key, value in data.items():
        if key == "family" and family is not None:
            continue
        if key not in sections:
            raise InputError(
                f"unknown section {key!r}; expected {', '.join(sections)}", path=source, line=line_of(data, key)
            )
        if value is not None and not isinstance(value, sections[key]):
            shape = "a mapping" if sections[key] is dict else f"a {sections[key].__name__}"
            raise InputError(f"section {key!r} must be {shape}", path=source, line=line_of(data, key))
    return data


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
            message = f"{message}, got {error['input']!r}"
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


def read_spec_file(path: Path, parameter: str) -> str:
    """The text of a user's spec file; a missing, unreadable or non-UTF-8 file is one clear error."""
    return read_text(path, what="spec file", parameter=parameter)


def spec_texts(family: str, extra: Path | None, parameter: str) -> list[tuple[str, str]]:
    """(text, source) of the shipped spec file, then of the user's ``extra`` file when given."""
    shipped = f"specs/{family}.yaml"
    texts = [(resources.files("shiftbench").joinpath(shipped).read_text("utf-8"), f"shiftbench/{shipped}")]
    if extra is not None:
        texts.append((read_spec_file(extra, parameter), str(extra)))
    return texts


def merge_named(parts: Iterable[tuple[Mapping[str, T], str]], what: str) -> dict[str, T]:
    """Union of named entries from several files; a name defined in two files is an error naming both."""
    merged: dict[str, T] = {}
    origin: dict[str, str] = {}
    for entries, source in parts:
        for name, entry in entries.items():
            if name in merged:
                raise InputError(
                    f"{what} {name!r} is already defined in {origin[name]}: choose another name", path=source
                )
            merged[name] = entry
            origin[name] = source
    return merged


class Spec(BaseModel):
    """A benchmark spec: a frozen, strictly typed model whose name is its benchmark's."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, arbitrary_types_allowed=True)
    # Parameters ``--set`` and the launchpad may override (the rest define the benchmark itself).
    OVERRIDABLE: ClassVar[tuple[str, ...]] = ()

    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        problem = benchmark_name_problem(name)
        if problem is None and "@" in name:
            problem = f"invalid benchmark name {name!r}: '@' is reserved for shiftbench's source tags (NAME@TAG)"
        if problem is not None:  # a name becomes a directory of the store: check it where it is written
            raise ValueError(problem)
        return name

    @classmethod
    def nullable(cls) -> frozenset[str]:
        """Parameters whose value may be null, read from the annotations (typed launchpad config
        carries them as YAML text)."""
        return frozenset(name for name, f in cls.model_fields.items() if type(None) in get_args(f.annotation))

    def params(self) -> dict[str, Any]:
        """The parameters recorded with every version (``benchmarks.params``)."""
        return self.model_dump(mode="json", exclude={"name"})

    def with_overrides(self, overrides: Mapping[str, Any]) -> Self:
        """A new validated spec with some parameters replaced (``--set``, launchpad config)."""
        unknown = sorted(set(overrides) - set(self.OVERRIDABLE))
        if unknown:
            raise InputError(f"unknown parameter; expected one of {', '.join(self.OVERRIDABLE)}", parameter=unknown[0])
        values = {name: getattr(self, name) for name in type(self).model_fields}
        values.update(overrides)
        # A shipped spec renamed NAME@TAG (shiftbench.naming) is validated under its spec name, then keeps its tag.
        values["name"] = self.name.partition("@")[0]
        return build(type(self), values, "overrides").model_copy(update={"name": self.name})


def source_of(info: ValidationInfo) -> str:
    """The file (or "overrides") a model validator is validating, for its error messages."""
    context = info.context if isinstance(info.context, dict) else {}
    return str(context.get("source", "overrides"))


def build(
    model: type[S], values: Mapping[str, Any], source: str, lines: Callable[[str], int | None] | None = None
) -> S:
    """Validate ``values`` as ``model``; a type error names the parameter, the file and the line.

    Model validators read ``source`` from the validation context to name it in their own errors.
    """
    try:
        return model.model_validate(dict(values), context={"source": source})
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        parameter = loc[0] if loc else None
        message = str(error["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
        where = ".".join(loc[1:])
        detail = f"{where}: " if where else ""
        line = lines(parameter) if lines is not None and parameter is not None else None
        path = source if source != "overrides" else None
        suffix = "" if path is not None else f" (in {source})"
        raise InputError(
            f"{detail}{message}, got {error.get('input')!r}{suffix}", path=path, line=line, parameter=parameter
        ) from None

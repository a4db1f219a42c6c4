"""What every family's specs share: the base model :class:`Spec`, its validators, and how spec files are read.

Each family ships ``shiftbench/specs/<family>.yaml`` and accepts one extra file of the same format
(``SHIFTBENCH_<FAMILY>_SPECS``); its own spec models and how its file is laid out live in its package
(``shiftbench/<family>/specs.py``). Specs are frozen pydantic models validated strictly; an error names the file,
the line and the parameter (files are read by :mod:`shiftbench.config.located_yaml`). An extra file may add benchmarks
but never redefine a shipped one: a name defined twice is an error naming both files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from shiftbench.config.located_yaml import line_of, parse_yaml
from shiftbench.config.textio import read_text
from shiftbench.errors import InputError, shown
from shiftbench.store import benchmark_name_problem

T = TypeVar("T")
S = TypeVar("S", bound=BaseModel)


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
                f"unknown section {shown(key)}; expected {', '.join(sections)}", path=source, line=line_of(data, key)
            )
        if value is not None and not isinstance(value, sections[key]):
            shape = "a mapping" if sections[key] is dict else f"a {sections[key].__name__}"
            raise InputError(f"section {shown(key)} must be {shape}", path=source, line=line_of(data, key))
    return data


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
                    f"{what} {shown(name)} is already defined in {origin[name]}: choose another name", path=source
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
            problem = f"invalid benchmark name {shown(name)}: '@' is reserved for shiftbench's source tags (NAME@TAG)"
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
        # A shipped spec renamed NAME@TAG (shiftbench.specs.naming) is validated under its spec name, then keeps its
        # tag.
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
            f"{detail}{message}, got {shown(error.get('input'))}{suffix}", path=path, line=line, parameter=parameter
        ) from None


def at_least(value: int, parameter: str, minimum: int, where: str) -> int:
    if value < minimum:
        raise InputError(f"must be an integer >= {minimum}, got {shown(value)} (in {where})", parameter=parameter)
    return value


def fraction(value: float, parameter: str, where: str, *, low_open: bool = False, high_open: bool = False) -> float:
    """A number in [0, 1], either end open on request."""
    inside = (value > 0.0 if low_open else value >= 0.0) and (value < 1.0 if high_open else value <= 1.0)
    if not inside:
        bounds = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise InputError(f"must be a number in {bounds}, got {shown(value)} (in {where})", parameter=parameter)
    return value


def as_float(value: Any) -> Any:
    """An integer where a float is expected (``edge_threshold: 1``) is that float; bools stay errors (a ``before``
    field validator of strict models)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

"""ConDS specs as data (``shiftbench/specs/conds.yaml``): datasets, their attributes, and cases.

A *dataset spec* says where the attribute table comes from (CelebA, the generated sprites, or a
user's table), how raw columns become categorical attributes, which attribute is the label and
which three are shifted, and the default case parameters. A *case* is the label plus a shift
type per attribute (others uniform) plus parameters; the canonical suite of a dataset is
uniform, 3 single shifts x 3 attributes, 3 pairs x 6 ordered assignments and 6 triples.
Overrides (CLI ``--set``, Dagster config) make a new validated case and are recorded in params.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from shiftbench.config.located_yaml import line_of
from shiftbench.errors import InputError
from shiftbench.specs.spec_model import (
    Spec,
    at_least,
    build,
    fraction,
    merge_named,
    source_of,
    spec_document,
    spec_texts,
)

SHIFTS = ("sc", "ldd", "uds")
PAIRS = (("sc", "ldd"), ("sc", "uds"), ("ldd", "uds"))
SOURCES = ("celeba", "sprites", "table")
CASE_PARAMS = (
    "train_size",
    "test_per_cell",
    "id_val_fraction",
    "seed",
    "sc_counterexample_fraction",
    "ldd_rare_frequency",
    "allow_scale_down",
)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Attribute(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class ColumnMapping:
    """How one categorical attribute is read from raw columns.

    ``column``: the raw column holds the value (``raw`` maps a value to its raw spelling when
    they differ, e.g. dSprites' shape 1/2/3); ``flags``: one binary raw column per value
    (CelebA's 1/-1), the first listed flag that is set wins, none set gives ``others``.
    Unlisted raw values are an error unless ``others`` names a catch-all value.
    """

    name: str
    values: tuple[str, ...]
    column: str | None = None
    raw: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)
    others: str | None = None

    @property
    def attribute(self) -> Attribute:
        return Attribute(name=self.name, values=self.values)


class CaseSpec(Spec):
    OVERRIDABLE: ClassVar[tuple[str, ...]] = CASE_PARAMS

    dataset: str
    label: Attribute
    attributes: tuple[Attribute, ...]
    shifts: tuple[tuple[str, str], ...]  # (shift, attribute), in name order
    train_size: int | None = None  # None: the largest size the train pools support
    test_per_cell: int = 10
    id_val_fraction: float = 0.2
    seed: int = 0
    sc_counterexample_fraction: float = 0.01
    ldd_rare_frequency: float = 0.1
    ldd_rare_values: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    uds_unseen_values: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    sc_aligned_values: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    allow_scale_down: bool = False

    _size = field_validator("train_size", mode="before")(lambda value: _train_size(value))
    _fractions = field_validator("id_val_fraction", "sc_counterexample_fraction", "ldd_rare_frequency", mode="before")(
        lambda value: float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    )

    @model_validator(mode="after")
    def _valid(self, info: ValidationInfo) -> CaseSpec:
        return validate_case(self, source_of(info))

    def shift_of(self, attribute: str) -> str:
        return next((s for s, a in self.shifts if a == attribute), "none")

    def attribute_with(self, shift: str) -> str | None:
        return next((a for s, a in self.shifts if s == shift), None)

    def aligned_value(self, attribute: str, label_value: str) -> str:
        return self.sc_aligned_values[attribute][self.label.values.index(label_value)]

    def params(self) -> dict[str, Any]:
        """Everything that defines the split; recorded with every version."""
        shifted = {a for _, a in self.shifts}
        return {
            "dataset": self.dataset,
            "label": self.label.name,
            "label_values": list(self.label.values),
            "attributes": {a.name: list(a.values) for a in self.attributes},
            "shifts": dict(self.shifts),
            "train_size": "max" if self.train_size is None else self.train_size,
            "test_per_cell": self.test_per_cell,
            "id_val_fraction": self.id_val_fraction,
            "seed": self.seed,
            "sc_counterexample_fraction": self.sc_counterexample_fraction if self.attribute_with("sc") else None,
            "sc_aligned_values": {a: list(v) for a, v in self.sc_aligned_values.items() if self.shift_of(a) == "sc"},
            "ldd_rare_frequency": self.ldd_rare_frequency if self.attribute_with("ldd") else None,
            "ldd_rare_values": {a: list(v) for a, v in self.ldd_rare_values.items() if self.shift_of(a) == "ldd"},
            "uds_unseen_values": {a: list(v) for a, v in self.uds_unseen_values.items() if self.shift_of(a) == "uds"},
            "allow_scale_down": self.allow_scale_down,
            "shifted_attributes": sorted(shifted),
        }


def _train_size(value: Any) -> Any:
    """``max`` (or null): the largest size the train pools support."""
    if value is None or value == "max":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def validate_case(case: CaseSpec, source: str) -> CaseSpec:
    where = f"case {case.name} ({source})"
    names = [case.label.name, *[a.name for a in case.attributes]]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"{where}: attribute {twice[0]!r} is used twice (label and attributes must differ)")
    shifted_names = [a for _, a in case.shifts]
    for shift, attribute_name in case.shifts:
        if shift not in SHIFTS:
            raise InputError(f"{where}: unknown shift {shift!r}; expected one of {', '.join(SHIFTS)}", parameter=shift)
        if attribute_name not in names[1:]:
            raise InputError(
                f"{where}: shift {shift} names {attribute_name!r}, not one of the attributes {', '.join(names[1:])}",
                parameter=shift,
            )
    if len(set(shifted_names)) != len(shifted_names):
        raise InputError(f"{where}: an attribute can take one shift only", parameter="shifts")
    if len({s for s, _ in case.shifts}) != len(case.shifts):
        raise InputError(f"{where}: a shift type can be given to one attribute only", parameter="shifts")
    for attribute in [case.label, *case.attributes]:
        if len(attribute.values) < 2 or len(set(attribute.values)) != len(attribute.values):
            raise InputError(f"{where}: {attribute.name} needs at least two distinct values", parameter=attribute.name)
    if case.train_size is not None:
        at_least(case.train_size, "train_size", 1, where)
    at_least(case.test_per_cell, "test_per_cell", 1, where)
    fraction(case.id_val_fraction, "id_val_fraction", where, high_open=True)
    at_least(case.seed, "seed", 0, where)
    fraction(case.sc_counterexample_fraction, "sc_counterexample_fraction", where, high_open=True)
    fraction(case.ldd_rare_frequency, "ldd_rare_frequency", where, low_open=True, high_open=True)
    by_name = {a.name: a for a in case.attributes}
    for parameter, chosen in (("ldd_rare_values", case.ldd_rare_values), ("uds_unseen_values", case.uds_unseen_values)):
        for name, values in chosen.items():
            shifted = by_name.get(name)
            if shifted is None:
                raise InputError(f"{where}: {parameter} names {name!r}, not an attribute", parameter=parameter)
            bad = [v for v in values if v not in shifted.values]
            if bad or not values or len(set(values)) >= len(shifted.values):
                raise InputError(
                    f"{where}: {parameter}.{name} must be some but not all of {', '.join(shifted.values)}, "
                    f"got {list(values)}",
                    parameter=parameter,
                )
    for name, aligned in case.sc_aligned_values.items():
        target = by_name.get(name)
        if target is None or len(aligned) != len(case.label.values) or not set(aligned) <= set(target.values):
            raise InputError(
                f"{where}: sc_aligned_values.{name} must give one value of {name} per label value "
                f"({', '.join(case.label.values)})",
                parameter="sc_aligned_values",
            )
    return case


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    source: str
    label: str
    attributes: tuple[str, ...]
    columns: Mapping[str, ColumnMapping]
    path: Path | None = None  # source: table
    id_column: str = "example_id"
    case_defaults: Mapping[str, Any] = field(default_factory=dict)
    ldd_rare_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    uds_unseen_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sc_aligned_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source_file: str = ""  # the spec file, for error messages
    line: int | None = None

    def attribute(self, name: str) -> Attribute:
        return self.columns[name].attribute

    def case(self, shifts: tuple[tuple[str, str], ...]) -> CaseSpec:
        """One case of this dataset; defaults: rare = first value, unseen = last, SC diagonal."""
        label = self.attribute(self.label)
        attributes = tuple(self.attribute(a) for a in self.attributes)
        name = "-".join([self.name, *[f"{s}-{a}" for s, a in shifts]]) if shifts else f"{self.name}-uniform"
        values = {
            **self.case_defaults,
            "name": name,
            "dataset": self.name,
            "label": label,
            "attributes": attributes,
            "shifts": shifts,
            "ldd_rare_values": {a.name: self.ldd_rare_values.get(a.name, a.values[:1]) for a in attributes},
            "uds_unseen_values": {a.name: self.uds_unseen_values.get(a.name, a.values[-1:]) for a in attributes},
            "sc_aligned_values": {
                a.name: self.sc_aligned_values.get(
                    a.name, tuple(a.values[i % len(a.values)] for i in range(len(label.values)))
                )
                for a in attributes
            },
        }
        source = self.source_file or f"dataset {self.name}"
        return build(CaseSpec, values, source, lambda parameter: self.line)

    def canonical_cases(self) -> list[CaseSpec]:
        """Uniform, then 9 single shifts, 18 ordered pairs and 6 triples (ConDS Appendix A.1)."""
        shifts: list[tuple[tuple[str, str], ...]] = [()]
        shifts += [((s, a),) for s in SHIFTS for a in self.attributes]
        shifts += [((s1, a1), (s2, a2)) for s1, s2 in PAIRS for a1, a2 in itertools.permutations(self.attributes, 2)]
        shifts += [tuple(zip(SHIFTS, order, strict=True)) for order in itertools.permutations(self.attributes)]
        return [self.case(s) for s in shifts]


def _mapping(name: str, entry: Any, where: str) -> ColumnMapping:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: columns.{name} must be a mapping with 'column' or 'flags'")
    unknown = sorted(set(entry) - {"column", "values", "flags", "others"})
    if unknown:
        raise InputError(f"{where}: columns.{name}: unknown field {unknown[0]!r}")
    others = entry.get("others")
    if ("column" in entry) == ("flags" in entry):
        raise InputError(f"{where}: columns.{name} needs exactly one of 'column' and 'flags'")
    if "flags" in entry:
        flags = entry["flags"]
        if not isinstance(flags, dict) or not flags or others is None:
            raise InputError(f"{where}: columns.{name}: 'flags' maps values to raw columns and needs 'others'")
        values = (*[str(v) for v in flags], str(others))
        mapping = ColumnMapping(name, values, flags={str(k): str(v) for k, v in flags.items()}, others=str(others))
    else:
        raw_values = entry.get("values")
        if isinstance(raw_values, dict):
            raw = {str(k): str(v) for k, v in raw_values.items()}
        elif isinstance(raw_values, list):
            raw = {str(v): str(v) for v in raw_values}
        else:
            raise InputError(f"{where}: columns.{name}.values must list the values (or map them to raw values)")
        values = tuple(raw) + ((str(others),) if others is not None else ())
        mapping = ColumnMapping(name, values, column=str(entry["column"]), raw=raw, others=others)
    if len(set(mapping.values)) != len(mapping.values) or len(mapping.values) < 2:
        raise InputError(f"{where}: columns.{name} needs at least two distinct values")
    return mapping


def _value_lists(block: Any, parameter: str, where: str) -> dict[str, tuple[str, ...]]:
    if block is None:
        return {}
    if not isinstance(block, dict) or not all(isinstance(v, list) for v in block.values()):
        raise InputError(f"{where}: {parameter} must map attributes to lists of values", parameter=parameter)
    return {str(k): tuple(str(x) for x in v) for k, v in block.items()}


_DATASET_KEYS = {
    "source",
    "label",
    "attributes",
    "columns",
    "path",
    "id_column",
    "ldd_rare_values",
    "uds_unseen_values",
    "sc_aligned_values",
    *CASE_PARAMS,
}


def parse_dataset(
    name: str, entry: Any, defaults: Mapping[str, Any], source: str, line: int | None = None
) -> DatasetSpec:
    where = f"dataset {name}"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping", path=source)
    unknown = sorted(set(entry) - _DATASET_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}", path=source)
    if not _NAME.match(name):
        raise InputError(f"{where}: names are lower-case letters, digits and '_'", path=source)
    if entry.get("source") not in SOURCES:
        raise InputError(f"{where}: source must be one of {', '.join(SOURCES)}", path=source, parameter="source")
    columns = {str(k): _mapping(str(k), v, where) for k, v in (entry.get("columns") or {}).items()}
    for column in columns:
        if not _NAME.match(column):
            raise InputError(f"{where}: attribute name {column!r}: use lower-case letters, digits and '_'", path=source)
    label = entry.get("label")
    attributes = entry.get("attributes")
    if not isinstance(attributes, list) or not attributes:
        raise InputError(f"{where}: attributes must list the shifted attributes", path=source, parameter="attributes")
    for attribute in [label, *attributes]:
        if attribute not in columns:
            raise InputError(
                f"{where}: {attribute!r} is not an attribute (columns: {', '.join(columns)})",
                path=source,
                parameter="label" if attribute == label else "attributes",
            )
    path = entry.get("path")
    if entry["source"] == "table":
        if not path:
            raise InputError(f"{where}: source table needs 'path'", path=source, parameter="path")
        path = Path(os.path.expandvars(str(path)))
        if not path.is_absolute():
            path = Path(source).parent / path
    spec = DatasetSpec(
        name=name,
        source=str(entry["source"]),
        label=str(label),
        attributes=tuple(str(a) for a in attributes),
        columns=columns,
        path=path,
        id_column=str(entry.get("id_column", "example_id")),
        case_defaults={**defaults, **{k: entry[k] for k in CASE_PARAMS if k in entry}},
        ldd_rare_values=_value_lists(entry.get("ldd_rare_values"), "ldd_rare_values", where),
        uds_unseen_values=_value_lists(entry.get("uds_unseen_values"), "uds_unseen_values", where),
        sc_aligned_values=_value_lists(entry.get("sc_aligned_values"), "sc_aligned_values", where),
        source_file=source,
        line=line,
    )
    unknown_defaults = sorted(set(spec.case_defaults) - set(CASE_PARAMS))
    if unknown_defaults:
        raise InputError(f"{where}: unknown case parameter {unknown_defaults[0]!r}", path=source)
    spec.case(())  # validates the parameters once, with the file named
    return spec


@dataclass(frozen=True)
class CondsSpecs:
    datasets: dict[str, DatasetSpec]
    cases: dict[str, CaseSpec]

    def names(self) -> list[str]:
        return list(self.cases)

    def dataset_of(self, case: str) -> DatasetSpec:
        return self.datasets[self.cases[case].dataset]


def parse_specs(text: str, source: str) -> CondsSpecs:
    data = spec_document(text, source, {"case_defaults": dict, "datasets": dict}, family="conds")
    defaults = dict(data.get("case_defaults") or {})
    datasets = {
        str(k): parse_dataset(str(k), v, defaults, source, line_of(data, "datasets", k))
        for k, v in (data.get("datasets") or {}).items()
    }
    cases: dict[str, CaseSpec] = {}
    for dataset in datasets.values():
        for case in dataset.canonical_cases():
            cases[case.name] = case
    return CondsSpecs(datasets, cases)


def load_specs(extra: Path | None = None) -> CondsSpecs:
    """Shipped specs, plus datasets of ``extra`` (``SHIFTBENCH_CONDS_SPECS``, same format).

    Parsed once per version of the files (every case of every dataset is built and validated: a
    few milliseconds that callers looping over cases would otherwise pay per case).
    """
    stamp = None
    if extra is not None:
        with contextlib.suppress(OSError):
            info = extra.stat()
            stamp = (info.st_mtime_ns, info.st_size)
    return _load_specs(extra, stamp)


@functools.lru_cache(maxsize=8)
def _load_specs(extra: Path | None, stamp: tuple[int, int] | None) -> CondsSpecs:
    parsed = [
        (parse_specs(text, source), source) for text, source in spec_texts("conds", extra, "SHIFTBENCH_CONDS_SPECS")
    ]
    datasets = merge_named(((p.datasets, source) for p, source in parsed), "dataset")
    cases = merge_named(((p.cases, source) for p, source in parsed), "benchmark")
    return CondsSpecs(datasets, cases)

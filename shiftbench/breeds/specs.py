"""BREEDS benchmark specs: named presets as data (``shiftbench/specs/breeds.yaml``).

A spec is a frozen :class:`BreedsSpec`; overrides (CLI ``--set``, Dagster launchpad config)
produce a new spec and are recorded in the published params.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from shiftbench.breeds.tasks import SPLITS, TaskParams
from shiftbench.errors import InputError
from shiftbench.spec_files import parse_yaml, spec_texts

SPEC_FIELDS = ("level", "n_subclasses", "split", "seed", "ancestor")


@dataclass(frozen=True)
class BreedsSpec:
    name: str
    level: int
    n_subclasses: int
    split: str = "rand"
    seed: int = 2
    ancestor: str | None = None

    def task_params(self) -> TaskParams:
        return TaskParams(self.level, self.n_subclasses, self.split, self.seed, self.ancestor)

    def params(self) -> dict[str, Any]:
        values = asdict(self)
        values.pop("name")
        return values

    def with_overrides(self, overrides: Mapping[str, Any]) -> BreedsSpec:
        unknown = sorted(set(overrides) - set(SPEC_FIELDS))
        if unknown:
            raise InputError(f"unknown parameter; expected one of {', '.join(SPEC_FIELDS)}", parameter=unknown[0])
        return validate_spec(replace(self, **dict(overrides)), source="overrides")


def validate_spec(spec: BreedsSpec, source: str) -> BreedsSpec:
    for name in ("level", "n_subclasses", "seed"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise InputError(f"must be an integer, got {value!r} (in {source})", parameter=name)
    if spec.level < 0:
        raise InputError(f"must be >= 0 (in {source})", parameter="level")
    if spec.n_subclasses < 1:
        raise InputError(f"must be >= 1 (in {source})", parameter="n_subclasses")
    if not 0 <= spec.seed < 2**32:
        raise InputError(f"must be in [0, 2**32) for numpy's RandomState (in {source})", parameter="seed")
    if spec.split not in SPLITS:
        raise InputError(f"must be one of {', '.join(SPLITS)}, got {spec.split!r} (in {source})", parameter="split")
    if spec.ancestor is not None and not isinstance(spec.ancestor, str):
        raise InputError(f"must be a node id or null (in {source})", parameter="ancestor")
    return spec


def parse_specs(text: str, source: str) -> dict[str, BreedsSpec]:
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or data.get("family") != "breeds" or not isinstance(data.get("benchmarks"), dict):
        raise InputError("expected a mapping with family: breeds and a benchmarks mapping", path=source)
    defaults = dict(data.get("defaults") or {})
    variants = dict(data.get("variants") or {})
    specs: dict[str, BreedsSpec] = {}
    for name, entry in data["benchmarks"].items():
        values = {**defaults, **(entry or {})}
        unknown = sorted(set(values) - set(SPEC_FIELDS))
        if unknown:
            raise InputError(f"benchmark {name}: unknown field {unknown[0]!r}", path=source)
        try:
            base = BreedsSpec(name=str(name), **values)
        except TypeError as exc:
            raise InputError(f"benchmark {name}: {exc}", path=source) from None
        specs[base.name] = validate_spec(base, source)
        for suffix, change in variants.items():
            variant = replace(base, name=f"{base.name}-{suffix}", **dict(change or {}))
            specs[variant.name] = validate_spec(variant, source)
    return specs


def load_specs(extra: Path | None = None) -> dict[str, BreedsSpec]:
    """Shipped specs, plus those of ``SHIFTBENCH_BREEDS_SPECS`` (same format) when set."""
    specs: dict[str, BreedsSpec] = {}
    for text, source in spec_texts("breeds", "SHIFTBENCH_BREEDS_SPECS", extra):
        specs.update(parse_specs(text, source))
    return specs


def parse_override_value(raw: str) -> Any:
    """``--set KEY=VALUE`` values are YAML scalars: ``3`` is an int, ``null`` is None."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw

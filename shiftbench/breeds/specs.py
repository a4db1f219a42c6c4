"""BREEDS benchmark specs: named presets as data (``shiftbench/specs/breeds.yaml``).

A spec is a frozen, typed :class:`BreedsSpec`; overrides (CLI ``--set``, Dagster launchpad
config) produce a new validated spec and are recorded in the published params.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationInfo, model_validator

from shiftbench.breeds.tasks import SPLITS, TaskParams
from shiftbench.errors import InputError
from shiftbench.located_yaml import line_of
from shiftbench.spec_model import Spec, build, merge_named, source_of, spec_document, spec_texts

SPEC_FIELDS = ("level", "n_subclasses", "split", "seed", "ancestor")


class BreedsSpec(Spec):
    OVERRIDABLE: ClassVar[tuple[str, ...]] = SPEC_FIELDS

    level: int
    n_subclasses: int
    split: str = "rand"
    seed: int = 2
    ancestor: str | None = None

    @model_validator(mode="after")
    def _valid(self, info: ValidationInfo) -> BreedsSpec:
        source = source_of(info)
        if self.level < 0:
            raise InputError(f"must be >= 0 (in {source})", parameter="level")
        if self.n_subclasses < 1:
            raise InputError(f"must be >= 1 (in {source})", parameter="n_subclasses")
        if not 0 <= self.seed < 2**32:
            raise InputError(f"must be in [0, 2**32) for numpy's RandomState (in {source})", parameter="seed")
        if self.split not in SPLITS:
            raise InputError(f"must be one of {', '.join(SPLITS)}, got {self.split!r}", parameter="split")
        return self

    def task_params(self) -> TaskParams:
        return TaskParams(self.level, self.n_subclasses, self.split, self.seed, self.ancestor)

    def params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SPEC_FIELDS}


def parse_specs(text: str, source: str) -> dict[str, BreedsSpec]:
    data = spec_document(text, source, {"defaults": dict, "benchmarks": dict, "variants": dict}, family="breeds")
    defaults = dict(data.get("defaults") or {})
    variants = dict(data.get("variants") or {})
    specs: dict[str, BreedsSpec] = {}
    for name, entry in (data.get("benchmarks") or {}).items():
        if entry is not None and not isinstance(entry, dict):
            raise InputError(
                f"benchmark {name}: expected a mapping", path=source, line=line_of(data, "benchmarks", name)
            )
        values = {**defaults, **(entry or {}), "name": str(name)}

        def lines(parameter: str, name: Any = name) -> int | None:
            return line_of(data, "benchmarks", name, parameter) or line_of(data, "defaults", parameter)

        base = build(BreedsSpec, values, source, lines)
        specs[base.name] = base
        for suffix, change in variants.items():
            if change is not None and not isinstance(change, dict):
                raise InputError(f"variant {suffix}: expected a mapping", path=source, line=line_of(data, "variants"))
            variant = {**values, **(change or {}), "name": f"{base.name}-{suffix}"}

            def variant_lines(parameter: str, suffix: Any = suffix) -> int | None:
                return line_of(data, "variants", suffix, parameter)

            specs[variant["name"]] = build(BreedsSpec, variant, source, variant_lines)
    return specs


def load_specs(extra: Path | None = None) -> dict[str, BreedsSpec]:
    """Shipped specs, plus those of ``extra`` (``SHIFTBENCH_BREEDS_SPECS``, same format)."""
    texts = spec_texts("breeds", extra, "SHIFTBENCH_BREEDS_SPECS")
    return merge_named(((parse_specs(text, source), source) for text, source in texts), "benchmark")

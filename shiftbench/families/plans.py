"""What a command asks for, decided before any work starts: parameter overrides, the build plan, training runs.

The command line (``pipelines/cli``) parses its arguments, calls these and prints what they return. Which
benchmarks and variants a build covers, how an overridden spec is named and registered, what is skipped here and
why, and which benchmarks and seeds can be trained are decided here, once, with no Dagster: a bad request is an
:class:`~shiftbench.errors.InputError` naming the parameter, raised before any run starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shiftbench.config.located_yaml import parse_value
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, shown
from shiftbench.families import registry, variants
from shiftbench.families.family import Family, Kind


def parse_overrides(items: Iterable[str], parameter: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` items as parameters, each value read as a spec file reads it (numbers, lists, ``null``)."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {shown(item)}", parameter=parameter)
        overrides[key.strip()] = override_value(key.strip(), value)
    return overrides


def override_value(name: str, text: str) -> Any:
    """A ``--set`` or launchpad value read as a spec file reads it; an empty one is refused: it would read as null,
    the default (``classes=`` built every class), when the user meant to give something."""
    if not text.strip():
        raise InputError("has no value: give one, or null for none", parameter=name)
    return parse_value(text.strip())


@dataclass(frozen=True)
class BuildPlan:
    """What one build covers: the benchmarks of each kind, in build order (a kind with none is left out), one line
    per reason some benchmarks of the family are skipped here, and the name of a variant this build registered
    (new, so free again if nothing publishes)."""

    family: Family
    names: dict[Kind, list[str]]
    skipped: tuple[str, ...] = ()
    registered: str | None = None

    @property
    def total(self) -> int:
        return sum(len(names) for names in self.names.values())

    def inputs_needed(self, settings: Settings) -> list[str]:
        """The family inputs the planned benchmarks read, kind by kind (what the first run builds)."""
        needed: list[str] = []
        for kind, names in self.names.items():
            specs = [target.spec for name, target in variants.targets(settings, kind).items() if name in names]
            needed += kind.inputs_needed(settings, specs)
        return needed

    def fanned_out_kinds(self) -> list[Kind]:
        """The planned kinds when each benchmark is built in units (``--units``): every kind must have a fan-out."""
        kinds = [kind for kind in self.names if kind.fanout is not None]
        if len(kinds) != len(self.names):
            other = next(kind for kind in self.names if kind.fanout is None)
            raise InputError(
                f"{self.family.name} {other.plural} are built in one piece (no units)", parameter="--units"
            )
        return kinds


def build_plan(
    settings: Settings,
    family: str | None,
    benchmarks: Sequence[str],
    overrides: Mapping[str, Any],
    name: str | None,
) -> BuildPlan:
    """The plan of ``shiftbench build [FAMILY] [--benchmark B ...] [--set K=V ... --name NEW]``.

    Named benchmarks (duplicates once) must be of one family, the one given if any; overrides need ``name``, the
    new benchmark (a variant of exactly one benchmark, registered here); neither builds every benchmark of the
    family (default: the benchmarks' family, else :func:`registry.default_family`) that can be built here.
    """
    names = list(dict.fromkeys(benchmarks))
    kinds = [registry.kind_of(settings, benchmark) for benchmark in names]
    chosen = registry.family(family or (kinds[0].family if kinds else registry.default_family()))
    for benchmark, kind in zip(names, kinds, strict=True):
        if kind.family != chosen.name:
            raise InputError(f"{benchmark} is a {kind.family} {kind.name}, not {chosen.name}", parameter="--benchmark")
    if name is not None:
        return _variant_plan(settings, chosen, names, kinds, overrides, name)
    if overrides:
        shown = ", ".join(names) or f"the {chosen.name} benchmarks"
        raise InputError(
            f"overriding parameters of {shown} needs --name NEW: a benchmark's name always means the same content",
            parameter="--set",
        )
    if not names:
        return _family_plan(settings, chosen)
    plan: dict[Kind, list[str]] = {}
    for benchmark, kind in zip(names, kinds, strict=True):
        variants.resolve(settings, kind, benchmark)  # unavailable here: says why
        plan.setdefault(kind, []).append(benchmark)
    return BuildPlan(chosen, plan)


def _variant_plan(
    settings: Settings,
    family: Family,
    names: list[str],
    kinds: list[Kind],
    overrides: Mapping[str, Any],
    name: str,
) -> BuildPlan:
    """``--set ... --name NEW``: register (or find) the variant NEW of the one benchmark named, and build it."""
    if len(names) != 1:
        raise InputError("--name needs exactly one --benchmark (the spec it varies)", parameter="--name")
    known = set(variants.load_variants(settings))
    variant = registry.register_variant(settings, kinds[0], name, names[0], overrides)
    return BuildPlan(family, {kinds[0]: [variant.name]}, registered=None if variant.name in known else variant.name)


def _family_plan(settings: Settings, family: Family) -> BuildPlan:
    """Every benchmark of ``family`` that can be built here; the others counted under their reason."""
    plan: dict[Kind, list[str]] = {}
    skipped: list[str] = []
    for kind in family.kinds:
        plan[kind] = list(variants.targets(settings, kind))
        missing = variants.unavailable(settings, kind)
        for reason in sorted(set(missing.values())):
            count = sum(1 for r in missing.values() if r == reason)
            skipped.append(f"skipped {count} {kind.plural if count > 1 else kind.name}: {reason}")
    return BuildPlan(family, {kind: names for kind, names in plan.items() if names}, tuple(skipped))


def listing(settings: Settings, family: str | None) -> Iterator[tuple[str, str | None]]:
    """Every benchmark name of ``family`` (default: the first registered), kind by kind, with a note: why it cannot
    be built here, or the benchmark and overrides a named variant stands for."""
    chosen = registry.family(family or registry.default_family())
    registry.spec_kinds(settings)  # names clashing across families are an error here too
    for kind in chosen.kinds:
        missing = variants.unavailable(settings, kind)
        for name in kind.specs(settings):
            yield name, f"not here: {missing[name]}" if name in missing else None
        for variant in variants.load_variants(settings).values():
            if variant.family == chosen.name and variant.kind == kind.name:
                yield variant.name, f"variant of {variant.base}: {variant.overrides}"


# -- training -------------------------------------------------------------------------------------------------
def training_overrides(items: Iterable[str], **options: str | None) -> dict[str, Any]:
    """``--set`` items, then the options given by name (``--model``, ``--device``), which win."""
    overrides = parse_overrides(items)
    overrides.update({key: value for key, value in options.items() if value})
    return overrides


def trainable_kind(settings: Settings, benchmark: str) -> Kind:
    """The kind of ``benchmark``, which must have examples to train on."""
    kind = registry.kind_of(settings, benchmark)
    if not kind.trainable:
        raise InputError(f"{benchmark} is a {kind.family} {kind.name}: it has no examples to train on")
    return kind

"""The registered benchmark families, typed, and the rules on benchmark names across them (DomainBed-style: explicit,
no lookup by string).

The families are registered in :data:`shiftbench.config.family_registry.REGISTRY` (the built-in ones by module path,
imported on first use; one :func:`register` call for a family made elsewhere). The Dagster asset factory, the CLI
and the tests ask here (:func:`families`, :func:`family`, :func:`kinds`); nothing else names a family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shiftbench.config.family_registry import REGISTRY
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families import variants as _variants
from shiftbench.families.analysis import Analysis
from shiftbench.families.family import Family, Kind
from shiftbench.families.variants import Variant, load_variants, suggest
from shiftbench.specs.naming import TAG_SEPARATOR, paper_name, refusal, tagged, tagged_instead
from shiftbench.store import check_benchmark_name


def register(family: Family) -> None:
    """Make ``family`` known to the pipeline: its assets, checks, partitions, catalog views, CLI and training."""
    REGISTRY.register(family)


def unregister(name: str) -> None:
    REGISTRY.unregister(name)


def names() -> list[str]:
    """The registered families' names, in registration order (no family is imported)."""
    return REGISTRY.names()


def find(name: str) -> Family | None:
    """The registered family ``name`` (imported on first use), None when there is none."""
    found = REGISTRY.get(name)
    if found is not None and not isinstance(found, Family):
        raise TypeError(f"the family registered as {name!r} is a {type(found).__name__}, not a Family")
    return found


def family(name: str) -> Family:
    found = find(name)
    if found is None:
        raise InputError(f"unknown family {name!r}; known: {', '.join(names())}", parameter="family")
    return found


def families() -> dict[str, Family]:
    """Every registered family by name, in registration order (each imported)."""
    return {name: family(name) for name in names()}


def analyses() -> dict[str, Analysis]:
    """Every registered family's analyses by name."""
    return {a.name: a for family in families().values() for a in family.analyses}


def default_family() -> str:
    """What ``shiftbench build`` builds when given neither a family nor benchmarks: the first registered."""
    return names()[0]


def kinds() -> list[Kind]:
    return [kind for family in families().values() for kind in family.kinds]


def spec_kinds(settings: Settings) -> dict[str, Kind]:
    """Every spec name of every family with its kind; a name defined by two kinds is an error.

    Names are global (the catalog, ``versions`` and ``train`` take a bare name), so a user's spec
    file may not reuse a name another family defines.
    """
    owners: dict[str, Kind] = {}
    for kind in kinds():
        for name in kind.specs(settings):
            other = owners.setdefault(name, kind)
            if other is not kind:
                given = [k.spec_source for k in (other, kind) if k.spec_source and settings.value(k.spec_source)]
                files = [f"SHIFTBENCH_{source.upper()}" for source in given]
                raise InputError(
                    f"benchmark name {name!r} is both a {other.family} {other.name} spec and a {kind.family} "
                    f"{kind.name} spec: names are global, rename one",
                    parameter=" or ".join(dict.fromkeys(files)) or None,
                )
    return owners


def spec_owners(settings: Settings) -> dict[str, str]:
    """Every spec name of every family, with the family that defines it (names are global).

    A paper's name stays taken while its spec is built under ``NAME@TAG``: nobody else may use it.
    """
    owners: dict[str, str] = {}
    for name, kind in spec_kinds(settings).items():
        owners[name] = f"a {kind.family} {kind.name} spec"
        owners.setdefault(paper_name(name), f"a {kind.family} {kind.name} spec (the paper's name of {name})")
    return owners


def kind_of(settings: Settings, benchmark: str) -> Kind:
    """The kind a benchmark name belongs to (a spec or a registered variant); unknown names suggest close ones."""
    found = spec_kinds(settings).get(benchmark)
    if found is not None:
        return found
    variants = load_variants(settings)
    variant = variants.get(benchmark)
    if variant is not None:
        return family(variant.family).kind(variant.kind)
    kinds_by_name = spec_kinds(settings)
    refused = refused_paper_name(benchmark, {name: kind.family for name, kind in kinds_by_name.items()})
    if refused is not None:
        raise InputError(refused, parameter="benchmark")
    owners = {name: f"a {kind.family} {kind.name} spec" for name, kind in kinds_by_name.items()}
    owners |= {v.name: f"a {v.family} variant of {v.base}" for v in variants.values()}
    papers = {paper_name(name): name for name in kinds_by_name if paper_name(name) not in kinds_by_name}
    close = suggest(benchmark, owners, papers)  # a paper's name refused here is matched, its NAME@TAG shown
    raise InputError(f"unknown benchmark {benchmark!r}{close}", parameter="benchmark")


def refused_paper_name(benchmark: str, families: Mapping[str, str], *, published: bool = False) -> str | None:
    """Why ``benchmark``, a paper's name, is not among ``families``' names (name -> family) though its
    ``NAME@TAG`` is, with what each tag says about the data and the name to use; None for any other name."""
    instead: dict[str, str | None] = {}
    for name in tagged_instead(benchmark, families):
        owner = find(families[name])
        tag = name.partition(TAG_SEPARATOR)[2]
        if owner is not None and benchmark in owner.shipped_names() and owner.is_source_tag(tag):
            instead[name] = owner.tag_meaning(tag)
    return refusal(benchmark, instead, published=published) if instead else None


def unpublished_paper_name(benchmark: str, splits: Mapping[str, str]) -> str | None:
    """Why ``benchmark`` is no published split when it is a paper's name published only as ``NAME@TAG`` (the
    ``refusal`` :func:`shiftbench.splits.published.published_split` takes), None for any other name."""
    return refused_paper_name(benchmark, splits, published=True)


def register_variant(settings: Settings, kind: Kind, name: str, source: str, overrides: Mapping[str, Any]) -> Variant:
    """Name ``source`` (a spec, or a variant: then its base with both sets of overrides) + ``overrides``.

    The tag follows the data: a variant of ``metashift@generated`` named ``x`` is ``x@generated`` (a name given
    with the same tag is taken as it is; another tag is refused).
    """
    base, merged = source, dict(overrides)
    existing = load_variants(settings).get(source)
    if existing is not None:
        base, merged = existing.base, {**existing.overrides, **overrides}
    return _variants.register(settings, kind, variant_name(name, base), base, merged, spec_owners(settings))


def variant_name(name: str, base: str) -> str:
    """The name a variant of ``base`` asked for as ``name`` gets: the base's source tag follows it."""
    _, separator, tag = base.partition(TAG_SEPARATOR)
    given, given_separator, given_tag = name.partition(TAG_SEPARATOR)
    if given_separator and (not separator or given_tag != tag):
        said = f"{base} carries the tag @{tag}" if separator else f"{base} is built from the paper's own data"
        raise InputError(
            f"'@' is reserved for shiftbench's source tags (NAME@TAG): {said}, so the variant is named "
            f"{tagged(given, tag or None)}",
            parameter="--name",
        )
    return tagged(given, tag or None)


def check_new_name(settings: Settings, name: str, parameter: str) -> str:
    """A name for a new benchmark spec: a valid directory name, no source tag, not a name any family defines."""
    check_benchmark_name(name, parameter)
    if TAG_SEPARATOR in name:
        raise InputError(f"'@' is reserved for shiftbench's source tags (NAME@TAG), got {name!r}", parameter=parameter)
    owners = spec_owners(settings)
    if name in owners:
        raise InputError(f"{name!r} is already {owners[name]}: choose another name", parameter=parameter)
    return name

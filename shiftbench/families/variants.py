"""Named variants: a benchmark built from another benchmark's spec with some parameters overridden.

``shiftbench build --benchmark living17 --set seed=3 --name living17-s3`` (or the launchpad's
``publish_as``) registers ``living17-s3`` = ``living17`` + ``{seed: 3}`` in
``$SHIFTBENCH_HOME/variants.json``. From then on it is a benchmark of its own: its own Dagster
partition, versions and rebuilds. Overriding a benchmark's parameters always needs such a name,
and a name never replaces another benchmark: not a spec's (of any family), not a different
variant, not a benchmark published by another family or from another spec.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.family import Kind, Target
from shiftbench.store import Store, check_benchmark_name, write_atomic
from shiftbench.tables.fingerprint import canonical_json


class Variant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: str
    kind: str
    base: str
    overrides: dict[str, Any]


def load_variants(settings: Settings) -> dict[str, Variant]:
    path = settings.variants_path
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text("utf-8"))
        return {name: Variant.model_validate(entry) for name, entry in data.items()}
    except (ValueError, TypeError) as exc:
        raise InputError(f"unreadable variants file ({exc}); fix or remove it", path=path) from None


def _locked(settings: Settings) -> FileLock:
    settings.home.mkdir(parents=True, exist_ok=True)
    return FileLock(settings.home / ".variants.lock")


def _save(settings: Settings, variants: Mapping[str, Variant]) -> None:
    text = json.dumps({k: v.model_dump() for k, v in sorted(variants.items())}, indent=2, sort_keys=True)
    write_atomic(settings.variants_path, text)


def unregister(settings: Settings, name: str) -> None:
    """Forget a variant (a name registered by a build that then failed, so it published nothing)."""
    with _locked(settings):
        variants = load_variants(settings)
        if variants.pop(name, None) is not None:
            _save(settings, variants)


def register(
    settings: Settings,
    kind: Kind,
    name: str,
    base: str,
    overrides: Mapping[str, Any],
    taken: Mapping[str, str],
) -> Variant:
    """Record ``name`` = ``base`` + ``overrides`` (validated); ``taken`` maps every spec name to its file.

    Registering the same definition again is a no-op; anything that would give an existing name
    other content is an error naming what already holds it.
    """
    check_benchmark_name(name, "--name")
    if "@" in name and name.partition("@")[2] != base.partition("@")[2]:  # only the base's own tag (registry)
        raise InputError(f"'@' is reserved for shiftbench's source tags (NAME@TAG), got {name!r}", parameter="--name")
    specs = kind.specs(settings)
    if base not in specs:
        raise InputError(f"{base!r} is not a {kind.family} {kind.name} spec", parameter="--benchmark")
    if name in taken:
        raise InputError(
            f"{name!r} is already a benchmark spec ({taken[name]}): choose another name", parameter="--name"
        )
    specs[base].with_overrides(overrides)  # validates every value before anything is recorded
    variant = Variant(name=name, family=kind.family, kind=kind.name, base=base, overrides=dict(overrides))
    with _locked(settings):
        variants = load_variants(settings)
        existing = variants.get(name)
        if existing is not None and existing != variant:
            defined = f"{existing.base} with {canonical_json(existing.overrides)}"
            raise InputError(f"{name!r} already names {defined}: choose another name", parameter="--name")
        store = Store(settings.store_dir)
        owner = store.layout.family_of(name)
        latest = store.log.latest(name, family=owner) if owner is not None else None
        if owner is not None and owner != kind.family:
            raise InputError(f"{name!r} is a published {owner} benchmark: choose another name", parameter="--name")
        if existing is None and latest is not None:
            recorded = (latest.params.get("overrides") or {}) if latest.params else {}
            spec = store.layout.staged(owner or kind.family, name, latest.version).manifest().get("spec")
            if spec != base or canonical_json(recorded) != canonical_json(dict(overrides)):
                raise InputError(
                    f"{name!r} is already published from {spec} with {canonical_json(recorded)}: choose another name",
                    parameter="--name",
                )
        if existing is None:
            variants[name] = variant
            _save(settings, variants)
    return variant


def targets(settings: Settings, kind: Kind) -> dict[str, Target]:
    """Every benchmark of ``kind`` that can be built here: its specs, then its named variants."""
    specs = kind.specs(settings)
    found = {name: Target(name, spec) for name, spec in specs.items() if kind.unavailable(settings, spec) is None}
    for variant in load_variants(settings).values():
        if variant.family == kind.family and variant.kind == kind.name and variant.base in found:
            spec = specs[variant.base].with_overrides(variant.overrides)
            found[variant.name] = Target(variant.name, spec, variant.overrides)
    return found


def unavailable(settings: Settings, kind: Kind) -> dict[str, str]:
    """Specs of ``kind`` that cannot be built with these settings, and why."""
    return {
        name: reason
        for name, spec in kind.specs(settings).items()
        if (reason := kind.unavailable(settings, spec)) is not None
    }


def resolve(settings: Settings, kind: Kind, name: str) -> Target:
    """The target named ``name``: a spec or a variant; an unknown name suggests close ones."""
    found = targets(settings, kind)
    if name in found:
        return found[name]
    reason = unavailable(settings, kind).get(name)
    if reason is not None:
        raise InputError(f"{name} cannot be built here: {reason}", parameter="benchmark")
    raise InputError(f"unknown {kind.family} {kind.name} {name!r}{suggest(name, list(found))}", parameter="benchmark")


def suggest(name: str, candidates: list[str] | Mapping[str, str], aliases: Mapping[str, str] | None = None) -> str:
    """ "; did you mean ...?" with up to three close names (and what they are, given a mapping). ``aliases``: names
    matched but never shown, each standing for a candidate (a paper's name for its ``NAME@TAG``)."""
    # A paper's name built from another source here is NAME@TAG (shiftbench.specs.naming): say so first.
    close = [c for c in candidates if c.startswith(f"{name}@")][:3]
    aliases = aliases or {}
    pool = [*candidates, *(a for a in aliases if a not in candidates)]
    for match in difflib.get_close_matches(name, pool, n=3, cutoff=0.6):
        shown = aliases.get(match, match) if match not in candidates else match
        if shown not in close:
            close.append(shown)
    close = close[:3]
    what = candidates if isinstance(candidates, Mapping) else {}
    shown = [f"{c} ({what[c].removeprefix('a ')})" if c in what else c for c in close]
    return f"; did you mean {', '.join(shown)}?" if close else ""

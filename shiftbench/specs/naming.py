"""Names tell the truth: a paper's benchmark name only ever carries that paper's content.

The specs shipped with shiftbench are named after the papers (``living17``, ``metashift``,
``cat-dog-dg-cabinet-bed``, ``celeba-sc-...``). Built from anything but the paper's sources (a
fallback hierarchy, the generated scene sample, a partial CelebA file), such a spec is published
as ``NAME@TAG`` (``living17@wordnet-default``, ``cat-dog-dg-cabinet-bed@generated``), so the
catalog never shows two different contents under one paper name. Names of the user's own specs
and named variants are theirs and are never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

from shiftbench.specs.spec_model import Spec

S = TypeVar("S", bound=Spec)
TAG_SEPARATOR = "@"
_OTHER_DATA = "not the paper's data"


def tagged(name: str, tag: str | None) -> str:
    return f"{name}{TAG_SEPARATOR}{tag}" if tag else name


def with_source_tag(name: str, tag: str) -> str:
    """``NAME@TAG``; a name that carries a tag of its own (``animals10-dg-cabinet-bed@whole-class``: what its spec
    chose) keeps one '@', the source tag joined with '-' (``...@whole-class-gqa-files``), as BREEDS joins its
    (``@breeds-files-edits``)."""
    return f"{name}-{tag}" if TAG_SEPARATOR in name else tagged(name, tag)


def paper_name(name: str) -> str:
    """The paper's name a (possibly tagged) benchmark name starts with."""
    return name.split(TAG_SEPARATOR, 1)[0]


def tag_paper_names(
    specs: Mapping[str, S], shipped: Collection[str], tag: str | Callable[[S], str | None] | None
) -> dict[str, S]:
    """``specs`` by benchmark name, the shipped ones renamed ``NAME@TAG`` when their source is not the paper's."""
    renamed: dict[str, S] = {}
    for name, spec in specs.items():
        spec_tag = tag(spec) if callable(tag) else tag
        if name in shipped and spec_tag:
            spec = spec.model_copy(update={"name": with_source_tag(name, spec_tag)})
        renamed[spec.name] = spec
    return renamed


def tagged_instead(name: str, names: Iterable[str]) -> list[str]:
    """The ``name@TAG`` among ``names`` when ``name`` itself is not one of them: a paper's name refused here."""
    names = list(names)
    if name in names or TAG_SEPARATOR in name:
        return []
    return sorted(n for n in names if paper_name(n) == name)


def refusal(name: str, instead: Mapping[str, str | None], *, published: bool = False) -> str:
    """Why the paper's name ``name`` is refused and which name to use: ``instead`` maps each ``name@TAG`` there is
    to what its tag says about the data (None: the family does not say)."""
    where = "published here from other data" if published else "built from other data with these settings"
    named = "; ".join(f"{n}: {meaning or _OTHER_DATA}" for n, meaning in sorted(instead.items()))
    use = next(iter(instead)) if len(instead) == 1 else f"one of {', '.join(sorted(instead))}"
    return f"{name!r} is the paper's name, given only to the paper's own data; it is {where} ({named}): use {use}"

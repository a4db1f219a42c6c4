"""Names tell the truth: a paper's benchmark name only ever carries that paper's content.

The specs shipped with shiftbench are named after the papers (``living17``, ``metashift``,
``cat-dog-dg-cabinet-bed``, ``celeba-sc-...``). Built from anything but the paper's sources (a
fallback hierarchy, the generated scene sample, a partial CelebA file), such a spec is published
as ``NAME@TAG`` (``living17@wordnet-default``, ``cat-dog-dg-cabinet-bed@generated``), so the
catalog never shows two different contents under one paper name. Names of the user's own specs
and named variants are theirs and are never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from shiftbench.spec_files import Spec

S = TypeVar("S", bound=Spec)
TAG_SEPARATOR = "@"


def tagged(name: str, tag: str | None) -> str:
    return f"{name}{TAG_SEPARATOR}{tag}" if tag else name


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
            spec = spec.model_copy(update={"name": tagged(name, spec_tag)})
        renamed[spec.name] = spec
    return renamed

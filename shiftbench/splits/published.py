"""A published split as the store holds it: its version, manifest and examples, and where its images are.

Below training and evaluation: :func:`shiftbench.load_split`, ``shiftbench train`` (:mod:`shiftbench.erm.launch`),
``eval`` and ``export`` read a split here, one way. Reading opens the store once and looks up one version; it
imports no family (what it needs is in the version's manifest) and no torch. A version whose files do not match
its manifest's sizes and SHA-256 is never served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, StoreError
from shiftbench.splits.images import STANDIN, ImageSource, resolve_images
from shiftbench.splits.standin import TEMPLATE as STANDIN_TEMPLATE
from shiftbench.splits.standin import write_standins
from shiftbench.store import Store, damage

# Store entries that are results (ERM runs, scored predictions, analyses over them), not splits: their families.
RESULT_FAMILIES = ("erm", "eval", "analysis")
# Why a name is no published split, from the families' own words (benchmark, published splits: name -> family) ->
# the refusal or None: :func:`shiftbench.families.registry.unpublished_paper_name`, handed in by the caller so
# that reading a split imports no family.
NameRefusal = Callable[[str, Mapping[str, str]], str | None]


@dataclass(frozen=True)
class PublishedSplit:
    family: str
    benchmark: str
    version: str
    path: Path
    dataset: str
    manifest: dict[str, Any]
    examples: pl.DataFrame  # example_id, split, y, y_name, group


def published_split(
    settings: Settings,
    benchmark: str,
    version: str | None = None,
    *,
    published_only: bool = False,
    refusal: NameRefusal | None = None,
) -> PublishedSplit:
    """A benchmark's version (default: its latest published one) with its examples. ``published_only``: a
    ``version`` that was staged but never published (or was removed since) is refused too, naming the published
    ones (:func:`shiftbench.load_split`); the CLI's ``--version`` takes any version in the store.

    A version whose files do not match its manifest's sizes and SHA-256 is never served (:class:`StoreError` naming
    the file), whoever asks: ``train``, ``eval``, ``export`` and :func:`shiftbench.load_split`. ``refusal`` says why
    an unknown name is not published (a paper's name published only as ``NAME@TAG``)."""
    store = Store(settings.store_dir)
    family = store.layout.family_of(benchmark)
    if family is None or family in RESULT_FAMILIES:
        raise _not_published(store, benchmark, refusal)
    if version is None:
        latest = store.log.latest(benchmark, family=family)
        if latest is None:
            raise InputError(f"benchmark {benchmark!r} has no published version", parameter="benchmark")
        version = latest.version
    elif published_only and not _is_published(store, family, benchmark, version):
        known = [v.version for v in store.log.versions(benchmark)]
        raise InputError(f"{benchmark} has no version {version!r}; published: {', '.join(known)}", parameter="version")
    staged = store.layout.staged(family, benchmark, version)
    problem = damage(staged)  # every table file, before anything is read
    if problem is not None:
        raise StoreError(f"{problem}: not served (`shiftbench check {benchmark}` reports the damage)")
    if not staged.table_path("examples").is_file():
        raise InputError(f"{benchmark} version {version} has no examples to train on", parameter="benchmark")
    manifest = staged.manifest()
    dataset = str(manifest.get("params", {}).get("dataset") or manifest.get("sources", {}).get("dataset") or family)
    examples = pl.read_parquet(staged.table_path("examples"), columns=["example_id", "split", "y", "y_name", "group"])
    return PublishedSplit(family, benchmark, version, staged.path, dataset, manifest, examples)


def _is_published(store: Store, family: str, benchmark: str, version: str) -> bool:
    """Whether ``version`` is among the benchmark's published versions (as :meth:`PublicationLog.versions` lists
    them: in its publication log, not removed by gc, still in the store), from its log alone."""
    logged = any(event["version"] == version for event in store.log.events(family, benchmark))
    there = store.layout.version_dir(family, benchmark, version).is_dir()
    return logged and there and version not in store.log.removed_versions(family, benchmark)


def _not_published(store: Store, benchmark: str, refusal: NameRefusal | None) -> InputError:
    """The error for a name with no published split: a paper's name published only as ``NAME@TAG`` says which
    (``refusal``, the families' words), another name lists some that are published."""
    splits = {v.benchmark: v.family for v in store.log.versions() if v.family not in RESULT_FAMILIES}
    if refusal is not None and (refused := refusal(benchmark, splits)) is not None:
        return InputError(refused, parameter="benchmark")
    known = sorted(splits)
    hint = f"; published: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}" if known else ""
    return InputError(f"no published benchmark {benchmark!r}{hint}", parameter="benchmark")


def split_images(
    settings: Settings, split: PublishedSplit, image_root: str | None = None, path_template: str | None = None
) -> ImageSource:
    """The split's images as its manifest records them, a user's root, or rendered stand-ins."""
    images = resolve_images(settings, split.manifest, image_root, path_template)
    if images.kind != STANDIN:
        return images
    root = settings.cache_dir / "standin" / f"{split.benchmark}-{split.version}"
    write_standins(split.examples, root)
    return ImageSource(root, STANDIN_TEMPLATE, STANDIN)

"""Contract rules of the MetaShift tables written in code: those SQL cannot run in reasonable time.

Each function is named by a ``type: custom`` quality rule of a contract in ``data_contracts/``
(``implementation: shiftbench.metashift.checks:<function>``), receives the version's table files and
returns the number the rule compares (here: how many rows break it). See :mod:`shiftbench.store.contracts`.

The rules' code stays in this one module: a contract's fingerprint hashes the source of the module its custom
rules name (and only that one), so a change here invalidates the checks recorded under the old code. The compiled
count of a class's images (:func:`shiftbench.metashift.kernels.recount_class`) lives beside the build's loops it
shares its mechanics with.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from shiftbench.metashift.compiled import njit_cached
from shiftbench.metashift.index import _bits, _unique_pairs, sorted_unique
from shiftbench.metashift.kernels import recount_class
from shiftbench.runtime.memory import release_freed_memory

_KEY = ["benchmark", "version"]
_EDGE_COLUMNS = pl.Schema(
    {"benchmark": pl.String(), "version": pl.String(), "class": pl.String(), "subset_a": pl.String(),
     "subset_b": pl.String(), "n_shared": pl.Int64(), "overlap": pl.Float64()}
)  # fmt: skip
_SUBSET_COLUMNS = pl.Schema(
    {"benchmark": pl.String(), "version": pl.String(), "subset": pl.String(), "class": pl.String(),
     "n_images": pl.Int64()}
)  # fmt: skip
_MEMBERSHIP_COLUMNS = pl.Schema(
    {"benchmark": pl.String(), "version": pl.String(), "subset": pl.String(), "image_id": pl.String()}
)
# Overlaps are compared with this tolerance (the SQL rules use the same): the values are ratios of integers.
OVERLAP_TOLERANCE = 1e-12


def _scan(files: Mapping[str, Path], table: str, columns: pl.Schema) -> pl.LazyFrame:
    """A table of the version, or no rows when the version has none (as the SQL rules see an absent table)."""
    path = files.get(table)
    if path is None:
        return pl.LazyFrame(schema=dict(columns))
    return pl.scan_parquet(path).select(list(columns))


@njit_cached
def _grouped(codes: np.ndarray, values: np.ndarray, n_codes: int) -> tuple[np.ndarray, np.ndarray]:
    """``values`` grouped by ``codes`` (a counting sort, one pass): group k is ``values[offsets[k]:offsets[k + 1]]``."""
    offsets = np.zeros(n_codes + 1, dtype=np.int64)
    for code in codes:
        offsets[code + 1] += 1
    for k in range(n_codes):
        offsets[k + 1] += offsets[k]
    position = offsets[:-1].copy()
    grouped = np.empty(len(values), dtype=values.dtype)
    for k in range(len(codes)):
        grouped[position[codes[k]]] = values[k]
        position[codes[k]] += 1
    return offsets, grouped


@njit_cached
def _shared_counts(
    offsets: np.ndarray, images: np.ndarray, small: np.ndarray, large: np.ndarray, n_images: int
) -> np.ndarray:
    """|images(small[e]) ∩ images(large[e])| for every edge e, edges sorted by ``large``: the larger subset's images
    are marked once in an array indexed by image, then the smaller's are looked up there (each distinct image once,
    whatever the rows repeat)."""
    marked_by = np.full(n_images, -1, dtype=np.int64)
    counted_for = np.full(n_images, -1, dtype=np.int64)
    shared = np.zeros(len(small), dtype=np.int64)
    current = -1
    for e in range(len(small)):
        if large[e] != current:
            current = large[e]
            for k in range(offsets[current], offsets[current + 1]):
                marked_by[images[k]] = current
        count = 0
        for k in range(offsets[small[e]], offsets[small[e] + 1]):
            image = images[k]
            if marked_by[image] == current and counted_for[image] != e:
                counted_for[image] = e
                count += 1
        shared[e] = count
    return shared


def _stored_edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
    """Edges of ``metashift_edges`` that do not follow from the memberships: ``n_shared`` is not |A ∩ B| counted
    in ``metashift_subset_images``, ``overlap`` is not ``n_shared / min(|A|, |B|)`` (sizes of ``metashift_subsets``),
    or either subset is not of the edge's class.

    The memberships of the edges' subsets are read as integer codes and grouped by subset; each edge marks its
    larger subset's images in an array indexed by image and looks up the smaller's there (compiled: at GQA scale
    74 M lookups in well under a second, with the memberships held once as two 32-bit columns). The same rule in
    SQL joins every class's memberships with themselves on the image (135 M rows there) and took 43 s in DuckDB;
    a polars join of the lookups peaked at 2 GiB.
    """
    edges = _scan(files, "metashift_edges", _EDGE_COLUMNS).collect()
    subsets = _scan(files, "metashift_subsets", _SUBSET_COLUMNS)
    broken = 0
    for (benchmark, version), part in edges.group_by(_KEY):
        same = (pl.col("benchmark") == benchmark) & (pl.col("version") == version)
        ends = pl.concat([part["subset_a"], part["subset_b"]]).unique().sort().to_frame("subset").with_row_index("code")
        members = (
            _scan(files, "metashift_subset_images", _MEMBERSHIP_COLUMNS)
            .filter(same)
            .join(ends.lazy(), on="subset", how="inner")
            .select("code", pl.col("image_id").cast(pl.Categorical).to_physical().alias("image"))
            .collect(engine="streaming")
        )
        codes, images = members["code"].to_numpy(), members["image"].to_numpy()
        del members
        offsets, images = _grouped(codes, images, ends.height)
        del codes
        sizes = pl.DataFrame({"code": ends["code"], "size": np.diff(offsets)})
        # Only the edges' subsets (a GQA-scale collection has 115 k of them among 1.7 M candidates).
        known = (
            subsets.filter(same).join(ends.lazy(), on="subset", how="semi").select("subset", "class", "n_images")
        ).collect()
        coded = (
            part.with_row_index("edge")
            .join(ends.rename({"subset": "subset_a", "code": "a"}), on="subset_a")
            .join(ends.rename({"subset": "subset_b", "code": "b"}), on="subset_b")
            .join(sizes.rename({"code": "a", "size": "members_a"}), on="a")
            .join(sizes.rename({"code": "b", "size": "members_b"}), on="b")
            .join(
                known.rename({"subset": "subset_a", "class": "class_a", "n_images": "size_a"}),
                on="subset_a",
                how="left",
            )
            .join(
                known.rename({"subset": "subset_b", "class": "class_b", "n_images": "size_b"}),
                on="subset_b",
                how="left",
            )
        )
        a_smaller = pl.col("members_a") <= pl.col("members_b")
        lookups = coded.select(
            "edge",
            pl.when(a_smaller).then("a").otherwise("b").alias("small"),
            pl.when(a_smaller).then("b").otherwise("a").alias("large"),
        ).sort("large", "edge")
        shared = _shared_counts(
            offsets,
            images,
            lookups["small"].to_numpy(),
            lookups["large"].to_numpy(),
            int(images.max()) + 1 if len(images) else 0,
        )
        counted = lookups.select("edge", pl.Series("counted", shared))
        checked = coded.join(counted, on="edge", how="left")
        wrong = (
            pl.col("class_a").ne_missing(pl.col("class"))
            | pl.col("class_b").ne_missing(pl.col("class"))
            | (pl.col("counted") != pl.col("n_shared"))
            | (pl.col("overlap") - pl.col("n_shared") / pl.min_horizontal("size_a", "size_b"))
            .abs()
            .gt(OVERLAP_TOLERANCE)
            .fill_null(True)
        )
        broken += int(checked.select(wrong.sum()).item())
    return broken


# -- versions that store their annotations (metashift_scene_*), not their memberships ------------------------------
_SCENE_TABLES = (
    "metashift_scene_objects",
    "metashift_scene_contexts",
    "metashift_scene_class_names",
    "metashift_scene_vocabulary",
)
_SELECTED_COLUMNS = pl.Schema(
    {"benchmark": pl.String(), "version": pl.String(), "subset": pl.String(), "class": pl.String(),
     "context": pl.String(), "context_kind": pl.String(), "n_images": pl.Int64(), "selected": pl.Boolean()}
)  # fmt: skip
_KIND_NUMBER = {"object": 0, "general": 1, "attribute": 2}
DENSE_PAIRS_MAX = 8192  # a class's selected subsets counted in a dense matrix up to this many


def _stores_scenes(files: Mapping[str, Path]) -> bool:
    return all(table in files for table in _SCENE_TABLES)


def _csr(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """Offsets of rows sorted by ``rows``."""
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=offsets[1:])
    return offsets


@dataclass(frozen=True)
class _Recount:
    """A version's selected subsets (sorted by name) with the sizes and shared images counted from its annotations."""

    subsets: pl.DataFrame  # subset, class, n_images, counted
    shared: np.ndarray  # |A ∩ B| of every pair asked for, in its order (-1: not two selected subsets of its class)


def _scene_recount(files: Mapping[str, Path], benchmark: str, version: str) -> _Recount:
    """The sizes of a version's selected subsets and the shared images of its edges, counted again from the stored
    annotations (both rules read it: made once per version and files, :func:`_recount_of`)."""
    same = (pl.col("benchmark") == benchmark) & (pl.col("version") == version)
    asked = _scan(files, "metashift_edges", _EDGE_COLUMNS).filter(same).select("class", "subset_a", "subset_b")
    return _count_again(files, same, asked)


_RECOUNTS: dict[tuple[Any, ...], _Recount] = {}


def _recount_of(files: Mapping[str, Path], benchmark: str, version: str) -> _Recount:
    """One recount per version and set of files (their paths, sizes and times): the two rules share it."""
    key = (
        benchmark,
        version,
        *sorted((name, str(p), p.stat().st_size, p.stat().st_mtime_ns) for name, p in files.items()),
    )
    if key not in _RECOUNTS:
        _RECOUNTS.clear()  # only the version being checked is kept
        _RECOUNTS[key] = _scene_recount(files, benchmark, version)
    return _RECOUNTS[key]


@dataclass(frozen=True)
class _Stored:
    """A version's stored annotations as arrays: an image's tags (CSR), who shows each class, the class's
    attributes (sorted by class then image), and the vocabulary."""

    tag_offsets: np.ndarray
    tags: np.ndarray
    kinds: np.ndarray  # 0 object, 1 general
    shows_offsets: np.ndarray  # the images that show class code c: shows_image[shows_offsets[c] : shows_offsets[c + 1]]
    shows_image: np.ndarray
    attribute_class: np.ndarray
    attribute_image: np.ndarray
    attribute_code: np.ndarray
    code_of: dict[str, int]
    size: int


def _stored(files: Mapping[str, Path], same: pl.Expr) -> _Stored:
    vocabulary = pl.scan_parquet(files["metashift_scene_vocabulary"]).filter(same).select("code", "value").collect()
    code_of = dict(zip(vocabulary["value"].to_list(), vocabulary["code"].to_list(), strict=True))
    size = max(code_of.values(), default=0) + 1  # a code outside the vocabulary counts as its last one, for nothing
    # One row per (image, code, kind), sorted by image (the store writes them sorted; a file may not be), a row given
    # twice (which the primary key rule reports) once: one polars sort of one packed 64-bit key, codes as int32.
    keys = []
    for table, column, kind in (("metashift_scene_objects", "name", 0), ("metashift_scene_contexts", "context", 1)):
        keys.append(
            pl.scan_parquet(files[table])
            .filter(same)
            .select(
                (pl.col("image").cast(pl.UInt64) * (1 << 33))
                + (pl.col(column).clip(0, size - 1).cast(pl.UInt64) * 2)
                + kind
            )
            .collect()
            .to_series()
        )
    key = sorted_unique(np.concatenate([k.to_numpy() for k in keys]) if len(keys) > 1 else keys[0].to_numpy())
    del keys
    image = (key >> np.uint64(33)).astype(np.int32)
    tags = ((key >> np.uint64(1)) & np.uint64(0xFFFFFFFF)).astype(np.int32)
    kinds = (key & np.uint64(1)).astype(np.int8)
    del key
    n_images = int(image.max()) + 1 if len(image) else 1
    names = pl.scan_parquet(files["metashift_scene_class_names"]).filter(same).select("class", "name").collect()
    names = names.filter((pl.col("name") >= 0) & (pl.col("name") < size)).sort("name", "class")
    # the images that show each class: an object row whose name is one of the class's names
    objects_only = not kinds.any()  # tag tables and object-only collections: every row, without a copy
    rows = slice(None) if objects_only else np.flatnonzero(kinds == 0)
    classes: np.ndarray
    shown: np.ndarray
    if names["name"].is_duplicated().any():  # class groups: a name may show several classes
        name_offsets = _csr(names["name"].to_numpy().astype(np.int64), size)
        per_row = np.diff(name_offsets)[tags[rows]]
        starts = np.repeat(name_offsets[tags[rows]], per_row)
        member = starts + (np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row))
        classes = names["class"].to_numpy().astype(np.int64)[member]
        shown = np.repeat(image[rows], per_row).astype(np.int64)
    else:  # each name shows one class at most: a lookup (no copy of every row when all are objects, as in tag tables)
        class_of = np.full(size, -1, dtype=np.int32)
        class_of[names["name"].to_numpy()] = names["class"].to_numpy()
        of_row = class_of[tags[rows]]
        keep = of_row >= 0
        classes, shown = of_row[keep], image[rows][keep]
        del of_row, keep
    shows_class, shows_image = _unique_pairs(classes, shown, _bits(n_images))
    del classes, shown, rows
    shows_offsets = _csr(shows_class, size)
    shows_image = shows_image.astype(np.int32)  # images < 2^31 (stored as Int32)
    del shows_class
    attributes = pl.DataFrame(schema={"image": pl.Int32, "class": pl.Int32, "attribute": pl.Int32})
    if "metashift_scene_attributes" in files:
        stored = pl.scan_parquet(files["metashift_scene_attributes"]).filter(same)
        attributes = stored.select("image", "class", "attribute").collect()
    attributes = attributes.filter((pl.col("attribute") >= 0) & (pl.col("attribute") < size))
    attributes = attributes.sort("class", "image", "attribute")
    return _Stored(
        _csr(image, n_images),
        tags,
        kinds,
        shows_offsets,
        shows_image,
        attributes["class"].to_numpy().astype(np.int64),
        attributes["image"].to_numpy().astype(np.int64),
        attributes["attribute"].to_numpy().astype(np.int64),
        code_of,
        size,
    )


def _count_again(files: Mapping[str, Path], same: pl.Expr, edges: pl.LazyFrame) -> _Recount:
    """Count again, class by class, the images of a version's selected subsets and of the pairs ``asked`` (edges):
    an image is in class(context) when an object name of the class shows in it (``metashift_scene_class_names``)
    and it has the context (``metashift_scene_objects``: an object name; ``metashift_scene_contexts``: an
    image-level context;
    ``metashift_scene_attributes``: an attribute of an object of the class). Reads the stored tables only (not the
    build's index), in compiled loops over the images of one class at a time, classes on threads."""
    subsets = _scan(files, "metashift_subsets", _SELECTED_COLUMNS).filter(same & pl.col("selected")).collect()
    ordered = subsets.with_row_index("row").sort("class", "subset")
    ordered = ordered.with_columns(pl.int_range(pl.len()).over("class").alias("number"))
    # the pairs asked for, as the numbers of their subsets within the edge's class (NULL: not a selected subset of it)
    numbered = ordered.select("class", "subset", "number")
    asked = edges.collect()  # collected here, so that its names are freed once the pairs are numbered
    pairs_asked = (
        asked.with_row_index("pair")
        .join(numbered.rename({"subset": "subset_a", "number": "x"}), on=["class", "subset_a"], how="left")
        .join(numbered.rename({"subset": "subset_b", "number": "y"}), on=["class", "subset_b"], how="left")
        .filter(pl.col("x").is_not_null() & pl.col("y").is_not_null())
        .select("pair", "class", "x", "y")  # the names are not kept: only the numbers are looked up
    )
    n_asked = asked.height
    del asked
    release_freed_memory()
    stored = _stored(files, same)  # after the names are gone: the two never wait in memory together
    by_class = {key[0]: frame for key, frame in pairs_asked.partition_by("class", as_dict=True).items()}
    counted = np.full(subsets.height, -1, dtype=np.int64)
    shared = np.full(n_asked, -1, dtype=np.int64)
    scratch: dict[int, np.ndarray] = {}

    def one(class_name: str, part: pl.DataFrame) -> None:
        local = scratch.setdefault(threading.get_ident(), np.full((3, stored.size), -1, dtype=np.int64))
        code = stored.code_of.get(class_name, -1)
        contexts = [stored.code_of.get(c, -1) for c in part["context"].to_list()]
        kinds = [_KIND_NUMBER[k] for k in part["context_kind"].to_list()]
        for number, (kind, context) in enumerate(zip(kinds, contexts, strict=True)):
            if context >= 0:
                local[kind, context] = number
        k = part.height
        lo, hi = (stored.shows_offsets[code], stored.shows_offsets[code + 1]) if code >= 0 else (0, 0)
        a_lo, a_hi = np.searchsorted(stored.attribute_class, [code, code + 1])
        wanted = by_class.get(class_name)
        dense = wanted is not None and k <= DENSE_PAIRS_MAX
        pairs = np.zeros((k, k) if dense else (0, 0), dtype=np.int64)
        images = stored.shows_image[lo:hi]
        counted[part["row"].to_numpy()] = recount_class(
            images,
            stored.tag_offsets,
            stored.tags,
            stored.kinds,
            stored.attribute_image[a_lo:a_hi],
            stored.attribute_code[a_lo:a_hi],
            local,
            k,
            pairs,
        )
        if wanted is not None:
            x, y = wanted["x"].to_numpy(), wanted["y"].to_numpy()
            low, high = np.minimum(x, y), np.maximum(x, y)
            if dense:
                shared[wanted["pair"].to_numpy()] = pairs[low, high]
            else:
                for pair, first, second in zip(wanted["pair"].to_list(), low.tolist(), high.tolist(), strict=True):
                    shared[pair] = _shared_slow(
                        images, stored.tag_offsets, stored.tags, stored.kinds, local, first, second
                    )
        for kind, context in zip(kinds, contexts, strict=True):
            if context >= 0:
                local[kind, context] = -1

    with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(lambda item: one(str(item[0][0]), item[1]), ordered.group_by("class", maintain_order=True)))
    return _Recount(subsets.with_columns(pl.Series("counted", counted)), shared)


def _shared_slow(
    images: np.ndarray,
    tag_offsets: np.ndarray,
    tags: np.ndarray,
    kinds: np.ndarray,
    local: np.ndarray,
    first: int,
    second: int,
) -> int:
    """|A ∩ B| of two subsets of a class too large for a dense matrix (object and general contexts)."""
    count = 0
    for image in images.tolist():
        numbers = {int(local[kinds[j], tags[j]]) for j in range(tag_offsets[image], tag_offsets[image + 1])}
        count += first in numbers and second in numbers
    return count


def _scene_versions(files: Mapping[str, Path]) -> list[tuple[str, str]]:
    keys = _scan(files, "metashift_subsets", _SELECTED_COLUMNS).select(*_KEY).unique().collect()
    return sorted(keys.iter_rows())


def _scene_subset_size_mismatches(files: Mapping[str, Path]) -> int:
    broken = 0
    for benchmark, version in _scene_versions(files):
        recount = _recount_of(files, benchmark, version)
        broken += recount.subsets.filter(pl.col("counted") != pl.col("n_images")).height
    return broken


def _scene_edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
    n_edges = _scan(files, "metashift_edges", _EDGE_COLUMNS).select(pl.len()).collect().item()
    broken = 0
    checked = 0
    for benchmark, version in _scene_versions(files):
        same = (pl.col("benchmark") == benchmark) & (pl.col("version") == version)
        mine = _scan(files, "metashift_edges", _EDGE_COLUMNS).filter(same).drop(*_KEY).collect()
        recount = _recount_of(files, benchmark, version)
        known = recount.subsets.select("subset", "class", "n_images")
        checked_edges = (
            mine.with_columns(pl.Series("counted", recount.shared).replace(-1, None))
            .join(known.rename({"subset": "subset_a", "class": "class_a", "n_images": "size_a"}), on="subset_a",
                  how="left")
            .join(known.rename({"subset": "subset_b", "class": "class_b", "n_images": "size_b"}), on="subset_b",
                  how="left")
        )  # fmt: skip
        wrong = (
            pl.col("class_a").ne_missing(pl.col("class"))
            | pl.col("class_b").ne_missing(pl.col("class"))
            | pl.col("counted").ne_missing(pl.col("n_shared"))
            | (pl.col("overlap") - pl.col("n_shared") / pl.min_horizontal("size_a", "size_b"))
            .abs()
            .gt(OVERLAP_TOLERANCE)
            .fill_null(True)
        )
        broken += int(checked_edges.select(wrong.sum()).item())
        checked += mine.height
    # edges of a version without selected subsets: nothing they could follow from
    return broken + int(n_edges) - checked


def edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
    """Edges of ``metashift_edges`` that do not follow from the version's subsets: ``n_shared`` is not |A ∩ B|
    counted again from its stored annotations (or, for a version written before them, its stored memberships),
    ``overlap`` is not ``n_shared / min(|A|, |B|)``, or a subset is not a selected subset of the edge's class."""
    if "metashift_edges" not in files:
        return 0
    return _scene_edge_overlap_mismatches(files) if _stores_scenes(files) else _stored_edge_overlap_mismatches(files)


def subset_size_mismatches(files: Mapping[str, Path]) -> int:
    """Selected subsets whose ``n_images`` is not the number of their images, counted again from the version's
    stored annotations (or, for a version written before them, from its stored ``metashift_subset_images``)."""
    if _stores_scenes(files):
        return _scene_subset_size_mismatches(files)
    subsets = _scan(files, "metashift_subsets", _SELECTED_COLUMNS).select(*_KEY, "subset", "n_images")
    members = _scan(files, "metashift_subset_images", _MEMBERSHIP_COLUMNS).group_by(*_KEY, "subset").len("n")
    joined = subsets.join(members, on=[*_KEY, "subset"], how="left")
    return int(joined.filter(pl.col("n").fill_null(0) != pl.col("n_images")).select(pl.len()).collect().item())

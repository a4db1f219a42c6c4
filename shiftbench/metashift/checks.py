"""Contract rules of the MetaShift tables written in code: those SQL cannot run in reasonable time.

Each function is named by a ``type: custom`` quality rule of a contract in ``data_contracts/``
(``implementation: shiftbench.metashift.checks:<function>``), receives the version's table files and
returns the number the rule compares (here: how many rows break it). See :mod:`shiftbench.contracts`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import polars as pl
from numba import njit

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


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
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
_SCENE_TABLES = ("metashift_scene_tags", "metashift_scene_class_names", "metashift_scene_vocabulary")
MEMBERSHIP_CHUNK = 30_000_000  # (class, image, tag) rows joined at a time: memory stays bounded at any scale
_SELECTED_COLUMNS = pl.Schema(
    {"benchmark": pl.String(), "version": pl.String(), "subset": pl.String(), "class": pl.String(),
     "context": pl.String(), "context_kind": pl.String(), "n_images": pl.Int64(), "selected": pl.Boolean()}
)  # fmt: skip


def _stores_scenes(files: Mapping[str, Path]) -> bool:
    return all(table in files for table in _SCENE_TABLES)


def _scene_versions(files: Mapping[str, Path]) -> Iterator[tuple[pl.Expr, pl.DataFrame]]:
    """Per version of the files: a filter for its rows, and its selected subsets with their codes and a number."""
    subsets = _scan(files, "metashift_subsets", _SELECTED_COLUMNS).filter(pl.col("selected")).collect()
    vocabulary = pl.scan_parquet(files["metashift_scene_vocabulary"]).select(*_KEY, "code", "value").collect()
    for (benchmark, version), part in subsets.group_by(_KEY):
        same = (pl.col("benchmark") == benchmark) & (pl.col("version") == version)
        words = vocabulary.filter(same).select("code", "value")
        coded = (
            part.sort("subset")
            .with_row_index("number")
            .join(words.rename({"value": "class", "code": "class_code"}), on="class", how="left")
            .join(words.rename({"value": "context", "code": "context_code"}), on="context", how="left")
        )
        yield same, coded


def _scene_memberships(
    files: Mapping[str, Path], same: pl.Expr, subsets: pl.DataFrame
) -> Iterator[tuple[pl.DataFrame, np.ndarray, np.ndarray]]:
    """The images of the selected subsets, counted again from the stored annotations, a chunk of classes at a time:
    (the chunk's subsets, their numbers and images as two arrays, one row per membership).

    An image is in class(context) when an object name of the class shows in it (``metashift_scene_class_names``)
    and it has the context (``metashift_scene_tags``, kind object or general; ``metashift_scene_attributes`` for an
    attribute of an object of the class). Independent of the build's index: joins over the stored tables.
    """
    tags = pl.scan_parquet(files["metashift_scene_tags"]).filter(same).select("image", "tag", "kind").collect()
    names = pl.scan_parquet(files["metashift_scene_class_names"]).filter(same).select("class", "name").collect()
    attributes = (
        pl.scan_parquet(files["metashift_scene_attributes"])
        .filter(same)
        .select("image", "class", "attribute")
        .collect()
        if "metashift_scene_attributes" in files
        else pl.DataFrame(schema={"image": pl.Int32, "class": pl.Int32, "attribute": pl.Int32})
    )
    shows = (
        tags.filter(pl.col("kind") == "object")
        .join(names, left_on="tag", right_on="name")
        .select("class", "image")
        .unique()
    )
    per_image = tags.group_by("image").len("n_tags")
    load = shows.join(per_image, on="image", how="left").group_by("class").agg(pl.col("n_tags").sum()).sort("class")
    chunk: list[int] = []
    rows = 0
    for klass, n in load.iter_rows():
        chunk.append(int(klass))
        rows += int(n or 0)
        if rows >= MEMBERSHIP_CHUNK:
            yield _chunk_memberships(subsets, chunk, shows, tags, attributes)
            chunk, rows = [], 0
    if chunk:
        yield _chunk_memberships(subsets, chunk, shows, tags, attributes)
    unknown = subsets.filter(pl.col("class_code").is_null() | ~pl.col("class_code").is_in(load["class"].implode()))
    if unknown.height:  # a selected subset whose class no stored annotation shows: it has no image here
        yield unknown, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _chunk_memberships(
    subsets: pl.DataFrame, chunk: list[int], shows: pl.DataFrame, tags: pl.DataFrame, attributes: pl.DataFrame
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    wanted = subsets.filter(pl.col("class_code").is_in(chunk))
    shown = shows.filter(pl.col("class").is_in(chunk))
    by_context = (
        shown.join(tags, on="image")
        .join(
            wanted.select("number", "class_code", "context_code", pl.col("context_kind").alias("kind")),
            left_on=["class", "tag", "kind"],
            right_on=["class_code", "context_code", "kind"],
        )
        .select("number", "image")
    )
    by_attribute = attributes.filter(pl.col("class").is_in(chunk)).join(
        wanted.filter(pl.col("context_kind") == "attribute").select("number", "class_code", "context_code"),
        left_on=["class", "attribute"],
        right_on=["class_code", "context_code"],
    )
    members = pl.concat([by_context, by_attribute.select("number", "image")]).unique()
    return wanted, members["number"].to_numpy().astype(np.int64), members["image"].to_numpy().astype(np.int64)


def _scene_subset_size_mismatches(files: Mapping[str, Path]) -> int:
    broken = 0
    for same, subsets in _scene_versions(files):
        for wanted, numbers, _ in _scene_memberships(files, same, subsets):
            counted = np.bincount(numbers, minlength=subsets.height)
            sizes = counted[wanted["number"].to_numpy()]
            broken += int((sizes != wanted["n_images"].to_numpy()).sum())
    return broken


def _scene_edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
    edges = _scan(files, "metashift_edges", _EDGE_COLUMNS).collect()
    broken = 0
    checked = 0
    for same, subsets in _scene_versions(files):
        mine = edges.filter(same)
        numbered = subsets.select("subset", "number", "class", "n_images")
        coded = (
            mine.with_row_index("edge")
            .join(numbered.rename({"subset": "subset_a", "number": "a", "class": "class_a", "n_images": "size_a"}),
                  on="subset_a", how="left")
            .join(numbered.rename({"subset": "subset_b", "number": "b", "class": "class_b", "n_images": "size_b"}),
                  on="subset_b", how="left")
        )  # fmt: skip
        counted = np.full(coded.height, -1, dtype=np.int64)
        for wanted, numbers, images in _scene_memberships(files, same, subsets):
            if not len(numbers):
                continue
            offsets, grouped = _grouped(numbers, images, subsets.height)
            in_chunk = coded.filter(pl.col("a").is_in(wanted["number"].implode()))
            if not in_chunk.height:
                continue
            sizes = np.diff(offsets)
            a, b = in_chunk["a"].to_numpy(), in_chunk["b"].fill_null(0).to_numpy()
            a_smaller = sizes[a] <= sizes[b]
            small, large = np.where(a_smaller, a, b), np.where(a_smaller, b, a)
            order = np.lexsort((np.arange(len(large)), large))
            shared = _shared_counts(offsets, grouped, small[order], large[order], int(images.max()) + 1)
            counted[in_chunk["edge"].to_numpy()[order]] = shared
        checked += coded.height
        result = coded.with_columns(pl.Series("counted", counted))
        wrong = (
            pl.col("a").is_null()
            | pl.col("b").is_null()
            | pl.col("class_a").ne_missing(pl.col("class"))
            | pl.col("class_b").ne_missing(pl.col("class"))
            | (pl.col("counted") != pl.col("n_shared"))
            | (pl.col("overlap") - pl.col("n_shared") / pl.min_horizontal("size_a", "size_b"))
            .abs()
            .gt(OVERLAP_TOLERANCE)
            .fill_null(True)
        )
        broken += int(result.select(wrong.sum()).item())
    # edges of a version without selected subsets: nothing they could follow from
    return broken + edges.height - checked


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

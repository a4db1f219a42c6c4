"""Contract rules of the MetaShift tables written in code: those SQL cannot run in reasonable time.

Each function is named by a ``type: custom`` quality rule of a contract in ``data_contracts/``
(``implementation: shiftbench.metashift.checks:<function>``), receives the version's table files and
returns the number the rule compares (here: how many rows break it). See :mod:`shiftbench.contracts`.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
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

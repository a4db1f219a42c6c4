"""Contract rules of the MetaShift tables written in code: those SQL cannot run in reasonable time.

Each function is named by a ``type: custom`` quality rule of a contract in ``data_contracts/``
(``implementation: shiftbench.metashift.checks:<function>``), receives the version's table files and
returns the number the rule compares (here: how many rows break it). See :mod:`shiftbench.contracts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

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


def _pair_key(subset: str) -> pl.Expr:
    return pl.col(subset).cast(pl.UInt64) * 2**32 + pl.col("image").cast(pl.UInt64)


def _end(subsets: pl.DataFrame, end: str) -> pl.DataFrame:
    """``subsets`` named as one end of an edge: subset_a, class_a, size_a (or b)."""
    return subsets.rename({"subset": f"subset_{end}", "class": f"class_{end}", "n_images": f"size_{end}"})


def edge_overlap_mismatches(files: Mapping[str, Path]) -> int:
    """Edges of ``metashift_edges`` that do not follow from the memberships: ``n_shared`` is not |A ∩ B| counted
    in ``metashift_subset_images``, ``overlap`` is not ``n_shared / min(|A|, |B|)`` (sizes of ``metashift_subsets``),
    or either subset is not of the edge's class.

    Each edge looks up the images of its smaller subset among the larger subset's images (a streaming polars
    join; at GQA scale 74 M lookups in about 3 s). The same rule in SQL joins every class's memberships with
    themselves on the image (135 M rows there) and took 43 s in DuckDB, 12 s with integer codes.
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
        sizes = members.group_by("code").len("size")
        known = subsets.filter(same).select("subset", "class", "n_images").collect()
        coded = (
            part.with_row_index("edge")
            .join(ends.rename({"subset": "subset_a", "code": "a"}), on="subset_a")
            .join(ends.rename({"subset": "subset_b", "code": "b"}), on="subset_b")
            .join(sizes.rename({"code": "a", "size": "members_a"}), on="a", how="left")
            .join(sizes.rename({"code": "b", "size": "members_b"}), on="b", how="left")
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
        a_smaller = pl.col("members_a").fill_null(0) <= pl.col("members_b").fill_null(0)
        lookups = coded.select(
            "edge",
            pl.when(a_smaller).then("a").otherwise("b").alias("small"),
            pl.when(a_smaller).then("b").otherwise("a").alias("large"),
        )
        # (subset, image) as one 64-bit key: a single-column semi-join (a third less memory than two columns)
        keys = members.select(_pair_key("code").alias("key"))
        shared = (
            lookups.lazy()
            .join(members.lazy().rename({"code": "small"}), on="small")
            .select("edge", _pair_key("large").alias("key"))
            .join(keys.lazy(), on="key", how="semi")
            .group_by("edge")
            .len("counted")
            .collect(engine="streaming")
        )
        del keys, members
        checked = coded.join(shared, on="edge", how="left").with_columns(pl.col("counted").fill_null(0))
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

"""ConDS family: from an attribute table and a case to the published tables of one case version.

Dataset card
------------
- Source: ConDS (Jeon et al., TMLR 2025, "An Analysis of Model Robustness across Concurrent Distribution
  Shifts"); CelebA attributes (non-commercial research use), a user's attribute table, or the
  generated ``sprites`` images (not dSprites: drawn by shiftbench, see ``sources/sprites.py``).
- A *case* is a benchmark: label + a shift type per attribute. Splits (WILDS names): ``train``
  and ``id_val`` (held out of the drawn training distribution, same distribution) and ``test``
  (uniform over all cells, the OOD split). ``group`` is the full cell
  (``label=value|attribute=value|...``), the key of worst-group metrics.
- ``conds_examples`` has one column per attribute (the label included) next to ``y``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from shiftbench.conds.engine import Draw, draw_case
from shiftbench.conds.specs import CaseSpec
from shiftbench.conds.summary import ShiftSummary, summarize
from shiftbench.families.benchmarks_table import benchmarks_row
from shiftbench.warehouse.magnitudes import SCOPE_ALL, magnitudes_table

FAMILY = "conds"
# The shift measures of a ConDS case, measured on the published split.
MEASURES = {
    "tv_distance": "ConDS: total variation distance between the train and test distributions of the joint "
    "(label, attributes) values",
    "cramers_v": "ConDS: Cramér's V between the label and one attribute (scope) on train",
    "mutual_information": "ConDS: mutual information between the label and one attribute (scope) on train, in bits",
}

CASE_SCHEMA = pl.Schema(
    {
        "dataset": pl.String(),
        "label": pl.String(),
        "attributes": pl.List(pl.String()),
        "shift_kind": pl.String(),
        "sc_attribute": pl.String(),
        "ldd_attribute": pl.String(),
        "uds_attribute": pl.String(),
        "n_cells": pl.Int64(),
        "test_per_cell": pl.Int64(),
        "requested_train_size": pl.Int64(),
        "largest_train_size": pl.Int64(),
        "scaled_down": pl.Boolean(),
        "n_train": pl.Int64(),
        "n_id_val": pl.Int64(),
        "n_test": pl.Int64(),
        "id_val_fraction": pl.Float64(),
        "sc_counterexample_fraction": pl.Float64(),
        "sc_observed_fraction": pl.Float64(),
        "ldd_rare_frequency": pl.Float64(),
        "ldd_observed_ratio": pl.Float64(),
        "tv_distance": pl.Float64(),
    }
)
ATTRIBUTE_SCHEMA = pl.Schema(
    {
        "attribute": pl.String(),
        "role": pl.String(),
        "shift": pl.String(),
        "values": pl.List(pl.String()),
        "sc_aligned_values": pl.List(pl.String()),
        "ldd_rare_values": pl.List(pl.String()),
        "uds_unseen_values": pl.List(pl.String()),
        "unseen_in_train": pl.List(pl.String()),
        "cramers_v": pl.Float64(),
        "mutual_information": pl.Float64(),
    }
)


def shift_kind(case: CaseSpec) -> str:
    return "+".join(s for s, _ in case.shifts) or "uniform"


def _case_row(case: CaseSpec, draw: Draw, summary: ShiftSummary) -> pl.DataFrame:
    counts = draw.assignments.group_by("split").len()
    n = dict(counts.iter_rows())
    row = {
        "dataset": case.dataset,
        "label": case.label.name,
        "attributes": [a.name for a in case.attributes],
        "shift_kind": shift_kind(case),
        "sc_attribute": case.attribute_with("sc"),
        "ldd_attribute": case.attribute_with("ldd"),
        "uds_attribute": case.attribute_with("uds"),
        "n_cells": draw.cells.height,
        "test_per_cell": case.test_per_cell,
        "requested_train_size": case.train_size,
        "largest_train_size": draw.largest_train_size,
        "scaled_down": draw.scaled_down,
        "n_train": n.get("train", 0),
        "n_id_val": n.get("id_val", 0),
        "n_test": n.get("test", 0),
        "id_val_fraction": case.id_val_fraction,
        "sc_counterexample_fraction": case.sc_counterexample_fraction if case.attribute_with("sc") else None,
        "sc_observed_fraction": summary.sc_observed_fraction,
        "ldd_rare_frequency": case.ldd_rare_frequency if case.attribute_with("ldd") else None,
        "ldd_observed_ratio": summary.ldd_observed_ratio,
        "tv_distance": summary.tv_distance,
    }
    return pl.DataFrame([row], schema=CASE_SCHEMA)


def _attribute_rows(case: CaseSpec, summary: ShiftSummary) -> pl.DataFrame:
    rows = []
    for attribute in [case.label, *case.attributes]:
        shift = case.shift_of(attribute.name)
        rows.append(
            {
                "attribute": attribute.name,
                "role": "label" if attribute.name == case.label.name else "attribute",
                "shift": shift,
                "values": list(attribute.values),
                "sc_aligned_values": list(case.sc_aligned_values[attribute.name]) if shift == "sc" else None,
                "ldd_rare_values": list(case.ldd_rare_values[attribute.name]) if shift == "ldd" else None,
                "uds_unseen_values": list(case.uds_unseen_values[attribute.name]) if shift == "uds" else None,
            }
        )
    declared = pl.DataFrame(rows, schema={k: ATTRIBUTE_SCHEMA[k] for k in list(ATTRIBUTE_SCHEMA)[:7]})
    return declared.join(summary.attributes, on="attribute", how="left").select(list(ATTRIBUTE_SCHEMA))


def case_tables(
    case: CaseSpec,
    table: pl.DataFrame,
    sources: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
) -> tuple[dict[str, pl.DataFrame], Draw, ShiftSummary]:
    """All tables of one case version (without ``version``), from the dataset's attribute table."""
    draw = draw_case(table, case)
    names = [case.label.name, *[a.name for a in case.attributes]]
    y_of = {v: k for k, v in enumerate(case.label.values)}
    drawn = draw.assignments.join(table.select("example_id", *names), on="example_id").sort("example_id")
    summary = summarize(drawn.select("example_id", "split", *names), drawn["cell"], case)
    conds_examples = drawn.select(
        "example_id",
        "split",
        pl.col(case.label.name).replace_strict(y_of, return_dtype=pl.Int32).alias("y"),
        *names,
    )
    examples = drawn.select(
        pl.lit(FAMILY).alias("family"),
        pl.lit(case.dataset).alias("dataset"),
        "example_id",
        "split",
        pl.col(case.label.name).replace_strict(y_of, return_dtype=pl.Int32).alias("y"),
        pl.col(case.label.name).alias("y_name"),
        pl.col("cell").alias("group"),
    )
    params = {**case.params(), "overrides": dict(overrides or {})}
    cells = draw.cells.select(
        "cell", "y", "stratum", "weight", "n_available", "train_pool", "n_train", "n_id_val", "n_test"
    )
    tables = {
        "benchmarks": benchmarks_row(FAMILY, case.name, params, sources, examples.height),
        "examples": examples,
        "conds_examples": conds_examples,
        "conds_cases": _case_row(case, draw, summary),
        "conds_attributes": _attribute_rows(case, summary),
        "conds_value_counts": summary.value_counts,
        "conds_cells": cells,
        "shift_magnitudes": magnitudes(summary),
    }
    return tables, draw, summary


def magnitudes(summary: ShiftSummary) -> pl.DataFrame:
    """TV distance of the case, and each attribute's association with the label on train."""
    rows: list[tuple[str, str, float | None]] = [("tv_distance", SCOPE_ALL, summary.tv_distance)]
    for attribute, v, mi in summary.attributes.select("attribute", "cramers_v", "mutual_information").iter_rows():
        rows += [("cramers_v", attribute, v), ("mutual_information", attribute, mi)]
    return magnitudes_table(FAMILY, rows)

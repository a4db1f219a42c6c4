"""Shift summaries measured on a published ConDS split (never copied from the case's parameters).

Per attribute (the label included): the value counts of every split, the label-attribute
association in ``train`` (Cramér's V and mutual information in bits), and the values seen at
test but never in training. Per case: the total-variation distance between the train and test
joint distributions over cells, the observed SC counterexample fraction and the observed LDD
rare-to-common ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from shiftbench.conds.specs import CaseSpec

TRAINING_SPLITS = ("train", "id_val")


def _contingency(frame: pl.DataFrame, label: str, attribute: str) -> np.ndarray:
    counts = frame.group_by(label, attribute).len()
    rows = sorted(counts[label].unique().to_list())
    cols = sorted(counts[attribute].unique().to_list())
    table = np.zeros((len(rows), len(cols)), dtype=np.int64)
    for a, b, n in counts.iter_rows():
        table[rows.index(a), cols.index(b)] = n
    return table


def cramers_v(table: np.ndarray) -> float | None:
    """Cramér's V of a contingency table; None when either variable has a single observed value."""
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return None
    from scipy.stats import contingency  # imported when measured: scipy.stats costs 0.3 s to import

    return round(float(contingency.association(table, method="cramer")), 12)


def mutual_information_bits(table: np.ndarray) -> float:
    """I(label; attribute) = H(label) + H(attribute) - H(label, attribute), in bits."""
    total = table.sum()
    if total == 0:
        return 0.0
    p = table / total
    from scipy.stats import entropy

    value = entropy(p.sum(axis=1), base=2) + entropy(p.sum(axis=0), base=2) - entropy(p.ravel(), base=2)
    return round(max(0.0, float(value)), 12)  # rounding can give -1e-16


@dataclass(frozen=True)
class ShiftSummary:
    value_counts: pl.DataFrame  # attribute, value, split, n, share
    attributes: pl.DataFrame  # attribute, unseen_in_train, cramers_v, mutual_information
    tv_distance: float
    sc_observed_fraction: float | None
    ldd_observed_ratio: float | None


def summarize(examples: pl.DataFrame, cells: pl.Series, case: CaseSpec) -> ShiftSummary:
    """``examples``: example_id, split, one column per attribute; ``cells``: the cell of each row."""
    columns = [case.label, *case.attributes]
    count_parts = []
    for attribute in columns:
        for split in ("train", "id_val", "test"):
            part = examples.filter(pl.col("split") == split)
            counts = dict(part.group_by(attribute.name).len().iter_rows())
            total = max(part.height, 1)
            count_parts.append(
                pl.DataFrame(
                    {
                        "attribute": attribute.name,
                        "value": list(attribute.values),
                        "split": split,
                        "n": [int(counts.get(v, 0)) for v in attribute.values],
                        "share": [counts.get(v, 0) / total for v in attribute.values],
                    },
                    schema={
                        "attribute": pl.String,
                        "value": pl.String,
                        "split": pl.String,
                        "n": pl.Int64,
                        "share": pl.Float64,
                    },
                )
            )
    value_counts = pl.concat(count_parts)
    train = examples.filter(pl.col("split") == "train")
    rows: list[tuple[str, list[str], float | None, float | None]] = []
    for attribute in columns:
        seen = set(train[attribute.name].to_list())
        tested = set(examples.filter(pl.col("split") == "test")[attribute.name].to_list())
        unseen = [v for v in attribute.values if v in tested and v not in seen]
        if attribute.name == case.label.name:
            rows.append((attribute.name, unseen, None, None))
            continue
        table = _contingency(train, case.label.name, attribute.name)
        rows.append((attribute.name, unseen, cramers_v(table), mutual_information_bits(table)))
    attributes = pl.DataFrame(
        rows,
        schema={
            "attribute": pl.String,
            "unseen_in_train": pl.List(pl.String),
            "cramers_v": pl.Float64,
            "mutual_information": pl.Float64,
        },
        orient="row",
    )
    with_cells = examples.with_columns(cells.alias("cell"))
    train_p = with_cells.filter(pl.col("split") == "train").group_by("cell").len("n_train")
    test_p = with_cells.filter(pl.col("split") == "test").group_by("cell").len("n_test")
    # Sorted, summed in numpy, rounded: a group-by's row order must not reach the published bits.
    joint = train_p.join(test_p, on="cell", how="full", coalesce=True).fill_null(0).sort("cell")
    p_train = joint["n_train"].to_numpy() / max(int(joint["n_train"].sum()), 1)
    p_test = joint["n_test"].to_numpy() / max(int(joint["n_test"].sum()), 1)
    tv = round(0.5 * float(np.abs(p_train - p_test).sum()), 12)
    return ShiftSummary(value_counts, attributes, tv, _sc_fraction(examples, case), _ldd_ratio(value_counts, case))


def _sc_fraction(examples: pl.DataFrame, case: CaseSpec) -> float | None:
    attribute = case.attribute_with("sc")
    if attribute is None:
        return None
    drawn = examples.filter(pl.col("split").is_in(TRAINING_SPLITS))
    if drawn.is_empty():
        return None
    aligned = pl.col(case.label.name).replace_strict(
        {y: case.aligned_value(attribute, y) for y in case.label.values}, return_dtype=pl.String
    )
    return round(float(drawn.select((pl.col(attribute) != aligned).mean()).item()), 12)


def _ldd_ratio(value_counts: pl.DataFrame, case: CaseSpec) -> float | None:
    """Mean rare-value count over mean common-value count in the drawn training set."""
    attribute = case.attribute_with("ldd")
    if attribute is None:
        return None
    counts = (
        value_counts.filter((pl.col("attribute") == attribute) & pl.col("split").is_in(TRAINING_SPLITS))
        .group_by("value")
        .agg(pl.col("n").sum())
        .sort("value")
    )
    rare = counts.filter(pl.col("value").is_in(case.ldd_rare_values[attribute]))["n"].mean()
    common = counts.filter(~pl.col("value").is_in(case.ldd_rare_values[attribute]))["n"].mean()
    if not isinstance(rare, int | float) or not isinstance(common, int | float) or common == 0:
        return None
    return round(float(rare) / float(common), 12)

"""Scoring predictions on a published split: predictions + split -> metrics, and nothing else.

The one scoring function (:func:`score`): :meth:`shiftbench.Split.evaluate` calls it, and so does ``shiftbench
eval`` before it publishes the scores (:mod:`shiftbench.results.scored_predictions`), so the numbers are the same on
both
paths. Every split the predictions cover whole is scored with the metric vocabulary of the ERM baselines
(:mod:`shiftbench.scoring.metrics`); a split covered in part is refused.

Groups are the split's own ``group`` column, or any metadata fields of the split (``group_by``: columns of
``examples`` or of the family's metadata table, e.g. ConDS' ``object_color``), WILDS' ``CombinatorialGrouper``:
the group of an example is ``field=value,field=value``. A family may name subsets scored besides splits and groups
(``Family.eval_subsets``; ConDS: the values unseen in training (UDS), the rare values (LDD) and the SC
counterexamples), declared as ``module:function`` in its registry entry: scoring imports that module only, never
the registry of families, publishing, DuckDB or a family's build (tests/test_api.py checks it in a fresh process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from shiftbench.config.family_registry import REGISTRY, attribute
from shiftbench.errors import InputError
from shiftbench.scoring import metrics as m
from shiftbench.scoring.grouper import Grouper, metadata_table
from shiftbench.splits.published import PublishedSplit

# The columns of the metrics a scoring gives (eval_results has them after its key columns).
METRICS_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "eval_split": pl.String,
    "metric": pl.String,
    "group": pl.String,
    "value": pl.Float64,
}


@dataclass(frozen=True)
class Predictions:
    """Predicted labels: ``frame`` holds ``row`` (0-based), ``example_id``, ``y_pred`` [, ``probabilities``: K floats].
    ``path`` and ``first_line``: the file they were read from, named by errors (None: given in Python, named as the
    parameter ``y_pred``); ``first_line``: a CSV's line of row 0 (Parquet: None, rows are named by number)."""

    frame: pl.DataFrame
    path: Path | None = None
    first_line: int | None = None

    def where(self, row: int) -> dict[str, Any]:
        """``path``/``line`` for an InputError about ``row``, or the row number in the message."""
        if self.path is None:
            return {"parameter": "y_pred"}
        return {"path": self.path, "line": row + self.first_line} if self.first_line else {"path": self.path}

    def row_text(self, row: int) -> str:
        """``row N: `` where the error's location does not name the row already (a CSV's errors name its line)."""
        return "" if self.first_line else f"row {row + 1}: "

    def place(self, row: int) -> str:
        """Where ``row`` is, in words: ``line N`` of a CSV, else ``row N`` (1-based)."""
        return f"line {row + self.first_line}" if self.first_line else f"row {row + 1}"


@dataclass(frozen=True)
class Scores:
    """What a scoring gives: the splits the predictions cover whole, and their metrics."""

    covered_splits: list[str]
    metrics: list[m.Metric]

    def table(self) -> pl.DataFrame:
        """``eval_split, metric, group, value``: one row per metric."""
        rows = [
            {"eval_split": r.eval_split, "metric": r.metric, "group": r.group, "value": r.value} for r in self.metrics
        ]
        return pl.DataFrame(rows, schema=METRICS_SCHEMA)


def score(
    split: PublishedSplit,
    predictions: Predictions,
    group_by: Sequence[str] = (),
    *,
    group_parameter: str = "--group-by",
) -> Scores:
    """The metrics of ``predictions`` on every split of ``split`` they cover whole. ``group_parameter``: how the
    caller's ``group_by`` is named in an error (the CLI's flag, the API's argument)."""
    examples = split.examples
    frame = predictions.frame
    _require_classes(predictions, int(examples.select(pl.col("y").max()).item()) + 1)
    unknown = frame.join(examples.select("example_id"), on="example_id", how="anti").sort("row")
    if unknown.height:
        row = unknown.row(0, named=True)
        raise InputError(
            f"{predictions.row_text(row['row'])}example {row['example_id']!r} is not an example of "
            f"{split.benchmark} version {split.version}",
            **predictions.where(row["row"]),
        )
    joined = examples.join(frame, on="example_id", how="left")
    covered = _covered_splits(split, joined, predictions)
    joined = joined.with_columns(_groups(split, examples, group_by, group_parameter).alias("group"))
    classes = examples.group_by("y").agg(pl.col("y_name").first()).sort("y")["y_name"].to_list()
    groups = sorted(joined["group"].unique().to_list())
    subsets = _eval_subsets(split, joined)
    results: list[m.Metric] = []
    for name in covered:
        results += _split_metrics(name, joined, classes, groups, subsets)
    return Scores(covered, results + m.gap_metrics(results))


def _split_metrics(
    name: str, joined: pl.DataFrame, class_names: list[str], group_names: list[str], subsets: Mapping[str, np.ndarray]
) -> list[m.Metric]:
    """One covered split's metrics: accuracy by group, by class, calibration (with probabilities), subsets."""
    group_index = {g: i for i, g in enumerate(group_names)}
    selected = (joined["split"] == name).to_numpy()
    part = joined.filter(pl.col("split") == name)
    y_true = part["y"].to_numpy().astype(np.int64)
    y_pred = part["y_pred"].to_numpy().astype(np.int64)
    index = np.array([group_index[g] for g in part["group"].to_list()], dtype=np.int64)
    results = [
        metric
        for metric in m.split_metrics(name, y_true, y_pred, np.zeros(len(y_true)), index, group_names)
        if metric.metric != "loss_avg"  # predictions carry no loss
    ]
    results += m.class_metrics(name, y_true, y_pred, class_names)
    if "probabilities" in part.columns:
        results += m.calibration_metrics(name, y_true, np.array(part["probabilities"].to_list()))
    for subset, mask in sorted(subsets.items()):
        results.append(m.subset_accuracy(name, subset, y_true, y_pred, mask[selected]))
    return results


def _eval_subsets(split: PublishedSplit, joined: pl.DataFrame) -> Mapping[str, np.ndarray]:
    """The subsets the split's family scores besides splits and groups (its declared ``eval_subsets`` function,
    whose module alone is imported: no registry of families, no build code; most families have none)."""
    declared = REGISTRY.eval_subsets(split.family)
    if declared is None:
        return {}
    subsets = attribute(declared)
    assert callable(subsets), declared
    found: Mapping[str, np.ndarray] = subsets(split.path, joined)
    return found


def _covered_splits(split: PublishedSplit, joined: pl.DataFrame, predictions: Predictions) -> list[str]:
    """The splits the predictions cover whole (a split not covered at all is not scored; one covered in part is
    refused)."""
    covered = []
    for name in sorted(joined["split"].unique().to_list()):
        part = joined.filter(pl.col("split") == name)
        missing = part.filter(pl.col("y_pred").is_null())
        if missing.height == part.height:
            continue
        if missing.height:
            raise InputError(
                f"split {name!r} is covered only in part: example {missing['example_id'].sort()[0]!r} and "
                f"{missing.height - 1} more of its {part.height} have no prediction",
                path=predictions.path,
            )
        covered.append(name)
    if not covered:
        raise InputError(
            f"no prediction for any example of {split.benchmark} version {split.version}", path=predictions.path
        )
    return covered


def _require_classes(predictions: Predictions, n_classes: int) -> None:
    """Every ``y_pred`` a class in 0..K-1, whoever made the frame: a label outside is refused, never scored 0."""
    outside = predictions.frame.filter((pl.col("y_pred") < 0) | (pl.col("y_pred") >= n_classes)).sort("row")
    if outside.height:
        row = outside.row(0, named=True)
        raise InputError(
            f"{predictions.row_text(row['row'])}example {row['example_id']!r}: y_pred {row['y_pred']!r} is not a "
            f"class in 0..{n_classes - 1}",
            **predictions.where(row["row"]),
        )


def _groups(
    split: PublishedSplit, examples: pl.DataFrame, group_by: Sequence[str], parameter: str = "--group-by"
) -> pl.Series:
    """The group of every example under ``group_by`` (:class:`shiftbench.scoring.grouper.Grouper`: the split's
    own ``group`` when empty), named as training names it."""
    grouper = Grouper.parse(group_by)
    if grouper.own:
        return examples["group"]
    available = dict.fromkeys(examples.columns)
    extra = split.path / f"{metadata_table(split.family)}.parquet"
    if extra.is_file():
        available |= dict.fromkeys(pl.read_parquet_schema(extra))
    unknown = grouper.unknown(list(available))
    if unknown is not None:
        fields = ", ".join(sorted(c for c in available if c not in ("example_id", "split")))
        raise InputError(f"{unknown!r} is not a field of {split.benchmark} (fields: {fields})", parameter=parameter)
    joined = examples
    needed = [f for f in grouper.fields if f not in examples.columns]
    if needed:
        attributes = pl.read_parquet(extra, columns=["example_id", *needed])
        joined = examples.join(attributes, on="example_id", how="left")
    columns = [joined[field].cast(pl.String).to_list() for field in grouper.fields]
    return pl.Series("group", grouper.names(columns), dtype=pl.String)

"""Score anyone's predictions on a published split: ``shiftbench eval`` (WILDS' ``dataset.eval``).

Most researchers train with their own code. Their predictions file (Parquet or CSV: ``example_id``,
``y_pred``, optionally one probability column per class ``p_0 … p_{K-1}``) is checked strictly,
scored with the metric vocabulary of the ERM baselines (:mod:`shiftbench.erm.metrics`) on every split
it covers fully, and published like an ERM run: a results version of family ``eval`` (tables
``eval_results`` and ``eval_runs``), staged, checked against its contracts, then published. The view
``results`` puts these next to the ERM baselines (method ``erm``).

Groups are the split's own ``group`` column, or any metadata fields of the split (``group_by``: columns
of ``examples`` or of the family's metadata table, e.g. ConDS' ``object_color``), WILDS' ``CombinatorialGrouper``: the
group of an example is ``field=value,field=value``. ConDS splits also report accuracy on the values
unseen in training (UDS), on the rare values (LDD) and on the SC counterexamples.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from shiftbench import cards, registry
from shiftbench.erm import metrics as m
from shiftbench.erm.config import METHODS as TRAINED_METHODS
from shiftbench.erm.launch import PublishedSplit
from shiftbench.errors import InputError
from shiftbench.grouper import Grouper, metadata_table
from shiftbench.publishing import PublishOutcome, environment, stage_check_publish
from shiftbench.settings import Settings

FAMILY = "eval"
PROBABILITY_TOLERANCE = 1e-3  # |sum of a row's probabilities - 1|
_METHOD = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# The columns both tables start with, and those of eval_runs (their contracts: data_contracts/eval_*.yaml).
SchemaType = pl.DataType | type[pl.DataType]
KEY_SCHEMA: dict[str, SchemaType] = {
    "benchmark": pl.String,
    "run": pl.String,
    "split_version": pl.String,
    "family": pl.String,
    "method": pl.String,
    "seed": pl.Int64,
}
RUN_SCHEMA: dict[str, SchemaType] = {
    "covered_splits": pl.List(pl.String),
    "group_by": pl.List(pl.String),
    "n_predictions": pl.Int64,
    "has_probabilities": pl.Boolean,
    "predictions_sha256": pl.String,
}


@dataclass(frozen=True)
class Predictions:
    path: Path
    frame: pl.DataFrame  # row (0-based), example_id, y_pred, [probabilities: list of K floats]
    first_line: int | None  # CSV: the file line of row 0; Parquet: None (rows are named by number)
    sha256: str

    def where(self, row: int) -> dict[str, Any]:
        """``path``/``line`` for an InputError about ``row``, or the row number in the message."""
        return {"path": self.path, "line": row + self.first_line} if self.first_line else {"path": self.path}

    def row_text(self, row: int) -> str:
        return "" if self.first_line else f"row {row + 1}: "


MAX_SEED = 2**31 - 1  # what torch, numpy and every trainer take as a seed


def check_method(method: str) -> str:
    """A scored method's name: not one of the trainer's methods, whose names mean runs trained here."""
    if not _METHOD.match(method):
        raise InputError(f"a method name is 1-40 of a-z, 0-9, '_' and '-', got {method!r}", parameter="--method")
    if method in TRAINED_METHODS:
        raise InputError(
            f"{method!r} names the ERM job's trained runs ({', '.join(TRAINED_METHODS)}); name your method, "
            f"e.g. {method}-mine",
            parameter="--method",
        )
    return method


def check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"must be an integer in 0..{MAX_SEED}, got {seed!r}", parameter="--seed")
    return seed


def read_predictions(path: Path, n_classes: int) -> Predictions:
    """The predictions file, checked: ids, integer labels in 0..K-1, no duplicates, probabilities summing to 1."""
    if not path.is_file():
        raise InputError("predictions file not found", path=path, parameter="PREDICTIONS")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            frame, first_line = pl.read_parquet(path), None
        elif suffix in (".csv", ".tsv"):
            frame = pl.read_csv(path, separator="\t" if suffix == ".tsv" else ",", infer_schema=False)
            first_line = 2
        else:
            raise InputError("expected a .parquet, .csv or .tsv file", path=path, parameter="PREDICTIONS")
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(f"unreadable predictions: {str(exc).splitlines()[0]}", path=path) from None
    for column in ("example_id", "y_pred"):
        if column not in frame.columns:
            raise InputError(f"no {column!r} column (have {', '.join(frame.columns)})", path=path)
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    prediction = Predictions(path, frame, first_line, sha256)
    frame = frame.with_row_index("row").with_columns(pl.col("example_id").cast(pl.String))

    def fail(row: int, example_id: Any, message: str) -> InputError:
        return InputError(f"{prediction.row_text(row)}example {example_id!r}: {message}", **prediction.where(row))

    labels = _integer_labels(frame["y_pred"], prediction)
    bad = frame.filter(labels.is_null() | (labels < 0) | (labels >= n_classes))
    if bad.height:
        row = bad.row(0, named=True)
        raise fail(row["row"], row["example_id"], f"y_pred {row['y_pred']!r} is not a class in 0..{n_classes - 1}")
    frame = frame.with_columns(labels.alias("y_pred"))
    empty = frame.filter(pl.col("example_id").is_null() | (pl.col("example_id") == ""))
    if empty.height:
        raise fail(int(empty["row"][0]), "", "empty example id")
    repeated = frame.filter(pl.col("example_id").is_duplicated()).sort("row")
    if repeated.height:
        first = repeated.row(0, named=True)
        again = repeated.filter(pl.col("example_id") == first["example_id"]).row(1, named=True)
        raise fail(again["row"], first["example_id"], f"predicted twice (first at {prediction.row_text(first['row'])})")
    columns = [f"p_{k}" for k in range(n_classes)]
    given = [c for c in frame.columns if c.startswith("p_")]
    keep = ["row", "example_id", "y_pred"]
    if given:
        if sorted(given) != sorted(columns):
            raise InputError(
                f"probability columns must be exactly p_0 … p_{n_classes - 1}, got {', '.join(given)}", path=path
            )
        casted = frame.with_columns(pl.col(c).cast(pl.Float64, strict=False) for c in columns)
        total = pl.sum_horizontal(columns)
        wrong = casted.filter(
            pl.any_horizontal(pl.col(c).is_null() | (pl.col(c) < 0) | (pl.col(c) > 1) for c in columns)
            | ((total - 1).abs() > PROBABILITY_TOLERANCE)
        )
        if wrong.height:
            row = wrong.row(0, named=True)
            values = [row[c] for c in columns]
            raise fail(row["row"], row["example_id"], f"probabilities {values} are not in [0, 1] summing to 1")
        frame = casted.with_columns(pl.concat_list(columns).alias("probabilities"))
        keep.append("probabilities")
    return Predictions(path, frame.select(keep), first_line, sha256)


def _integer_labels(column: pl.Series, predictions: Predictions) -> pl.Series:
    """``y_pred`` as integers, never by a silent cast: a float, boolean or other typed column is refused, and text
    (CSV) must be a plain integer (a value that is not is NULL here and reported with its row)."""
    if column.dtype == pl.String:
        text = pl.DataFrame({"text": column.str.strip_chars()})
        integer = pl.col("text").str.contains(r"^[+-]?\d{1,18}$")
        return text.select(pl.when(integer).then(pl.col("text")).cast(pl.Int64).alias("y_pred")).to_series()
    if not column.dtype.is_integer():
        raise InputError(f"y_pred must hold integer class indices, the column is {column.dtype}", path=predictions.path)
    return column.cast(pl.Int64, strict=False)


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
    """The group of every example under ``group_by`` (:class:`shiftbench.grouper.Grouper`: the split's
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


def score(
    split: PublishedSplit,
    predictions: Predictions,
    method: str,
    seed: int,
    group_by: Sequence[str] = (),
    *,
    group_parameter: str = "--group-by",
) -> dict[str, pl.DataFrame]:
    """``eval_results`` and ``eval_runs`` of one predictions file: every fully covered split is scored.
    ``group_parameter``: how the caller's ``group_by`` is named in an error (the CLI's flag, the API's argument)."""
    examples = split.examples
    class_names = examples.group_by("y").agg(pl.col("y_name").first()).sort("y")["y_name"].to_list()
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
    groups = _groups(split, examples, group_by, group_parameter)
    joined = joined.with_columns(groups.alias("group"))
    group_names = sorted(joined["group"].unique().to_list())
    group_index = {g: i for i, g in enumerate(group_names)}
    family = registry.FAMILIES.get(split.family)
    subsets = family.eval_subsets(split.path, joined) if family is not None and family.eval_subsets else {}
    results: list[m.Metric] = []
    for name in covered:
        selected = (joined["split"] == name).to_numpy()
        part = joined.filter(pl.col("split") == name)
        y_true = part["y"].to_numpy().astype(np.int64)
        y_pred = part["y_pred"].to_numpy().astype(np.int64)
        index = np.array([group_index[g] for g in part["group"].to_list()], dtype=np.int64)
        results += [
            metric
            for metric in m.split_metrics(name, y_true, y_pred, np.zeros(len(y_true)), index, group_names)
            if metric.metric != "loss_avg"  # predictions carry no loss
        ]
        results += m.class_metrics(name, y_true, y_pred, class_names)
        if "probabilities" in part.columns:
            results += m.calibration_metrics(name, y_true, np.array(part["probabilities"].to_list()))
        for subset, mask in sorted(subsets.items()):
            results.append(m.subset_accuracy(name, subset, y_true, y_pred, mask[selected]))
    results += m.gap_metrics(results)
    run = f"{split.benchmark}.{method}.seed{seed}"
    common = {"benchmark": split.benchmark, "run": run, "split_version": split.version, "family": split.family}
    key = {**common, "method": method, "seed": seed}
    eval_results = pl.DataFrame(
        [{**key, "eval_split": r.eval_split, "metric": r.metric, "group": r.group, "value": r.value} for r in results],
        schema={**KEY_SCHEMA, "eval_split": pl.String, "metric": pl.String, "group": pl.String, "value": pl.Float64},
    )
    run_row = {
        **key,
        "covered_splits": covered,
        "group_by": list(group_by),
        "n_predictions": frame.height,
        "has_probabilities": "probabilities" in frame.columns,
        "predictions_sha256": predictions.sha256,
    }
    eval_runs = pl.DataFrame([run_row], schema={**KEY_SCHEMA, **RUN_SCHEMA})
    return {"eval_results": eval_results, "eval_runs": eval_runs}


def publish_scores(
    settings: Settings,
    split: PublishedSplit,
    predictions: Predictions,
    method: str,
    seed: int,
    group_by: Sequence[str] = (),
) -> tuple[PublishOutcome, dict[str, pl.DataFrame]]:
    """Score, stage, check and publish a results version; nothing is recorded when a check fails."""
    tables = score(split, predictions, check_method(method), check_seed(seed), group_by)
    run = str(tables["eval_runs"]["run"][0])
    manifest = {
        "split": {"family": split.family, "benchmark": split.benchmark, "version": split.version},
        "method": method,
        "seed": seed,
        "group_by": list(group_by),
        "predictions": {"path": str(predictions.path), "sha256": predictions.sha256},
        "environment": environment(),
    }
    described = cards.with_split_magnitudes(tables, split.path)
    info = cards.CardInfo(
        title=f"Scored predictions of {method} (seed {seed}) on {split.benchmark}",
        shift=f"Predictions made outside shiftbench, scored on the split {split.benchmark} (version "
        f"{split.version}); the shift magnitudes below are that split's.",
        licences=("Results: MIT (shiftbench); the predictions are the submitter's",),
        citation="Koh, Sagawa et al. WILDS: A Benchmark of in-the-Wild Distribution Shifts. ICML 2021 (evaluation).",
    )

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        facts = cards.Version(run, version, {**manifest, "family": FAMILY}, described, files, figures, info)
        return cards.documents(facts)

    return stage_check_publish(settings, FAMILY, run, tables, manifest, documents=documents), tables

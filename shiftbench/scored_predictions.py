"""Predictions made outside shiftbench, scored on a published split and published: ``shiftbench eval`` (WILDS'
``dataset.eval``).

Most researchers train with their own code. Their predictions file (Parquet or CSV: ``example_id``,
``y_pred``, optionally one probability column per class ``p_0 … p_{K-1}``) is checked strictly here
(:func:`read_predictions`), scored by :func:`shiftbench.evaluation.score` (as :meth:`shiftbench.Split.evaluate`
scores), and the scores published like an ERM run: a results version of family ``eval`` (tables ``eval_results``
and ``eval_runs``), staged, checked against its contracts, then published. The view ``results`` puts these next
to the ERM baselines (method ``erm``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench import cards
from shiftbench.errors import InputError
from shiftbench.evaluation import METRICS_SCHEMA, Predictions, Scores
from shiftbench.method_names import METHODS as TRAINED_METHODS
from shiftbench.publishing import PublishOutcome, environment, stage_check_publish
from shiftbench.settings import Settings
from shiftbench.splits import PublishedSplit

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
class PredictionsFile:
    """A predictions file as read and checked: its predictions and the SHA-256 of its bytes (recorded with the
    scores)."""

    predictions: Predictions
    sha256: str

    @property
    def path(self) -> Path:
        assert self.predictions.path is not None
        return self.predictions.path


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


def read_predictions(path: Path, n_classes: int) -> PredictionsFile:
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
    prediction = Predictions(frame, path, first_line)
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
    return PredictionsFile(Predictions(frame.select(keep), path, first_line), sha256)


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


def eval_tables(
    split: PublishedSplit, submitted: PredictionsFile, scores: Scores, method: str, seed: int, group_by: Sequence[str]
) -> dict[str, pl.DataFrame]:
    """``eval_results`` and ``eval_runs`` of one predictions file's scores (their contracts: data_contracts/eval_*)."""
    run = f"{split.benchmark}.{method}.seed{seed}"
    common = {"benchmark": split.benchmark, "run": run, "split_version": split.version, "family": split.family}
    key = {**common, "method": method, "seed": seed}
    eval_results = pl.DataFrame(
        [{**key, **row} for row in scores.table().iter_rows(named=True)], schema={**KEY_SCHEMA, **METRICS_SCHEMA}
    )
    frame = submitted.predictions.frame
    run_row = {
        **key,
        "covered_splits": scores.covered_splits,
        "group_by": list(group_by),
        "n_predictions": frame.height,
        "has_probabilities": "probabilities" in frame.columns,
        "predictions_sha256": submitted.sha256,
    }
    eval_runs = pl.DataFrame([run_row], schema={**KEY_SCHEMA, **RUN_SCHEMA})
    return {"eval_results": eval_results, "eval_runs": eval_runs}


def publish_scores(
    settings: Settings,
    split: PublishedSplit,
    submitted: PredictionsFile,
    scores: Scores,
    method: str,
    seed: int,
    group_by: Sequence[str] = (),
) -> tuple[PublishOutcome, dict[str, pl.DataFrame]]:
    """Stage, check and publish the scores of a predictions file as a results version; nothing is recorded when a
    check fails."""
    tables = eval_tables(split, submitted, scores, check_method(method), check_seed(seed), group_by)
    run = str(tables["eval_runs"]["run"][0])
    manifest = {
        "split": {"family": split.family, "benchmark": split.benchmark, "version": split.version},
        "method": method,
        "seed": seed,
        "group_by": list(group_by),
        "predictions": {"path": str(submitted.path), "sha256": submitted.sha256},
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

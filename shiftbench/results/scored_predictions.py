"""Predictions made outside shiftbench, scored on a published split and published: ``shiftbench eval`` (WILDS'
``dataset.eval``).

Most researchers train with their own code. Their predictions file (Parquet or CSV: ``example_id``,
``y_pred``, optionally one probability column per class ``p_0 … p_{K-1}``) is checked strictly here
(:func:`read_predictions`), scored by :func:`shiftbench.splits.evaluation.score` (as :meth:`shiftbench.Split.evaluate`
scores), and the scores published like an ERM run: a results version of family ``eval`` (tables ``eval_results``
and ``eval_runs``), staged, checked against its contracts, then published. The view ``results`` puts these next
to the ERM baselines (method ``erm``).

A result says what it is over: ``eval_runs.image_source`` is the scored split's image source (its manifest's
``images.source``; :mod:`shiftbench.scoring.provenance` labels it real, generated or standin), and a grouping other than
the split's own is part of the run's name (:func:`run_name`), so scoring again with another ``--group-by`` is a
result beside the first, never a new version of it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.scoring.grouper import Grouper
from shiftbench.scoring.method_names import METHODS as TRAINED_METHODS
from shiftbench.scoring.provenance import CARD_TITLES as IMAGES_TITLES
from shiftbench.scoring.provenance import card_sentence, data_tag, images_of, split_image_source
from shiftbench.splits.evaluation import METRICS_SCHEMA, Predictions, Scores
from shiftbench.splits.published import PublishedSplit
from shiftbench.store import check_benchmark_name
from shiftbench.warehouse import cards
from shiftbench.warehouse.publishing import PublishOutcome, environment, stage_check_publish

FAMILY = "eval"
PROBABILITY_TOLERANCE = 1e-3  # |sum of a row's probabilities - 1|
_METHOD = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_FIELDS = re.compile(r"^[a-z0-9_]+$")  # metadata fields named as they are in a run's name
MAX_GROUPING_NAME = 40
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
    "image_source": pl.String,
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
    if path.is_dir():
        raise InputError("is a directory, not a predictions file", path=path, parameter="PREDICTIONS")
    if not path.exists():
        raise InputError("predictions file not found", path=path, parameter="PREDICTIONS")
    if not path.is_file():
        raise InputError("not a regular file (a predictions file is read whole)", path=path, parameter="PREDICTIONS")
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

    blank = _first_blank(frame)
    if blank is not None:
        what = "blank line" if first_line else "empty row"
        raise InputError(f"{prediction.row_text(blank)}{what}: no example_id, no y_pred", **prediction.where(blank))
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
        raise fail(again["row"], first["example_id"], f"predicted twice (first at {prediction.place(first['row'])})")
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


def _first_blank(frame: pl.DataFrame) -> int | None:
    """The first row whose every field is empty (a CSV's blank line reads as one), or None."""
    fields = [c for c in frame.columns if c != "row"]
    empty = pl.all_horizontal(pl.col(c).cast(pl.String).str.strip_chars().fill_null("") == "" for c in fields)
    rows = frame.filter(empty)["row"]
    return int(rows[0]) if rows.len() else None


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


def grouping_name(group_by: Sequence[str]) -> str | None:
    """The part of a run's name that says its grouping: None for the split's own groups, ``by-<field>-<field>``
    for metadata fields (``by--<hash>`` where a field is not plain ``a-z0-9_`` or the name would be long)."""
    grouper = Grouper.parse(group_by)
    if grouper.own:
        return None
    plain = "-".join(grouper.fields)
    if all(_FIELDS.match(f) for f in grouper.fields) and len(plain) <= MAX_GROUPING_NAME:
        return f"by-{plain}"
    return f"by--{hashlib.sha256(','.join(grouper.fields).encode()).hexdigest()[:8]}"


def run_name(benchmark: str, method: str, seed: int, group_by: Sequence[str] = ()) -> str:
    """``<benchmark>.<method>.seed<N>``, or ``<benchmark>.<method>.by-<fields>.seed<N>`` for another grouping."""
    grouping = grouping_name(group_by)
    return f"{benchmark}.{method}{'.' + grouping if grouping else ''}.seed{seed}"


def eval_tables(
    split: PublishedSplit, submitted: PredictionsFile, scores: Scores, method: str, seed: int, group_by: Sequence[str]
) -> dict[str, pl.DataFrame]:
    """``eval_results`` and ``eval_runs`` of one predictions file's scores (their contracts: data_contracts/eval_*)."""
    parameter = "--group-by" if grouping_name(group_by) else "--method"  # what made the name too long
    run = check_benchmark_name(run_name(split.benchmark, method, seed, group_by), parameter)
    common = {"benchmark": split.benchmark, "run": run, "split_version": split.version, "family": split.family}
    key = {**common, "method": method, "seed": seed}
    eval_results = pl.DataFrame(
        [{**key, **row} for row in scores.table().iter_rows(named=True)], schema={**KEY_SCHEMA, **METRICS_SCHEMA}
    )
    frame = submitted.predictions.frame
    grouper = Grouper.parse(group_by)
    run_row = {
        **key,
        "covered_splits": scores.covered_splits,
        "group_by": [] if grouper.own else list(grouper.fields),
        "n_predictions": frame.height,
        "has_probabilities": "probabilities" in frame.columns,
        "predictions_sha256": submitted.sha256,
        "image_source": split_image_source(split.manifest),
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
    row = tables["eval_runs"].row(0, named=True)
    run, fields = str(row["run"]), list(row["group_by"])
    images = images_of(row["image_source"], data_tag(split.benchmark))
    manifest = {
        "split": {"family": split.family, "benchmark": split.benchmark, "version": split.version},
        "method": method,
        "seed": seed,
        "group_by": fields,
        "images": {"source": row["image_source"], "label": images},
        "predictions": {"path": str(submitted.path), "sha256": submitted.sha256},
        "environment": environment(),
    }
    described = cards.with_split_magnitudes(tables, split.path)
    grouping = f"the groups by {', '.join(fields)} (--group-by)" if fields else "the split's own groups"
    info = cards.CardInfo(
        title=f"Scored predictions of {method} (seed {seed}) on {split.benchmark}{IMAGES_TITLES.get(images, '')}",
        shift=f"Predictions made outside shiftbench, scored on the split {split.benchmark} (version "
        f"{split.version}); worst-group accuracy (acc_wg) is over {grouping}; the shift magnitudes below are that "
        f"split's.{card_sentence(images, scored=True)}",
        licences=("Results: MIT (shiftbench); the predictions are the submitter's",),
        citation="Koh, Sagawa et al. WILDS: A Benchmark of in-the-Wild Distribution Shifts. ICML 2021 (evaluation).",
    )

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        facts = cards.Version(run, version, {**manifest, "family": FAMILY}, described, files, figures, info)
        return cards.documents(facts)

    return stage_check_publish(settings, FAMILY, run, tables, manifest, documents=documents), tables

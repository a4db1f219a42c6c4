"""The papers' analyses over the results: versioned tables with a plot each, rebuilt when results change.

Each analysis is a SQL query over the catalog's ``leaderboard_with_standins`` (means over seeds on the latest
split versions), or over the per-run ``results`` and ``erm_runs`` where it needs each run's config (BREEDS Figures 5
and 6: architecture and intervention; it averages the seeds itself), joined with the split tables that say what
shifted (``metashift_tasks``, ``conds_cases``, ``benchmarks``), published as a store entry of family ``analysis``
(stage, contract check, publish, like every version) with its figure attached. A family declares its analyses
(``Family.analyses``: a query file, a contract and a plot function in its package);
``shiftbench.families.registry.analyses``
lists them all.

Provenance travels with every analysis: its table carries each row's ``image_source`` and ``data_tag``, a
learner on stand-in images is marked in the figure (:data:`shiftbench.results.plots.STANDIN_MARK`), and the figure's
title and the card say when stand-in images, generated images or tagged splits (not the papers' data) are in it
(:func:`provenance`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.scoring.provenance import GENERATED, STANDIN, UNRECORDED, images_of
from shiftbench.store.contracts import contracts
from shiftbench.warehouse import cards
from shiftbench.warehouse.catalog import open_catalog
from shiftbench.warehouse.publishing import PublishOutcome, environment, stage_check_publish

FAMILY = "analysis"


@dataclass(frozen=True)
class Analysis:
    """One analysis: its store entry, its table (with a contract), the query and the figure."""

    name: str  # the store entry, e.g. metashift-accuracy-vs-distance
    family: str  # whose splits and results it reads
    table: str
    query: str  # its SQL file's name, under ``sql_dir``
    title: str
    source: str  # the paper and section it reproduces
    figure: Callable[[pl.DataFrame, str], bytes]
    figure_file: str
    sql_dir: Path  # the family's folder of analysis queries

    def sql(self) -> str:
        return (self.sql_dir / self.query).read_text("utf-8")


def compute(settings: Settings, analysis: Analysis) -> pl.DataFrame:
    """The analysis table from the catalog (every publication refreshes it, so the latest results are in)."""
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        frame = con.sql(analysis.sql()).pl()
    assert isinstance(frame, pl.DataFrame)
    columns = [c for c in contracts()[analysis.table].columns if c not in {"benchmark", "version"}]
    # DuckDB's parallel aggregates may sum in any order: rounding to 12 places keeps the bytes (and the
    # version id) the same for the same results, and sorting fixes the row order.
    floats = [c for c in columns if frame.schema[c].is_float()]
    keys = [c for c in columns if c not in floats]
    return frame.select(columns).with_columns(pl.col(floats).round(12)).sort(keys, nulls_last=True)


def provenance(frame: pl.DataFrame) -> str:
    """What a reader of the analysis must know about its data ('' when every row is on the papers' names and
    real images): results on generated stand-in images, on generated images (the ConDS sprites), of unrecorded
    images, splits whose ``@TAG`` says they are not the paper's (labels: :mod:`shiftbench.scoring.provenance`)."""
    measured = frame.filter(pl.col("image_source").is_null() | (pl.col("image_source") != ""))  # paper rows: ''
    labels = [images_of(source, tag) for source, tag in measured.select("image_source", "data_tag").iter_rows()]
    standin = labels.count(STANDIN)
    parts = []
    if standin and standin == len(labels):
        parts.append("stand-in images only: not results on the datasets' images")
    elif standin:
        parts.append("learners marked [stand-in images] trained on generated stand-ins, not the datasets' images")
    if GENERATED in labels:
        parts.append("generated images (the ConDS sprites): results on generated data, not photographs")
    if UNRECORDED in labels:
        parts.append("scored predictions of unrecorded images")
    tags = sorted({str(t) for t in frame["data_tag"].drop_nulls().to_list()})
    if tags:
        parts.append(f"splits tagged {', '.join('@' + t for t in tags)}: not the papers' data")
    return "; ".join(parts)


def publish(settings: Settings, analysis: Analysis) -> tuple[PublishOutcome | None, pl.DataFrame]:
    """Stage, check and publish the analysis when there are results for it (``None`` when there are none:
    an empty analysis is not a version worth citing)."""
    frame = compute(settings, analysis)
    if frame.is_empty():
        return None, frame
    tables = {analysis.table: frame}
    manifest = {"analysis": {"source": analysis.source, "query": analysis.query}, "environment": environment()}
    note = provenance(frame)
    # Under the title, wrapped: the narrowest figure (one MetaShift panel) shows about 60 characters a line.
    title = "\n".join([analysis.title, *textwrap.wrap(f"({note})", 60)]) if note else analysis.title
    info = cards.CardInfo(
        title=analysis.title,
        shift=f"Reproduces {analysis.source} over every result in the catalog: one row per split and method "
        "(means over seeds on the split's latest version)." + (f" Provenance: {note}." if note else ""),
        licences=("Results: MIT (shiftbench)",),
        citation=analysis.source,
    )

    def attachments() -> dict[str, bytes]:
        return {analysis.figure_file: analysis.figure(frame, title)}

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        facts = cards.Version(analysis.name, version, {**manifest, "family": FAMILY}, tables, files, figures, info)
        return cards.documents(facts)

    published = stage_check_publish(
        settings, FAMILY, analysis.name, tables, manifest, attachments=attachments, documents=documents
    )
    return published, frame

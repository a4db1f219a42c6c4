"""The papers' analyses over the results: versioned tables with a plot each, rebuilt when results change.

Each analysis is a SQL query over the catalog's ``leaderboard`` (means over seeds on the latest split
versions) joined with the split tables that say what shifted (``metashift_tasks``, ``conds_cases``,
``benchmarks``), published as a store entry of family ``analysis`` (stage, contract check, publish,
like every version) with its figure attached. One registry: adding an analysis is a query file, a
contract and a plot function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from shiftbench import cards, plots
from shiftbench.catalog import SQL_DIR, open_catalog
from shiftbench.contracts import contracts
from shiftbench.errors import ContractViolation
from shiftbench.publishing import PublishOutcome, check_version, describe_failures, environment, publish_staged
from shiftbench.settings import Settings
from shiftbench.store import Store

FAMILY = "analysis"


@dataclass(frozen=True)
class Analysis:
    """One analysis: its store entry, its table (with a contract), the query and the figure."""

    name: str  # the store entry, e.g. metashift-accuracy-vs-distance
    family: str  # whose splits and results it reads
    table: str
    query: str  # file under shiftbench/sql/analysis/
    title: str
    source: str  # the paper and section it reproduces
    figure: Callable[[pl.DataFrame, str], bytes]
    figure_file: str

    def sql(self) -> str:
        return (SQL_DIR / "analysis" / self.query).read_text("utf-8")


ANALYSES: dict[str, Analysis] = {
    a.name: a
    for a in (
        Analysis(
            "metashift-accuracy-vs-distance",
            "metashift",
            "analysis_metashift_distance",
            "metashift_accuracy_vs_distance.sql",
            "MetaShift: accuracy against the training-test distance d",
            "Liang and Zou, MetaShift (ICLR 2022), Section 4.2 and Figure 5",
            plots.accuracy_vs_distance,
            "accuracy_vs_distance.png",
        ),
        Analysis(
            "breeds-source-vs-target",
            "breeds",
            "analysis_breeds_source_target",
            "breeds_source_vs_target.sql",
            "BREEDS: source against target accuracy, and relative accuracy",
            "Santurkar, Tsipras and Madry, BREEDS (ICLR 2021), Section 5 and Figure 4",
            plots.source_vs_target,
            "source_vs_target.png",
        ),
        Analysis(
            "conds-accuracy-by-shift",
            "conds",
            "analysis_conds_shifts",
            "conds_accuracy_by_shift.sql",
            "ConDS: accuracy by shift kind and by number of concurrent shifts",
            "Jeon et al., Concurrent distribution shifts (TMLR 2025), Sections 4-5",
            plots.accuracy_by_shift,
            "accuracy_by_shift.png",
        ),
        Analysis(
            "conds-grid-vs-paper",
            "conds",
            "analysis_conds_grid",
            "conds_grid_vs_paper.sql",
            "ConDS: the grid per learner beside the paper's Table 3, by concurrent shifts and SC",
            "Jeon et al., Concurrent distribution shifts (TMLR 2025), Table 3 and Figure 4",
            plots.conds_grid_vs_paper,
            "grid_vs_paper.png",
        ),
    )
}


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


def publish(settings: Settings, analysis: Analysis) -> tuple[PublishOutcome | None, pl.DataFrame]:
    """Stage, check and publish the analysis when there are results for it (``None`` when there are none:
    an empty analysis is not a version worth citing)."""
    frame = compute(settings, analysis)
    if frame.is_empty():
        return None, frame
    tables = {analysis.table: frame}
    manifest = {"analysis": {"source": analysis.source, "query": analysis.query}, "environment": environment()}
    info = cards.CardInfo(
        title=analysis.title,
        shift=f"Reproduces {analysis.source} over every result in the catalog: one row per split and method "
        "(means over seeds on the split's latest version).",
        licences=("Results: MIT (shiftbench)",),
        citation=analysis.source,
    )

    def attachments() -> dict[str, bytes]:
        return {analysis.figure_file: analysis.figure(frame, analysis.title)}

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        facts = cards.Version(analysis.name, version, {**manifest, "family": FAMILY}, tables, files, figures, info)
        return cards.documents(facts)

    store = Store(settings.store_dir)
    staged = store.stage(
        FAMILY, analysis.name, tables, manifest_extra=manifest, attachments=attachments, documents=documents
    )
    results = check_version(store, staged)
    failed = describe_failures(results)
    if failed:
        raise ContractViolation(f"{analysis.name} breaks its contracts, not published: {failed}")
    return PublishOutcome(staged, publish_staged(settings, staged), results), frame

"""Model selection over a search's draws, DomainBed's way: a declared rule, applied per trial, reported apart.

Each method picks, per (benchmark, learner, search space, trial), the draw whose run scores highest on one split and
metric; ties go to the lowest draw. Results are reported per method, as the mean over trials of the picked runs'
metrics (DomainBed's ``collect_results``: mean ± standard error over trials), and the leaderboard carries the
method as a column (``selection``; ``none`` for a run of fixed hyperparameters), so two rules are never averaged.
The selection itself is computed on demand in DuckDB (``search_selection`` in sql/catalog/create_union_views.sql)
from this table, which the catalog creates as the view ``selection_methods``.

Within a run the iteration is the run's own choice (its ``selection_split``, erm_runs); DomainBed's methods also pick
the step, these pick among runs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from shiftbench.errors import InputError

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class Selection:
    """A selection method: the split and metric it maximises, and how a reader sees it named."""

    name: str
    eval_split: str
    metric: str
    label: str


SELECTIONS = {
    s.name: s
    for s in (
        Selection("training_domain", "id_val", "acc_avg", "training-domain validation (id_val accuracy; DomainBed)"),
        Selection("ood_validation", "val", "acc_avg", "OOD validation (val accuracy; WILDS)"),
        Selection("worst_group", "id_val", "acc_wg", "worst-group validation (id_val worst-group accuracy)"),
        Selection("test_oracle", "test", "acc_avg", "test-domain oracle (test accuracy: a test-set choice)"),
    )
}
LEAVE_ONE_OUT = "leave_one_domain_out"


def parse_selections(text: str | None) -> list[str]:
    """``--select`` as method names (default: every method), each known; leave-one-domain-out said apart."""
    names = [n.strip() for n in (text or ",".join(SELECTIONS)).split(",") if n.strip()]
    for name in names:
        if name not in SELECTIONS and name != LEAVE_ONE_OUT:
            raise InputError(
                f"unknown selection method {name!r}; known: {', '.join([*SELECTIONS, LEAVE_ONE_OUT])}",
                parameter="--select",
            )
    if len(set(names)) != len(names):
        raise InputError("a selection method is named twice", parameter="--select")
    return names


def check_selections(benchmark: str, names: Sequence[str], splits: Collection[str], training_domains: int) -> None:
    """Every method asked for can select on ``benchmark``: its split exists; one line naming the first that cannot.

    Leave-one-domain-out needs at least two training domains, and then a run trained with each held out, which
    shiftbench does not train: it is refused either way, saying which."""
    for name in names:
        if name == LEAVE_ONE_OUT:
            reason = (
                f"needs at least two training domains; {benchmark} has {training_domains}"
                if training_domains < 2
                else "needs a run per training domain held out, which shiftbench does not train: use training_domain"
            )
            raise InputError(f"{LEAVE_ONE_OUT} {reason}", parameter="--select")
        selection = SELECTIONS[name]
        if selection.eval_split not in splits:
            raise InputError(
                f"{name} selects on the split {selection.eval_split!r}, which {benchmark} lacks "
                f"(it has {', '.join(sorted(splits))})",
                parameter="--select",
            )


def methods_view_sql() -> str:
    """``selection_methods``: this module's table as a catalog view (one source for the CLI and the SQL)."""
    rows = ", ".join(
        f"({_literal(s.name)}, {_literal(s.eval_split)}, {_literal(s.metric)}, {_literal(s.label)})"
        for s in SELECTIONS.values()
    )
    return (
        "CREATE OR REPLACE VIEW selection_methods AS SELECT * FROM "
        f"(VALUES {rows}) AS m(selection, eval_split, metric, label);"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def selection_report(con: duckdb.DuckDBPyConnection, benchmarks: Sequence[str], selections: Sequence[str]) -> str:
    """DomainBed's ``collect_results`` layout for the searches on ``benchmarks``: a block per selection method, a row
    per (benchmark, learner, space), test accuracy and worst-group accuracy as mean ± standard error over trials."""
    query = """
        SELECT selection, benchmark, model || CASE WHEN method = 'erm' THEN '' ELSE '.' || method END AS learner,
               search, images, count(DISTINCT trial) AS trials, max(n_draws) AS draws,
               list(DISTINCT draw ORDER BY draw) AS picked
        FROM search_selection
        WHERE benchmark IN (SELECT unnest($benchmarks)) AND selection IN (SELECT unnest($selections))
        GROUP BY ALL
    """
    picks = con.sql(query, params={"benchmarks": list(benchmarks), "selections": list(selections)}).pl()
    scores = con.sql(
        """
        SELECT p.selection, p.benchmark, p.search, p.images,
               p.model || CASE WHEN p.method = 'erm' THEN '' ELSE '.' || p.method END AS learner, r.metric,
               avg(r.value) AS mean, stddev_samp(r.value) / sqrt(count(r.value)) AS se
        FROM search_selection AS p JOIN results AS r ON r.run = p.run AND r.version = p.version
        WHERE r.eval_split = 'test' AND r.metric IN ('acc_avg', 'acc_wg')
        GROUP BY ALL
        """
    ).pl()
    lines: list[str] = []
    for name in selections:
        lines.append(f"[search] selection: {SELECTIONS[name].label}")
        rows = picks.filter(pl.col("selection") == name).sort("benchmark", "learner", "search")
        if rows.is_empty():
            lines.append("  no runs of a search scored on its split")
        for row in rows.iter_rows(named=True):
            cells = [_cell(scores, {**row, "metric": metric, "selection": name}) for metric in ("acc_avg", "acc_wg")]
            lines.append(
                f"  {row['benchmark']}  {row['learner']}  space {row['search']} ({row['images']})  "
                f"test/acc_avg {cells[0]}  test/acc_wg {cells[1]}  trials {row['trials']}  draws {row['draws']}  "
                f"picked draws {','.join(map(str, row['picked']))}"
            )
    return "\n".join(lines)


def _cell(scores: pl.DataFrame, key: dict[str, object]) -> str:
    match = scores.filter(
        *(
            pl.col(column) == key[column]
            for column in ("selection", "benchmark", "search", "images", "learner", "metric")
        )
    )
    if match.is_empty():
        return "-"
    mean, se = match.row(0, named=True)["mean"], match.row(0, named=True)["se"]
    return f"{100 * mean:.1f}" + ("" if se is None else f" ± {100 * se:.1f}")

"""Results: ``shiftbench eval`` (score a predictions file), ``sql``, ``leaderboard`` and ``analyse``."""

import argparse
import sys
from pathlib import Path

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.pipelines.cli.common import Subcommands, comma_list, shiftbench_command


def add_sql(sub: Subcommands) -> None:
    sql = sub.add_parser("sql", help="run SQL against the catalog")
    sql.add_argument("query")
    sql.add_argument("--csv", action="store_true", help="write CSV to stdout")
    sql.add_argument("--max-rows", type=int, default=40)
    sql.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="interrupt the query after this long (default: 600)",
    )
    sql.set_defaults(func=cmd_sql)


def add_leaderboard(sub: Subcommands) -> None:
    board = sub.add_parser("leaderboard", help="methods side by side: mean ± 95%% interval over seeds")
    board.add_argument("benchmark", nargs="*", help="default: every benchmark with results")
    board.add_argument("--metrics", default="acc_avg,acc_wg", metavar="M,...")
    board.add_argument("--splits", default="test", metavar="SPLIT,...")
    board.add_argument("--format", choices=("text", "markdown"), default="text")
    board.add_argument(
        "--include-standin",
        action="store_true",
        help="also show rows on generated stand-in images (left out by default), labelled in the column images",
    )
    board.set_defaults(func=cmd_leaderboard)


def add_analyse(sub: Subcommands) -> None:
    analyse = sub.add_parser("analyse", help="the papers' analyses over the results (tables + plots)")
    analyse.add_argument("analysis", nargs="*", help="default: all (metashift-accuracy-vs-distance, ...)")
    analyse.set_defaults(func=cmd_analyse)


def add_eval(sub: Subcommands) -> None:
    scored = sub.add_parser("eval", help="score a predictions file on a published split and publish the results")
    scored.add_argument("benchmark")
    scored.add_argument("predictions", type=Path, help="Parquet/CSV: example_id, y_pred[, p_0 ... p_K-1]")
    scored.add_argument("--method", required=True, help="the method's name (results view: method)")
    scored.add_argument("--seed", type=int, default=0)
    scored.add_argument("--version", help="split version (default: latest)")
    scored.add_argument("--group-by", metavar="FIELD,...", help="worst-group over these metadata fields")
    scored.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a predictions file on a published split (shiftbench.splits.evaluation) and publish the results
    (shiftbench.results.scored_predictions)."""
    import polars as pl

    from shiftbench.families.registry import unpublished_paper_name
    from shiftbench.results.scored_predictions import check_method, check_seed, publish_scores, read_predictions
    from shiftbench.scoring import worst_group
    from shiftbench.scoring.provenance import MEANINGS, data_tag, images_of
    from shiftbench.splits.evaluation import score
    from shiftbench.splits.published import published_split

    settings = Settings.from_env()
    check_method(args.method)
    check_seed(args.seed)
    split = published_split(settings, args.benchmark, args.version, refusal=unpublished_paper_name)
    submitted = read_predictions(args.predictions, int(split.examples.select(pl.col("y").max()).item()) + 1)
    group_by = comma_list(args.group_by) if args.group_by else []
    scores = score(split, submitted.predictions, group_by)
    outcome, tables = publish_scores(settings, split, submitted, scores, args.method, args.seed, group_by)
    run = tables["eval_runs"].row(0, named=True)
    state = "now latest" if outcome.publication.changed_latest else "already latest"
    print(
        f"{run['run']}: version {outcome.staged.version} ({state}; {split.benchmark} {split.version}, "
        f"splits {', '.join(run['covered_splits'])})"
    )
    images = images_of(run["image_source"], data_tag(split.benchmark))
    grouping = f"the groups by {', '.join(run['group_by'])}" if run["group_by"] else "the split's own groups"
    print(f"  images {images}: {MEANINGS[images]}; acc_wg over {grouping}")
    notes = worst_group.notes(tables["eval_results"])
    headline = tables["eval_results"].filter(pl.col("metric").is_in(["acc_avg", "acc_wg", "f1_macro", "ece"]))
    for row in headline.sort("eval_split", "metric").iter_rows(named=True):
        said = [row["group"], notes.get(row["eval_split"])] if row["metric"] == "acc_wg" else []
        group = f" ({'; '.join(filter(None, said))})" if any(said) else ""
        value = "NULL" if row["value"] is None else f"{row['value']:.4f}"
        print(f"  {row['eval_split']}/{row['metric']:<12} {value}{group}")
    print(f"\nResults: {shiftbench_command()} sql \"SELECT * FROM results WHERE run = '{run['run']}'\"")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """Run one query on the catalog: read-only, refreshed first when a file it lists changed (damage left out);
    every DuckDB error, binding or running, one line (shiftbench.warehouse.catalog_query)."""
    from shiftbench.warehouse.catalog import check_query, left_out, open_catalog
    from shiftbench.warehouse.catalog_query import check_timeout, csv_text, show

    settings = Settings.from_env()
    if args.max_rows < 1:
        raise InputError(f"must be at least 1, got {args.max_rows}", parameter="--max-rows")
    check_timeout(args.timeout)
    check_query(args.query)  # before anything is opened: a COPY, ATTACH, SET ... is refused, nothing written
    con, refreshed = open_catalog(settings.catalog_path, settings.store_dir)  # rebuilt first if stale
    with con:
        for warning in left_out(con, refreshed):
            print(f"warning: {warning}", file=sys.stderr)
        if args.csv:
            sys.stdout.write(csv_text(con, args.query, timeout_s=args.timeout))
        else:
            show(con, args.query, max_rows=args.max_rows, timeout_s=args.timeout)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """The leaderboard view as a table for a paper (Markdown) or the terminal: results on the splits' own images,
    real or generated (and scored predictions of them), each row labelled by its images and a legend under the
    table; rows on stand-in images only with ``--include-standin``, labelled."""
    from shiftbench.results.reporting import (
        check_request,
        images_shown,
        leaderboard_table,
        left_out,
        left_out_note,
        to_markdown,
        to_text,
    )
    from shiftbench.scoring.provenance import legend
    from shiftbench.warehouse.catalog import open_catalog

    settings = Settings.from_env()
    metrics = comma_list(args.metrics)
    splits = comma_list(args.splits)
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        check_request(con, args.benchmark, metrics, splits)
        table = leaderboard_table(con, args.benchmark, metrics, splits, include_standin=args.include_standin)
        hidden = {} if args.include_standin else left_out(con, args.benchmark, metrics, splits)
    if table.is_empty():
        print("no results on the latest split versions (shiftbench train, shiftbench eval)", file=sys.stderr)
    else:
        sys.stdout.write(to_markdown(table) if args.format == "markdown" else to_text(table))
        legends = [legend(images) for images in images_shown(table)]  # what each label of the column images means
        markdown = args.format == "markdown"
        print("\n" + ("\n\n" if markdown else "\n").join(f"_{line}_" if markdown else line for line in legends))
    if hidden:
        print(left_out_note(hidden), file=sys.stderr)
    return 0


def cmd_analyse(args: argparse.Namespace) -> int:
    """Rebuild the papers' analyses from the results in the catalog and publish the ones with data: a run of their
    assets (job ``analyses``) on the instance the UI reads, so each published analysis shows materialized there."""
    import dagster as dg

    from shiftbench.assets.analysis import JOB, NO_RESULTS, analysis_key
    from shiftbench.families import registry
    from shiftbench.pipelines import runs
    from shiftbench.pipelines.cli.common import dagster_instance

    analyses = registry.analyses()
    settings = Settings.from_env()
    unknown = [n for n in args.analysis if n not in analyses]
    if unknown:
        raise InputError(f"unknown analysis {unknown[0]!r}; known: {', '.join(analyses)}", parameter="analysis")
    keys = {name: analysis_key(analyses[name]) for name in args.analysis or list(analyses)}
    instance = dagster_instance(settings)
    run = runs.run_job(instance, JOB, assets=list(keys.values()))
    records = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    materialized = {m.asset_key: m for r in records if (m := r.asset_materialization) is not None}
    failed = runs.failed_steps(instance, run)
    for name, key in keys.items():
        if key in materialized:
            meta = {k: v.value for k, v in materialized[key].metadata.items()}
            figure = Path(str(meta["path"])) / "files" / analyses[name].figure_file
            print(f"{name}: version {meta['version']}, {meta['rows']} rows; table {analyses[name].table}; {figure}")
        elif key.to_python_identifier() in failed:
            print(f"{name}: error: {failed[key.to_python_identifier()]}; nothing published", file=sys.stderr)
        else:
            print(f"{name}: {NO_RESULTS} (shiftbench train, shiftbench eval)")
    if run.is_success:
        return 0
    _, is_input = runs.run_error(instance, run)
    return 2 if is_input else 1

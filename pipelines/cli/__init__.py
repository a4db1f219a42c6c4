"""The ``shiftbench`` command: the same Dagster jobs the UI runs, from a terminal.

    shiftbench build [FAMILY] [--benchmark NAME ...] [--set KEY=VALUE ... --name NEW] [--list]
    shiftbench sql "SELECT ..." [--csv] [--timeout SECONDS]   one query, read-only
    shiftbench versions [BENCHMARK]
    shiftbench check [BENCHMARK ...]      re-check published versions against their contracts
    shiftbench catalog                    recreate the DuckDB views
    shiftbench gc [--keep N] [--dry-run]  delete all but the N most recent versions
    shiftbench train BENCHMARK [--model M] [--seed N] [--device D] [--preset P] [--set KEY=VALUE ...]
    shiftbench train BENCHMARK [BENCHMARK ...] --seeds 0,1,2 [--parallel K] [...]   (a sweep)
    shiftbench export BENCHMARK DIR --layout imagefolder

Runs go to the Dagster instance in ``$DAGSTER_HOME`` (default ``$SHIFTBENCH_HOME/dagster_home``)
with the code location's origin, so ``dagster dev`` on the same DAGSTER_HOME lists them under their
jobs. Building any number of benchmarks of a kind is one run. Every user error, before or inside a
run, is one line naming the file, line or parameter, with exit code 2 (1 when a benchmark failed
its contract checks, the store is damaged, shiftbench itself failed or the disk is full); nothing is
published then and previous versions stay latest.

One module per command group, each adding its own subcommands: ``build`` (build), ``train`` and ``sweep``
(train), ``results`` (eval, sql, leaderboard, analyse), ``warehouse`` (versions, check, catalog, gc),
``export``, ``generate``; ``app`` assembles the parser and runs a command. The decisions behind a command
(the build plan, overrides, which runs can train) are the library's (:mod:`shiftbench.families.plans`).
"""

from shiftbench.pipelines.cli.app import build_parser, entry, leave, main
from shiftbench.pipelines.cli.common import OneLineParser, dagster_instance, ensure_dagster_home

_instance = dagster_instance  # the name bench/ scripts open the instance by

__all__ = ["OneLineParser", "build_parser", "dagster_instance", "ensure_dagster_home", "entry", "leave", "main"]

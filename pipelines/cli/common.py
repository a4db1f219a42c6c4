"""What every command of the ``shiftbench`` command line shares: its argument parser and the Dagster instance."""

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

from shiftbench.config.settings import Settings
from shiftbench.errors import one_line

_DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\npython_logs:\n  python_log_level: WARNING\n"

PARSER_LINE = 400  # argparse's messages are short but for the value they echo
# What a command module adds its subcommand to (``add_subparsers``).
Subcommands = argparse._SubParsersAction


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr and exit code 2, like every other user error. argparse
    echoes the bad value whole (``invalid float value: '...'``): the line is cut at ``PARSER_LINE`` characters."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {one_line(f'{self.prog}: {message}', PARSER_LINE)} (see {self.prog} --help)\n")


def ensure_dagster_home(settings: Settings) -> Path:
    """A persistent instance with telemetry off (this machine is offline; users may be too)."""
    home = Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(_DAGSTER_YAML, encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(home.absolute())
    return home


def dagster_instance(settings: Settings) -> Any:
    """The Dagster instance, created by one process at a time.

    Dagster's SQLite storages create their tables and stamp their schema version when first
    opened; two processes doing that at once in a new home race (duplicate alembic heads leave the
    home unusable). Opening under a lock costs milliseconds once the home exists.
    """
    import dagster as dg
    from filelock import FileLock

    home = ensure_dagster_home(settings)
    with FileLock(home / ".instance.lock"):
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # run storage
        instance.get_dynamic_partitions("shiftbench")  # event log storage
        instance.all_instigator_state()  # schedule storage
    return instance


def asset_key(path: tuple[str, ...]) -> Any:
    import dagster as dg

    return dg.AssetKey(list(path))


def comma_list(text: str) -> list[str]:
    """``a, b,,c`` as ``["a", "b", "c"]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


def shiftbench_command() -> str:
    """``shiftbench`` as the user can run it from here, for the commands a hint prints (``Results: shiftbench sql
    ...``): the bare name when their shell finds this same console script; else the script beside this Python
    (``.venv/bin/shiftbench``: relative to the working directory when under it); else ``python -m``."""
    script = Path(sys.executable).parent / "shiftbench"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m shiftbench.pipelines.cli"
    found = shutil.which("shiftbench")
    if found is not None and Path(found).resolve() == script.resolve():
        return "shiftbench"
    try:
        shown = script.absolute().relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(script.absolute()))
    return shlex.quote(str(shown) if "/" in str(shown) else f"./{shown}")

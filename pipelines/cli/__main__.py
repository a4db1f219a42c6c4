"""``python -m shiftbench.pipelines.cli ...``: the ``shiftbench`` command (how a sweep starts its runs)."""

from shiftbench.pipelines.cli import entry

entry()

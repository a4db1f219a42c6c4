"""``python -m pipelines.cli ...``: the ``shiftbench`` command (how a sweep starts its runs)."""

from pipelines.cli import entry

entry()

"""The Dagster assets (installed as ``shiftbench.assets``, mapped by pyproject's package-dir): thin wrappers that call
the library in ``shiftbench/`` and record what it did. ``dagster dev`` finds them through the code location
``shiftbench.pipelines.definitions`` (``build_definitions``), not by importing this package; docs/dagster.md."""

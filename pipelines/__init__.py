"""The Dagster code location and the CLI (installed as ``shiftbench.pipelines``, mapped by pyproject's package-dir):
``definitions.py`` is what ``dagster dev`` loads (``[tool.dagster]`` in pyproject.toml), ``cli/`` is the
``shiftbench`` command, ``sensors.py`` and ``search.py`` the sensors; docs/dagster.md, docs/cli.md."""

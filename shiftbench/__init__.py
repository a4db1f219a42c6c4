"""shiftbench: distribution-shift benchmarks rebuilt from raw metadata, versioned, checked and scored.

``shiftbench.load_split(name)`` is the Python front door (:mod:`shiftbench.api`). It is imported on
first use: the training job imports this package on machines without polars or duckdb.
"""

from typing import Any

__all__ = ["Split", "load_split"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shiftbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'shiftbench' has no attribute {name!r}")

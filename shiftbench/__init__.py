"""shiftbench: distribution-shift benchmarks rebuilt from raw metadata, versioned, checked and scored.

``shiftbench.load_split(name)`` is the Python front door (:mod:`shiftbench.api`). It is imported on
first use: the training job imports this package on machines without polars or duckdb.

The root holds the front door only (this file, :mod:`shiftbench.api`, :mod:`shiftbench.errors`); the rest lives
in subpackages (docs/architecture.md). The modules that stood in the root until 0.1 still import under their old
names, with a DeprecationWarning, until the next release (``_MOVED``; ``shiftbench.splits``' old names: its
``__getattr__``).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["Split", "load_split"]

# Old module (``shiftbench.<old>``) -> where it lives now (issue 50).
_MOVED = {
    "analysis": "families.analysis",
    "audit": "warehouse.audit",
    "batches": "tables.batches",
    "benchmark_builds": "families.benchmark_builds",
    "benchmarks_table": "families.benchmarks_table",
    "cache": "runtime.cache",
    "calibration": "sources.calibration",
    "cards": "warehouse.cards",
    "catalog": "warehouse.catalog",
    "catalog_files": "warehouse.catalog_files",
    "catalog_query": "warehouse.catalog_query",
    "contracts": "store.contracts",
    "cpus": "runtime.cpus",
    "evaluation": "splits.evaluation",
    "family": "families.family",
    "family_registry": "config.family_registry",
    "fingerprint": "tables.fingerprint",
    "grouper": "scoring.grouper",
    "hierarchy": "sources.hierarchy",
    "images": "splits.images",
    "located_yaml": "config.located_yaml",
    "magnitudes": "warehouse.magnitudes",
    "memory": "runtime.memory",
    "method_names": "scoring.method_names",
    "metrics": "scoring.metrics",
    "naming": "specs.naming",
    "outputs": "runtime.outputs",
    "package_files": "config.package_files",
    "plans": "families.plans",
    "plots": "results.plots",
    "progress": "runtime.progress",
    "provenance": "scoring.provenance",
    "publishing": "warehouse.publishing",
    "registry": "families.registry",
    "reporting": "results.reporting",
    "scored_predictions": "results.scored_predictions",
    "seeding": "runtime.seeding",
    "selection": "scoring.selection",
    "settings": "config.settings",
    "spec_model": "specs.spec_model",
    "split_dataset": "splits.split_dataset",
    "split_table": "splits.split_table",
    "standin": "splits.standin",
    "streamed": "tables.streamed",
    "textio": "config.textio",
    "training_conflicts": "scoring.training_conflicts",
    "variants": "families.variants",
    "worst_group": "scoring.worst_group",
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shiftbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'shiftbench' has no attribute {name!r}")


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``shiftbench.<old>`` as the module it became, the same object, warning once per name."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(f"{__name__}.")
        return importlib.util.spec_from_loader(fullname, self) if old != fullname and old in _MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = f"{__name__}.{_MOVED[spec.name.removeprefix(f'{__name__}.')]}"
        warnings.warn(f"{spec.name} is now {new}; the old name goes in the next release", DeprecationWarning, 2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # importlib sets the alias's spec on it next: put back in exec
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and spec.name in self._specs:
            module.__spec__ = self._specs.pop(spec.name)


def _install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())


_install()

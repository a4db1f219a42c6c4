"""A collection build fanned out: a plan, units that run apart (worker processes, Dagster steps), one stage.

The plan writes the scene index and what every unit reads into a work folder and splits the classes into buckets;
each unit builds its bucket from the saved index (memory-mapped); the stage reads every unit's classes and stages
the version a build in one piece gives (the same tables, the same id).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.family import Target
from shiftbench.metashift import collection
from shiftbench.metashift.figures import collection_figures_started
from shiftbench.metashift.index import SceneIndex
from shiftbench.metashift.staging import CollectionPlan, prepare_collection, stage_built
from shiftbench.runtime.cache import CachedArtifact
from shiftbench.runtime.memory import release_freed_memory
from shiftbench.store import StagedVersion


def plan_collection(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact], work: Path, n_units: int
) -> list[str]:
    """Write the index and the plan into ``work`` and split the classes into ``n_units`` buckets (their names)."""
    plan, index = prepare_collection(settings, target, inputs)
    if not 1 <= n_units <= len(index.classes):  # a unit builds whole classes: never fewer steps than asked, silently
        raise InputError(
            f"{n_units} units for the {len(index.classes)} classes of {target.benchmark}: a unit builds whole classes, "
            f"so 1..{len(index.classes)}",
            parameter="units",
        )
    groups = collection.buckets(index, n_units)
    work.mkdir(parents=True, exist_ok=True)
    index.save(work / "index")
    (work / "plan.pickle").write_bytes(pickle.dumps(plan))
    units = {str(k): group for k, group in enumerate(groups)}
    (work / "units.json").write_text(json.dumps(units), "utf-8")
    return list(units)


def build_collection_unit(work: Path, unit: str) -> None:
    """One bucket of classes, from the saved index (memory-mapped), into ``work/unit-<name>.pickle``."""
    plan: CollectionPlan = pickle.loads((work / "plan.pickle").read_bytes())
    codes = json.loads((work / "units.json").read_text("utf-8"))[unit]
    collection.build_bucket(work / "index", plan.settings, codes, work / f"unit-{unit}.pickle", workers=1)


def stage_collection_units(
    settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact], work: Path
) -> StagedVersion:
    """The version from every unit's classes: the tables, hence the id, of a build in one piece."""
    plan: CollectionPlan = pickle.loads((work / "plan.pickle").read_bytes())
    units = json.loads((work / "units.json").read_text("utf-8"))
    outcomes = collection.read_buckets([work / f"unit-{unit}.pickle" for unit in units])
    figures = collection_figures_started(outcomes, target.benchmark)
    index = SceneIndex.load(work / "index")
    tables, results, distances = collection.collection_tables(plan.spec, index, plan.scope, outcomes, plan.sources)
    del index, outcomes, results
    release_freed_memory()
    return stage_built(settings, target, plan, tables, distances, figures)

"""Builds of a family's benchmarks: its inputs, then each benchmark staged, checked and published, one outcome each.

A family's ``build.py`` makes a benchmark's tables; this module runs builds of them: the inputs a selection reads,
the family's ``Kind.stage`` for each benchmark, and the steps of :mod:`shiftbench.warehouse.publishing` (the one owner
of
stage -> check -> publish -> catalog refresh) after it, recording what happened to each benchmark as an
:class:`Outcome`. The Dagster shell and the library run these same functions: a batched Dagster run stages and
checks every selected benchmark, publishes those that passed and refreshes the catalog once; :func:`build` does
the same without Dagster, for scripts, notebooks and benchmarks. A bad input of one benchmark (an
:class:`InputError`) is that benchmark's outcome; the others still build.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import ContractViolation, InputError, ShiftbenchError
from shiftbench.families.family import Description, Family, Kind, Markdown, Table, Target
from shiftbench.runtime import progress
from shiftbench.runtime.cache import CachedArtifact, write_file_atomic
from shiftbench.specs.naming import tagged
from shiftbench.store import Publication, StagedVersion, Store
from shiftbench.store.contracts import RuleResult
from shiftbench.warehouse import cards, publishing


@dataclass
class Outcome:
    """What happened to one benchmark of a build."""

    kind: Kind
    benchmark: str
    target: Target | None = None  # what was built (None: publishing what was staged earlier)
    staged: StagedVersion | None = None
    results: dict[str, list[RuleResult]] = field(default_factory=dict)  # empty when not checked here
    failed_rules: list[str] = field(default_factory=list)
    rules: int = 0
    publication: Publication | None = None
    error: str | None = None  # one line: the file and line or parameter at fault, or what failed
    user_error: bool = True  # the error is the input's (exit code 2), not a failure of shiftbench (1)
    traceback: str | None = None  # a failure of shiftbench itself (a bug): its traceback, for the report
    seconds: float = 0.0
    description: Description | None = None  # how the staged version reads (set once it is staged)

    @property
    def checked(self) -> bool:
        return self.staged is not None and not self.failed_rules and self.error is None

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        if self.failed_rules:
            return "failed_checks"
        return "published" if self.publication is not None else "checked"


def build_inputs(settings: Settings, family: Family, names: Iterable[str] | None = None) -> dict[str, CachedArtifact]:
    """The family's inputs (or only ``names`` and what they read), each built once, in order."""
    built: dict[str, CachedArtifact] = {}
    for item in family.inputs_for(names if names is not None else [i.name for i in family.inputs]):
        progress.report(progress.Event("input", item.name, status="start"))
        built[item.name] = item.build(settings, {name: built[name] for name in item.inputs})
        progress.report(progress.Event("input", item.name, status="done", detail=item.summary(built[item.name])))
    return built


def stage_benchmark(settings: Settings, kind: Kind, target: Target, inputs: Mapping[str, CachedArtifact]) -> Outcome:
    """Stage one benchmark and record its contract check; a bad input is the outcome, not a raise."""
    started = time.perf_counter()
    outcome = Outcome(kind, target.benchmark, target)
    checked: dict[str, dict[str, list[RuleResult]]] = {}

    def check_while_attaching(files: Mapping[str, Path]) -> None:
        checked["results"] = publishing.check_files(files)

    try:
        outcome.staged = kind.stage(settings, replace(target, check=check_while_attaching), inputs)
        results = publishing.check_just_staged(settings, outcome.staged, checked.get("results"))
    except ShiftbenchError as exc:  # bad input, a damaged store: this benchmark's outcome, one line
        outcome.error = str(exc)
        outcome.user_error = isinstance(exc, InputError)
    except Exception as exc:  # a failure of shiftbench itself: still only this benchmark's, and said so
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.user_error = False
        outcome.traceback = traceback.format_exc()  # one line for the user, the traceback for the report
    else:
        outcome.results = results
        outcome.rules = sum(len(r) for r in results.values())
        outcome.failed_rules = [r.line() for rules in results.values() for r in rules if not r.passed]
    outcome.seconds = time.perf_counter() - started
    return outcome


def publish_outcome(settings: Settings, outcome: Outcome) -> Outcome:
    """Publish a checked outcome (the store refuses anything without a passing check); the catalog is refreshed by
    the caller, once for a whole build."""
    if outcome.staged is None:
        return outcome
    try:
        outcome.publication = publishing.publish(settings, outcome.staged)
    except ContractViolation as exc:
        outcome.error = str(exc)
    return outcome


def publish_last_staged(settings: Settings, kind: Kind, benchmark: str) -> Outcome:
    """Publish the version staged last for ``benchmark`` (what "materialize only the publish asset" does)."""
    outcome = Outcome(kind, benchmark)
    store = Store(settings.store_dir)
    staged = store.layout.latest_staged(kind.family, benchmark)
    if staged is None:
        outcome.error = f"{benchmark} has no staged version: build it first"
        return outcome
    outcome.staged = staged
    record = store.checks.check_record(staged)
    if record is not None:
        outcome.rules, outcome.failed_rules = record.rules, list(record.failed)
    return publish_outcome(settings, outcome)


def describe(kind: Kind, staged: StagedVersion) -> Description:
    """The kind's description of a version, with its shift card (shown on the publish asset's materialization)."""
    description = kind.describe(staged)
    extra: dict[str, Any] = {}
    card = staged.attachment("card.md")
    if card is not None:  # folded by the UI ("Show Markdown"): the magnitudes are shown inline too
        extra["card"] = Markdown(cards.without_images(card.decode()))
    if "shift_magnitudes" in staged.tables:
        magnitudes = pl.read_parquet(staged.table_path("shift_magnitudes"), columns=["measure", "scope", "value"])
        extra["shift_magnitudes"] = Table(magnitudes.filter(pl.col("scope") == "all").select("measure", "value"))
    return replace(description, metadata={**extra, **description.metadata}) if extra else description


def migration_marker(settings: Settings, family: Family) -> Path:
    """Written once a family's benchmarks in this store were checked by :func:`retire_misnamed`."""
    return settings.store_dir / ".migrations" / f"names-carry-sources-{family.name}"


def retire_misnamed(settings: Settings, family: Family) -> list[str]:
    """Move aside benchmarks published under a paper's name from other sources (by an older shiftbench).

    Before names carried their source (``NAME@TAG``), an offline build published e.g. the generated
    scenes' task as ``cat-dog-dg-cabinet-bed``. Such a benchmark, whose latest version's recorded
    sources are not the paper's, is moved to ``store/.retired/`` so that no view shows it under the
    paper's name; its content is rebuilt under ``NAME@TAG``. Returns one line per benchmark moved.
    A migration of warehouses written before: it runs once per store and family (:func:`migration_marker`),
    since this shiftbench never publishes such a name.
    """
    marker = migration_marker(settings, family)
    if marker.is_file():
        return []
    store = Store(settings.store_dir)
    moved = []
    for name in sorted(family.shipped_names()):
        there = store.layout.benchmark_dir(family.name, name).is_dir()
        latest = store.log.latest(name, family=family.name) if there else None
        if latest is None:
            continue
        manifest = store.layout.staged(family.name, name, latest.version).manifest()
        tag = family.source_tag(manifest)
        if tag is None:
            continue
        target = store.retention.retire(family.name, name)
        moved.append(
            f"{name}: its versions were built from non-paper sources ({tag}) under the paper's name by an "
            f"older shiftbench; moved to {target} (it builds as {tagged(name, tag)})"
        )
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomic(marker, "checked: no benchmark under a paper's name from other sources\n")
    return moved


def iter_build(
    settings: Settings,
    family: Family,
    targets: Sequence[tuple[Kind, Target]],
    *,
    inputs: Mapping[str, CachedArtifact] | None = None,
    stage: bool = True,
    publish_checked: bool = True,
) -> Iterator[Outcome]:
    """Stage and check ``targets`` one by one, publishing those that pass; yields each outcome.

    With ``stage=False`` only publishes the version each target staged last (if it passed).
    The caller refreshes the catalog once at the end (:func:`build` does).
    """
    artifacts: Mapping[str, CachedArtifact] = {}
    retired = retire_misnamed(settings, family)
    for line in retired:
        progress.report(progress.Event("input", "store", status="warning", detail=line))
    if retired:
        publishing.refresh_catalog(settings)
    if stage:
        needed = {name for kind, target in targets for name in kind.inputs_needed(settings, [target.spec])}
        artifacts = dict(inputs) if inputs is not None else build_inputs(settings, family, needed)
    for index, (kind, target) in enumerate(targets, start=1):
        progress.report(progress.Event(kind.name, target.benchmark, index, len(targets), "start"))
        if stage:
            outcome = stage_benchmark(settings, kind, target, artifacts)
            if publish_checked and outcome.checked:
                publish_outcome(settings, outcome)
        else:
            outcome = publish_last_staged(settings, kind, target.benchmark)
        if outcome.staged is not None and outcome.error is None:
            try:
                outcome.description = describe(kind, outcome.staged)
            except Exception as exc:  # describing is for people: it never costs a published version
                outcome.description = Description({}, f"(not described: {type(exc).__name__}: {exc})")
                outcome.traceback = traceback.format_exc()  # but it is a bug: its report needs the traceback
        detail = (
            outcome.error
            or "; ".join(outcome.failed_rules[:3])
            or (outcome.description.summary if outcome.description is not None else "")
        )
        progress.report(
            progress.Event(kind.name, target.benchmark, index, len(targets), outcome.status, detail, outcome=outcome)
        )
        yield outcome


def build(
    settings: Settings,
    family: Family,
    targets: Sequence[tuple[Kind, Target]],
    *,
    inputs: Mapping[str, CachedArtifact] | None = None,
    publish_checked: bool = True,
) -> list[Outcome]:
    """Stage, check and (when they pass) publish ``targets``; refresh the catalog once at the end."""
    outcomes = list(iter_build(settings, family, targets, inputs=inputs, publish_checked=publish_checked))
    if any(o.publication is not None for o in outcomes):
        publishing.refresh_catalog(settings)
    return outcomes

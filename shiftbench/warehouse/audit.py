"""``shiftbench check``: everything the store can verify about its benchmarks, each damaged file named.

For each benchmark (every one, or those named): its records (the publication log's chain and head, the list of
versions gc removed, the pointer to the version staged last) and its latest version: the manifest and its files
(names, id, sizes, SHA-256, no stray table file), each table's content hash recomputed from its rows (what the
version id was made of: :mod:`shiftbench.store.content`), its check record, and every contract run again and
recorded. Damage is a finding, never an exception: one damaged benchmark does not stop the others' checks, and
the command's exit code is 1 when anything was found. Only a name that is not a published benchmark at all is bad
input.

What no check from inside the store can see (a log rewritten end to end, ``HEAD`` included) is said in
``docs/reliability.md``; each benchmark's line ends with its log's head, for comparison with a copy kept elsewhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from shiftbench.warehouse.catalog_files import recorded_events, vanished_events
from shiftbench.errors import InputError
from shiftbench.warehouse.publishing import check_staged, check_version
from shiftbench.store import LOG_HEAD, StagedVersion, Store, damage
from shiftbench.store.content import content_findings
from shiftbench.store.log import latest_event

Say = Callable[[str], None]


@dataclass
class Audit:
    """What ``check`` found: ``findings`` counts damaged files and failed contract rules (exit 1 when any)."""

    say: Say
    findings: int = 0
    lines: list[str] = field(default_factory=list)

    def ok(self, line: str) -> None:
        self.lines.append(line)
        self.say(line)

    def found(self, line: str) -> None:
        self.findings += 1
        self.ok(line)


def check_store(store: Store, names: Sequence[str] = (), say: Say = print, catalog: Path | None = None) -> Audit:
    """Check the named benchmarks (every benchmark of the store when none is named); see the module's docstring.
    ``catalog``: the catalog whose record of the log's events is compared with the log (:func:`vanished_events`)."""
    audit = Audit(say)
    chosen = [(f, b) for f, b in store.layout.benchmarks() if not names or b in names]
    readings = {(f, b): store.log.read(f, b) for f, b in chosen}
    vanished = _vanished(store, catalog, names)
    problems = {
        (f, b): [*reading.problems, *filter(None, [store.layout.staged_problem(f, b)]), *vanished.pop((f, b), [])]
        for (f, b), reading in readings.items()
    }
    present = {b for (f, b), reading in readings.items() if reading.events or problems[f, b]}
    missing = [name for name in dict.fromkeys(names) if name not in present]
    if missing:
        raise InputError(f"{missing[0]!r} has no published version", parameter="BENCHMARK")
    for (family, benchmark), reading in readings.items():
        latest = latest_event(store.layout, family, benchmark, reading.events)
        if latest is not None:
            _check_latest(store, family, benchmark, str(latest["version"]), audit)
        for problem in problems[family, benchmark]:  # a benchmark staged and never published has none
            audit.found(f"DAMAGED: {problem}")
    for lines in vanished.values():  # benchmarks no longer in the store at all
        for problem in lines:
            audit.found(f"DAMAGED: {problem}")
    return audit


def _vanished(store: Store, catalog: Path | None, names: Sequence[str]) -> dict[tuple[str, str], list[str]]:
    """The events the catalog saw that are gone from the log, by benchmark (store/<family>/<benchmark>/...)."""
    if catalog is None:
        return {}
    home = catalog.parent
    found: dict[tuple[str, str], list[str]] = {}
    for name in recorded_events(catalog):
        parts = PurePosixPath(name).parts  # store, family, benchmark, publications, file
        if len(parts) != 5 or (names and parts[2] not in names):
            continue
        found.setdefault((parts[1], parts[2]), []).extend(vanished_events(home, [name]))
    return {key: lines for key, lines in found.items() if lines}


def _check_latest(store: Store, family: str, benchmark: str, version: str, audit: Audit) -> None:
    staged = StagedVersion(family, benchmark, version, store.layout.version_dir(family, benchmark, version), False)
    name = f"{benchmark} {version}"
    problem = damage(staged)
    if problem is not None:  # the files are not what the manifest says: nothing more to check in them
        repair = " (rebuild it to repair)" if staged.path.is_dir() else ""  # else the log's lines say why
        audit.found(f"{name}: DAMAGED: {problem}{repair}")
        return
    tables = staged.manifest()["tables"]
    verified, notes, rewritten = content_findings(staged)
    for line in rewritten:
        audit.found(f"{name}: DAMAGED: {line}")
    record_problem = store.checks.damaged_record(staged)
    if record_problem is not None:
        audit.found(f"DAMAGED: {record_problem}")
    # With rows that are not the version's, the rules still run (to say what the rows break), unrecorded.
    results = check_staged(staged) if rewritten else check_version(store, staged, reuse=False, verify=False)
    failed = [rule for rules in results.values() for rule in rules if not rule.passed]
    total = sum(len(rules) for rules in results.values())
    files = len(tables) + len(staged.manifest().get("attachments") or {})
    audit.ok(
        f"{name}: {files} files match their checksums, {verified}/{len(tables)} tables their content hash, "
        f"{total - len(failed)}/{total} rules hold{' (not recorded)' if rewritten else ''}; "
        f"log head {_head(store, family, benchmark)}"
    )
    for rule in failed:
        audit.found(f"  {rule.line()}")
    for note in notes:
        audit.ok(f"  note: {note}")


def _head(store: Store, family: str, benchmark: str) -> str:
    """The first 16 hex digits of the SHA-256 of the log's ``HEAD`` (the newest event's number, name and hash): one
    value to compare with a copy kept outside the store."""
    path = store.layout.publications_dir(family, benchmark) / LOG_HEAD
    try:
        data = path.read_bytes()
    except OSError:
        return "none"
    return hashlib.sha256(data).hexdigest()[:16]

"""The publication log: which checked version of each benchmark is latest, and since when.

A version becomes latest only when an event naming it is appended to its benchmark's log, under the benchmark's
lock, after its files were verified and a passing contract check of exactly those files was found. The log is a
chain (each event carries its sequence number and the hash of the event before; ``HEAD`` names the newest), so
reading it also finds a missing, edited or forged event; what it finds goes to the log's ``problems``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shiftbench.errors import StoreError
from shiftbench.store.checks import VersionChecks, verify
from shiftbench.store.layout import LOG_HEAD, StagedVersion, StoreLayout
from shiftbench.tables.fingerprint import canonical_json


@dataclass(frozen=True)
class Publication:
    family: str
    benchmark: str
    version: str
    published_at: str
    changed_latest: bool


@dataclass(frozen=True)
class LogReading:
    events: list[dict[str, Any]]  # readable, oldest first
    problems: list[str]  # each names its file
    proven: dict[Path, bytes]  # damaged events and the bytes the chain proves they had (publishing rewrites them)


@dataclass(frozen=True)
class VersionInfo:
    family: str
    benchmark: str
    version: str
    published_at: str
    is_latest: bool
    n_examples: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


class PublicationLog:
    """Publishing checked versions, and reading back what was published (latest, every version, removed ones).

    Damage met while reading is added to ``problems``, each naming its file: a damaged file is skipped, not fatal
    (``shiftbench versions`` and the catalog say what was left out).
    """

    def __init__(self, layout: StoreLayout, checks: VersionChecks) -> None:
        self.layout = layout
        self.checks = checks
        self.problems: set[str] = set()

    def publish(self, staged: StagedVersion) -> Publication:
        """Make a checked version the latest of its benchmark (no-op when it already is).

        Raises :class:`ContractViolation` unless a passing check of exactly these files is recorded.
        """
        with self.layout.lock(staged.family, staged.benchmark):  # the check cannot change between these lines
            verify(staged)
            self.checks.require_passing_check(staged)
            self._repair(staged.family, staged.benchmark)
            current = self.latest(staged.benchmark, family=staged.family)
            if current is not None and current.version == staged.version:
                return Publication(staged.family, staged.benchmark, staged.version, current.published_at, False)
            published_at = self._append(staged)
        return Publication(staged.family, staged.benchmark, staged.version, published_at, True)

    def _repair(self, family: str, benchmark: str) -> None:
        """Rewrite the damaged events whose bytes the chain proves (:func:`_proven`), and the head a publish stopped
        before writing (:func:`_pending_head`), before a new event follows."""
        for path, data in self.read(family, benchmark).proven.items():
            self.layout.write(path, data)
        directory = self.layout.publications_dir(family, benchmark)
        head = _pending_head(directory)
        if head is not None:
            self.layout.write(directory / LOG_HEAD, canonical_json(head))

    def _append(self, staged: StagedVersion) -> str:
        """Write the event publishing ``staged``, then the log's head naming it; its time of publication."""
        now_ns = time.time_ns()
        published_at = datetime.fromtimestamp(now_ns / 1e9, UTC).isoformat(timespec="microseconds")
        directory = self.layout.publications_dir(staged.family, staged.benchmark)
        directory.mkdir(parents=True, exist_ok=True)
        files = sorted(directory.glob("*.json"))
        event = {
            "family": staged.family,
            "benchmark": staged.benchmark,
            "version": staged.version,
            "published_at": published_at,
            "sequence": len(files) + 1,
            "previous": hashlib.sha256(files[-1].read_bytes()).hexdigest() if files else None,
        }
        name = f"{now_ns:020d}-{staged.version}.json"
        text = canonical_json(event)
        self.layout.write(directory / name, text)
        head = {"sequence": event["sequence"], "event": name, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        self.layout.write(directory / LOG_HEAD, canonical_json(head))
        return published_at

    def read(self, family: str, benchmark: str) -> LogReading:
        """The benchmark's log as it stands: its readable events, oldest first, and what is wrong with it (a
        damaged event is skipped; it and any break in the chain, a missing, edited or forged event or a removed
        newest one, are named), and the damaged events whose bytes the chain proves."""
        directory = self.layout.publications_dir(family, benchmark)
        removed, removed_problem = self._removed(family, benchmark)
        problems = [removed_problem] if removed_problem else []
        if not directory.is_dir():
            return LogReading([], problems, {})
        paths = sorted(directory.glob("*.json"))  # zero-padded ns timestamps: sorted == chronological
        datas = [_read_bytes(path) for path in paths]
        parsed = [_read_event(data) for data in datas]
        head = _read_head(directory)
        proven = _proven(family, benchmark, paths, datas, parsed, head)
        events = []
        newest: tuple[Path, str] | None = None  # the newest readable event and the version it publishes
        previous: tuple[Path, str] | None = None  # the last event and the hash of its (proven) bytes
        chained = False
        for position, (path, data, event) in enumerate(zip(paths, datas, parsed, strict=True), start=1):
            if event is None:
                problems.append(_damaged_event(path, benchmark, path in proven))
                previous = (path, hashlib.sha256(proven[path]).hexdigest()) if path in proven else None
                continue
            problem = _chain_problem(event, position, previous, chained)
            if problem is not None:
                problems.append(f"{path}: {problem}")
            chained = chained or "sequence" in event
            version = str(event["version"])
            gone = version in removed or removed_problem is not None  # a damaged list: gc may have removed it
            if not gone and not self.layout.version_dir(family, benchmark, version).is_dir():
                problems.append(f"{path}: publishes version {version}, which is not in the store")
            events.append(event)
            newest = (path, version)
            previous = (path, hashlib.sha256(data).hexdigest())
        if (
            newest is not None
            and newest[1] in removed
            and not self.layout.version_dir(family, benchmark, newest[1]).is_dir()
        ):
            problems.append(
                f"{newest[0]}: the newest event publishes version {newest[1]}, which gc removed (gc never removes "
                "the latest version: a forged event?)"
            )
        head_problem = _head_problem(
            directory, paths, events, head, set(paths) - {p for p, e in zip(paths, parsed, strict=True) if e}
        )
        if head_problem is not None:
            problems.append(head_problem)
        return LogReading(events, problems, proven)

    def events(self, family: str, benchmark: str) -> list[dict[str, Any]]:
        """The readable publication events, oldest first; what :meth:`read` finds wrong goes to :attr:`problems`."""
        reading = self.read(family, benchmark)
        self.problems.update(reading.problems)
        return reading.events

    def removed_versions(self, family: str, benchmark: str) -> set[str]:
        """Versions ``gc`` deleted: their events stay in the log, and they are no longer listed."""
        removed, problem = self._removed(family, benchmark)
        if problem is not None:
            self.problems.add(problem)
        return removed

    def _removed(self, family: str, benchmark: str) -> tuple[set[str], str | None]:
        path = self.layout.removed_path(family, benchmark)
        try:
            listed = json.loads(path.read_text("utf-8")).get("removed", {})
            if not isinstance(listed, dict):
                raise ValueError(listed)
        except FileNotFoundError:
            return set(), None
        except (OSError, ValueError, AttributeError):
            return set(), (
                f"{path}: damaged list of removed versions (kept as it is: gc removes nothing of {benchmark} until "
                "it is restored)"
            )
        return set(listed), None

    def record_removed(self, family: str, benchmark: str, version: str) -> None:
        """Note that ``gc`` deleted a version published once (its events stay: the log is a chain). A damaged list
        is never replaced: it may be the only record of what gc deleted."""
        path = self.layout.removed_path(family, benchmark)
        listed, problem = self._removed(family, benchmark)
        if problem is not None:
            raise StoreError(problem)
        stamped = dict(json.loads(path.read_text("utf-8"))["removed"]) if listed else {}
        stamped[version] = datetime.now(UTC).isoformat(timespec="seconds")
        self.layout.write(path, canonical_json({"removed": dict(sorted(stamped.items()))}))

    def latest(self, benchmark: str, family: str | None = None) -> VersionInfo | None:
        """The benchmark's latest version (:func:`latest_event`), as ``versions``, the catalog and ``check`` say."""
        family = family or self.layout.family_of(benchmark)
        if family is None:
            return None
        last = latest_event(self.layout, family, benchmark, self.events(family, benchmark))
        if last is None:
            return None
        return self._info(family, benchmark, last["version"], last["published_at"], True)

    def versions(self, benchmark: str | None = None) -> list[VersionInfo]:
        """Published versions still in the store (first publication of each), oldest first per benchmark."""
        result: list[VersionInfo] = []
        for family, name in self.layout.benchmarks():
            if benchmark is not None and name != benchmark:
                continue
            events = self.events(family, name)
            last = latest_event(self.layout, family, name, events)
            first_seen: dict[str, str] = {}
            for event in events:  # a version not in the store is not listed (reading the log named its event)
                if self.layout.version_dir(family, name, event["version"]).is_dir():
                    first_seen.setdefault(event["version"], event["published_at"])
            for version, published_at in first_seen.items():
                is_latest = last is not None and version == last["version"]
                result.append(self._info(family, name, version, published_at, is_latest))
        return result

    def _info(self, family: str, benchmark: str, version: str, published_at: str, is_latest: bool) -> VersionInfo:
        manifest_path = self.layout.version_dir(family, benchmark, version) / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text("utf-8"))
        except (OSError, ValueError):
            self.problems.add(f"{manifest_path}: damaged or missing manifest (run `shiftbench check`)")
            manifest = {}
        if not isinstance(manifest, dict):
            manifest = {}
        return VersionInfo(
            family,
            benchmark,
            version,
            published_at,
            is_latest,
            manifest.get("n_examples"),
            manifest.get("params", {}),
        )


def latest_event(
    layout: StoreLayout, family: str, benchmark: str, events: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The event that makes a version latest: the newest readable event of the log whose version is in the store.

    The one definition ``versions``, the catalog (what ``sql`` reads) and ``check`` use. An event naming a version
    that is not there (deleted by hand, forged, removed by gc) is passed over: reading the log names it, and the
    version of the newest event before it that is there is latest. A version there but damaged stays latest: the
    catalog leaves its rows out rather than serve an older version as the latest."""
    there = [event for event in events if layout.version_dir(family, benchmark, str(event["version"])).is_dir()]
    return there[-1] if there else None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _read_event(data: bytes) -> dict[str, Any] | None:
    """A publication event, or None when the file is damaged (truncated, not JSON, fields missing)."""
    try:
        event = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(event, dict) or not all(isinstance(event.get(k), str) for k in ("version", "published_at")):
        return None
    return event


def _read_head(directory: Path) -> dict[str, Any] | None:
    """The log's head record (sequence, event, sha256), or None when it is missing or damaged."""
    try:
        head = json.loads((directory / LOG_HEAD).read_text("utf-8"))
        return {"sequence": int(head["sequence"]), "event": str(head["event"]), "sha256": str(head["sha256"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pending_head(directory: Path) -> dict[str, Any] | None:
    """The head a publish stopped before writing: exactly one event after the one ``HEAD`` names, which follows it
    in the chain (its number, and the hash ``HEAD`` records as its predecessor's); None when there is none."""
    head = _read_head(directory)
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if head is None or len(paths) != head["sequence"] + 1 or len(paths) < 2 or paths[-2].name != head["event"]:
        return None
    data = _read_bytes(paths[-1])
    event = _read_event(data)
    if event is None or event.get("sequence") != len(paths) or event.get("previous") != head["sha256"]:
        return None
    if hashlib.sha256(_read_bytes(paths[-2])).hexdigest() != head["sha256"]:
        return None
    return {"sequence": len(paths), "event": paths[-1].name, "sha256": hashlib.sha256(data).hexdigest()}


def _damaged_event(path: Path, benchmark: str, proven: bool) -> str:
    if proven:
        repair = f"publishing {benchmark} again rewrites it: its name and the chain prove its bytes"
    else:
        repair = "the chain does not prove its bytes: restore the file from a backup"
    return f"{path}: damaged publication event (ignored; {repair})"


def _candidates(family: str, benchmark: str, path: Path, sequence: int, previous: str | None) -> list[bytes]:
    """The bytes a publication event had, made again from its file's name (when it was published, and what) and its
    place in the chain: as ``_append`` writes it, and as events were written before the chain existed."""
    stamp, _, version = path.stem.partition("-")
    if not stamp.isdigit() or not version:
        return []
    published_at = datetime.fromtimestamp(int(stamp) / 1e9, UTC).isoformat(timespec="microseconds")
    plain = {"family": family, "benchmark": benchmark, "version": version, "published_at": published_at}
    chained = {**plain, "sequence": sequence, "previous": previous}
    return [canonical_json(chained).encode(), canonical_json(plain).encode()]


def _proven(
    family: str,
    benchmark: str,
    paths: list[Path],
    datas: list[bytes],
    parsed: list[dict[str, Any] | None],
    head: dict[str, Any] | None,
) -> dict[Path, bytes]:
    """The damaged events whose bytes the chain proves: made again from the file's name and place, they hash to what
    the event after records as its predecessor's hash (or, for the newest, what ``HEAD`` records)."""
    proven: dict[Path, bytes] = {}
    for k, path in enumerate(paths):
        if parsed[k] is not None:
            continue
        if k + 1 < len(paths):
            after = parsed[k + 1]
            target = after.get("previous") if after is not None else None
        else:
            target = head["sha256"] if head is not None and head["event"] == path.name else None
        before = datas[k - 1] if k and parsed[k - 1] is not None else proven.get(paths[k - 1]) if k else None
        if target is None or (k and before is None):
            continue
        previous = hashlib.sha256(before).hexdigest() if before is not None else None
        for candidate in _candidates(family, benchmark, path, k + 1, previous):
            if hashlib.sha256(candidate).hexdigest() == target:
                proven[path] = candidate
    return proven


def _chain_problem(
    event: Mapping[str, Any], position: int, previous: tuple[Path, str] | None, chained: bool
) -> str | None:
    """Why ``event`` (the ``position``-th file of the log) does not follow the readable event before it."""
    sequence = event.get("sequence")
    if sequence is None:  # an event from before the chain existed: only before the first chained one
        return "an event without a sequence number after the chained ones (forged?)" if chained else None
    if not isinstance(sequence, int) or sequence != position:
        missing = sequence - position if isinstance(sequence, int) and sequence > position else 0
        what = f"{missing} event(s) before it are missing" if missing else "it is out of place in the log"
        return f"publication event {sequence!r} is the log's event {position}: {what}"
    if previous is not None and event.get("previous") != previous[1]:
        return f"does not follow {previous[0].name} (its hash of the event before differs: edited or forged)"
    return None


def _head_problem(
    directory: Path,
    paths: list[Path],
    events: list[dict[str, Any]],
    head: dict[str, Any] | None,
    damaged: set[Path],
) -> str | None:
    """Whether the log's newest events are all there: ``HEAD`` names the newest event by number and hash."""
    head_path = directory / LOG_HEAD
    chained = any("sequence" in event for event in events)
    if not head_path.is_file():
        return f"{head_path}: missing (the log's head record)" if chained else None
    if head is None:
        return f"{head_path}: damaged (the log's head record)"
    sequence, name, digest = head["sequence"], head["event"], head["sha256"]
    if sequence > len(paths):
        return f"{directory / name}: missing: the log's head names it (the newest publication event was removed)"
    newest = paths[sequence - 1] if sequence >= 1 else None
    if newest is None or newest.name != name:
        return f"{head_path}: names {name}, but the log's event {sequence} is {newest.name if newest else 'none'}"
    if newest not in damaged and hashlib.sha256(newest.read_bytes()).hexdigest() != digest:
        return f"{newest}: differs from the log's head record (edited)"
    if len(paths) > sequence:  # a publish writes the head right after its event: a crash between leaves one behind
        after = len(paths) - sequence
        if after > 1:
            return f"{paths[sequence + 1]}: {after} events after the log's head (not written by a publish)"
        return (
            f"{paths[sequence]}: after the event the log's head names ({name}): a publish stopped before writing "
            "its head, or a forged event (publishing any version of the benchmark completes the head)"
        )
    return None

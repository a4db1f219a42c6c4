"""The files the catalog lists, and how a reader notices that one changed after the catalog was built.

A refresh lists the Parquet files of intact versions, named relative to the warehouse (the folder that holds
``catalog.duckdb`` and ``store/``), and records each file's state (size, mtime, ctime, inode) in the
``catalog_files`` table, taken *before* the file is checked. A version whose files all still have the state
recorded by the previous catalog gets the cheap check (manifest readable, every file present with its recorded
size); any other version (new, changed, or left out before) is checked against its manifest's SHA-256 checksums.
A reader stats the recorded files on open (:func:`changed_files`) and refreshes when one differs, so a version
whose data was rewritten after the refresh, at its old size included, is verified and left out rather than served.

What it cannot see: content rewritten in place with size, mtime, ctime and inode all as recorded (ctime can only
be put back by changing the system clock or writing the disk below the filesystem), or a file system that does
not keep ctime. ``shiftbench check`` hashes every file whatever its state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import duckdb

# 3: the publication log's files in catalog_files, the latest versions as the log says (latest_data), every event
# the catalog has seen (catalog_events), and the results views with images and grouping. A catalog of another layout
# is rebuilt by its reader.
CATALOG_LAYOUT = "3"


@dataclass(frozen=True)
class FileState:
    """What a stat says about a file: any rewrite changes at least the ctime (mtime can be set back, ctime not)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileState | None:
        try:
            stat = path.stat()
        except OSError:
            return None
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


@dataclass(frozen=True)
class StoreContents:
    tables: dict[str, list[str]]  # table -> files of intact versions, relative to the warehouse (posix)
    states: dict[str, FileState]  # relative file -> its state when it was checked (the log's files too)
    publications: list[tuple[str, str, str, str]]  # (family, benchmark, version, published_at)
    problems: list[str]
    latest: list[tuple[str, str, str, str]] = field(default_factory=list)  # the log's latest, damaged or not
    events: list[str] = field(default_factory=list)  # every publication event file, relative to the warehouse


def relative(path: Path, home: Path) -> str:
    """``path`` named from the warehouse folder, with forward slashes (how the views and catalog_files name it)."""
    return PurePosixPath(Path(os.path.relpath(path, home))).as_posix()


def scan_store(store: Path, home: Path, known: Mapping[str, FileState]) -> StoreContents:
    """The intact versions' files and the readable publication events; ``known`` is what the previous catalog
    recorded: a version whose files all kept their recorded state gets the cheap check, any other the checksums."""
    from shiftbench.store import StagedVersion, Store, damage
    from shiftbench.store.log import latest_event

    reader = Store(store)
    contents = StoreContents({}, {}, [], [])
    if not store.is_dir():
        return contents
    for family_dir in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
            intact: set[str] = set()
            versions_dir = bench_dir / "versions"
            for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
                if version_dir.name.startswith(".") or not (version_dir / "manifest.json").exists():
                    continue
                files = {relative(path, home): path for path in sorted(version_dir.glob("*.parquet"))}
                states = {name: FileState.of(path) for name, path in files.items()}  # before the check
                unchanged = bool(files) and all(known.get(name) == state for name, state in states.items())
                staged = StagedVersion(family_dir.name, bench_dir.name, version_dir.name, version_dir, False)
                problem = damage(staged, checksums=not unchanged)
                if problem is not None:
                    contents.problems.append(problem)
                    continue
                intact.add(version_dir.name)
                for name, path in files.items():
                    contents.tables.setdefault(path.stem, []).append(name)
                    state = states[name]
                    if state is not None:
                        contents.states[name] = state
            events = reader.log.events(family_dir.name, bench_dir.name)
            for event in events:
                if event["version"] in intact:
                    contents.publications.append(
                        (family_dir.name, bench_dir.name, event["version"], event["published_at"])
                    )
            latest = latest_event(reader.layout, family_dir.name, bench_dir.name, events)
            if latest is not None:
                contents.latest.append((family_dir.name, bench_dir.name, latest["version"], latest["published_at"]))
            _log_files(reader.layout.publications_dir(family_dir.name, bench_dir.name), home, contents)
    contents.problems.extend(sorted(reader.log.problems))
    return contents


def _log_files(directory: Path, home: Path, contents: StoreContents) -> None:
    """Record the log's files (its folder, each event, ``HEAD``): a reader that finds one changed, added or removed
    refreshes before it answers, so ``sql`` never says another latest version than ``versions``."""
    if not directory.is_dir():
        return
    for path in [directory, *sorted(directory.iterdir())]:
        state = FileState.of(path)
        if state is not None:
            contents.states[relative(path, home)] = state
        if path.suffix == ".json":
            contents.events.append(relative(path, home))


def is_table_file(name: str) -> bool:
    """Whether a file the catalog records is a version's table (else one of the log's files)."""
    return name.endswith(".parquet")


def recorded_states(catalog_path: Path) -> dict[str, FileState] | None:
    """The file states a catalog recorded (None: no catalog there, not one of this layout, or unreadable)."""
    if not catalog_path.is_file():
        return None
    try:
        with duckdb.connect(str(catalog_path), read_only=True) as con:
            return states_in(con)
    except duckdb.Error:
        return None


def recorded_events(catalog_path: Path) -> list[str]:
    """Every publication event file a catalog has seen, relative to the warehouse (none: no catalog of this layout).

    A refresh keeps those of the catalog it replaces: events are never removed (gc keeps them, publishing rewrites
    a damaged one in place), so one gone from the log is the trace of a rewritten log (:func:`vanished_events`)."""
    if not catalog_path.is_file():
        return []
    try:
        with duckdb.connect(str(catalog_path), read_only=True) as con:
            if states_in(con) is None:
                return []
            return [str(name) for (name,) in con.execute("SELECT path FROM catalog_events ORDER BY path").fetchall()]
    except duckdb.Error:
        return []


def vanished_events(home: Path, recorded: list[str]) -> list[str]:
    """The recorded events no longer in the log, each as a line naming its file."""
    return [
        f"{home / name}: a publication event gone from the log, where the catalog saw it (events are never "
        "removed: the log was rewritten, its newest event removed and HEAD rewritten, or restored from an older "
        "copy; docs/reliability.md)"
        for name in recorded
        if not (home / name).is_file()
    ]


def states_in(con: duckdb.DuckDBPyConnection) -> dict[str, FileState] | None:
    """The file states recorded in an open catalog (None when it is not a catalog of this layout)."""
    try:
        layout = con.execute("SELECT value FROM catalog_info WHERE key = 'layout'").fetchone()
        if layout is None or layout[0] != CATALOG_LAYOUT:
            return None
        rows = con.execute("SELECT path, size, mtime_ns, ctime_ns, inode FROM catalog_files").fetchall()
    except duckdb.Error:
        return None
    return {str(path): FileState(*map(int, state)) for path, *state in rows}


def changed_files(home: Path, states: Mapping[str, FileState]) -> list[str]:
    """The recorded files whose state differs now (rewritten, replaced, touched or gone), relative to ``home``."""
    return sorted(name for name, state in states.items() if FileState.of(home / name) != state)


def damage_of(home: Path, names: list[str]) -> list[str]:
    """What is wrong with the versions that hold these files, checked against their checksums (one per version)."""
    from shiftbench.store import StagedVersion, damage

    version_dirs = sorted({(home / name).parent for name in names if is_table_file(name)})
    problems = []
    for version_dir in version_dirs:
        bench_dir = version_dir.parent.parent
        staged = StagedVersion(bench_dir.parent.name, bench_dir.name, version_dir.name, version_dir, False)
        problem = damage(staged, checksums=True)
        if problem is not None:
            problems.append(problem)
    return problems

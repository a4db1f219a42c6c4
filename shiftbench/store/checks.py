"""Checking a version: its files against its manifest, and the record of its contract checks.

Publishing trusts nothing it did not check itself: a version's files must have exactly the checksums in its
manifest, and a passing contract check must be recorded for exactly those files under the contracts in force
now. Both questions are answered here, so that publishing (:mod:`shiftbench.store.log`) and staging
(which finds a damaged copy of the version it is writing) ask them the same way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shiftbench.errors import ContractViolation, StoreError
from shiftbench.store.layout import StagedVersion, StoreLayout, version_id
from shiftbench.tables.fingerprint import sha256_file


def contracts_fingerprint(tables: list[str]) -> str:
    """The contracts in force for ``tables``. Imported when a check is recorded or compared, not with the store:
    reading a split (:func:`shiftbench.load_split`) verifies files and needs no contracts (duckdb, the ODCS models)."""
    from shiftbench.store.contracts import contracts_fingerprint as fingerprint

    return fingerprint(tables)


@dataclass(frozen=True)
class CheckRecord:
    """The outcome of a version's contract checks, tied to the files and contracts checked."""

    version: str
    passed: bool
    files: dict[str, str]  # table -> sha256 of the Parquet file that was checked
    contracts: str  # fingerprint of the contracts applied
    rules: int
    failed: list[str]  # "table.rule: observed X, expected Y"
    checked_at: str
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # table -> every rule's outcome


def damage(staged: StagedVersion, *, checksums: bool = True) -> str | None:
    """What is wrong with a version's files (naming the file), or None when they match the manifest.

    Always compared (cheap: the catalog asks this of every version): the manifest parses and names this version,
    whose id its tables' content hashes give; every table and attachment it lists is there with its recorded
    size; no other table file lies beside them. With ``checksums``, every file's SHA-256 too.
    """
    manifest_path = staged.path / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
        tables = dict(manifest["tables"])
        attachments = dict(manifest.get("attachments") or {})
    except FileNotFoundError:
        if not staged.path.is_dir():
            return f"{staged.path}: missing (version {staged.version} is not in the store)"
        return f"{manifest_path}: incomplete version (no manifest)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{manifest_path}: damaged manifest ({type(exc).__name__})"
    if not all(isinstance(entry, dict) for entry in [*tables.values(), *attachments.values()]):
        return f"{manifest_path}: damaged manifest (an entry that is not a mapping)"
    return (
        _identity_problem(staged, manifest, tables)
        or _tables_problem(staged, tables, checksums)
        or _attachments_problem(staged, attachments, checksums)
    )


def _identity_problem(staged: StagedVersion, manifest: dict[str, Any], tables: dict[str, Any]) -> str | None:
    """Whether the manifest describes this folder's version: its names, and the id its content hashes make."""
    manifest_path = staged.path / "manifest.json"
    named = (manifest.get("family"), manifest.get("benchmark"), manifest.get("version"))
    if named != (staged.family, staged.benchmark, staged.version):
        return f"{manifest_path}: describes {'/'.join(map(str, named))}, not this folder's version"
    try:
        made = version_id(staged.family, staged.benchmark, {name: e["content_sha256"] for name, e in tables.items()})
    except (KeyError, TypeError):
        return f"{manifest_path}: damaged manifest (a table without its content hash)"
    if made != staged.version:
        return f"{manifest_path}: its tables' content hashes make version {made}, not {staged.version} (edited)"
    return None


def _tables_problem(staged: StagedVersion, tables: dict[str, Any], checksums: bool) -> str | None:
    manifest_path = staged.path / "manifest.json"
    for name, entry in sorted(tables.items()):
        path = staged.path / str(entry.get("file", ""))
        if name != path.stem or path.parent != staged.path:
            return f"{manifest_path}: table {name} points at {entry.get('file')}"
        problem = _file_problem(staged, path, entry, checksums)
        if problem is not None:
            return problem
    listed = {f"{name}.parquet" for name in tables}
    extra = sorted(p for p in staged.path.glob("*.parquet") if p.name not in listed)
    if extra:
        return f"{extra[0]}: not in the manifest of version {staged.version} (a table file added after staging)"
    return None


def _attachments_problem(staged: StagedVersion, attachments: dict[str, Any], checksums: bool) -> str | None:
    for _, entry in sorted(attachments.items()):
        problem = _file_problem(staged, staged.path / str(entry.get("file", "")), entry, checksums)
        if problem is not None:
            return problem
    return None


def _file_problem(staged: StagedVersion, path: Path, entry: dict[str, Any], checksums: bool) -> str | None:
    if not path.is_file():
        return f"{path}: missing (listed in the manifest of version {staged.version})"
    size = entry.get("bytes")
    if size is not None and path.stat().st_size != size:
        return f"{path}: {path.stat().st_size} bytes, the manifest of version {staged.version} says {size}"
    if checksums and sha256_file(path) != entry.get("sha256"):
        return f"{path}: checksum mismatch with the manifest of version {staged.version}"
    return None


def verify(staged: StagedVersion) -> None:
    """Check every file against the manifest's checksums before it can be published."""
    problem = damage(staged)
    if problem is not None:
        raise StoreError(problem)


class VersionChecks:
    """The contract check records of one store: written, read, and judged against the files and contracts now.

    The contracts in force are fingerprinted by :func:`contracts_fingerprint`, looked up at each call (a test that
    changes the contracts in force replaces it).
    """

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout

    def record_check(
        self,
        staged: StagedVersion,
        passed: bool,
        rules: int,
        failed: list[str],
        results: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> CheckRecord:
        """Record the outcome of the version's contract checks with the checksums of the files checked.

        Call right after :func:`verify` (``check_version`` does): the checksums recorded are the
        manifest's, which the files on disk were just shown to match.
        """
        manifest = staged.manifest()
        record = CheckRecord(
            version=staged.version,
            passed=passed,
            files={name: entry["sha256"] for name, entry in sorted(manifest["tables"].items())},
            contracts=contracts_fingerprint(sorted(manifest["tables"])),
            rules=rules,
            failed=failed,
            checked_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            results=dict(results or {}),
        )
        path = self.layout.check_path(staged.family, staged.benchmark, staged.version)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.layout.lock(staged.family, staged.benchmark):  # never between a publish's check and its event
            if self.damaged_record(staged) is not None:  # kept for inspection, as a damaged version is
                path.rename(path.with_name(f".damaged-{path.stem}-{uuid.uuid4().hex[:8]}.json"))
            self.layout.write(path, json.dumps(asdict(record), indent=2, sort_keys=True))
        return record

    def check_record(self, staged: StagedVersion) -> CheckRecord | None:
        """The recorded check of ``staged``; None when there is none or it is damaged (:meth:`damaged_record`)."""
        path = self.layout.check_path(staged.family, staged.benchmark, staged.version)
        try:
            record = CheckRecord(**json.loads(path.read_text("utf-8")))
        except (OSError, ValueError, TypeError):
            return None
        well_formed = isinstance(record.files, dict) and isinstance(record.failed, list)
        return record if well_formed and isinstance(record.results, dict) else None

    def damaged_record(self, staged: StagedVersion) -> str | None:
        """What is wrong with the version's check record, naming it (None: absent or readable)."""
        path = self.layout.check_path(staged.family, staged.benchmark, staged.version)
        if path.is_file() and self.check_record(staged) is None:
            return f"{path}: damaged check record (checking the version again records it anew; the damaged one is kept)"
        return None

    def valid_check(self, staged: StagedVersion) -> CheckRecord | None:
        """The recorded *passing* check if it still describes exactly these files under today's contracts.

        Call after :func:`verify` (which re-hashes the files against the manifest). A failed check is
        never reused: checking again costs little and says the same unless something changed.
        """
        record = self.check_record(staged)
        if record is None or not record.results or self.record_problem(record, staged) is not None:
            return None
        return record

    def require_passing_check(self, staged: StagedVersion) -> None:
        """Refuse a version that has no passing check of exactly these files under today's contracts."""
        record = self.check_record(staged)
        name = f"{staged.benchmark} version {staged.version}"
        if record is None:
            raise ContractViolation(f"{name} has not been checked against its contracts: not published")
        problem = self.record_problem(record, staged)
        if problem is not None:
            raise ContractViolation(f"{name} {problem}: not published")

    def record_problem(self, record: CheckRecord, staged: StagedVersion) -> str | None:
        """Why a check record does not allow publishing ``staged`` (None: it passed, on these files, today)."""
        if not record.passed:
            shown = "; ".join(record.failed[:3])
            if len(record.failed) > 3:
                shown += f"; ... ({len(record.failed)} rules)"
            return f"failed its contract checks ({shown})"
        files = {name: entry["sha256"] for name, entry in staged.manifest()["tables"].items()}
        if record.files != files:
            return "was checked on other files than these: check it again"
        if record.contracts != contracts_fingerprint(sorted(files)):
            return "was checked against other contracts than today's: check it again"
        return None

"""Content-addressed cache directories under ``$SHIFTBENCH_HOME/cache``.

Intermediate results (parsed raw sources, hierarchies) are written once into a directory named
by their content fingerprint, so steps running in different processes hand each other a path,
not a pickle, and an unchanged input is never parsed twice. Every write goes through a uniquely
named temporary sibling and a rename, so concurrent builds and readers never see half a file.

What the warehouse records about a place inside itself (an artifact's folder, generated images) is named
relative to the warehouse folder (:func:`home_record`), so a moved or copied warehouse finds it where it is now.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shiftbench.errors import StoreError

ARTIFACT_FILE = "artifact.json"


@dataclass(frozen=True)
class CachedArtifact:
    """A directory of Parquet files with the content fingerprint it is named after."""

    path: Path
    fingerprint: str
    meta: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> CachedArtifact:
        """The artifact a build wrote at ``path`` (what Dagster steps hand each other)."""
        try:
            data = json.loads((path / ARTIFACT_FILE).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: not a complete cached artifact ({exc}); rebuild the inputs") from None
        return cls(path, str(data["fingerprint"]), dict(data["meta"]))


def home_record(path: Path, home: Path) -> str:
    """How a record kept in the warehouse names ``path``: relative to the warehouse folder ``home`` when it is
    inside it (the record then holds after ``mv`` of the warehouse), else absolute (a user's ImageNet folder)."""
    return path.relative_to(home).as_posix() if path.is_relative_to(home) else str(path)


def from_home_record(record: str, home: Path) -> Path:
    """The path a :func:`home_record` names, in the warehouse at ``home`` (an absolute record as it is)."""
    path = Path(record)
    return path if path.is_absolute() else home / path


def find_cached(record: str, home: Path, cache_dir: Path) -> Path:
    """A cache folder (``<cache>/<kind>/<key>``) a record names: a :func:`home_record`, or the absolute path an
    older release recorded; when that path is gone (the warehouse was moved since), the folder at the same place
    in this warehouse's cache, if there is one."""
    path = from_home_record(record, home)
    if path.is_absolute() and not path.exists():
        here = cache_dir / path.parent.name / path.name
        if here.is_dir():
            return here
    return path


def unique_sibling(path: Path) -> Path:
    """A temporary name next to ``path`` that no other writer uses."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_file_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a unique temporary file and a rename: readers see all of it or nothing."""
    tmp = unique_sibling(path)
    try:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def publish_cache_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Write a cache directory through a temporary sibling, so readers never see half of it."""
    if target.exists():
        return
    tmp = unique_sibling(target)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        tmp.rename(target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached(target: Path, fingerprint: str, meta: dict[str, Any], write: Callable[[Path], None]) -> CachedArtifact:
    """The artifact at ``target``: written by ``write`` unless it is there already, with its meta."""

    def write_all(tmp: Path) -> None:
        write(tmp)
        (tmp / ARTIFACT_FILE).write_text(json.dumps({"fingerprint": fingerprint, "meta": meta}, indent=2), "utf-8")

    publish_cache_dir(target, write_all)
    if not (target / ARTIFACT_FILE).is_file():  # written by an older release: describe it now
        write_file_atomic(target / ARTIFACT_FILE, json.dumps({"fingerprint": fingerprint, "meta": meta}, indent=2))
    return CachedArtifact(target, fingerprint, meta)

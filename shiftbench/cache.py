"""Content-addressed cache directories under ``$SHIFTBENCH_HOME/cache``.

Intermediate results (parsed raw sources, hierarchies) are written once into a directory named
by their content fingerprint, so steps running in different processes hand each other a path,
not a pickle, and an unchanged input is never parsed twice.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CachedArtifact:
    """A directory of Parquet files with the content fingerprint it is named after."""

    path: Path
    fingerprint: str
    meta: dict[str, Any]


def publish_cache_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Write a cache directory through a temporary sibling, so readers never see half of it."""
    if target.exists():
        return
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        tmp.rename(target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

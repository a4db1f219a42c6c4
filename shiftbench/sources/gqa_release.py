"""Whether GQA scene-graph files are the release's: a paper's name only for the paper's data.

MetaShift's object and general contexts come from GQA's scene graphs of Visual Genome, released as
``train_sceneGraphs.json`` (74,942 images) and ``val_sceneGraphs.json`` (10,696 images), version 1.1. The
release publishes no checksum, so the files are recognised by their published image counts: both files,
with exactly those counts, build the papers' benchmarks (``metashift``, ``cat-dog-dg-...``); anything else in
GQA's format (one of the files, a sample, a crafted file) builds ``NAME@gqa-files``. The files' content
fingerprint is recorded in every version's ``benchmarks.sources`` either way, so two homes can compare.

Counting a file's images decodes its top level only (about 0.5 s per 200 MB); the count is cached by the
file's path, size and modification time, so naming benchmarks (every ``build --list``, every sensor tick)
costs it once per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import msgspec

from shiftbench.runtime.cache import write_file_atomic

RELEASE_IMAGE_COUNTS = (74_942, 10_696)  # train_sceneGraphs.json, val_sceneGraphs.json (GQA 1.1)
TAG = "gqa-files"


def image_count(path: Path, cache_dir: Path) -> int | None:
    """The number of images (top-level keys) of a scene-graph file; None when it is not a readable JSON object."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    cached = cache_dir / "gqa_image_counts" / f"{key}.json"
    if cached.is_file():
        try:
            return int(json.loads(cached.read_text("utf-8"))["images"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        count = len(msgspec.json.decode(path.read_bytes(), type=dict[str, msgspec.Raw]))
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs the count again
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(cached, json.dumps({"path": str(path), "images": count}))
    return count


def is_release(paths: Sequence[Path], cache_dir: Path) -> bool:
    """Whether ``paths`` are GQA's two released scene-graph files (by their published image counts)."""
    if len(paths) != len(RELEASE_IMAGE_COUNTS):  # one file, or three, is never the release: nothing to count
        return False
    counts = [image_count(path, cache_dir) for path in paths]
    return sorted(c for c in counts if c is not None) == sorted(RELEASE_IMAGE_COUNTS) and None not in counts

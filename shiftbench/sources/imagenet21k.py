"""ImageNet-21k: the class lists of its releases and subsets, a user's wnid list, and an image folder.

- The lists (one wnid per line, line order = the class index models were trained with) are timm's data
  files: Google's fall11 ImageNet-21k (``in21k``), ImageNet-22k (``in22k``), ImageNet-12k (``in12k``),
  the MIIL fall11 and winter21 subsets (``in21k-miil``, ``in21k-miil-w21``) and ILSVRC-2012
  (``in1k``). They ship as ``data/imagenet21k_classes.parquet`` (a row per wnid of the union, a column
  per list holding its class index or null; Apache-2.0, ``data/LICENSE-TIMM``), made by
  ``scripts/make_package_data.py`` from the timm wheel; the key-value metadata records timm's version
  and each file's SHA-256, and reading a list checks it reproduces that file byte for byte. With the
  source ``timm`` the lists are read from an installed timm's files instead, without importing timm.
- A user's list: one wnid per line, ``#`` comments and blank lines allowed, read strictly.
- Images are listed (never opened) from class folders ``<wnid>/`` directly under the root, or under
  ``fall11_whole/``, ``winter21_whole/`` (the two releases' archive layouts) or ``train/``. A version records
  the listing's hash (names, never modification times); the folders' times only say when to list again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

import polars as pl
import pyarrow.parquet as pq

from shiftbench.errors import InputError, shown
from shiftbench.sources.imagenet import IMAGE_SUFFIXES
from shiftbench.sources.packaged import DATA_DIR
from shiftbench.tables.fingerprint import sha256_table, sha256_text

LISTS: tuple[str, ...] = ("in21k", "in22k", "in12k", "in21k-miil", "in21k-miil-w21", "in1k")
TIMM_FILES: dict[str, str] = {
    "in21k": "imagenet21k_goog_synsets.txt",
    "in22k": "imagenet22k_synsets.txt",
    "in12k": "imagenet12k_synsets.txt",
    "in21k-miil": "imagenet21k_miil_synsets.txt",
    "in21k-miil-w21": "imagenet21k_miil_w21_synsets.txt",
    "in1k": "imagenet_synsets.txt",
}
TIMM_INFO_DIR = ("data", "_info")  # the lists' folder inside the timm package
CLASS_TABLE = DATA_DIR / "imagenet21k_classes.parquet"
PROVENANCE_KEY = b"shiftbench.imagenet21k"  # the Parquet key-value metadata entry (JSON)
CLASS_SOURCE_SETTING = "SHIFTBENCH_IMAGENET21K_CLASS_SOURCE"
DIR_SETTING = "SHIFTBENCH_IMAGENET21K_DIR"
LAYOUTS = ("", "fall11_whole", "winter21_whole", "train")  # where class folders may stand under the root
WNID = re.compile(r"n\d{8}")
VAL_ONE_IN = 10
SPLIT_RULE = f"blake2b-64(file name) % {VAL_ONE_IN} == 0 -> val"  # part of the folder's stamp


@dataclass(frozen=True)
class ClassList:
    name: str  # one of LISTS, or "user"
    wnids: tuple[str, ...]  # in the list's own order (= the class index)
    provenance: dict[str, str]


# -- class lists ----------------------------------------------------------------------------------
def class_list(name: str, *, source: Literal["package", "timm"] = "package") -> ClassList:
    """A named list from the shipped Parquet file (``package``) or an installed timm's data files."""
    if name not in LISTS:
        raise InputError(f"unknown class list {name!r}; known: {', '.join(LISTS)}", parameter="classes")
    if source == "package":
        return _package_list(name)
    if source == "timm":
        package_dir, version = installed_timm()
        return timm_class_list(name, package_dir, version)
    raise InputError(f"unknown class source {source!r}; known: package, timm", parameter=CLASS_SOURCE_SETTING)


def installed_timm() -> tuple[Path, str]:
    """The installed timm's package folder and version, found without executing the package."""
    spec = importlib.util.find_spec("timm")  # a top-level name: located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "timm is not installed: install it (pip install timm) or use 'package', the lists shipped with shiftbench",
            parameter=CLASS_SOURCE_SETTING,
        )
    try:
        version = metadata.version("timm")
    except metadata.PackageNotFoundError:  # a source checkout on the path: no distribution metadata
        version = "unknown"
    return Path(next(iter(spec.submodule_search_locations))), version


def timm_class_list(name: str, package_dir: Path, timm_version: str) -> ClassList:
    """The list ``name`` from the data files of the timm package in ``package_dir``."""
    path = package_dir.joinpath(*TIMM_INFO_DIR, TIMM_FILES[name])
    wnids, raw = _read_wnid_file(path)
    provenance = {"source": "timm", "timm_version": timm_version, "file": TIMM_FILES[name]}
    return ClassList(name, wnids, {**provenance, "sha256": hashlib.sha256(raw).hexdigest()})


def read_wnid_list(path: Path) -> ClassList:
    """A user's list: one wnid (``n`` + 8 digits) a line, in class-index order; ``#`` starts a comment."""
    wnids, raw = _read_wnid_file(path)
    return ClassList("user", wnids, {"source": "user", "file": str(path), "sha256": hashlib.sha256(raw).hexdigest()})


def _read_wnid_file(path: Path) -> tuple[tuple[str, ...], bytes]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the class list: {exc.strerror or exc}", path=path) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    return parse_wnids(text, path), raw


def parse_wnids(text: str, path: Path | str) -> tuple[str, ...]:
    """The wnids of a list's text, in order; a malformed line, a duplicate or no wnid at all is refused."""
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not WNID.fullmatch(entry):
            raise InputError(f"not a WordNet id (n and 8 digits): {shown(entry)}", path=path, line=number)
        if entry in first_line:
            message = f"{entry} is listed twice (lines {first_line[entry]} and {number})"
            raise InputError(message, path=path, line=number)
        first_line[entry] = number
    if not first_line:
        raise InputError("no WordNet ids in the file (one a line: n and 8 digits)", path=path)
    return tuple(first_line)


def list_bytes(wnids: Sequence[str]) -> bytes:
    """A list as timm's file holds it: a wnid and a newline each (what the recorded SHA-256 is of)."""
    return "".join(f"{wnid}\n" for wnid in wnids).encode()


@functools.cache
def _shipped_table() -> tuple[pl.DataFrame, dict[str, object]]:
    table = pq.read_table(CLASS_TABLE)
    provenance: dict[str, object] = json.loads((table.schema.metadata or {})[PROVENANCE_KEY])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame, provenance


def shipped_provenance() -> dict[str, object]:
    """The shipped file's record: timm's version, the wheel, and each list's file, SHA-256 and size."""
    return _shipped_table()[1]


def _package_list(name: str) -> ClassList:
    frame, provenance = _shipped_table()
    wnids = tuple(frame.filter(pl.col(name).is_not_null()).sort(name)["wnid"].to_list())
    files = provenance["files"]
    assert isinstance(files, dict)
    recorded: dict[str, object] = files[name]
    sha256 = hashlib.sha256(list_bytes(wnids)).hexdigest()
    if sha256 != recorded["sha256"]:  # the package's own data is damaged: a bug, not the user's input
        raise RuntimeError(f"{CLASS_TABLE}: list {name!r} does not reproduce {recorded['file']} (sha256 {sha256})")
    source = {"source": "package", "timm_version": str(provenance["timm_version"]), "file": str(recorded["file"])}
    return ClassList(name, wnids, {**source, "sha256": sha256})


# -- images ---------------------------------------------------------------------------------------
def imagenet21k_split(file_name: str) -> Literal["train", "val"]:
    """ImageNet-21k has no validation split; a file is ``val`` when the first 8 bytes of
    ``hashlib.blake2b(file_name.encode("utf-8"), digest_size=8)``, read as a big-endian integer, are
    divisible by 10 (about 1 file in 10), else ``train``. Only the file name counts (not its folder or
    the root), so the same image gets the same split in either release's layout and on every machine."""
    digest = hashlib.blake2b(file_name.encode("utf-8"), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") % VAL_ONE_IN == 0 else "train"


def _has_class_folders(base: Path, *, archives: bool = False) -> bool:
    """Whether ``base`` holds a ``<wnid>/`` folder (or, with ``archives``, a ``<wnid>.tar`` file)."""
    try:
        with os.scandir(base) as entries:
            if archives:
                return any(e.name.endswith(".tar") and WNID.fullmatch(e.name.removesuffix(".tar")) for e in entries)
            return any(WNID.fullmatch(e.name) and e.is_dir() for e in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False


def imagenet21k_class_root(root: Path) -> Path:
    """The one folder under ``root`` holding the class folders (``root`` itself or a release's folder)."""
    if not root.is_dir():
        problem = "is not a folder" if root.exists() else "does not exist"
        raise InputError(f"the ImageNet-21k folder {problem}", path=root, parameter=DIR_SETTING)
    found = [base for base in LAYOUTS if _has_class_folders(root / base)]
    if len(found) > 1:
        places = ", ".join(f"{base or '.'}/" for base in found)
        raise InputError(f"class folders in more than one place ({places}): point it at one", parameter=DIR_SETTING)
    if not found:
        archives = any(_has_class_folders(root / base, archives=True) for base in LAYOUTS)
        hint = "; it holds per-class .tar archives: extract each into a <wnid>/ folder" if archives else ""
        where = ", ".join(f"{base}/" for base in LAYOUTS if base)
        message = f"no class folders (<wnid>/ with images) in it or under {where}{hint}"
        raise InputError(message, path=root, parameter=DIR_SETTING)
    return root / found[0]


def list_imagenet21k_images(root: Path, wnids: Sequence[str]) -> pl.DataFrame:
    """``image_id`` (the path relative to ``root``), ``wnid``, ``imagenet_split`` (:func:`imagenet21k_split`)
    for the images in the class folders of ``wnids``, sorted by ``image_id``; a wnid without a folder has no
    rows, folders of other wnids are ignored. Files are listed by name, never opened."""
    for wnid in wnids:
        if not WNID.fullmatch(wnid):
            raise InputError(f"not a WordNet id: {wnid!r}", parameter="classes")
    base = imagenet21k_class_root(root)
    prefix = f"{base.relative_to(root).as_posix()}/" if base != root else ""
    image_ids: list[str] = []
    image_wnids: list[str] = []
    splits: list[str] = []
    for wnid in sorted(set(wnids)):
        try:
            with os.scandir(base / wnid) as entries:
                names = sorted(e.name for e in entries if e.name.lower().endswith(IMAGE_SUFFIXES))
        except (FileNotFoundError, NotADirectoryError):
            continue
        image_ids.extend(f"{prefix}{wnid}/{name}" for name in names)
        image_wnids.extend([wnid] * len(names))
        splits.extend(imagenet21k_split(name) for name in names)
    return pl.DataFrame(
        {"image_id": image_ids, "wnid": image_wnids, "imagenet_split": splits},
        schema={"image_id": pl.String, "wnid": pl.String, "imagenet_split": pl.String},
    ).sort("image_id")


def imagenet21k_dir_stamp(root: Path | None) -> str:
    """A cache key, never part of an id: the names, modification times, link counts and inodes of the class
    folders (a folder's mtime changes whenever a file in it is added, removed or renamed) and the split rule.
    Cheap (no file is listed); a copy or a restore of the same images has another stamp but the same listing,
    and the listing's hash (:func:`imagenet21k_listing_sha256`) is what a version records."""
    parts = [SPLIT_RULE]
    folders = {base: root / base for base in LAYOUTS} if root is not None else {}
    for base, folder in folders.items():
        try:
            with os.scandir(folder) as scanned:
                entries = sorted((e for e in scanned if WNID.fullmatch(e.name) and e.is_dir()), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            stat = entry.stat()
            parts.append(f"{base}/{entry.name}:{stat.st_mtime_ns}:{stat.st_nlink}:{stat.st_ino}")
    return sha256_text("\n".join(parts))


def imagenet21k_listing_sha256(images: pl.DataFrame) -> str:
    """The content hash of a listing (:func:`list_imagenet21k_images`): image ids, wnids and splits, as
    ImageNet-1k's listing is hashed; the same images give the same hash wherever and however they were copied."""
    return sha256_table(images)

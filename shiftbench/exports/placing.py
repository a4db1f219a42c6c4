"""How images enter an export (``--images``), and the folder an export is written in whole or not at all.

- ``link`` (the default): a hard link to the image when the export is on the image's filesystem, else a
  copy. No extra space on one filesystem; the export survives moving or deleting the warehouse (a hard link
  is the file itself); the file is shared with the warehouse's, so an export's images are to be read, not
  edited in place.
- ``copy``: an independent copy: the images' full size again; nothing is shared.
- ``symlink``: an absolute symbolic link to the image: no image bytes, but it dangles once the warehouse or the
  image root moves, and a copy of the export elsewhere (``rsync``, ``scp``, a push) carries dangling links.

:func:`staged_folder` writes into a hidden folder inside the target and moves its entries up at the end;
a failure (any exception, Ctrl-C included) removes what was written, so no half export is left behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from shiftbench.runtime.outputs import check_output_dir, inside

ImageMode = Literal["link", "copy", "symlink"]
IMAGE_MODES: tuple[str, ...] = get_args(ImageMode)
DEFAULT_MODE: ImageMode = "link"
PARTIAL = ".shiftbench-partial"  # the staging folder inside the target, gone when an export ends


@dataclass(frozen=True)
class Placed:
    """What placing the images did: how many became hard links, copies and symbolic links, and the bytes copied."""

    linked: int = 0
    copied: int = 0
    symlinked: int = 0
    copied_bytes: int = 0

    def describe(self) -> str:
        parts = []
        if self.linked:
            parts.append(f"{self.linked:,} hard links")
        if self.copied:
            parts.append(f"{self.copied:,} copies ({self.copied_bytes / 1e6:,.1f} MB)")
        if self.symlinked:
            parts.append(f"{self.symlinked:,} symlinks (they dangle if the images move)")
        return ", ".join(parts) or "no image files"


def place_images(files: Sequence[tuple[str, str]], work: Path, mode: ImageMode) -> Placed:
    """Put each ``(source, path under work)`` in ``work`` as ``mode`` says (``link``: copies where linking fails:
    another filesystem, a read-only or foreign-owned image root)."""
    linked = copied = symlinked = copied_bytes = 0
    made: set[Path] = set()
    for source, relative in files:
        destination = inside(work, work / relative)
        if destination.parent not in made:
            destination.parent.mkdir(parents=True, exist_ok=True)
            made.add(destination.parent)
        real = Path(source).resolve()
        if mode == "symlink":
            destination.symlink_to(real)
            symlinked += 1
            continue
        if mode == "link":
            try:
                os.link(real, destination)
                linked += 1
                continue
            except OSError:
                pass  # another filesystem (EXDEV), protected hard links (EPERM), too many links: copy instead
        shutil.copyfile(real, destination)
        copied += 1
        copied_bytes += destination.stat().st_size
    return Placed(linked, copied, symlinked, copied_bytes)


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A folder to write the export in; its entries become ``target``'s when the block ends, and on any failure
    ``target`` is left as it was before (absent, or empty)."""
    check_output_dir(target, "DIR")
    created = _first_missing(target)
    work = target / PARTIAL
    try:
        work.mkdir(parents=True)
        yield work
        for entry in sorted(work.iterdir()):
            entry.rename(target / entry.name)
        work.rmdir()
    except BaseException:
        _undo(target, created)
        raise


def _first_missing(target: Path) -> Path | None:
    """The topmost folder of ``target``'s path that does not exist yet (None: ``target`` exists)."""
    missing = None
    for folder in (target.absolute(), *target.absolute().parents):
        if os.path.lexists(folder):
            break
        missing = folder
    return missing


def _undo(target: Path, created: Path | None) -> None:
    """Remove what the export wrote: the folders it created, or everything inside a target that was empty."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    for entry in target.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)

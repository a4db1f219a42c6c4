"""Errors that tell the user exactly which input is wrong.

Every failure caused by user input (a file, a line of a file, a parameter) raises
:class:`InputError`, so the CLI and the Dagster assets can show one clear message and
publish nothing.
"""

from __future__ import annotations

import errno
import reprlib
import shutil
from pathlib import Path
from typing import Any

SHOWN_CHARACTERS = 120  # a value echoed in an error (a line of a file, a setting's value) is cut past this
LINE_CHARACTERS = 1000  # and the whole line the command prints, whatever put it together
_FULL_MESSAGES = ("no space left", "disk is full", "database or disk is full")
_NEARLY_FULL_BYTES = 4 << 20  # SQLite reports a full tmpfs as "disk I/O error": check what is left


class ShiftbenchError(Exception):
    """Base class of the errors shiftbench raises on purpose."""


class InputError(ShiftbenchError):
    """Bad input: names the file (and line) or the parameter at fault."""

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        parameter: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.parameter = parameter
        self.message = message
        where = []
        if self.path is not None:
            where.append(self.path if line is None else f"{self.path}:{line}")
        if parameter is not None:
            where.append(f"parameter {parameter!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its fields (a worker process raises it, the caller re-raises it as it was)."""
        return (_input_error, (self.message, self.path, self.line, self.parameter))


def _input_error(message: str, path: str | None, line: int | None, parameter: str | None) -> InputError:
    return InputError(message, path=path, line=line, parameter=parameter)


class ContractViolation(ShiftbenchError):
    """A staged version breaks its data contract; it is not published."""


class StoreError(ShiftbenchError):
    """The versioned store is in a state it cannot safely change (e.g. a checksum mismatch)."""


class _Bounded(reprlib.Repr):
    """``repr`` that never walks a whole structure: a YAML alias bomb is a few objects referenced billions of
    times, and its full ``repr`` is as long as the bomb."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = self.maxarray = 6
        self.maxdict = 6
        self.maxstring = self.maxother = self.maxlong = SHOWN_CHARACTERS


_BOUNDED = _Bounded()


def shown(value: Any, limit: int = SHOWN_CHARACTERS) -> str:
    """``repr(value)`` for an error line, about ``limit`` characters at most: a longer text is cut, with an ellipsis
    and its length (``'nnnn…' (200,000 characters)``); a structure shows its first items (and how many there are)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{repr(value[:limit])[:limit]}… ({len(value):,} characters)"
    text = _BOUNDED.repr(value)
    cut = len(text) > limit
    if cut:
        text = f"{text[:limit]}…"
    if isinstance(value, list | tuple | dict | set | frozenset) and (cut or len(value) > _BOUNDED.maxlist):
        text = f"{text} ({len(value):,} items)"
    return text


def one_line(text: str, limit: int = LINE_CHARACTERS) -> str:
    """A message as the one line a command prints: at most ``limit`` characters (a safety net: the values in it are
    bounded where they are echoed, :func:`shown`), cut with an ellipsis and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters in all)"


def disk_full(exc: BaseException, where: Path | None = None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the disk ran out of space.

    Dagster's SQLite storages and DuckDB wrap the OS error in their own types with only its text,
    so the chain and the messages are searched; an I/O error on a nearly full ``where`` counts too.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(current).lower()
        if any(message in text for message in _FULL_MESSAGES):
            return True
        if "disk i/o error" in text and where is not None and free_bytes(where) < _NEARLY_FULL_BYTES:
            return True
        current = current.__cause__ or current.__context__
    return False


def free_bytes(path: Path) -> int:
    """Free space of the disk holding ``path`` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0

"""Reading a user's text file (a spec, an edit file, a hierarchy file) with one clear error.

A missing file, a directory, a file we may not read or one that is not UTF-8 is an
:class:`InputError` naming the file (and the setting that pointed at it), never an ``OSError``.
"""

from __future__ import annotations

from pathlib import Path

from shiftbench.errors import InputError


def read_text(path: Path, *, what: str = "file", parameter: str | None = None) -> str:
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} not found", path=path, parameter=parameter) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path=path, parameter=parameter) from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (byte {exc.start})", path=path, line=line, parameter=parameter) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what}: {exc.strerror}", path=path, parameter=parameter) from None

"""Where MetaShift's compiled loops are cached: a user's cache folder, never the installed package.

numba caches a ``cache=True`` function in the ``__pycache__`` beside its source whenever that folder can be
written: an install in site-packages gets files written into it, and a read-only install depends on
numba finding another place. Every numba function of shiftbench is decorated by :func:`njit_cached`, which
caches it in ``NUMBA_CACHE_DIR`` when the user set it (numba's own setting), else in
``$XDG_CACHE_HOME/shiftbench/numba`` (default ``~/.cache/shiftbench/numba``). Where neither can be written the
function is compiled in each process and cached nowhere. numba reads its cache folder
(``numba.core.config.CACHE_DIR``) when a function is decorated, so it is set only while shiftbench's functions
are decorated, and anyone else's numba code in the process keeps numba's own behaviour.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, overload

_DECORATING = threading.Lock()
_SETTING = "CACHE_DIR"  # numba.core.config's name for NUMBA_CACHE_DIR (not in numba's type hints)


@cache
def cache_dir() -> Path | None:
    """The folder compiled functions are cached in, created; None when it cannot be written."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        folder = Path(given) if given else base / "shiftbench" / "numba"
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()  # what numba itself tries before it caches there
    except (OSError, RuntimeError):  # RuntimeError: no home directory to be found
        return None
    return folder


@overload
def njit_cached(function: Callable[..., Any], *, inline: bool = False) -> Any: ...


@overload
def njit_cached(function: None = None, *, inline: bool = False) -> Callable[[Callable[..., Any]], Any]: ...


def njit_cached(function: Callable[..., Any] | None = None, *, inline: bool = False) -> Any:
    """``numba.njit(nogil=True)`` cached in :func:`cache_dir` (compiled per process when there is none);
    ``@njit_cached(inline=True)``: a small helper numba inlines into its callers (``inline="always"``), so sharing it
    costs no call per image."""
    if function is None:
        return lambda given: njit_cached(given, inline=inline)
    from numba import njit
    from numba.core import config

    options: dict[str, Any] = {"nogil": True, "inline": "always" if inline else "never"}
    folder = cache_dir()
    if folder is None:
        return njit(**options)(function)
    with _DECORATING:
        before = getattr(config, _SETTING)
        setattr(config, _SETTING, str(folder))
        try:
            return njit(cache=True, **options)(function)
        finally:
            setattr(config, _SETTING, before)

"""Where a command writes, checked before anything is written: one line naming the path, never a traceback.

Every command that writes outside the store (``export`` a folder, ``generate --out`` a file, ``train``'s
stand-in images) asks here first: the target is a directory (or a file) or can be created, is writable,
and does not lie under a file. Values that become path components (an environment or class name of an
export) go through :func:`path_component`, so that no output lands outside its target.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
import uuid
from pathlib import Path

from shiftbench.errors import InputError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_COMPONENT = 80


def _existing_ancestor(path: Path) -> Path:
    """The nearest ancestor of ``path`` (itself included) that exists."""
    current = path.absolute()
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def _creatable(path: Path, parameter: str) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    ancestor = _existing_ancestor(path.parent)
    if not ancestor.is_dir():
        raise InputError(f"cannot be created: {ancestor} is not a directory", path=path, parameter=parameter)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"cannot be created: {ancestor} is not writable", path=path, parameter=parameter)


def check_output_dir(path: Path, parameter: str) -> Path:
    """``path`` is an empty writable directory, or can be created as one (nothing is created here)."""
    if os.path.lexists(path):
        if not path.is_dir():
            raise InputError("exists and is not a directory", path=path, parameter=parameter)
        if any(path.iterdir()):
            raise InputError("target directory is not empty", path=path, parameter=parameter)
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError("directory is not writable", path=path, parameter=parameter)
    else:
        _creatable(path, parameter)
    return path


def empty_output_dir(path: Path, parameter: str) -> Path:
    """An empty, writable directory at ``path``, created if missing (an export never mixes two splits)."""
    check_output_dir(path, parameter)
    if path.is_dir():
        return path
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"cannot be created ({exc.strerror})", path=path, parameter=parameter) from None
    return path


def output_file(path: Path, parameter: str) -> Path:
    """A file that can be written at ``path`` (replaced if it exists); its folder must exist already."""
    if path.is_dir():
        raise InputError("is a directory, expected a file", path=path, parameter=parameter)
    if os.path.lexists(path):
        if not os.access(path, os.W_OK):
            raise InputError("file is not writable", path=path, parameter=parameter)
        return path
    parent = path.absolute().parent
    if not parent.is_dir():
        what = "does not exist" if not os.path.lexists(parent) else "is not a directory"
        raise InputError(f"its folder {parent} {what}", path=path, parameter=parameter)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"its folder {parent} is not writable", path=path, parameter=parameter)
    return path


def write_output_file(path: Path, text: str, parameter: str) -> None:
    """Write ``text`` whole or not at all (through a temporary sibling), after :func:`output_file`."""
    output_file(path, parameter)
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise InputError(f"cannot be written ({exc.strerror})", path=path, parameter=parameter) from None


def path_component(value: str) -> str:
    """``value`` as one safe path component: letters, digits, ``.``, ``_`` and ``-``, never ``.``/``..`` or hidden.

    Values that are already safe are kept as they are; any other value is sanitised and given a short hash of
    the original, so two different values never share a folder (``a b`` and ``a_b`` stay apart).
    """
    cleaned = _UNSAFE.sub("_", value).strip("_")[:MAX_COMPONENT]
    if cleaned == value and value and not value.startswith("."):
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned.lstrip('.') or 'value'}-{digest}"


def inside(root: Path, path: Path) -> Path:
    """``path``, refused unless it lies under ``root`` (the last guard before writing)."""
    if not path.absolute().is_relative_to(root.absolute()) or ".." in path.relative_to(root).parts:
        raise InputError(f"would be written outside {root}", path=path)
    return path


def check_path_template(template: str, parameter: str) -> str:
    """A template with exactly one ``{}`` (the example id) and no other field or format spec."""
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)]
    except ValueError as exc:
        raise InputError(
            f"invalid template {template!r} ({exc}); use one {{}} for the example id", parameter=parameter
        ) from None
    fields = [f for f in fields if f[0] is not None]
    if len(fields) != 1 or fields[0] != ("", "", None):
        raise InputError(
            f"the template {template!r} must hold exactly one {{}} (the example id) and no other field",
            parameter=parameter,
        )
    return template


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a uniquely named temporary sibling, then rename: readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)

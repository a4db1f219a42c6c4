"""Errors that tell the user exactly which input is wrong.

Every failure caused by user input (a file, a line of a file, a parameter) raises
:class:`InputError`, so the CLI and the Dagster assets can show one clear message and
publish nothing.
"""

from __future__ import annotations

from pathlib import Path


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
        where = []
        if self.path is not None:
            where.append(self.path if line is None else f"{self.path}:{line}")
        if parameter is not None:
            where.append(f"parameter {parameter!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ContractViolation(ShiftbenchError):
    """A staged version breaks its data contract; it is not published."""


class StoreError(ShiftbenchError):
    """The versioned store is in a state it cannot safely change (e.g. a checksum mismatch)."""

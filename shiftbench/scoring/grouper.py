"""One definition of a group, as WILDS' CombinatorialGrouper: the value combinations of metadata fields.

Training (the groups a method weighs and the groups a run reports), ``shiftbench eval --group-by`` and
``shiftbench.load_split(...).evaluate`` name groups here, so results of one grouping join row by row.
The split's own groups (the field ``group``) keep the names a family gave them at build time, made here
too (:func:`cell_name`: ``shape=ellipse|object_color=blue|...``);
any other fields give ``field=value`` joined by ``,`` in the order given (``y=0,object_color=blue``),
values as the split stores them (labels as integers, attributes as text, a missing value ``NULL``).
numpy only: the training job imports it where polars is absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shiftbench.errors import InputError

OWN = "group"
_CELL = "|"  # between the fields of a split's own group (a ConDS cell), "," between those of a grouping


@dataclass(frozen=True)
class Grouper:
    fields: tuple[str, ...] = (OWN,)

    @classmethod
    def parse(cls, spec: str | Sequence[str] | None) -> Grouper:
        """``"y,object_color"``, a list of fields, or nothing (the split's own groups)."""
        names = [f.strip() for f in spec.split(",")] if isinstance(spec, str) else list(spec or ())
        names = [f for f in names if f]
        return cls(tuple(names) if names else (OWN,))

    @property
    def own(self) -> bool:
        return self.fields == (OWN,)

    def unknown(self, available: Sequence[str]) -> str | None:
        """The first field the split does not have, if any."""
        return next((f for f in self.fields if f not in available), None)

    def names(self, columns: Sequence[Sequence[object]]) -> list[str]:
        """Each example's group name; ``columns[j]`` holds field j's value for every example."""
        if self.own:
            return [str(v) for v in columns[0]]
        return [
            ",".join(f"{field}={'NULL' if v is None else v}" for field, v in zip(self.fields, row, strict=True))
            for row in zip(*columns, strict=True)
        ]

    def labels(self, columns: Sequence[Sequence[object]]) -> list[str]:
        """Each example's group as its values only (``0_blue``; one field: ``blue``): short folder names
        for layouts that name groups by folders (DomainBed's environments); :meth:`names` maps them back."""
        if self.own:
            return [str(v) for v in columns[0]]
        return ["_".join("NULL" if v is None else str(v) for v in row) for row in zip(*columns, strict=True)]

    def assign(self, columns: Sequence[Sequence[object]]) -> tuple[np.ndarray, list[str]]:
        """``(codes, names)``: every example's index into the sorted names of the groups present."""
        per_example = self.names(columns)
        names = sorted(set(per_example))
        position = {name: i for i, name in enumerate(names)}
        return np.asarray([position[n] for n in per_example], dtype=np.int64), names


def metadata_table(family: str) -> str:
    """The table of a version holding its examples' metadata fields beyond ``examples`` (one column per field,
    keyed by ``example_id``), by a family's convention: ``<family>_examples`` (ConDS' ``conds_examples``)."""
    return f"{family}_examples"


def require_fields(grouper: Grouper, available: Sequence[str], *, parameter: str, what: str) -> None:
    """One line naming the unknown field and the fields ``what`` has."""
    missing = grouper.unknown(available)
    if missing is not None:
        raise InputError(f"unknown metadata field {missing!r}; {what} has: {', '.join(available)}", parameter=parameter)


def cell_name(fields: Sequence[str], values: Sequence[object]) -> str:
    """A split's own group from its defining fields (a ConDS cell): ``shape=ellipse|object_color=blue``."""
    return _CELL.join(f"{field}={value}" for field, value in zip(fields, values, strict=True))


def cell_expression(fields: Sequence[str]) -> Any:
    """:func:`cell_name` as a polars expression over the columns ``fields`` (imported here: the training
    job has no polars)."""
    import polars as pl

    return pl.concat_str([pl.lit(f"{field}=") + pl.col(field) for field in fields], separator=_CELL)

"""One shift-magnitude vocabulary across families: the ``shift_magnitudes`` table of every version.

Every published version says how large its shift is, in rows ``(family, measure, scope, value)``
(``scope`` is ``all`` for the whole benchmark, else the superclass, class, community or attribute
a value is about). The catalog view ``shift_magnitudes`` puts all families side by side, so that,
e.g., BREEDS' ``good`` and ``bad`` splits are comparable numbers. Each family declares its
measures (:attr:`shiftbench.families.family.Family.measures`); :func:`vocabulary` is their union, a name meaning one thing
across families, and a version's rows use only its family's measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from shiftbench.config.family_registry import REGISTRY

SCOPE_ALL = "all"


def measures(family: str) -> Mapping[str, str]:
    """``family``'s measures (name -> what it means), as its declaration gives them (:attr:`Family.measures`): asked
    of the registry, so the answer never depends on what was imported before."""
    found = REGISTRY.get(family)
    if found is None:
        raise ValueError(f"no family {family!r} is registered to define shift measures")
    return found.measures


def vocabulary() -> dict[str, str]:
    """Every registered family's measures: one vocabulary, in which a name another family defines otherwise is
    refused (the catalog's ``shift_magnitudes`` view puts the families side by side)."""
    words: dict[str, str] = {}
    for family in REGISTRY.families():
        for name, meaning_ in family.measures.items():
            if words.setdefault(name, meaning_) != meaning_:
                raise ValueError(f"shift measure {name!r} of {family.name} is already defined otherwise: {words[name]}")
    return words


def meaning(family: str, measure: str) -> str:
    """What ``measure`` of ``family`` means (the cards describe a version's measures with it)."""
    return measures(family)[measure]


SCHEMA = {"family": pl.String, "measure": pl.String, "scope": pl.String, "value": pl.Float64}


def magnitudes_table(family: str, rows: Iterable[tuple[str, str, float | None]]) -> pl.DataFrame:
    """``(measure, scope, value)`` rows as the ``shift_magnitudes`` table of a version."""
    listed = [(family, measure, scope, None if value is None else float(value)) for measure, scope, value in rows]
    unknown = sorted({row[1] for row in listed} - set(measures(family)))
    if unknown:  # a family using a measure the vocabulary does not define is shiftbench's bug
        raise ValueError(f"measures not in the shift-magnitude vocabulary: {', '.join(unknown)}")
    return pl.DataFrame(listed, schema=SCHEMA, orient="row")


_HALF = 2.0**26  # a 53-bit significand as two halves of at most 27 and 26 bits
_CHUNK = 1 << 20  # values per pass (small arrays stay in the allocator's cache; 2^20 halves sum exactly)
_SCALE = 1126  # frexp(x) = (m, e) with x = (m * 2^53) * 2^(e - 53) and e - 53 >= -1126 for every finite float64


def _exact_total(array: np.ndarray) -> int:
    """The exact sum of finite float64 values as an integer multiple of 2^-_SCALE (see :func:`exact_sum`)."""
    total = 0
    for start in range(0, len(array), _CHUNK):
        fraction, exponent = np.frexp(array[start : start + _CHUNK])
        significand = np.ldexp(fraction, 53)  # an integer-valued float, |significand| < 2^53
        high = np.trunc(significand / _HALF)
        power = exponent + (_SCALE - 53)
        high_sums = np.bincount(power, weights=high)
        low_sums = np.bincount(power, weights=significand - high * _HALF)
        for k in np.flatnonzero((high_sums != 0) | (low_sums != 0)).tolist():
            total += ((int(high_sums[k]) << 26) + int(low_sums[k])) << k
    return total


def exact_sum(values: pl.Series | np.ndarray) -> float:
    """The exactly rounded sum of float values (``math.fsum``'s value), whatever their order.

    Vectorised, because ``math.fsum`` needs a Python float per value (a second for the 27 M distances of a
    GQA-scale collection): ``numpy.frexp`` writes each value as an integer significand below 2^53 times a power
    of two; the significands' two halves are summed per power with ``numpy.bincount`` (exactly: every partial
    sum is an integer below 2^53), the per-power sums are added as Python integers, and the exact total is
    rounded once by Python's correctly rounded integer division. Infinities and NaNs take ``math.fsum``'s rules.
    """
    array = np.ascontiguousarray(values.to_numpy() if isinstance(values, pl.Series) else values, dtype=np.float64)
    if not np.isfinite(array).all():
        return math.fsum(array.tolist())
    return _exact_total(array) / (1 << _SCALE)  # a zero sum is +0.0, as fsum gives it


_BIN_SHIFT = 44  # a value's bin: the top 20 bits of its order-preserving 64-bit key (256 bins per power of two)


def _order_keys(values: np.ndarray) -> np.ndarray:
    """64-bit unsigned keys that sort as the float64 values do (negative values with their bits flipped)."""
    bits = values.view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))


@dataclass(frozen=True)
class ValuesPart:
    """What the first pass keeps of one part of the values: made anywhere (a worker thread), merged in order."""

    count: int
    total: int  # exact, in units of 2^-_SCALE
    largest: float
    lowest_bin: int
    bin_counts: np.ndarray  # the histogram from ``lowest_bin`` on (a part's values span a few magnitudes)

    @property
    def mean(self) -> float:
        return (self.total / (1 << _SCALE)) / self.count

    @staticmethod
    def of(values: np.ndarray) -> ValuesPart | None:
        values = np.ascontiguousarray(values, dtype=np.float64)
        if not len(values):
            return None
        bins = _bins(values)
        lowest = int(bins.min())
        return ValuesPart(len(values), _exact_total(values), float(values.max()), lowest, np.bincount(bins - lowest))


def _bins(values: np.ndarray) -> np.ndarray:
    return (_order_keys(values) >> np.uint64(_BIN_SHIFT)).astype(np.int64)


def in_bins(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The values that fall in the histogram bins ``wanted`` (what the second pass keeps of a part)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    kept: np.ndarray = values[np.isin(_bins(values), wanted)]
    return kept


class OrderStatistics:
    """Mean, median, 90th percentile and max of finite values given in parts, exactly, without holding them.

    Pass one (:meth:`add`, or :meth:`merge` of :meth:`ValuesPart.of` made elsewhere) counts the values, sums them
    exactly and builds a histogram of their order-preserving bit patterns; :meth:`summary` then finds the bins that
    hold the ranks it needs and reads the values again (``again(wanted)``: each part's :func:`in_bins`), keeping
    only those bins' values, to pick the exact order statistics. The quantiles are the linear interpolation between
    the two nearest ranks (polars' ``quantile(q, "linear")`` and ``median``: the same floats).
    """

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.largest = -math.inf
        self.histogram = np.zeros(1 << (64 - _BIN_SHIFT), dtype=np.int64)

    def merge(self, part: ValuesPart | None) -> float | None:
        """Count a part in; returns its own exactly rounded mean (None when it has no values)."""
        if part is None:
            return None
        self.count += part.count
        self.total += part.total
        self.largest = max(self.largest, part.largest)
        self.histogram[part.lowest_bin : part.lowest_bin + len(part.bin_counts)] += part.bin_counts
        return part.mean

    def add(self, values: np.ndarray) -> float | None:
        """Count ``values`` in; returns their own exactly rounded mean (None when there are none)."""
        return self.merge(ValuesPart.of(values))

    def _ranked(self, ranks: list[int], again: Callable[[np.ndarray], Iterable[np.ndarray]]) -> dict[int, float]:
        """The values at ``ranks`` (0-based, in sorted order): the second pass."""
        cumulative = np.cumsum(self.histogram)
        bins = {rank: int(np.searchsorted(cumulative, rank, side="right")) for rank in ranks}
        wanted = np.array(sorted(set(bins.values())), dtype=np.int64)
        kept = list(again(wanted))
        pool = np.sort(np.concatenate(kept)) if kept else np.zeros(0)
        pool_keys = _bins(pool)
        result = {}
        for rank, b in bins.items():
            before = int(cumulative[b - 1]) if b > 0 else 0
            first = int(np.searchsorted(pool_keys, b, side="left"))
            result[rank] = float(pool[first + rank - before])
        return result

    def summary(
        self, prefix: str, scope: str, again: Callable[[np.ndarray], Iterable[np.ndarray]]
    ) -> list[tuple[str, str, float | None]]:
        """``(measure, scope, value)`` rows as :func:`summary` gives for the same values; ``again(wanted)`` yields
        :func:`in_bins` ``(part, wanted)`` of every part."""
        if self.count == 0:
            return [(f"{prefix}_{stat}", scope, None) for stat in ("mean", "median", "p90", "max")]
        positions = {q: (self.count - 1) * q for q in (0.5, 0.9)}
        ranks = sorted({r for h in positions.values() for r in (math.floor(h), math.ceil(h))})
        at = self._ranked(ranks, again)

        def quantile(q: float) -> float:
            h = positions[q]
            low, high = at[math.floor(h)], at[math.ceil(h)]
            return low + (h - math.floor(h)) * (high - low)

        return [
            (f"{prefix}_mean", scope, (self.total / (1 << _SCALE)) / self.count),
            (f"{prefix}_median", scope, quantile(0.5)),
            (f"{prefix}_p90", scope, quantile(0.9)),
            (f"{prefix}_max", scope, self.largest),
        ]


def summary(values: pl.Series, prefix: str, scope: str) -> list[tuple[str, str, float | None]]:
    """Mean, median, p90 and max of a distance column as ``(measure, scope, value)`` rows."""
    clean = values.drop_nulls().drop_nans() if values.dtype.is_float() else values.drop_nulls()
    if clean.is_empty():
        return [(f"{prefix}_{stat}", scope, None) for stat in ("mean", "median", "p90", "max")]
    return [
        # fsum is exactly rounded whatever the order: the rows of a class arrive in an order parallel
        # joins choose, and a plain sum would differ in the last bits (and so the version id).
        (f"{prefix}_mean", scope, exact_sum(clean) / clean.len()),
        (f"{prefix}_median", scope, float(clean.median())),  # type: ignore[arg-type]
        (f"{prefix}_p90", scope, float(clean.quantile(0.9, interpolation="linear"))),  # type: ignore[arg-type]
        (f"{prefix}_max", scope, float(clean.max())),  # type: ignore[arg-type]
    ]

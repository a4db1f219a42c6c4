"""The ConDS shift engine: from an attribute table and a case to train / id_val / test splits.

How a case is realised (ConDS Section 3 and Appendix A.1-A.2; Wiles et al. 2022):

- A *cell* is one combination of label value and attribute values. Every cell is first split
  into a test pool of exactly ``test_per_cell`` examples and a train pool (the rest), by one
  seeded permutation per cell that depends on the dataset and the cell only: every case of a
  dataset has the same uniform test split, and a smaller training set is a prefix of a larger.
- The training distribution is a product of one factor per attribute, so attributes stay
  independent of each other and the label stays uniform:

  - no shift: uniform over the attribute's values;
  - SC (spurious correlation): label value i is *aligned* with attribute value i (modulo the
    number of values) unless the spec says otherwise; a fraction ``sc_counterexample_fraction``
    of the training set is counterexamples, spread uniformly over the misaligned pairs;
  - LDD (low data drift): ``ldd_rare_values`` each get ``ldd_rare_frequency`` times the share
    of a common value, label uniform within every value;
  - UDS (unseen data shift): ``uds_unseen_values`` get no training example at all.

- Counts per cell are apportioned by largest remainders (ties broken in a seeded random order,
  so no value is favoured). Under SC the number of counterexamples
  is apportioned first (``round(N * f)``), so the drawn training set has exactly the asked
  fraction up to rounding; ``id_val`` is held out of every cell in proportion (same
  distribution as ``train``), again with counterexamples apportioned separately.
- ``train_size`` is the size of the drawn training distribution (``train`` + ``id_val``);
  ``None`` asks for the largest size every train pool can supply (the paper: "variations in
  dataset sizes across the DSs result from the limited availability of certain attribute
  combinations"). A fixed size the pools cannot supply is an error naming the cell, unless
  ``allow_scale_down`` is set; the test count per cell is never scaled.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from shiftbench.conds.specs import CaseSpec
from shiftbench.errors import InputError
from shiftbench.runtime.seeding import rng_for
from shiftbench.scoring.grouper import cell_expression, cell_name

ALIGNED, COUNTEREXAMPLE, ALL = "aligned", "counterexample", "all"


def cell_weights(case: CaseSpec) -> pl.DataFrame:
    """Every cell of the case with its share of the training distribution and its SC stratum."""
    columns = [case.label, *case.attributes]
    names = [a.name for a in columns]
    sc = case.attribute_with("sc")
    rows = []
    for values in itertools.product(*[a.values for a in columns]):
        weight = 1.0 / len(case.label.values)
        stratum = ALL
        y = case.label.values.index(values[0])
        for attribute, value in zip(case.attributes, values[1:], strict=True):
            shift = case.shift_of(attribute.name)
            k = len(attribute.values)
            if shift == "sc":
                aligned = case.aligned_value(attribute.name, values[0])
                stratum = ALIGNED if value == aligned else COUNTEREXAMPLE
                f = case.sc_counterexample_fraction
                weight *= (1 - f) if stratum == ALIGNED else f / (k - 1)
            elif shift == "ldd":
                rare = case.ldd_rare_values[attribute.name]
                r = case.ldd_rare_frequency
                weight *= (r if value in rare else 1.0) / (r * len(rare) + (k - len(rare)))
            elif shift == "uds":
                unseen = case.uds_unseen_values[attribute.name]
                weight *= 0.0 if value in unseen else 1.0 / (k - len(unseen))
            else:
                weight *= 1.0 / k
        rows.append((cell_name(names, values), y, *values, weight, stratum if sc is not None else ALL))
    schema = {"cell": pl.String(), "y": pl.Int64(), **{n: pl.String() for n in names}}
    schema.update(weight=pl.Float64(), stratum=pl.String())
    return pl.DataFrame(rows, schema=schema, orient="row")


def apportion(total: int, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Largest-remainder apportionment: every count is the floor or ceiling of its quota.

    Equal remainders (every cell of a uniform case has one) are broken by a seeded random order,
    not by cell order, which would always favour the first values. (Hamilton's method; written
    here because it is a few lines and no well-kept library exposes it for arrays.)
    """
    counts = np.zeros(len(weights), dtype=np.int64)
    mass = float(weights.sum())
    if total <= 0 or mass <= 0:
        return counts
    quotas = total * weights / mass
    counts = np.floor(quotas).astype(np.int64)
    left = total - int(counts.sum())
    remainders = np.round(quotas - counts, 9)  # float noise must not decide a tie
    order = np.lexsort((rng.permutation(len(weights)), -remainders))
    counts[order[:left]] += 1
    return counts


def _round(x: float) -> int:
    return math.floor(x + 0.5)


def _by_stratum(
    total: int, share_of_counterexamples: float, weights: np.ndarray, strata: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Apportion ``total`` over cells, counterexamples (if any stratum says so) first and exactly."""
    if not (strata == COUNTEREXAMPLE).any():
        return apportion(total, weights, rng)
    counter = _round(total * share_of_counterexamples)
    counts = np.zeros(len(weights), dtype=np.int64)
    for stratum, amount in ((ALIGNED, total - counter), (COUNTEREXAMPLE, counter)):
        mask = strata == stratum
        counts[mask] = apportion(amount, weights[mask], rng)
    return counts


def _tie_breaker(case: CaseSpec, purpose: str) -> np.random.Generator:
    return rng_for(case.seed, case.dataset, case.name, purpose)


def train_counts(cells: pl.DataFrame, case: CaseSpec, size: int) -> np.ndarray:
    """Examples per cell in the drawn training distribution (``train`` + ``id_val``) of ``size``."""
    weights, strata = cells["weight"].to_numpy(), cells["stratum"].to_numpy()
    return _by_stratum(size, case.sc_counterexample_fraction, weights, strata, _tie_breaker(case, "train"))


def id_val_counts(cells: pl.DataFrame, drawn: np.ndarray, case: CaseSpec) -> np.ndarray:
    """``id_val`` examples per cell: ``id_val_fraction`` of the drawn set, same distribution."""
    total = _round(int(drawn.sum()) * case.id_val_fraction)
    strata = cells["stratum"].to_numpy()
    counter_share = float(drawn[strata == COUNTEREXAMPLE].sum()) / max(int(drawn.sum()), 1)
    return _by_stratum(total, counter_share, drawn.astype(np.float64), strata, _tie_breaker(case, "id_val"))


def largest_train_size(cells: pl.DataFrame, case: CaseSpec, pools: np.ndarray) -> int:
    """The largest drawn training size whose per-cell counts fit in the train pools."""
    weights = cells["weight"].to_numpy()
    strata = cells["stratum"].to_numpy()
    shares = weights / weights.sum()
    if (strata == COUNTEREXAMPLE).any():
        f = case.sc_counterexample_fraction
        for stratum, mass in ((ALIGNED, 1 - f), (COUNTEREXAMPLE, f)):
            mask = strata == stratum
            shares[mask] = mass * weights[mask] / weights[mask].sum() if weights[mask].sum() else 0.0
    needed = shares > 0
    size = int(np.floor(np.min(pools[needed] / shares[needed]))) + 1 if needed.any() else 0
    while size > 0 and (train_counts(cells, case, size) > pools).any():
        size -= 1
    return size


@dataclass(frozen=True)
class Draw:
    """A realised case: which example goes to which split, and the per-cell accounting."""

    assignments: pl.DataFrame  # example_id, cell, split
    cells: pl.DataFrame  # cell, y, values..., weight, stratum, n_available, train_pool, n_train, n_id_val, n_test
    requested_train_size: int | None
    largest_train_size: int
    scaled_down: bool


def _ranked(table: pl.DataFrame, case: CaseSpec, names: list[str]) -> pl.DataFrame:
    """Each example's rank in its cell's seeded permutation (the dataset, seed and cell fix it)."""
    keyed = table.select("example_id", cell_expression(names).alias("cell"))
    parts = []
    for (cell,), part in keyed.sort("example_id").group_by("cell", maintain_order=True):
        order = rng_for(case.seed, case.dataset, str(cell)).permutation(part.height)
        rank = np.empty(part.height, dtype=np.int64)
        rank[order] = np.arange(part.height)
        parts.append(part.with_columns(pl.Series("rank", rank)))
    if not parts:
        return keyed.with_columns(pl.lit(0, dtype=pl.Int64).alias("rank"))
    return pl.concat(parts)


def _describe(cell: str) -> str:
    return "(" + ", ".join(cell.split("|")) + ")"


def _check_table(table: pl.DataFrame, case: CaseSpec, names: list[str]) -> None:
    """The attribute table has the case's columns, unique example ids and only the values the case declares."""
    missing = [n for n in ["example_id", *names] if n not in table.columns]
    if missing:
        raise InputError(f"case {case.name}: the attribute table has no column {missing[0]!r}", parameter="attributes")
    if table["example_id"].is_duplicated().any():
        duplicate = table.filter(pl.col("example_id").is_duplicated())["example_id"][0]
        raise InputError(f"case {case.name}: example id {duplicate!r} appears twice in the attribute table")
    for attribute in [case.label, *case.attributes]:
        unknown = table.filter(~pl.col(attribute.name).is_in(attribute.values) | pl.col(attribute.name).is_null())
        if unknown.height:
            raise InputError(
                f"case {case.name}: value {unknown[attribute.name][0]!r} of {attribute.name} (example "
                f"{unknown['example_id'][0]!r}) is not one of {', '.join(attribute.values)}",
                parameter=attribute.name,
            )


def _available(cells: pl.DataFrame, ranked: pl.DataFrame, case: CaseSpec) -> pl.DataFrame:
    """The cells with their example counts (``n_available``); every cell must fill its uniform test share."""
    available = ranked.group_by("cell").len("n_available")
    cells = cells.join(available, on="cell", how="left").with_columns(pl.col("n_available").fill_null(0).cast(pl.Int64))
    short = cells.filter(pl.col("n_available") < case.test_per_cell)
    if short.height:
        row = short.row(0, named=True)
        raise InputError(
            f"case {case.name}: cell {_describe(row['cell'])} has {row['n_available']} examples, but the uniform "
            f"test split needs test_per_cell={case.test_per_cell} in every cell ({short.height} such cells)",
            parameter="test_per_cell",
        )
    return cells


def _train_size(cells: pl.DataFrame, case: CaseSpec, pools: np.ndarray, largest: int) -> tuple[int, bool]:
    """The drawn training size (asked for, or the largest) and whether it was scaled down to fit the pools."""
    size = case.train_size if case.train_size is not None else largest
    scaled_down = False
    if size > largest:
        if not case.allow_scale_down:
            counts = train_counts(cells, case, size)
            worst = int(np.argmax(counts - pools))
            raise InputError(
                f"case {case.name}: train_size={size} needs {counts[worst]} training examples in cell "
                f"{_describe(cells['cell'][worst])}, whose train pool has {pools[worst]} "
                f"({cells['n_available'][worst]} examples, {case.test_per_cell} kept for test); the largest size "
                f"this case supports is {largest}: lower train_size or set allow_scale_down=true",
                parameter="train_size",
            )
        size, scaled_down = largest, True
    if size <= 0:
        empty = cells.filter((pl.col("weight") > 0) & (pl.col("n_available") <= case.test_per_cell))
        where = _describe(empty["cell"][0]) if empty.height else "(none)"
        raise InputError(
            f"case {case.name}: no training set is possible: cell {where} has no example left after the test split",
            parameter="train_size",
        )
    return size, scaled_down


def _drawn(cells: pl.DataFrame, case: CaseSpec, size: int, pools: np.ndarray, largest: int) -> np.ndarray:
    """Training examples per cell at ``size``, checked against the pools."""
    drawn = train_counts(cells, case, size)
    over = drawn > pools
    if over.any():  # rounding is not monotone in the size: a smaller size can still miss by one
        worst = int(np.argmax(drawn - pools))
        raise InputError(
            f"case {case.name}: train_size={size} needs {drawn[worst]} training examples in cell "
            f"{_describe(cells['cell'][worst])}, whose train pool has {pools[worst]}; try train_size={largest}",
            parameter="train_size",
        )
    return drawn


def _assignments(ranked: pl.DataFrame, cells: pl.DataFrame, t: int) -> pl.DataFrame:
    """Each example's split by its rank in its cell: the first ``t`` test, then train, then id_val, the rest none."""
    limits = cells.select("cell", "n_train", "n_id_val")
    return (
        ranked.join(limits, on="cell")
        .with_columns(
            pl.when(pl.col("rank") < t)
            .then(pl.lit("test"))
            .when(pl.col("rank") - t < pl.col("n_train"))
            .then(pl.lit("train"))
            .when(pl.col("rank") - t < pl.col("n_train") + pl.col("n_id_val"))
            .then(pl.lit("id_val"))
            .otherwise(None)
            .alias("split")
        )
        .filter(pl.col("split").is_not_null())
        .select("example_id", "cell", "split")
        .sort("example_id")
    )


def draw_case(table: pl.DataFrame, case: CaseSpec) -> Draw:
    """Split ``table`` (``example_id`` plus one string column per label/attribute) for ``case``."""
    names = [case.label.name, *[a.name for a in case.attributes]]
    _check_table(table, case, names)
    cells = cell_weights(case)
    ranked = _ranked(table, case, names)
    cells = _available(cells, ranked, case)
    pools = (cells["n_available"] - case.test_per_cell).to_numpy()
    largest = largest_train_size(cells, case, pools)
    size, scaled_down = _train_size(cells, case, pools, largest)
    drawn = _drawn(cells, case, size, pools, largest)
    held = id_val_counts(cells, drawn, case)
    cells = cells.with_columns(
        pl.Series("train_pool", pools, dtype=pl.Int64),
        pl.Series("n_train", drawn - held),
        pl.Series("n_id_val", held),
        pl.lit(case.test_per_cell, dtype=pl.Int64).alias("n_test"),
    )
    return Draw(_assignments(ranked, cells, case.test_per_cell), cells, case.train_size, largest, scaled_down)

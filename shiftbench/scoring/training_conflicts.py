"""Training conflicts between subsets (MetaShift §4.3, Appendix B.3): which training subsets help or hurt which
evaluation subsets, read from the loss changes of every gradient step.

A tracked run records, after every step ``t``, each evaluation subset's mean loss ``L_e(t)`` and how many images of
each training subset the step's batch held, ``n_s(t)``. Per evaluation subset the loss change
``L_e(t) - L_e(t-1)`` is regressed on the batch composition (least squares, no intercept: every batch has the same
size, so an intercept would be a combination of the counts). The published ``coefficient`` is the regression
slope with its sign turned, ``-beta``: the loss reduction on the evaluation subset per image of the training
subset in a step, positive where training on the row subset helps the column subset (the paper's green).
``normalized_coefficient`` divides each evaluation subset's coefficients by their largest absolute value (the
paper's [-1, 1]; per column, so an evaluation subset whose loss moves little is read on the same scale as one whose
loss moves a lot).

Pure numpy: the training job (torch, numpy, pyarrow only) calls :func:`fit_conflicts` at the end of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shiftbench.errors import InputError

# A manifest key a split carries when its examples are subsets (the descriptor's parts are checked by
# :func:`subset_descriptor`): MetaShift's conflicts task writes it.
DESCRIPTOR_KEY = "subsets"
DOMAINS = ("in_domain", "out_of_domain")


@dataclass(frozen=True)
class Subset:
    name: str
    class_name: str
    role: str  # train (trained on, evaluated in-domain) | ood (evaluated out-of-domain only)
    community: int


@dataclass(frozen=True)
class SubsetDescriptor:
    """What a split says about its subsets: the column holding them, the training split, each evaluation split's
    domain, and every subset in the heatmap's order (class, role, meta-graph community, name)."""

    column: str
    train_split: str
    evaluation_splits: dict[str, str]  # split -> in_domain | out_of_domain
    order: tuple[Subset, ...]

    @property
    def training(self) -> list[str]:
        return [s.name for s in self.order if s.role == "train"]


def subset_descriptor(manifest: dict[str, Any], benchmark: str) -> SubsetDescriptor:
    """The split's subset descriptor, or the one line that says the split carries no subsets."""
    raw = manifest.get(DESCRIPTOR_KEY)
    if not isinstance(raw, dict):
        raise InputError(
            f"{benchmark} carries no subsets to track: its manifest has no 'subsets' descriptor (a task that records "
            "each example's subset writes one, such as a conflicts task; docs/erm.md#training-conflicts)",
            parameter="track_conflicts",
        )
    try:
        order = tuple(
            Subset(str(e["subset"]), str(e["class"]), str(e["role"]), int(e["community"])) for e in raw["order"]
        )
        descriptor = SubsetDescriptor(
            str(raw["column"]), str(raw["train_split"]), {str(k): str(v) for k, v in raw["evaluation_splits"].items()},
            order,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{benchmark}: the manifest's subset descriptor is malformed ({exc})", parameter="track_conflicts"
        ) from None
    if not descriptor.training or set(descriptor.evaluation_splits.values()) - set(DOMAINS):
        raise InputError(
            f"{benchmark}: the manifest's subset descriptor names no training subset or an unknown domain",
            parameter="track_conflicts",
        )
    return descriptor


@dataclass(frozen=True)
class ConflictFit:
    """Per (training subset, evaluation subset): the coefficient (loss reduction per image in a step), its
    per-column normalisation, its standard error, and the column's R² (uncentred: the fit has no intercept)."""

    coefficient: np.ndarray  # [S, E]
    normalized: np.ndarray  # [S, E]
    std_error: np.ndarray  # [S, E]
    r2: np.ndarray  # [E]
    intervals: int  # the regression's rows


def tracked_intervals(max_iters: int, every: int) -> int:
    """The regression's rows a run of ``max_iters`` steps gives, tracked every ``every`` steps (a last shorter
    interval is closed at the end: 40 steps at 3 are 14)."""
    return -(-max_iters // every)


def check_intervals(intervals: int, n_subsets: int) -> None:
    """One line when the regression cannot separate the training subsets (it needs more rows than unknowns): known
    from the config before a step is taken (shiftbench.erm.launch.plan_run), and checked again on what was tracked
    (a run stopped early by patience has fewer)."""
    if intervals <= n_subsets:
        raise InputError(
            f"{intervals} tracked intervals cannot separate {n_subsets} training subsets: train more than "
            f"{n_subsets} steps (times track_every)",
            parameter="max_iters",
        )


def fit_conflicts(compositions: np.ndarray, losses: np.ndarray) -> ConflictFit:
    """``compositions`` [T, S]: images of each training subset in interval t's batches (one step each with
    ``track_every: 1``); ``losses`` [T + 1, E]: each evaluation subset's mean loss before the first step and after
    every interval."""
    x = np.asarray(compositions, dtype=np.float64)
    y = np.diff(np.asarray(losses, dtype=np.float64), axis=0)
    steps, n_subsets = x.shape
    if y.shape[0] != steps:
        raise ValueError(f"{steps} batch compositions but {y.shape[0]} loss changes")
    check_intervals(steps, n_subsets)
    beta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ beta
    rss = (residual**2).sum(axis=0)
    sigma2 = rss / max(steps - rank, 1)
    inverse = np.linalg.pinv(x.T @ x)
    std_error = np.sqrt(np.outer(np.clip(np.diag(inverse), 0.0, None), sigma2))
    total = (y**2).sum(axis=0)
    r2 = np.where(total > 0, 1.0 - rss / np.where(total > 0, total, 1.0), 0.0)
    coefficient = -beta
    scale = np.abs(coefficient).max(axis=0)
    normalized = np.divide(coefficient, scale, out=np.zeros_like(coefficient), where=scale > 0)
    return ConflictFit(coefficient, normalized, std_error, r2, steps)


def conflict_rows(
    fit: ConflictFit, training: Sequence[Subset], evaluation: Sequence[tuple[Subset, str]], *, steps: int, every: int
) -> dict[str, list[Any]]:
    """The fit as columns of ``erm_training_conflicts`` (without the run's keys): one row per pair, with each
    subset's position in the heatmap, the gradient steps tracked and the steps between two evaluations."""
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "training_subset", "training_class", "row", "evaluation_subset", "evaluation_class", "evaluation_domain",
            "column", "coefficient", "normalized_coefficient", "std_error", "r2", "steps", "intervals", "track_every",
        )
    }  # fmt: skip
    for i, source in enumerate(training):
        for j, (target, domain) in enumerate(evaluation):
            values = (
                source.name, source.class_name, i, target.name, target.class_name, domain, j,
                float(fit.coefficient[i, j]), float(fit.normalized[i, j]), float(fit.std_error[i, j]),
                float(fit.r2[j]), steps, fit.intervals, every,
            )  # fmt: skip
            for name, value in zip(columns, values, strict=True):
                columns[name].append(value)
    return columns

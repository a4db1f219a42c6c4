"""``track_conflicts``: after every gradient step (every ``track_every`` steps), each evaluation subset's loss, and
the batches' composition by training subset (MetaShift §4.3), recorded without touching the training state.

The evaluation runs on a shadow copy of the model that the live weights are copied into after each step (the live
model is never switched to eval mode, its batch-norm statistics and generators are never used): the tracked run's
weights are the untracked run's, bit for bit on CPU. The shadow is channels-last (the small CNN's forward pass over 624
images of 32x32 took 1.16 training steps' time instead of 2.04 on 2 cores, measured while writing this) and the
evaluation images are normalised once, so an evaluation is one batched forward pass in chunks and one scatter of the
per-example losses into per-subset means: no Python loop per subset. The losses stay on the training device until
the run ends (no host sync per step); :mod:`shiftbench.scoring.training_conflicts` fits the regression.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench.erm.data import Batches, normalize
from shiftbench.erm.photos import PhotoBatches
from shiftbench.erm.step import autocast
from shiftbench.errors import InputError
from shiftbench.scoring.training_conflicts import (
    DOMAINS,
    Subset,
    SubsetDescriptor,
    conflict_rows,
    fit_conflicts,
)
from shiftbench.splits.split_table import SplitTable

EVAL_CHUNK = 64  # images per forward pass of an evaluation (64 ran 7 % faster than 128 on 2 cores, measured once)


@dataclass(frozen=True)
class Layout:
    """Which examples the tracking reads: each training row's subset code, each evaluation row's column."""

    training: list[Subset]
    evaluation: list[tuple[Subset, str]]  # (subset, domain) per heatmap column
    train_code: np.ndarray  # [N] training subset of each example (-1: not a training example)
    eval_rows: np.ndarray  # the evaluated examples
    eval_column: np.ndarray  # [len(eval_rows)] their column


def layout(table: SplitTable, descriptor: SubsetDescriptor, train_split: str) -> Layout:
    """The tracked subsets as the split holds them (refused in one line when the split does not hold them)."""
    names = np.asarray(table.decoded(descriptor.column)) if descriptor.column in table.metadata_fields else None
    if names is None:
        raise InputError(f"the split has no column {descriptor.column!r} of subsets", parameter="track_conflicts")
    training = [s for s in descriptor.order if s.role == "train"]
    code = {s.name: k for k, s in enumerate(training)}
    is_train = table.splits == train_split
    train_code = np.array([code.get(n, -1) if t else -1 for n, t in zip(names.tolist(), is_train, strict=True)])
    if (train_code[is_train] < 0).any():
        raise InputError("training examples outside the split's training subsets", parameter="track_conflicts")
    evaluation: list[tuple[Subset, str]] = []
    rows, columns = [], []
    for domain in DOMAINS:
        splits = [s for s, d in descriptor.evaluation_splits.items() if d == domain]
        in_domain = np.isin(table.splits, splits)
        for subset in descriptor.order:
            found = np.flatnonzero(in_domain & (names == subset.name))
            if found.size:
                rows.append(found)
                columns.append(np.full(found.size, len(evaluation)))
                evaluation.append((subset, domain))
    if not evaluation:
        raise InputError("the split has no evaluation subsets", parameter="track_conflicts")
    return Layout(training, evaluation, train_code, np.concatenate(rows), np.concatenate(columns))


class ConflictTracker:
    """Records the evaluation subsets' mean losses every ``every`` steps (1: after each step, the paper's) and the
    training-subset counts of the batches in between: one regression row per interval."""

    def __init__(
        self, where: Layout, batches: Batches | PhotoBatches, table: SplitTable, max_iters: int, *,
        device: torch.device, precision: str, normalization: str, every: int = 1,
    ) -> None:  # fmt: skip
        self.where, self.device, self.precision, self.every = where, device, precision, every
        rows = torch.from_numpy(where.eval_rows)
        self.inputs = normalize(batches(rows), channels_last=True, kind=normalization)
        self.targets = torch.from_numpy(table.y[where.eval_rows]).to(device)
        self.column = torch.from_numpy(where.eval_column).to(device)
        n_eval = len(where.evaluation)
        self.sizes = torch.bincount(self.column, minlength=n_eval).double()
        self.train_code = torch.from_numpy(where.train_code)
        n_points = max_iters // every + 2  # the initial losses, every interval's, a last partial interval's
        self.losses = torch.zeros((n_points, n_eval), dtype=torch.float64, device=device)
        self.compositions = torch.zeros((n_points, len(where.training)), dtype=torch.int64)
        self.shadow: nn.Module | None = None
        self.started = False  # the initial losses are recorded
        self.intervals = 0  # closed intervals: losses[k] is after interval k, compositions[k] its batches' counts

    def start(self, model: nn.Module) -> None:
        """The losses of the initial weights."""
        self.losses[0] = self._losses(model)
        self.started = True

    def record(self, model: nn.Module, iteration: int, index: torch.Tensor) -> None:
        """Count the step's batch; after every ``every``-th step, the losses close the interval."""
        self.compositions[self.intervals] += torch.bincount(
            self.train_code[index], minlength=self.compositions.shape[1]
        )
        if iteration % self.every == 0:
            self._close(model)

    def finish(self, model: nn.Module) -> None:
        """Close a last interval shorter than ``every`` (the run stopped between two evaluations)."""
        if int(self.compositions[self.intervals].sum()) > 0:
            self._close(model)

    def _close(self, model: nn.Module) -> None:
        self.intervals += 1
        self.losses[self.intervals] = self._losses(model)

    def _shadow(self, model: nn.Module) -> nn.Module:
        if self.shadow is None:
            shadow = copy.deepcopy(model).to(memory_format=torch.channels_last).eval()  # type: ignore[call-overload]
            for module in shadow.modules():  # a method's feature hook (CORAL) must not see the shadow's passes
                module._forward_hooks.clear()
            self.shadow = shadow
        with torch.no_grad():
            for mine, live in zip(self.shadow.state_dict().values(), model.state_dict().values(), strict=True):
                mine.copy_(live)  # keeps the shadow's memory format
        return self.shadow

    def _losses(self, model: nn.Module) -> torch.Tensor:
        shadow = self._shadow(model)
        per_example = []
        with torch.inference_mode(), autocast(self.device, self.precision):
            for start in range(0, self.inputs.shape[0], EVAL_CHUNK):
                logits = shadow(self.inputs[start : start + EVAL_CHUNK]).float()
                per_example.append(
                    nn.functional.cross_entropy(logits, self.targets[start : start + EVAL_CHUNK], reduction="none")
                )
        sums = torch.zeros_like(self.sizes).index_add_(0, self.column, torch.cat(per_example).double())
        return sums / self.sizes

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the records so far, the open interval's counts included."""
        n = self.intervals
        return {"losses": self.losses[: n + 1].cpu(), "compositions": self.compositions[: n + 1].clone()}

    def restore(self, saved: dict[str, Any]) -> None:
        n = saved["losses"].shape[0]
        self.losses[:n] = saved["losses"].to(self.device)
        self.compositions[:n] = saved["compositions"]
        self.intervals, self.started = n - 1, True

    def rows(self, iterations: int) -> dict[str, list[Any]]:
        """The regression over the closed intervals, as ``erm_training_conflicts``' columns."""
        n = self.intervals
        fit = fit_conflicts(self.compositions[:n].numpy(), self.losses[: n + 1].cpu().numpy())
        return conflict_rows(fit, self.where.training, self.where.evaluation, steps=iterations, every=self.every)

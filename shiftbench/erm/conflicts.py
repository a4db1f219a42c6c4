"""``track_conflicts``: after every gradient step, each evaluation subset's loss and the batch's composition by
training subset (MetaShift §4.3), recorded on the training device without touching the training state.

The evaluation runs on a shadow copy of the model that the live weights are copied into after each step (the live
model is never switched to eval mode, its batch-norm statistics and generators are never used): the tracked run's
weights are the untracked run's, bit for bit on CPU. The shadow is channels-last (about 1.8x faster on CPU for
convolutions) and the evaluation images are normalised once, so a step's evaluation is one batched forward pass in
chunks and one scatter of the per-example losses into per-subset means: no Python loop per subset. Losses and
compositions stay on the device until the run ends (no host sync per step); :mod:`shiftbench.training_conflicts`
fits the regression.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench.erm.data import Batches, normalize
from shiftbench.erm.step import autocast
from shiftbench.errors import InputError
from shiftbench.split_table import SplitTable
from shiftbench.training_conflicts import (
    DOMAINS,
    ConflictFit,
    Subset,
    SubsetDescriptor,
    conflict_rows,
    fit_conflicts,
)

EVAL_CHUNK = 64  # images per forward pass of a step's evaluation: the fastest on CPU, measured (BENCHMARKS.md)


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
    """Records, after each step, the evaluation subsets' mean losses and the batch's training-subset counts."""

    def __init__(
        self, where: Layout, batches: Batches, table: SplitTable, max_iters: int, *, device: torch.device,
        precision: str, normalization: str,
    ) -> None:  # fmt: skip
        self.where, self.device, self.precision = where, device, precision
        rows = torch.from_numpy(where.eval_rows)
        self.inputs = normalize(batches(rows), channels_last=True, kind=normalization)
        self.targets = torch.from_numpy(table.y[where.eval_rows]).to(device)
        self.column = torch.from_numpy(where.eval_column).to(device)
        n_eval = len(where.evaluation)
        self.sizes = torch.bincount(self.column, minlength=n_eval).double()
        self.train_code = torch.from_numpy(where.train_code)
        self.losses = torch.zeros((max_iters + 1, n_eval), dtype=torch.float64, device=device)
        self.compositions = torch.zeros((max_iters, len(where.training)), dtype=torch.int64)
        self.shadow: nn.Module | None = None
        self.recorded = -1  # the last iteration whose losses are recorded (0: before the first step)

    def record(self, model: nn.Module, iteration: int, index: torch.Tensor | None = None) -> None:
        """The losses after ``iteration`` (0: the initial weights) and the composition of its batch."""
        if index is not None:
            self.compositions[iteration - 1] = torch.bincount(
                self.train_code[index], minlength=self.compositions.shape[1]
            )
        self.losses[iteration] = self._losses(model)
        self.recorded = iteration

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

    def state(self, iteration: int) -> dict[str, Any]:
        """What a checkpoint keeps: the records up to ``iteration``."""
        return {"losses": self.losses[: iteration + 1].cpu(), "compositions": self.compositions[:iteration].clone()}

    def restore(self, saved: dict[str, Any]) -> None:
        n = saved["losses"].shape[0]
        self.losses[:n] = saved["losses"].to(self.device)
        self.compositions[: n - 1] = saved["compositions"]
        self.recorded = n - 1

    def fit(self, iterations: int) -> ConflictFit:
        losses = self.losses[: iterations + 1].cpu().numpy()
        return fit_conflicts(self.compositions[:iterations].numpy(), losses)

    def rows(self, iterations: int) -> dict[str, list[Any]]:
        return conflict_rows(self.fit(iterations), self.where.training, self.where.evaluation)

"""What every fit of a training run shares (:class:`Run`: the data, the device and how it computes, the selection
split, how it checkpoints and stops) and a split's evaluation, the one the loop selects on and the final one.

:mod:`shiftbench.erm.train` makes the run; :mod:`shiftbench.erm.fit` fits it once per learning rate with the loop
of :mod:`shiftbench.erm.loop`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.conflicts import Layout
from shiftbench.erm.data import Batches, normalize
from shiftbench.erm.interrupt import StopRequest
from shiftbench.erm.photos import PhotoBatches
from shiftbench.erm.resume import MAX_OVERHEAD, Checkpoints
from shiftbench.erm.step import autocast
from shiftbench.scoring.metrics import Metric, calibration_metrics, class_metrics, pairwise_accuracy, split_metrics
from shiftbench.splits.split_table import SplitTable

Log = Callable[[str], None]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(
    model: nn.Module,
    batches: Batches | PhotoBatches,
    table: SplitTable,
    split: str,
    *,
    config: TrainConfig,
    device: torch.device,
    precision: str,
    channels_last: bool,
    grouping: tuple[np.ndarray, list[str]],
    final: bool = False,
    on_batch: Callable[[], None] | None = None,
) -> list[Metric]:
    """A split's metrics over the run's groups (``grouping``: each example's group and the names, from
    :func:`training_groups`); ``final`` adds per-class accuracy, balanced accuracy, macro F1 and ECE.
    ``on_batch`` runs after every batch (it raises to abandon the evaluation: a stop was asked for)."""
    rows = table.indices(split)
    predictions, losses, probabilities = [], [], []
    model.eval()
    with torch.inference_mode(), autocast(device, precision):
        for start in range(0, len(rows), config.eval_batch_size):
            index = torch.from_numpy(rows[start : start + config.eval_batch_size])
            x = normalize(batches(index), channels_last=channels_last, kind=config.normalization)
            y = torch.from_numpy(table.y[index.numpy()]).to(device)
            logits = model(x).float()
            losses.append(nn.functional.cross_entropy(logits, y, reduction="none").cpu())
            predictions.append(logits.argmax(1).cpu())
            if final:
                probabilities.append(logits.softmax(1).cpu())
            if on_batch is not None:
                on_batch()
    y_pred = torch.cat(predictions).numpy() if predictions else np.zeros(0, np.int64)
    loss = torch.cat(losses).numpy() if losses else np.zeros(0)
    y_true = table.y[rows]
    codes, names = grouping
    out = split_metrics(split, y_true, y_pred, loss, codes[rows], names)
    if final:
        out += class_metrics(split, y_true, y_pred, table.class_names)
        k = len(table.class_names)
        chances = torch.cat(probabilities).numpy() if probabilities else np.zeros((0, k))
        out += calibration_metrics(split, y_true, chances)
        out.append(pairwise_accuracy(split, y_true, chances))
    return out


@dataclass
class Resumable:
    """How a run checkpoints (every ``every`` iterations; 0: only when stopped) and stops on a signal, and the
    checkpoint it resumes from (``saved``, loaded and checked by :class:`Checkpoints`).

    A periodic checkpoint is skipped while writing the last one took more than ``MAX_OVERHEAD`` of the time since
    it: a model whose checkpoint is slow to write next to fast steps (a ResNet on a GPU) is checkpointed less
    often than ``every``, never at more than 2 % of its time. A stop always checkpoints."""

    checkpoints: Checkpoints
    stop: StopRequest
    every: int
    label: str  # how the stop line names the run: "sprites-uniform seed 0"
    saved: dict[str, Any] | None = None
    progress: int = 0  # steps taken and abandoned evaluations redone by this process (a requeue that made none stalls)
    write_s: float = 0.0  # how long the last checkpoint took to write
    written_at: float = field(default_factory=time.perf_counter)

    def due(self, iteration: int, start: int) -> bool:
        """Whether a periodic checkpoint is due after ``iteration`` (``start``: the iteration this process resumed
        from, already saved)."""
        if not self.every or iteration % self.every or iteration <= start:
            return False
        return self.write_s <= MAX_OVERHEAD * (time.perf_counter() - self.written_at)

    def save(self, state: dict[str, Any], iteration: int) -> None:
        started = time.perf_counter()
        self.checkpoints.save(state, iteration)
        self.written_at = time.perf_counter()
        self.write_s = self.written_at - started


@dataclass(frozen=True)
class Run:
    """What every learning rate's fit shares: the data, the device and how it computes, the selection split."""

    table: SplitTable
    batches: Batches | PhotoBatches
    config: TrainConfig
    train_rows: np.ndarray
    grouping: tuple[np.ndarray, list[str]]  # each example's group, and the groups' names
    selection: str | None
    device: torch.device
    precision: str
    channels_last: bool
    log: Log
    resumable: Resumable | None = None
    tracking: Layout | None = None  # track_conflicts: the subsets tracked after every step

    def evaluate(
        self, model: nn.Module, split: str, *, final: bool = False, on_batch: Callable[[], None] | None = None
    ) -> list[Metric]:
        return evaluate(
            model, self.batches, self.table, split, config=self.config, device=self.device, precision=self.precision,
            channels_last=self.channels_last, grouping=self.grouping, final=final, on_batch=on_batch,
        )  # fmt: skip

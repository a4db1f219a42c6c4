"""The training loop of one fit: steps, evaluations on the selection split, the best weights and the patience
left, and what a checkpoint keeps of it (:meth:`Loop.snapshot`, :meth:`Loop.resume`) to stop on a signal and
continue."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn

from shiftbench.erm.conflicts import ConflictTracker
from shiftbench.erm.data import BatchStream
from shiftbench.erm.interrupt import Interrupted
from shiftbench.erm.objective import Method
from shiftbench.erm.resume import DISCARD, random_states, restore_random_states
from shiftbench.erm.run import Run, synchronize
from shiftbench.erm.step import EagerStep, GraphStep
from shiftbench.errors import InputError
from shiftbench.runtime import progress
from shiftbench.scoring.metrics import Metric, value_of


class Abandoned(Exception):
    """An evaluation stopped between batches because the run was asked to stop."""


@dataclass
class Selected:
    """The training loop's record between evaluations: the curve, the best weights so far, the patience left."""

    best_state: dict[str, torch.Tensor]
    patience_left: int
    best_score: float = -math.inf
    best_iteration: int = 0
    stopped_early: bool = False
    curve: list[tuple[int, str, str, float]] = field(default_factory=list)


@dataclass
class Grid:
    """Where a learning-rate grid stands: the fit under way, each finished one's score, the best finished fit."""

    index: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] | None = None  # Fit.record() of the best finished fit

    def record(self) -> dict[str, Any]:
        return {"index": self.index, "scores": dict(self.scores), "best": self.best}


def record_evaluation(
    run: Run, state: Selected, model: nn.Module, step: EagerStep | GraphStep, iteration: int, running_seen: int,
    measured: list[Metric] | None,
) -> float | None:  # fmt: skip
    """Log the training loss since the last evaluation and the selection split's ``measured`` metrics: its score
    (None without a selection split, where the last iterate is the one kept)."""
    config, selection = run.config, run.selection
    train_loss = float(step.running_loss) / running_seen
    state.curve.append((iteration, config.train_split, "loss_avg", train_loss))
    state.curve.append((iteration, config.train_split, "acc_avg", int(step.running_correct) / running_seen))
    step.running_loss.zero_(), step.running_correct.zero_()
    if selection is None or measured is None:
        state.best_iteration, state.best_state = iteration, copy.deepcopy(model.state_dict())
        return None
    score = value_of(measured, selection, config.selection_metric)
    for name in ("acc_avg", "acc_wg", "loss_avg"):
        value = value_of(measured, selection, name)
        if value is not None:
            state.curve.append((iteration, selection, name, value))
    run.log(
        f"iteration {iteration}/{config.max_iters}: train loss {train_loss:.4f}, "
        f"{selection} {config.selection_metric} {score if score is not None else math.nan:.4f}"
    )
    progress.report(
        progress.Event(
            "train", run.table.benchmark, iteration, config.max_iters, "progress", fraction=iteration / config.max_iters
        )
    )
    return score


def keep_best(run: Run, state: Selected, model: nn.Module, score: float | None, iteration: int) -> bool:
    """Keep the weights when the selection score improves; True when patience has run out (stop early)."""
    config = run.config
    if score is not None and score > state.best_score:
        state.best_score, state.best_iteration, state.patience_left = score, iteration, config.patience
        state.best_state = copy.deepcopy(model.state_dict())
    elif config.patience:
        state.patience_left -= 1
        if state.patience_left <= 0:
            state.stopped_early = True
            run.log(f"early stop at iteration {iteration}: no better {run.selection} score in {config.patience} checks")
            return True
    return False


@dataclass
class Loop:
    """The training loop of one fit, with what a checkpoint keeps of it (:meth:`snapshot`, :meth:`resume`)."""

    run: Run
    model: nn.Module
    step_model: nn.Module
    step: EagerStep | GraphStep
    stream: BatchStream
    method: Method
    state: Selected
    grid: Grid
    start: int = 0  # the last iteration done before this process (a checkpoint's)
    pending: bool = False  # the checkpoint's evaluation of ``start`` was abandoned: redo it first
    # Running sums stay on the device (the step's): no host sync per step, so a GPU is never starved by logging.
    running_seen: int = 0
    steady_images: int = 0
    eval_time: float = 0.0
    t_steady: float = field(default_factory=time.perf_counter)
    tracker: ConflictTracker | None = None  # track_conflicts: losses per evaluation subset after every step

    def train(self) -> int:
        """Train from ``start``; the last iteration done."""
        config, iteration = self.run.config, self.start
        if self.tracker is not None and not self.tracker.started:
            self.tracker.start(self.model)  # the losses before the first step
        if self.pending:
            patience_out = self._evaluate(iteration, redo=True)
            self._progressed()
            if patience_out:
                return iteration
        self._stop_if_asked(iteration)
        for iteration in range(self.start + 1, config.max_iters + 1):
            self._step(iteration)
            if (iteration % config.eval_every == 0 or iteration == config.max_iters) and self._evaluate(iteration):
                break
            self._stop_if_asked(iteration)
        return iteration

    def _step(self, iteration: int) -> None:
        config, device = self.run.config, self.run.device
        self.model.train()
        if config.linear_probe:  # frozen features: keep batch-norm statistics too
            self.model.eval()
        index = next(self.stream)
        self.step(index, iteration)
        if self.tracker is not None:
            self.tracker.record(self.model, iteration, index)
        self.running_seen += len(index)
        warm = iteration - self.start
        if warm == 5:  # throughput excludes warm-up (allocator, cudnn autotune, compile)
            synchronize(device)
            self.t_steady, self.steady_images, self.eval_time = time.perf_counter(), 0, 0.0
        elif warm > 5:
            self.steady_images += len(index)
        self._progressed()
        if self.run.resumable is not None:
            self.run.resumable.stop.after_step(iteration)

    def _progressed(self) -> None:
        if self.run.resumable is not None:
            self.run.resumable.progress += 1

    def _evaluate(self, iteration: int, *, redo: bool = False) -> bool:
        """The evaluation at ``iteration`` (abandoned, checkpointed and stopped if a stop is asked for during it;
        ``redo``: the one a checkpoint abandoned); True when patience has run out."""
        run = self.run
        synchronize(run.device)
        t_eval_start = time.perf_counter()
        try:
            measured = run.evaluate(self.step_model, run.selection, on_batch=self._between_batches(iteration, redo)) \
                if run.selection is not None else None  # fmt: skip
        except Abandoned:
            self._stop(iteration, pending=True)
        score = record_evaluation(run, self.state, self.model, self.step, iteration, self.running_seen, measured)
        self.running_seen = 0
        self.eval_time += time.perf_counter() - t_eval_start
        return run.selection is not None and keep_best(run, self.state, self.model, score, iteration)

    def _between_batches(self, iteration: int, redo: bool) -> Callable[[], None] | None:
        resumable = self.run.resumable
        if resumable is None:
            return None

        def check() -> None:
            if not redo:  # the test hook stops an evaluation once
                resumable.stop.during_evaluation(iteration)
            if resumable.stop.requested:
                raise Abandoned

        return check

    def _stop_if_asked(self, iteration: int) -> None:
        """At a step boundary: stop with a checkpoint if asked to, else checkpoint every ``every`` iterations."""
        resumable = self.run.resumable
        if resumable is None or iteration >= self.run.config.max_iters:
            return
        if resumable.stop.requested:
            self._stop(iteration, pending=False)
        if resumable.due(iteration, self.start):
            resumable.save(self.snapshot(iteration, pending=False), iteration)

    def _stop(self, iteration: int, *, pending: bool) -> NoReturn:
        resumable = self.run.resumable
        assert resumable is not None and resumable.stop.signum is not None
        resumable.save(self.snapshot(iteration, pending=pending), iteration)
        config = self.run.config
        raise Interrupted(
            resumable.label, iteration, config.max_iters, resumable.stop.signum, str(resumable.checkpoints.folder)
        )

    def snapshot(self, iteration: int, *, pending: bool) -> dict[str, Any]:
        """Everything the next iteration depends on (shiftbench.erm.resume lists it)."""
        state = self.state
        synchronize(self.run.device)
        return {
            "iteration": iteration, "pending": pending, "model": self.model.state_dict(),
            "step": self.step.state_dict(), "method": self.method.state_dict(), "stream": self.stream.state(),
            "augment": self.step.inputs.augment_generator.get_state(), "random": random_states(),
            "running_seen": self.running_seen, "grid": self.grid.record(),
            "tracker": self.tracker.state() if self.tracker is not None else None,
            "selected": {
                "best_state": state.best_state, "best_score": state.best_score, "best_iteration": state.best_iteration,
                "patience_left": state.patience_left, "curve": state.curve,
            },
        }  # fmt: skip

    def resume(self) -> int | None:
        """Continue from the run's checkpoint when it belongs to this fit (the grid's learning rate under way)."""
        resumable = self.run.resumable
        saved = resumable.saved if resumable is not None else None
        if resumable is None or saved is None or saved["grid"]["index"] != self.grid.index:
            return None
        resumable.saved = None  # the grid's next fits start afresh
        try:
            self._restore(saved)
        except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise InputError(
                f"damaged checkpoint (it does not fit this run's model and state: {reason}): "
                f"{DISCARD.format(folder=resumable.checkpoints.folder)}; the run then starts over",
                path=resumable.checkpoints.state_path,
            ) from None
        self.run.log(f"resuming from iteration {self.start} ({resumable.checkpoints.folder})")
        resumable.stop.after_resume()
        return int(self.start)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        self.step.load_state_dict(saved["step"])
        self.method.load_state_dict(saved["method"])
        self.stream.restore(saved["stream"])
        self.step.inputs.augment_generator.set_state(saved["augment"])
        restore_random_states(saved["random"])
        if self.tracker is not None and saved.get("tracker") is not None:
            self.tracker.restore(saved["tracker"])
        selected = saved["selected"]
        self.state.best_state = selected["best_state"]
        self.state.best_score, self.state.best_iteration = selected["best_score"], selected["best_iteration"]
        self.state.patience_left = selected["patience_left"]
        self.state.curve = [tuple(point) for point in selected["curve"]]
        self.start, self.pending, self.running_seen = saved["iteration"], saved["pending"], saved["running_seen"]

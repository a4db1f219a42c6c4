"""ERM training with early stopping and model selection, then WILDS-style evaluation of every split.

Protocol (the papers' presets live in ``specs/erm.yaml``): iterations, not epochs; evaluate the
selection split every ``eval_every`` iterations; keep the best weights; stop after ``patience``
evaluations without improvement (ConDS Appendix A.4) or at ``max_iters``. Model selection uses
OOD validation (``val``) when the split has one, else ID validation (``id_val``) (WILDS Section
5.3); the results say which. On a GPU: bf16 autocast, channels_last, optional torch.compile. On
CPU: deterministic algorithms, so a seed gives the same weights and metrics every run.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import nn

from shiftbench import progress
from shiftbench.cpus import available_cpus
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.data import (
    Batches,
    BatchStream,
    group_balanced_batches,
    group_batches,
    normalize,
    standard_batches,
    training_groups,
)
from shiftbench.erm.interrupt import Interrupted, StopRequest
from shiftbench.erm.methods import Method, build_method
from shiftbench.erm.models import build_model, load_checkpoint
from shiftbench.erm.resume import MAX_OVERHEAD, Checkpoints, random_states, restore_random_states
from shiftbench.erm.step import EagerStep, GraphStep, StepInputs, autocast, build_step
from shiftbench.errors import InputError
from shiftbench.metrics import (
    Metric,
    calibration_metrics,
    class_metrics,
    gap_metrics,
    split_metrics,
    value_of,
)
from shiftbench.seeding import seed_for
from shiftbench.split_table import SplitTable

Log = Callable[[str], None]


@dataclass
class TrainResult:
    metrics: list[Metric]
    curve: list[tuple[int, str, str, float]]  # (iteration, split, metric, value)
    selection_split: str | None
    best_iteration: int
    iterations: int
    stopped_early: bool
    weights_path: Path
    weights_sha256: str
    device: str
    precision: str
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)
    train_images_per_s: float | None = None
    lr_grid_scores: dict[str, float] = field(default_factory=dict)  # lr -> best selection score
    training_groups: list[str] = field(default_factory=list)
    init: dict[str, object] | None = None  # what init_checkpoint loaded: entries, left at init, ignored
    step: str = "eager"  # eager | graph (captured in a CUDA graph) | static (the graph's program, uncaptured)
    threads: int = 0  # torch's CPU threads during the run
    resumed_from: int | None = None  # the checkpoint's iteration this process continued from


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"a GPU was requested but torch {torch.__version__} sees none (torch.cuda.is_available() is False); "
            "use device=cpu or auto",
            parameter="device",
        )
    return device


def choose_selection(config: TrainConfig, splits: Sequence[str]) -> str | None:
    if config.selection == "last":
        return None
    if config.selection != "auto":
        if config.selection not in splits:
            raise InputError(f"the benchmark has no {config.selection!r} split", parameter="selection")
        return config.selection
    return next((s for s in ("val", "id_val") if s in splits), None)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(
    model: nn.Module,
    batches: Batches,
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
        out += calibration_metrics(
            split, y_true, torch.cat(probabilities).numpy() if probabilities else np.zeros((0, k))
        )
    return out


@dataclass
class _Fit:
    """One training run at one learning rate: the selected weights and how they were chosen."""

    model: nn.Module
    step_model: nn.Module
    best_state: dict[str, torch.Tensor]
    best_score: float
    best_iteration: int
    iterations: int
    stopped_early: bool
    curve: list[tuple[int, str, str, float]]
    steady_images: int
    train_time: float
    init: dict[str, object] | None = None  # what the checkpoint loaded (models.LoadedCheckpoint)
    step: str = "eager"
    resumed_from: int | None = None

    _RECORDED = ("best_state", "best_score", "best_iteration", "iterations", "stopped_early", "curve",
                 "steady_images", "train_time", "init", "step", "resumed_from")  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The fit without its modules: what a checkpoint of a learning-rate grid keeps of a finished fit."""
        return {name: getattr(self, name) for name in self._RECORDED}

    @classmethod
    def from_record(cls, record: dict[str, Any], modules: _Fit) -> _Fit:
        """A recorded fit on the modules of another fit of the grid (the same model; its weights are loaded)."""
        values = {name: record[name] for name in cls._RECORDED}
        values["curve"] = [tuple(point) for point in values["curve"]]
        return cls(model=modules.model, step_model=modules.step_model, **values)


@dataclass(frozen=True)
class _Run:
    """What every learning rate's fit shares: the data, the device and how it computes, the selection split."""

    table: SplitTable
    batches: Batches
    config: TrainConfig
    train_rows: np.ndarray
    grouping: tuple[np.ndarray, list[str]]  # each example's group, and the groups' names
    selection: str | None
    device: torch.device
    precision: str
    channels_last: bool
    log: Log
    resumable: Resumable | None = None

    def evaluate(
        self, model: nn.Module, split: str, *, final: bool = False, on_batch: Callable[[], None] | None = None
    ) -> list[Metric]:
        return evaluate(
            model, self.batches, self.table, split, config=self.config, device=self.device, precision=self.precision,
            channels_last=self.channels_last, grouping=self.grouping, final=final, on_batch=on_batch,
        )  # fmt: skip


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


class _Abandoned(Exception):
    """An evaluation stopped between batches because the run was asked to stop."""


@dataclass
class _Selected:
    """The training loop's record between evaluations: the curve, the best weights so far, the patience left."""

    best_state: dict[str, torch.Tensor]
    patience_left: int
    best_score: float = -math.inf
    best_iteration: int = 0
    stopped_early: bool = False
    curve: list[tuple[int, str, str, float]] = field(default_factory=list)


def _compute(config: TrainConfig) -> tuple[torch.device, str, bool]:
    """The device, precision and memory format: bf16 and channels_last on a GPU unless the config says."""
    device = resolve_device(config.device)
    precision = ("bf16" if device.type == "cuda" else "fp32") if config.precision == "auto" else config.precision
    channels_last = device.type == "cuda" if config.channels_last is None else config.channels_last
    return device, precision, channels_last


def _rows_and_selection(table: SplitTable, config: TrainConfig) -> tuple[np.ndarray, str | None]:
    """The training rows and the selection split, or why the benchmark cannot be trained on as configured."""
    train_rows = table.indices(config.train_split)
    if train_rows.size == 0:
        raise InputError(
            f"the benchmark has no {config.train_split!r} examples (splits: {', '.join(table.split_names)})",
            parameter="train_split",
        )
    selection = choose_selection(config, table.split_names)
    if config.lr_grid and selection is None:
        raise InputError("a learning-rate grid needs a selection split (val or id_val)", parameter="lr_grid")
    return train_rows, selection


def cpu_threads(config: TrainConfig) -> int:
    """torch's CPU threads for the run. oneDNN's reductions split by thread, so the count is part of a CPU
    result (recorded with the run); by default the CPUs this process may use (a Slurm allocation, the affinity
    mask, a cgroup quota), not every core of the node, which oversubscribes a shared one."""
    return config.threads or available_cpus()


def _prepare(table: SplitTable, paths: Sequence[Path], config: TrainConfig, log: Log) -> tuple[_Run, float]:
    """The run's settings checked and its images loaded (with the seconds that took)."""
    device, precision, channels_last = _compute(config)
    train_rows, selection = _rows_and_selection(table, config)
    groups, group_labels = training_groups(table, config.group_by)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(cpu_threads(config))
    t0 = time.perf_counter()
    batches = Batches(paths, config, device, np.arange(len(paths)))
    load_s = time.perf_counter() - t0
    present = len(np.unique(groups[train_rows]))
    log(
        f"{len(paths):,} images {'cached on ' + device.type if batches.cached else 'decoded per batch'} "
        f"in {load_s:.1f}s; training {config.model} ({config.method}, {present} training groups "
        f"by {config.group_by}) on {len(train_rows):,} {config.train_split} examples, selection on "
        f"{selection or 'the last iterate'}, {precision}"
    )
    run = _Run(
        table, batches, config, train_rows, (groups, group_labels), selection, device, precision, channels_last, log
    )
    return run, load_s


@dataclass
class _Grid:
    """Where a learning-rate grid stands: the fit under way, each finished one's score, the best finished fit."""

    index: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] | None = None  # _Fit.record() of the best finished fit

    def record(self) -> dict[str, Any]:
        return {"index": self.index, "scores": dict(self.scores), "best": self.best}


def _fit_grid(run: _Run, checkpoint: Path | None) -> tuple[_Fit, dict[str, float]]:
    """One fit per learning rate of the grid (or the one ``lr``): the best on the selection split wins."""
    config = run.config
    grid = config.lr_grid or (config.lr,)
    saved = run.resumable.saved if run.resumable is not None else None
    position = _Grid(**saved["grid"]) if saved is not None else _Grid()
    candidate: _Fit | None = None
    for index in range(position.index, len(grid)):
        lr = grid[index]
        position.index = index
        if config.lr_grid:
            run.log(f"learning rate {lr:g} of the grid {', '.join(f'{v:g}' for v in config.lr_grid)}")
        candidate = _fit(replace(run, config=replace(config, lr=lr)), checkpoint, position)
        position.scores[f"{lr:g}"] = candidate.best_score
        if position.best is None or candidate.best_score > position.best["best_score"]:
            position.best = candidate.record()
    assert candidate is not None and position.best is not None
    return _Fit.from_record(position.best, candidate), position.scores


def _final_metrics(run: _Run, fit: _Fit) -> list[Metric]:
    """Every split's metrics under the selected weights, then the gaps between splits."""
    fit.model.load_state_dict(fit.best_state)
    metrics: list[Metric] = []
    for split in run.table.split_names:
        metrics += run.evaluate(fit.step_model, split, final=True)
    return metrics + gap_metrics(metrics)


def train(
    table: SplitTable,
    paths: Sequence[Path],
    config: TrainConfig,
    out_dir: Path,
    log: Log = print,
    *,
    checkpoint: Path | None = None,
    resumable: Resumable | None = None,
) -> TrainResult:
    """Train on ``config.train_split`` (once per learning rate of ``lr_grid``), select on the selection
    split, evaluate every split. With ``resumable``: checkpoint, stop on a signal (raising
    :class:`~shiftbench.erm.interrupt.Interrupted`) and continue from ``resumable.saved``."""
    started = time.perf_counter()
    run, load_s = _prepare(table, paths, config, log)
    run = replace(run, resumable=resumable)
    resumed_from = int(resumable.saved["iteration"]) if resumable is not None and resumable.saved else None
    timings = {"load_images_s": load_s}
    t_train = time.perf_counter()
    fit, grid_scores = _fit_grid(run, checkpoint)
    timings["train_s"] = time.perf_counter() - t_train
    if config.lr_grid:
        chosen = max(grid_scores, key=lambda k: grid_scores[k])
        log(f"selected learning rate {chosen} on {run.selection} ({config.selection_metric}: {grid_scores})")
    t_eval = time.perf_counter()
    metrics = _final_metrics(run, fit)
    timings["evaluate_s"] = time.perf_counter() - t_eval

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "model.pt"
    torch.save({k: v.detach().cpu() for k, v in fit.model.state_dict().items()}, weights)
    timings["total_s"] = time.perf_counter() - started
    device = run.device
    return TrainResult(
        metrics=metrics,
        curve=fit.curve,
        selection_split=run.selection,
        best_iteration=fit.best_iteration,
        iterations=fit.iterations,
        stopped_early=fit.stopped_early,
        weights_path=weights,
        weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
        device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        precision=run.precision,
        cached=run.batches.cached,
        timings=timings,
        train_images_per_s=fit.steady_images / fit.train_time if fit.steady_images and fit.train_time > 0 else None,
        lr_grid_scores=grid_scores if config.lr_grid else {},
        training_groups=run.grouping[1],
        init=fit.init,
        step=fit.step,
        threads=torch.get_num_threads(),
        resumed_from=resumed_from,
    )


def _initial_model(run: _Run, checkpoint: Path | None) -> tuple[nn.Module, nn.Module, dict[str, object] | None]:
    """The seeded model (with the checkpoint's weights, if any) on the device, the module that steps it, and
    what the checkpoint loaded."""
    config = run.config
    torch.manual_seed(seed_for(config.seed, run.table.benchmark, "init"))
    model = build_model(config.model, run.table.num_classes, config.image_size)
    if checkpoint is None and config.init_checkpoint:
        checkpoint = Path(config.init_checkpoint)
    init: dict[str, object] | None = None
    if checkpoint is not None:
        report = load_checkpoint(
            model,
            checkpoint,
            keep_head=not config.linear_probe,
            partial=config.init_partial,
            name=config.init_checkpoint,
        )
        init = report.as_dict()
        ignored = f", {len(report.ignored)} of the checkpoint's ignored" if report.ignored else ""
        run.log(
            f"loaded {config.init_checkpoint} from {checkpoint}: {len(report.loaded)} entries, "
            f"{len(report.left_at_init)} left at init{ignored}"
        )
    if config.linear_probe:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("fc."))
    model = model.to(run.device)
    if run.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_model: nn.Module = torch.compile(model) if config.compile else model  # type: ignore[assignment]
    return model, step_model, init


def _training_step(
    run: _Run, model: nn.Module, step_model: nn.Module
) -> tuple[EagerStep | GraphStep, BatchStream, Method]:
    """The method's training step and the stream of batches it takes, each seeded from the run's seed."""
    config, table, groups = run.config, run.table, run.grouping[0]
    method = build_method(
        config.method, groups[run.train_rows], int(groups.max()) + 1, method_params(config), run.device
    )
    captured: list[torch.Tensor] = []
    if method.needs_features:  # the input of the last layer: every model names it fc
        model.get_submodule("fc").register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))

    generator = torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "batches"))
    step = build_step(
        StepInputs(
            model, step_model, method, config, run.batches, torch.from_numpy(table.y), torch.from_numpy(groups),
            torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "augment")), run.device,
            run.precision, run.channels_last, captured,
        ),
        run.log,
    )  # fmt: skip
    return step, _batch_stream(config, method.default_loader, run.train_rows, groups, generator), method


def _record(
    run: _Run, state: _Selected, model: nn.Module, step: EagerStep | GraphStep, iteration: int, running_seen: int,
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


def _keep_best(run: _Run, state: _Selected, model: nn.Module, score: float | None, iteration: int) -> bool:
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


def _fit(run: _Run, checkpoint: Path | None, grid: _Grid) -> _Fit:
    """Initialise (or resume), then train with ``config.method`` until ``max_iters`` or early stopping."""
    model, step_model, init = _initial_model(run, checkpoint)
    step, stream, method = _training_step(run, model, step_model)
    state = _Selected(best_state=copy.deepcopy(model.state_dict()), patience_left=run.config.patience)
    loop = _Loop(run, model, step_model, step, stream, method, state, grid)
    resumed = loop.resume()
    iteration = loop.train()
    _synchronize(run.device)
    train_time = time.perf_counter() - loop.t_steady - loop.eval_time
    return _Fit(
        model, step_model, state.best_state, state.best_score, state.best_iteration, iteration, state.stopped_early,
        state.curve, loop.steady_images, train_time, init, step.kind, resumed,
    )  # fmt: skip


@dataclass
class _Loop:
    """The training loop of one fit, with what a checkpoint keeps of it (:meth:`snapshot`, :meth:`resume`)."""

    run: _Run
    model: nn.Module
    step_model: nn.Module
    step: EagerStep | GraphStep
    stream: BatchStream
    method: Method
    state: _Selected
    grid: _Grid
    start: int = 0  # the last iteration done before this process (a checkpoint's)
    pending: bool = False  # the checkpoint's evaluation of ``start`` was abandoned: redo it first
    # Running sums stay on the device (the step's): no host sync per step, so a GPU is never starved by logging.
    running_seen: int = 0
    steady_images: int = 0
    eval_time: float = 0.0
    t_steady: float = field(default_factory=time.perf_counter)

    def train(self) -> int:
        """Train from ``start``; the last iteration done."""
        config, iteration = self.run.config, self.start
        if self.pending and self._evaluate(iteration, redo=True):
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
        self.running_seen += len(index)
        warm = iteration - self.start
        if warm == 5:  # throughput excludes warm-up (allocator, cudnn autotune, compile)
            _synchronize(device)
            self.t_steady, self.steady_images, self.eval_time = time.perf_counter(), 0, 0.0
        elif warm > 5:
            self.steady_images += len(index)
        if self.run.resumable is not None:
            self.run.resumable.stop.after_step(iteration)

    def _evaluate(self, iteration: int, *, redo: bool = False) -> bool:
        """The evaluation at ``iteration`` (abandoned, checkpointed and stopped if a stop is asked for during it;
        ``redo``: the one a checkpoint abandoned); True when patience has run out."""
        run = self.run
        _synchronize(run.device)
        t_eval_start = time.perf_counter()
        try:
            measured = run.evaluate(self.step_model, run.selection, on_batch=self._between_batches(iteration, redo)) \
                if run.selection is not None else None  # fmt: skip
        except _Abandoned:
            self._stop(iteration, pending=True)
        score = _record(run, self.state, self.model, self.step, iteration, self.running_seen, measured)
        self.running_seen = 0
        self.eval_time += time.perf_counter() - t_eval_start
        return run.selection is not None and _keep_best(run, self.state, self.model, score, iteration)

    def _between_batches(self, iteration: int, redo: bool) -> Callable[[], None] | None:
        resumable = self.run.resumable
        if resumable is None:
            return None

        def check() -> None:
            if not redo:  # the test hook stops an evaluation once
                resumable.stop.during_evaluation(iteration)
            if resumable.stop.requested:
                raise _Abandoned

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
        _synchronize(self.run.device)
        return {
            "iteration": iteration, "pending": pending, "model": self.model.state_dict(),
            "step": self.step.state_dict(), "method": self.method.state_dict(), "stream": self.stream.state(),
            "augment": self.step.inputs.augment_generator.get_state(), "random": random_states(),
            "running_seen": self.running_seen, "grid": self.grid.record(),
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
        self.model.load_state_dict(saved["model"])
        self.step.load_state_dict(saved["step"])
        self.method.load_state_dict(saved["method"])
        self.stream.restore(saved["stream"])
        self.step.inputs.augment_generator.set_state(saved["augment"])
        restore_random_states(saved["random"])
        selected = saved["selected"]
        self.state.best_state = selected["best_state"]
        self.state.best_score, self.state.best_iteration = selected["best_score"], selected["best_iteration"]
        self.state.patience_left = selected["patience_left"]
        self.state.curve = [tuple(point) for point in selected["curve"]]
        self.start, self.pending, self.running_seen = saved["iteration"], saved["pending"], saved["running_seen"]
        self.run.log(f"resuming from iteration {self.start} ({resumable.checkpoints.folder})")
        return int(self.start)


def _batch_stream(
    config: TrainConfig, default_loader: str, train_rows: np.ndarray, groups: np.ndarray, generator: torch.Generator
) -> BatchStream:
    """The run's training batches (example rows), every one of the same size."""
    loader = default_loader if config.loader == "auto" else config.loader
    if loader == "group_balanced":
        return group_balanced_batches(train_rows, groups, config.batch_size, generator)
    if loader == "groups":
        return group_batches(train_rows, groups, config.batch_size, config.n_groups_per_batch, generator)
    return standard_batches(train_rows, min(config.batch_size, train_rows.size), generator)


def method_params(config: TrainConfig) -> dict[str, float]:
    """The hyperparameters of the training objectives, by name (shiftbench.erm.methods)."""
    names = ("groupdro_eta", "irm_lambda", "irm_anneal_iters", "coral_lambda")
    return {name: float(getattr(config, name)) for name in names}

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shiftbench import progress
from shiftbench.cpus import available_cpus
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.data import (
    Batches,
    SplitTable,
    group_balanced_batches,
    group_batches,
    normalize,
    standard_batches,
    training_groups,
)
from shiftbench.erm.methods import build_method
from shiftbench.erm.metrics import (
    Metric,
    calibration_metrics,
    class_metrics,
    gap_metrics,
    split_metrics,
    value_of,
)
from shiftbench.erm.models import build_model, load_checkpoint
from shiftbench.erm.step import EagerStep, GraphStep, StepInputs, autocast, build_step
from shiftbench.errors import InputError
from shiftbench.seeding import seed_for

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
) -> list[Metric]:
    """A split's metrics over the run's groups (``grouping``: each example's group and the names, from
    :func:`training_groups`); ``final`` adds per-class accuracy, balanced accuracy, macro F1 and ECE."""
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

    def evaluate(self, model: nn.Module, split: str, *, final: bool = False) -> list[Metric]:
        return evaluate(
            model, self.batches, self.table, split, config=self.config, device=self.device, precision=self.precision,
            channels_last=self.channels_last, grouping=self.grouping, final=final,
        )  # fmt: skip


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


def _fit_grid(run: _Run, checkpoint: Path | None) -> tuple[_Fit, dict[str, float]]:
    """One fit per learning rate of the grid (or the one ``lr``): the best on the selection split wins."""
    config = run.config
    grid_scores: dict[str, float] = {}
    fit: _Fit | None = None
    for lr in config.lr_grid or (config.lr,):
        if config.lr_grid:
            run.log(f"learning rate {lr:g} of the grid {', '.join(f'{v:g}' for v in config.lr_grid)}")
        candidate = _fit(replace(run, config=replace(config, lr=lr)), checkpoint)
        grid_scores[f"{lr:g}"] = candidate.best_score
        if fit is None or candidate.best_score > fit.best_score:
            fit = candidate
    assert fit is not None
    return fit, grid_scores


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
) -> TrainResult:
    """Train on ``config.train_split`` (once per learning rate of ``lr_grid``), select on the selection
    split, evaluate every split."""
    started = time.perf_counter()
    run, load_s = _prepare(table, paths, config, log)
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
) -> tuple[EagerStep | GraphStep, Iterator[torch.Tensor]]:
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
    return step, _batch_stream(config, method.default_loader, run.train_rows, groups, generator)


def _record(
    run: _Run,
    state: _Selected,
    model: nn.Module,
    step_model: nn.Module,
    step: EagerStep | GraphStep,
    iteration: int,
    running_seen: int,
) -> float | None:
    """Log the training loss since the last evaluation and evaluate the selection split: its score (None without
    one, where the last iterate is the one kept)."""
    config, selection = run.config, run.selection
    train_loss = float(step.running_loss) / running_seen
    state.curve.append((iteration, config.train_split, "loss_avg", train_loss))
    state.curve.append((iteration, config.train_split, "acc_avg", int(step.running_correct) / running_seen))
    step.running_loss.zero_(), step.running_correct.zero_()
    if selection is None:
        state.best_iteration, state.best_state = iteration, copy.deepcopy(model.state_dict())
        return None
    measured = run.evaluate(step_model, selection)
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


def _fit(run: _Run, checkpoint: Path | None) -> _Fit:
    """Initialise, then train with ``config.method`` until ``max_iters`` or early stopping."""
    config, device = run.config, run.device
    model, step_model, init = _initial_model(run, checkpoint)
    step, stream = _training_step(run, model, step_model)
    state = _Selected(best_state=copy.deepcopy(model.state_dict()), patience_left=config.patience)
    # Running sums stay on the device (the step's): no host sync per step, so a GPU is never starved by logging.
    running_seen, steady_images, eval_time, iteration = 0, 0, 0.0, 0
    t_steady = time.perf_counter()
    for iteration in range(1, config.max_iters + 1):
        model.train()
        if config.linear_probe:  # frozen features: keep batch-norm statistics too
            model.eval()
        index = next(stream)
        step(index, iteration)
        running_seen += len(index)
        if iteration == 5:  # throughput excludes warm-up (allocator, cudnn autotune, compile)
            _synchronize(device)
            t_steady, steady_images, eval_time = time.perf_counter(), 0, 0.0
        elif iteration > 5:
            steady_images += len(index)
        if iteration % config.eval_every and iteration != config.max_iters:
            continue
        _synchronize(device)
        t_eval_start = time.perf_counter()
        score = _record(run, state, model, step_model, step, iteration, running_seen)
        running_seen = 0
        eval_time += time.perf_counter() - t_eval_start
        if run.selection is not None and _keep_best(run, state, model, score, iteration):
            break
    _synchronize(device)
    train_time = time.perf_counter() - t_steady - eval_time
    return _Fit(
        model, step_model, state.best_state, state.best_score, state.best_iteration, iteration, state.stopped_early,
        state.curve, steady_images, train_time, init, step.kind,
    )  # fmt: skip


def _batch_stream(
    config: TrainConfig, default_loader: str, train_rows: np.ndarray, groups: np.ndarray, generator: torch.Generator
) -> Iterator[torch.Tensor]:
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

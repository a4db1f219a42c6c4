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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench import progress
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.data import (
    ImageCache,
    SplitTable,
    augment,
    decode,
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


class _Batches:
    """uint8 batches by example index: from the cache, or decoded per batch by a thread pool."""

    def __init__(self, paths: Sequence[Path], config: TrainConfig, device: torch.device, rows: np.ndarray) -> None:
        budget = config.cache_budget_gib * 2**30
        needed = ImageCache.bytes_needed(len(rows), config.image_size)
        self.cached = config.cache == "on" or (config.cache == "auto" and needed <= budget)
        self.device, self.size = device, config.image_size
        self.paths = paths
        workers = config.decode_workers or None
        # Only the rows a run touches are decoded; position maps an example row to its cache slot.
        self.position = np.full(len(paths), -1, dtype=np.int64)
        self.position[rows] = np.arange(len(rows))
        self.cache = ImageCache([paths[r] for r in rows], config.image_size, device, workers) if self.cached else None
        self.pool = None if self.cached else ThreadPoolExecutor(max_workers=workers)

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        if self.cache is not None:
            return self.cache.batch(torch.from_numpy(self.position[index.numpy()]))
        assert self.pool is not None
        arrays = list(self.pool.map(lambda r: decode(self.paths[r], self.size), index.tolist()))
        return torch.from_numpy(np.stack(arrays)).to(self.device, non_blocking=True)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str) -> Any:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.autocast(device_type=device.type, enabled=False)


def evaluate(
    model: nn.Module,
    batches: _Batches,
    table: SplitTable,
    split: str,
    *,
    config: TrainConfig,
    device: torch.device,
    precision: str,
    channels_last: bool,
    final: bool = False,
) -> list[Metric]:
    """A split's metrics; ``final`` adds per-class accuracy, balanced accuracy, macro F1 and ECE."""
    rows = table.indices(split)
    predictions, losses, probabilities = [], [], []
    model.eval()
    with torch.inference_mode(), _autocast(device, precision):
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
    out = split_metrics(split, y_true, y_pred, loss, table.group_index[rows], table.group_names)
    if final:
        out += class_metrics(split, y_true, y_pred, table.class_names)
        k = len(table.class_names)
        out += calibration_metrics(
            split, y_true, torch.cat(probabilities).numpy() if probabilities else np.zeros((0, k))
        )
    return out


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)


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
    device = resolve_device(config.device)
    precision = ("bf16" if device.type == "cuda" else "fp32") if config.precision == "auto" else config.precision
    channels_last = device.type == "cuda" if config.channels_last is None else config.channels_last
    train_rows = table.indices(config.train_split)
    if train_rows.size == 0:
        raise InputError(
            f"the benchmark has no {config.train_split!r} examples (splits: {', '.join(table.split_names)})",
            parameter="train_split",
        )
    selection = choose_selection(config, table.split_names)
    if config.lr_grid and selection is None:
        raise InputError("a learning-rate grid needs a selection split (val or id_val)", parameter="lr_grid")
    groups, group_labels = training_groups(table, config.group_by)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)

    rows = np.arange(len(paths))
    t0 = time.perf_counter()
    batches = _Batches(paths, config, device, rows)
    timings = {"load_images_s": time.perf_counter() - t0}
    present = len(np.unique(groups[train_rows]))
    log(
        f"{len(rows):,} images {'cached on ' + device.type if batches.cached else 'decoded per batch'} "
        f"in {timings['load_images_s']:.1f}s; training {config.model} ({config.method}, {present} training groups "
        f"by {config.group_by}) on {len(train_rows):,} {config.train_split} examples, selection on "
        f"{selection or 'the last iterate'}, {precision}"
    )
    t_train = time.perf_counter()
    grid_scores: dict[str, float] = {}
    fit: _Fit | None = None
    for lr in config.lr_grid or (config.lr,):
        if config.lr_grid:
            log(f"learning rate {lr:g} of the grid {', '.join(f'{v:g}' for v in config.lr_grid)}")
        candidate = _fit(
            table, batches, replace(config, lr=lr), train_rows, groups, selection, device, precision, channels_last,
            checkpoint, log,
        )  # fmt: skip
        grid_scores[f"{lr:g}"] = candidate.best_score
        if fit is None or candidate.best_score > fit.best_score:
            fit = candidate
    assert fit is not None
    timings["train_s"] = time.perf_counter() - t_train
    if config.lr_grid:
        chosen = max(grid_scores, key=lambda k: grid_scores[k])
        log(f"selected learning rate {chosen} on {selection} ({config.selection_metric}: {grid_scores})")

    model, step_model = fit.model, fit.step_model
    model.load_state_dict(fit.best_state)
    t_eval = time.perf_counter()
    metrics: list[Metric] = []
    for split in table.split_names:
        metrics += evaluate(
            step_model, batches, table, split, config=config, device=device, precision=precision,
            channels_last=channels_last, final=True,
        )  # fmt: skip
    metrics += gap_metrics(metrics)
    timings["evaluate_s"] = time.perf_counter() - t_eval

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "model.pt"
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, weights)
    timings["total_s"] = time.perf_counter() - started
    return TrainResult(
        metrics=metrics,
        curve=fit.curve,
        selection_split=selection,
        best_iteration=fit.best_iteration,
        iterations=fit.iterations,
        stopped_early=fit.stopped_early,
        weights_path=weights,
        weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
        device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        precision=precision,
        cached=batches.cached,
        timings=timings,
        train_images_per_s=fit.steady_images / fit.train_time if fit.steady_images and fit.train_time > 0 else None,
        lr_grid_scores=grid_scores if config.lr_grid else {},
        training_groups=group_labels,
        init=fit.init,
    )


def _fit(
    table: SplitTable,
    batches: _Batches,
    config: TrainConfig,
    train_rows: np.ndarray,
    groups: np.ndarray,
    selection: str | None,
    device: torch.device,
    precision: str,
    channels_last: bool,
    checkpoint: Path | None,
    log: Log,
) -> _Fit:
    """Initialise, then train with ``config.method`` until ``max_iters`` or early stopping."""
    torch.manual_seed(seed_for(config.seed, table.benchmark, "init"))
    model = build_model(config.model, table.num_classes, config.image_size)
    if checkpoint is None and config.init_checkpoint:
        checkpoint = Path(config.init_checkpoint)
    init: dict[str, object] | None = None
    if checkpoint is not None:
        report = load_checkpoint(model, checkpoint, keep_head=not config.linear_probe, partial=config.init_partial)
        init = report.as_dict()
        ignored = f", {len(report.ignored)} of the checkpoint's ignored" if report.ignored else ""
        log(
            f"loaded {config.init_checkpoint} from {checkpoint}: {len(report.loaded)} entries, "
            f"{len(report.left_at_init)} left at init{ignored}"
        )
    if config.linear_probe:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("fc."))
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_model: nn.Module = torch.compile(model) if config.compile else model  # type: ignore[assignment]
    method = build_method(config.method, groups[train_rows], int(groups.max()) + 1, method_params(config), device)
    captured: list[torch.Tensor] = []
    if method.needs_features:  # the input of the last layer: every model names it fc
        model.get_submodule("fc").register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))

    generator = torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "batches"))
    augment_generator = torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "augment"))
    loader = method.default_loader if config.loader == "auto" else config.loader
    stream: Iterator[torch.Tensor]
    if loader == "group_balanced":
        stream = group_balanced_batches(train_rows, groups, config.batch_size, generator)
    elif loader == "groups":
        stream = group_batches(train_rows, groups, config.batch_size, config.n_groups_per_batch, generator)
    else:
        stream = standard_batches(train_rows, min(config.batch_size, train_rows.size), generator)
    optimizer = _optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(config.lr_milestones), config.lr_gamma)
    labels = torch.from_numpy(table.y)
    group_codes = torch.from_numpy(groups)

    best_score, best_iteration, best_state = -math.inf, 0, copy.deepcopy(model.state_dict())
    patience_left, curve = config.patience, []
    # Running sums stay on the device: no host sync per step, so a GPU is never starved by logging.
    running_loss = torch.zeros((), device=device)
    running_correct = torch.zeros((), device=device, dtype=torch.long)
    running_seen, steady_images, eval_time, stopped_early, iteration = 0, 0, 0.0, False, 0
    t_steady = time.perf_counter()
    for iteration in range(1, config.max_iters + 1):
        model.train()
        if config.linear_probe:  # frozen features: keep batch-norm statistics too
            model.eval()
        if method.reset_optimizer(iteration):
            optimizer = _optimizer(model, config)
            passed = sum(1 for m in config.lr_milestones if m < iteration)  # drops already taken stay taken
            for group in optimizer.param_groups:
                group["lr"] = config.lr * config.lr_gamma**passed
            scheduler = torch.optim.lr_scheduler.MultiStepLR(
                optimizer, [m - iteration + 1 for m in config.lr_milestones if m >= iteration], config.lr_gamma
            )
        index = next(stream)
        x = normalize(
            augment(batches(index), config.augment, augment_generator),
            channels_last=channels_last,
            kind=config.normalization,
        )
        y = labels[index].to(device, non_blocking=True)
        g = group_codes[index].to(device, non_blocking=True)
        captured.clear()
        with _autocast(device, precision):
            logits = step_model(x)
            loss = method.loss(logits.float(), captured[0] if captured else None, y, g, iteration)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        scheduler.step()
        running_loss += loss.detach() * len(index)
        running_correct += (logits.detach().argmax(1) == y).sum()
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
        train_loss = float(running_loss) / running_seen
        curve.append((iteration, config.train_split, "loss_avg", train_loss))
        curve.append((iteration, config.train_split, "acc_avg", int(running_correct) / running_seen))
        running_loss.zero_(), running_correct.zero_()
        running_seen = 0
        if selection is None:
            best_iteration, best_state = iteration, copy.deepcopy(model.state_dict())
            eval_time += time.perf_counter() - t_eval_start
            continue
        measured = evaluate(
            step_model, batches, table, selection, config=config, device=device, precision=precision,
            channels_last=channels_last,
        )  # fmt: skip
        score = value_of(measured, selection, config.selection_metric)
        for name in ("acc_avg", "acc_wg", "loss_avg"):
            value = value_of(measured, selection, name)
            if value is not None:
                curve.append((iteration, selection, name, value))
        log(
            f"iteration {iteration}/{config.max_iters}: train loss {train_loss:.4f}, "
            f"{selection} {config.selection_metric} {score if score is not None else math.nan:.4f}"
        )
        progress.report(
            progress.Event(
                "train", table.benchmark, iteration, config.max_iters, "progress", fraction=iteration / config.max_iters
            )
        )
        eval_time += time.perf_counter() - t_eval_start
        if score is not None and score > best_score:
            best_score, best_iteration, patience_left = score, iteration, config.patience
            best_state = copy.deepcopy(model.state_dict())
        elif config.patience:
            patience_left -= 1
            if patience_left <= 0:
                stopped_early = True
                log(f"early stop at iteration {iteration}: no better {selection} score in {config.patience} checks")
                break
    _synchronize(device)
    train_time = time.perf_counter() - t_steady - eval_time
    return _Fit(
        model, step_model, best_state, best_score, best_iteration, iteration, stopped_early, curve, steady_images,
        train_time, init,
    )  # fmt: skip


def method_params(config: TrainConfig) -> dict[str, float]:
    """The hyperparameters of the training objectives, by name (shiftbench.erm.methods)."""
    names = ("groupdro_eta", "irm_lambda", "irm_anneal_iters", "coral_lambda")
    return {name: float(getattr(config, name)) for name in names}

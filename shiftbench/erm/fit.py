"""One fit per learning rate of a run (the grid's best on the selection split wins): the seeded model (or a
checkpoint's weights), the method's step and its batches, then the loop of :mod:`shiftbench.erm.loop`."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.conflicts import ConflictTracker
from shiftbench.erm.data import BatchStream, group_balanced_batches, group_batches, standard_batches
from shiftbench.erm.loop import Grid, Loop, Selected
from shiftbench.erm.methods import build_method
from shiftbench.erm.models import build_model, head_name, load_checkpoint
from shiftbench.erm.objective import Method
from shiftbench.erm.run import Run, synchronize
from shiftbench.erm.step import EagerStep, GraphStep, StepInputs, build_step
from shiftbench.runtime.seeding import seed_for


@dataclass
class Fit:
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
    conflicts: dict[str, list[object]] | None = None  # track_conflicts: the regression's rows

    _RECORDED = ("best_state", "best_score", "best_iteration", "iterations", "stopped_early", "curve",
                 "steady_images", "train_time", "init", "step", "resumed_from", "conflicts")  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The fit without its modules: what a checkpoint of a learning-rate grid keeps of a finished fit."""
        return {name: getattr(self, name) for name in self._RECORDED}

    @classmethod
    def from_record(cls, record: dict[str, Any], modules: Fit) -> Fit:
        """A recorded fit on the modules of another fit of the grid (the same model; its weights are loaded)."""
        values: dict[str, Any] = {name: record.get(name) for name in cls._RECORDED}
        values["curve"] = [tuple(point) for point in values["curve"]]
        return cls(model=modules.model, step_model=modules.step_model, **values)


def fit_grid(run: Run, checkpoint: Path | None) -> tuple[Fit, dict[str, float]]:
    """One fit per learning rate of the grid (or the one ``lr``): the best on the selection split wins."""
    config = run.config
    grid = config.lr_grid or (config.lr,)
    saved = run.resumable.saved if run.resumable is not None else None
    position = Grid(**saved["grid"]) if saved is not None else Grid()
    candidate: Fit | None = None
    for index in range(position.index, len(grid)):
        lr = grid[index]
        position.index = index
        if config.lr_grid:
            run.log(f"learning rate {lr:g} of the grid {', '.join(f'{v:g}' for v in config.lr_grid)}")
        candidate = fit_one(replace(run, config=replace(config, lr=lr)), checkpoint, position)
        position.scores[f"{lr:g}"] = candidate.best_score
        if position.best is None or candidate.best_score > position.best["best_score"]:
            position.best = candidate.record()
    assert candidate is not None and position.best is not None
    return Fit.from_record(position.best, candidate), position.scores


def fit_one(run: Run, checkpoint: Path | None, grid: Grid) -> Fit:
    """Initialise (or resume), then train with ``config.method`` until ``max_iters`` or early stopping."""
    model, step_model, init = initial_model(run, checkpoint)
    step, stream, method = training_step(run, model, step_model)
    state = Selected(best_state=copy.deepcopy(model.state_dict()), patience_left=run.config.patience)
    tracker = None
    if run.tracking is not None:
        config = run.config
        tracker = ConflictTracker(
            run.tracking, run.batches, run.table, config.max_iters, device=run.device, precision=run.precision,
            normalization=config.normalization, every=config.track_every,
        )  # fmt: skip
    loop = Loop(run, model, step_model, step, stream, method, state, grid, tracker=tracker)
    resumed = loop.resume()
    iteration = loop.train()
    if tracker is not None:
        tracker.finish(model)
    synchronize(run.device)
    train_time = time.perf_counter() - loop.t_steady - loop.eval_time
    return Fit(
        model, step_model, state.best_state, state.best_score, state.best_iteration, iteration, state.stopped_early,
        state.curve, loop.steady_images, train_time, init, step.kind, resumed,
        tracker.rows(iteration) if tracker is not None else None,
    )  # fmt: skip


def initial_model(run: Run, checkpoint: Path | None) -> tuple[nn.Module, nn.Module, dict[str, object] | None]:
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
        head = head_name(model) + "."
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith(head))
    model = model.to(run.device)
    if run.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    step_model: nn.Module = torch.compile(model) if config.compile else model  # type: ignore[assignment]
    return model, step_model, init


def training_step(
    run: Run, model: nn.Module, step_model: nn.Module
) -> tuple[EagerStep | GraphStep, BatchStream, Method]:
    """The method's training step and the stream of batches it takes, each seeded from the run's seed."""
    config, table, groups = run.config, run.table, run.grouping[0]
    head = model.get_submodule(head_name(model))
    shapes = {"features": float(getattr(head, "in_features", 0)), "classes": float(run.table.num_classes)}
    shapes["method_seed"] = float(seed_for(config.seed, run.table.benchmark, "method") % 2**31)
    method = build_method(
        config.method, groups[run.train_rows], int(groups.max()) + 1, {**method_params(config), **shapes}, run.device
    )
    captured: list[torch.Tensor] = []
    if method.needs_features:  # the input of the last layer
        model.get_submodule(head_name(model)).register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))

    generator = torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "batches"))
    step = build_step(
        StepInputs(
            model, step_model, method, config, run.batches, torch.from_numpy(table.y), torch.from_numpy(groups),
            torch.Generator().manual_seed(seed_for(config.seed, table.benchmark, "augment")), run.device,
            run.precision, run.channels_last, captured,
        ),
        run.log,
    )  # fmt: skip
    return step, batch_stream(config, method.default_loader, run.train_rows, groups, generator), method


def batch_stream(
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
    names: tuple[str, ...] = ("groupdro_eta", "irm_lambda", "irm_anneal_iters", "coral_lambda", "lr", "weight_decay")
    names += tuple(f.name for f in fields(config) if f.name.startswith(("cdann_", "causirl_", "mixup_", "sagnet_")))
    return {name: float(getattr(config, name)) for name in names}

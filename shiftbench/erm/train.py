"""ERM training with early stopping and model selection, then WILDS-style evaluation of every split.

Protocol (the papers' presets live in ``specs/erm.yaml``): iterations, not epochs; evaluate the
selection split every ``eval_every`` iterations; keep the best weights; stop after ``patience``
evaluations without improvement (ConDS Appendix A.4) or at ``max_iters``. Model selection uses
OOD validation (``val``) when the split has one, else ID validation (``id_val``) (WILDS Section
5.3); the results say which. On a GPU: bf16 autocast, channels_last, optional torch.compile. On
CPU: deterministic algorithms, so a seed gives the same weights and metrics every run.

The run is made here (settings checked, images loaded), fitted in :mod:`shiftbench.erm.fit` (the loop:
:mod:`shiftbench.erm.loop`; what the fits share and the evaluation: :mod:`shiftbench.erm.run`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.conflicts import layout
from shiftbench.erm.data import Batches, training_groups
from shiftbench.erm.fit import Fit, fit_grid
from shiftbench.erm.photos import PhotoBatches, Prepare
from shiftbench.erm.run import Log, Resumable, Run
from shiftbench.errors import InputError
from shiftbench.runtime.cpus import available_cpus
from shiftbench.scoring.metrics import Metric, gap_metrics
from shiftbench.scoring.training_conflicts import SubsetDescriptor
from shiftbench.splits.split_table import SplitTable


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
    conflicts: dict[str, list[object]] | None = None  # track_conflicts: erm_training_conflicts' columns


@dataclass(frozen=True)
class Prepared:
    """Where a run keeps prepared copies of its training photographs (``decode: prepared``), and the identity of
    its images (split version, root, template) that names a copy."""

    parent: Path
    identity: dict[str, object]


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
    if config.selection == "test_oracle":
        if "test" not in splits:
            raise InputError("the benchmark has no 'test' split to choose on", parameter="selection")
        return "test"
    if config.selection != "auto":
        if config.selection not in splits:
            raise InputError(f"the benchmark has no {config.selection!r} split", parameter="selection")
        return config.selection
    return next((s for s in ("val", "id_val") if s in splits), None)


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


def _prepare(
    table: SplitTable, paths: Sequence[Path], config: TrainConfig, log: Log, subsets: SubsetDescriptor | None,
    prepared: Prepared | None,
) -> tuple[Run, float]:  # fmt: skip
    """The run's settings checked and its images loaded (with the seconds that took)."""
    device, precision, channels_last = _compute(config)
    train_rows, selection = _rows_and_selection(table, config)
    tracking = None
    if config.track_conflicts:
        if subsets is None:
            raise InputError(f"{table.benchmark} carries no subsets to track", parameter="track_conflicts")
        tracking = layout(table, subsets, config.train_split)
    groups, group_labels = training_groups(table, config.group_by)
    if device.type == "cpu":
        _deterministic(compiled=config.compile)
        torch.set_num_threads(cpu_threads(config))
    t0 = time.perf_counter()
    where = None
    if prepared is not None:
        where = Prepare(prepared.parent, prepared.identity, train_rows, config.prepared_side, log)
    batches = make_batches(paths, config, device, where)
    load_s = time.perf_counter() - t0
    present = len(np.unique(groups[train_rows]))
    log(
        f"{len(paths):,} images {_how_loaded(config, batches, device)} in {load_s:.1f}s; training {config.model} "
        f"({config.method}, {present} training groups by {config.group_by}) on {len(train_rows):,} "
        f"{config.train_split} examples, selection on {selection or 'the last iterate'}, {precision}"
    )
    run = Run(
        table, batches, config, train_rows, (groups, group_labels), selection, device, precision, channels_last, log,
        tracking=tracking,
    )  # fmt: skip
    if tracking is not None:
        log(
            f"tracking training conflicts: {len(tracking.training)} training subsets x {len(tracking.evaluation)} "
            f"evaluation subsets ({tracking.eval_rows.size:,} images evaluated after every step)"
        )
    return run, load_s


def make_batches(
    paths: Sequence[Path], config: TrainConfig, device: torch.device, prepared: Prepare | None = None
) -> Batches | PhotoBatches:
    """The run's images: squares (``transforms: square``, cached when they fit) or a paper's protocol on the
    photographs (:mod:`shiftbench.erm.photos`)."""
    every = np.arange(len(paths))
    if config.transforms == "square":
        return Batches(paths, config, device, every)
    return PhotoBatches(paths, config, device, every, prepared)


def _how_loaded(config: TrainConfig, batches: Batches | PhotoBatches, device: torch.device) -> str:
    if config.transforms == "square":
        return f"cached on {device.type}" if batches.cached else "decoded per batch"
    evaluated = f"cached on {device.type}" if batches.cached else "decoded per batch"
    return f"under {config.transforms} (training crops per batch, evaluation images {evaluated})"


def _final_metrics(run: Run, fit: Fit) -> list[Metric]:
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
    subsets: SubsetDescriptor | None = None,
    prepared: Prepared | None = None,
) -> TrainResult:
    """Train on ``config.train_split`` (once per learning rate of ``lr_grid``), select on the selection
    split, evaluate every split. With ``resumable``: checkpoint, stop on a signal (raising
    :class:`~shiftbench.erm.interrupt.Interrupted`) and continue from ``resumable.saved``. With
    ``config.track_conflicts``: the split's ``subsets`` tracked after every step (:mod:`shiftbench.erm.conflicts`)."""
    started = time.perf_counter()
    run, load_s = _prepare(table, paths, config, log, subsets, prepared)
    run = replace(run, resumable=resumable)
    resumed_from = int(resumable.saved["iteration"]) if resumable is not None and resumable.saved else None
    timings = {"load_images_s": load_s}
    t_train = time.perf_counter()
    fit, grid_scores = fit_grid(run, checkpoint)
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
        conflicts=fit.conflicts,
    )


def _deterministic(*, compiled: bool) -> None:
    """``torch.use_deterministic_algorithms(True)``, which also imports ``torch._inductor`` to set its flag (1.5-3 s
    of every training process on CPU): only a compiled model needs that flag, the eager step needs the switch."""
    if compiled:
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)

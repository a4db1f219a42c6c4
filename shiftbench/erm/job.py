"""The training job's entry point: ``python -m shiftbench.erm.job`` (under Dagster Pipes or by hand).

Lean on purpose (docs/architecture.md, "Training"): it imports torch, numpy, pyarrow, Pillow and,
when launched by Dagster, ``dagster-pipes`` (no dependencies of its own), so it runs in a plain
GPU image. Everything dataset-specific (where images are, which preset) is resolved by the
launcher and arrives as one JSON job description:

    {"split_dir": ".../store/conds/<benchmark>/versions/<version>",
     "image_root": "...", "path_template": "images/{}.png",
     "config": {... TrainConfig ...}, "out_dir": "...",
     "checkpoint": "..."}  (optional: the file a registered init_checkpoint name resolved to)

Outputs in ``out_dir``: ``metrics.parquet`` (eval_split, metric, group, value), ``curve.parquet``
(iteration, split, metric, value), ``model.pt`` and ``run.json`` (with ``track_conflicts``, ``conflicts.parquet``:
the columns of ``erm_training_conflicts`` without the run's keys); or ``error.json`` with the
message of a bad input (exit code 2). The launcher publishes the results; this job never writes
to the store.

Interruption (:mod:`shiftbench.erm.interrupt`, :mod:`shiftbench.erm.resume`): the job checkpoints into
``out_dir/resume/`` every ``checkpoint_every`` iterations; on SIGINT, SIGTERM, SIGUSR1 or SIGHUP (held from its
first line until training begins) it checkpoints at the next step boundary, writes ``interrupted.json`` (what its
one line says), records the attempt in ``attempts.jsonl`` and exits 130 (SIGINT) or 75 (the others: run it again);
the attempt of a job (``launch``, or the Slurm job) that makes it ``max_stalled_attempts`` in a row without a step
fails instead (exit 2). The same job description run again resumes from the checkpoint; the checkpoint of another
run is refused (exit 2). ``run.json``, written last and atomically, commits the outputs: a folder holding one of
the same run is returned as it is, never trained again (:mod:`shiftbench.erm.run_folder`), and the checkpoint
folder is then discarded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shiftbench.erm.interrupt import SIGNALS
from shiftbench.runtime.cpus import yielding_waits

yielding_waits()  # before torch loads OpenMP: waiting threads sleep instead of spinning against other work
if __name__ == "__main__":  # the job's own process: a stop is held (before torch starts threads) until it is answered
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # shiftbench.erm.interrupt.stop_requests unblocks them

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from shiftbench.erm import resume, run_folder  # noqa: E402
from shiftbench.erm.config import TrainConfig  # noqa: E402
from shiftbench.erm.interrupt import (  # noqa: E402
    STOPPED_AT_ONCE,
    Interrupted,
    Stopped,
    job_lock,
    kill_point_for_tests,
    stop_requests,
)
from shiftbench.erm.models import build_model, load_checkpoint  # noqa: E402
from shiftbench.erm.run import Resumable  # noqa: E402
from shiftbench.erm.train import Prepared, TrainResult, cpu_threads, train  # noqa: E402
from shiftbench.errors import InputError  # noqa: E402
from shiftbench.runtime.cache import home_record  # noqa: E402
from shiftbench.scoring.training_conflicts import SubsetDescriptor, subset_descriptor  # noqa: E402
from shiftbench.splits.images import image_paths  # noqa: E402
from shiftbench.splits.split_table import SplitTable, read_split  # noqa: E402

JOB_FORMAT = 1


def _stderr(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def run_job(job: dict[str, Any], log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Train and write the outputs; returns the run summary (also ``run.json``). A folder an earlier attempt of the
    same run finished is not trained again: its summary is returned as it is (:mod:`shiftbench.erm.run_folder`)."""
    for key in ("split_dir", "image_root", "path_template", "config", "out_dir"):
        if key not in job:
            raise InputError("missing from the job description", parameter=key)
    out_dir = Path(job["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    with job_lock(out_dir):
        return _run_locked(job, out_dir, log)


def _run_locked(job: dict[str, Any], out_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    config = TrainConfig.from_mapping(job["config"])
    table = read_split(Path(job["split_dir"]))
    checkpoint = job.get("checkpoint") or config.init_checkpoint
    if checkpoint:  # a checkpoint that does not fit is refused before anything is loaded or logged
        check_checkpoint(config, table.num_classes, Path(checkpoint))
    identity = _identity(job, config, table, checkpoint)
    done = run_folder.finished(out_dir)
    if done is not None and not resume.differences(done.get("identity") or {}, identity):
        run_folder.discard_checkpoints(out_dir)  # a kill during the last attempt's clean-up may have left it
        log(f"{table.benchmark} version {table.version}: finished by an earlier attempt; its outputs are kept")
        return done
    for name in run_folder.STALE:
        (out_dir / name).unlink(missing_ok=True)
    label = f"{table.benchmark} seed {config.seed}"
    limit = int(job.get("max_stalled_attempts") or run_folder.MAX_STALLED_ATTEMPTS)
    job_id, node = _where(job)
    gave_up = run_folder.stall_line(run_folder.attempts(out_dir), limit, job_id)
    if gave_up is not None:  # a requeue that keeps stopping at the same point (a preemption requeues regardless)
        raise InputError(f"{label}: {gave_up}")
    paths = image_paths(table.example_ids, Path(job["image_root"]), job["path_template"])
    subsets = _subsets(Path(job["split_dir"]), table) if config.track_conflicts else None
    checkpoints = resume.Checkpoints(out_dir / run_folder.RESUME, identity)
    loaded = checkpoints.load()  # another run's or a damaged checkpoint is refused here, before training
    log(f"{table.benchmark} version {table.version}: {len(paths):,} examples, {table.num_classes} classes")
    started = int(loaded[0]["iteration"]) if loaded else 0
    with stop_requests() as stop:
        resumable = Resumable(checkpoints, stop, config.checkpoint_every, label, loaded[0] if loaded else None)
        try:
            result = train(
                table, paths, config, out_dir, log, checkpoint=Path(checkpoint) if checkpoint else None,
                resumable=resumable, subsets=subsets, prepared=_prepared(job, out_dir, table, identity),
            )  # fmt: skip
        except Interrupted as stopped:  # the launcher reads what happened (its one line, the exit code)
            attempt = run_folder.Attempt(
                started, stopped.iteration, signal.Signals(stopped.signum).name, resumable.progress, job_id, node
            )
            _record_stop(out_dir, stopped, attempt, limit)
            raise
        except Stopped as stopped:
            _record_stop(out_dir, stopped)
            raise
        except KeyboardInterrupt:  # a second Ctrl-C (shiftbench.erm.interrupt)
            _record_stop(out_dir, STOPPED_AT_ONCE)
            raise STOPPED_AT_ONCE from None
    _write_outputs(out_dir, result)
    kill_point_for_tests("outputs")
    summary = {
        "job_format": JOB_FORMAT,
        "benchmark": table.benchmark,
        "split_version": table.version,
        "config": config.as_dict(),
        "selection_split": result.selection_split,
        "selection_metric": config.selection_metric,
        "best_iteration": result.best_iteration,
        "iterations": result.iterations,
        "stopped_early": result.stopped_early,
        "device": result.device,
        "precision": result.precision,
        "step": result.step,
        "threads": result.threads,
        "cached": result.cached,
        "train_images_per_s": result.train_images_per_s,
        "timings": result.timings,
        "weights": {"file": result.weights_path.name, "sha256": result.weights_sha256},
        "torch": torch.__version__,
        "splits": {s: int(table.indices(s).size) for s in table.split_names},
        "metadata_fields": table.metadata_fields,
        "training_groups": result.training_groups,
        "lr_grid_scores": result.lr_grid_scores,
        "init": result.init,
        "resumed_from": result.resumed_from,
        "identity": identity,  # what a later attempt compares before it keeps these outputs
    }
    run_folder.write_json(out_dir / run_folder.RUN_JSON, summary)  # the commit: every output is in place
    kill_point_for_tests("run.json")
    run_folder.discard_checkpoints(out_dir, before_delete=lambda: kill_point_for_tests("discard"))
    return summary


def _prepared(job: dict[str, Any], out_dir: Path, table: SplitTable, identity: dict[str, Any]) -> Prepared:
    """Prepared copies of training photographs live in the warehouse's cache (shared by every run of the split),
    or beside the run when the job was given no warehouse."""
    parent = Path(job["home"]) / "cache" / "prepared" if job.get("home") else out_dir / "prepared"
    return Prepared(parent, {"split_version": table.version, **identity["images"]})


def _where(job: dict[str, Any]) -> tuple[str | None, str | None]:
    """The job this attempt belongs to (a Slurm task ``<array>_<index>`` or job id, the same across its requeues;
    else the launcher's ``launch`` id, a Dagster run's across its retries; None when started by hand) and the node."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    slurm_job = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")
    launch = job.get("launch")
    return slurm_job or (str(launch) if launch else None), socket.gethostname().split(".")[0]


def _record_stop(out_dir: Path, stopped: Stopped, attempt: run_folder.Attempt | None = None, limit: int = 0) -> None:
    """``interrupted.json`` for the launcher; a checkpointed stop also joins ``attempts.jsonl``, and the stop that
    makes the run give up (no progress in ``limit`` attempts in a row) becomes a failure, not a requeue."""
    if attempt is not None:
        run_folder.record_attempt(out_dir, attempt)
        gave_up = run_folder.stall_line(run_folder.attempts(out_dir), limit, attempt.job_id)
        if gave_up is not None:
            raise InputError(f"{stopped.line().split(':', 1)[0]}: {gave_up}") from None
    (out_dir / run_folder.INTERRUPTED_JSON).write_text(json.dumps(stopped.as_dict()), encoding="utf-8")


def _identity(job: dict[str, Any], config: TrainConfig, table: SplitTable, checkpoint: str | None) -> dict[str, Any]:
    """What the run's checkpoint must match (shiftbench.erm.resume): the split, config, images, init weights, code
    and, on CPU, the thread count (oneDNN splits reductions by thread) and the device ``auto`` chose."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device
    root = Path(job["image_root"])  # inside the warehouse: named relative to it, so a moved warehouse resumes
    identity = resume.identity(
        table.benchmark, table.version, config.as_dict(),
        {"root": home_record(root, Path(job["home"])) if job.get("home") else str(root),
         "template": str(job["path_template"])},
        hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest() if checkpoint else None,
    )  # fmt: skip
    identity["device"] = device
    if device == "cpu":
        identity["threads"] = cpu_threads(config)  # what the run sets (shiftbench.erm.train)
    return identity


def _subsets(split_dir: Path, table: SplitTable) -> SubsetDescriptor:
    """The split's subset descriptor (its manifest's ``subsets``), for ``track_conflicts``."""
    manifest = json.loads((split_dir / "manifest.json").read_text("utf-8"))
    return subset_descriptor(manifest, table.benchmark)


def check_checkpoint(config: TrainConfig, num_classes: int, checkpoint: Path) -> None:
    """Whether ``checkpoint`` fits the model the run trains (:func:`load_checkpoint` into a throwaway model)."""
    model = build_model(config.model, num_classes, config.image_size)
    load_checkpoint(
        model, checkpoint, keep_head=not config.linear_probe, partial=config.init_partial, name=config.init_checkpoint
    )


def _write_outputs(out_dir: Path, result: TrainResult) -> None:
    metrics = pa.table(
        {
            "eval_split": [m.eval_split for m in result.metrics],
            "metric": [m.metric for m in result.metrics],
            "group": pa.array([m.group for m in result.metrics], pa.string()),
            "value": pa.array([m.value for m in result.metrics], pa.float64()),
        }
    )
    pq.write_table(metrics, out_dir / "metrics.parquet")
    curve = pa.table(
        {
            "iteration": pa.array([c[0] for c in result.curve], pa.int64()),
            "split": [c[1] for c in result.curve],
            "metric": [c[2] for c in result.curve],
            "value": pa.array([c[3] for c in result.curve], pa.float64()),
        }
    )
    pq.write_table(curve, out_dir / "curve.parquet")
    if result.conflicts is not None:
        pq.write_table(pa.table(result.conflicts), out_dir / "conflicts.parquet")


def _fail(out_dir: Path | None, exc: InputError, *, show: bool = True) -> int:
    """A bad input: ``error.json`` for the launcher, and one line on stderr when nobody else says it."""
    if show:
        _stderr(f"error: {exc}")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "error.json").write_text(json.dumps({"error": str(exc)}), encoding="utf-8")
    return 2


def _run_under_pipes() -> int:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        job = pipes.get_extra("job")
        out_dir = Path(job["out_dir"]) if "out_dir" in job else None
        try:
            started = time.perf_counter()

            def log(message: str) -> None:
                pipes.log.info(message)  # the Dagster run's event log
                _stderr(message)  # the terminal, through the forwarded stdio

            summary = run_job(job, log=log)
        except InputError as exc:  # the launcher reads error.json and says it in one line
            return _fail(out_dir, exc, show=False)
        except Stopped as stopped:  # the launcher reads interrupted.json and says it in one line
            pipes.log.warning(stopped.line())
            return stopped.exit_code
        except KeyboardInterrupt:  # a second Ctrl-C before training started
            return STOPPED_AT_ONCE.exit_code
        pipes.report_custom_message({"run": summary, "wall_s": time.perf_counter() - started})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from dagster_pipes import PipesEnvVarParamsLoader

        loader = PipesEnvVarParamsLoader()  # type: ignore[no-untyped-call]
        if argv is None and loader.is_dagster_pipes_process():
            return _run_under_pipes()
    except ImportError:  # a GPU image without dagster-pipes: the job still runs by hand
        pass
    parser = argparse.ArgumentParser(prog="python -m shiftbench.erm.job", description=__doc__.splitlines()[0])
    parser.add_argument("job", type=Path, help="a JSON job description (see the module docstring)")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text(encoding="utf-8"))
    try:
        run_job(job)
    except InputError as exc:
        return _fail(Path(job["out_dir"]) if "out_dir" in job else None, exc)
    except Stopped as stopped:
        _stderr(stopped.line())
        return stopped.exit_code
    except KeyboardInterrupt:  # Ctrl-C before training started: nothing to keep
        _stderr(STOPPED_AT_ONCE.line())
        return STOPPED_AT_ONCE.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

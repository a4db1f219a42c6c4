"""Launching ERM runs: from a benchmark name to a job description, and from job outputs to a version.

The launcher knows the warehouse (which version, which preset, and where the images are: the split's manifest
says, see :mod:`shiftbench.splits.images`); the job (:mod:`shiftbench.erm.job`) knows only torch. Between them
travels one JSON job description, so the same job runs in-process, as a local subprocess or in a GPU pod. This
module imports no torch.

Results take the path every table takes: staged as a content-addressed version of the *run*
``<benchmark>.<preset>.<model>.seed<N>`` (family ``erm``; ``<preset>-<hash>`` when its training parameters depart
from the preset's; ``...seed<N>@standin`` when it trained on generated stand-in images, so such a run never shares a
name, a version lineage or an aggregate with a real one), checked against the contracts of ``erm_results``,
``erm_runs`` and ``erm_curves`` (the check is recorded), then published by the store, which refuses an unchecked or
failed version. The run's tables carry the split's ``benchmark`` and ``split_version``; the weights, the learning
curve and the ID-vs-OOD plot are attached to the version (``files/``) and listed with checksums in its manifest.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.erm import checkpoints, run_folder
from shiftbench.erm.config import EXECUTION_ONLY, TrainConfig, coerce_value
from shiftbench.erm.search import SEARCH_KEYS, searched_config
from shiftbench.errors import InputError, ShiftbenchError
from shiftbench.families import registry
from shiftbench.results import plots
from shiftbench.scoring.training_conflicts import check_intervals, subset_descriptor, tracked_intervals
from shiftbench.specs.naming import tagged
from shiftbench.specs.spec_model import merge_named, spec_document, spec_texts
from shiftbench.splits.images import STANDIN, ImageSource
from shiftbench.splits.published import PublishedSplit, published_split, split_images
from shiftbench.splits.standin import GENERATOR_VERSION as STANDIN_VERSION
from shiftbench.store import StagedVersion, check_benchmark_name
from shiftbench.store.contracts import RuleResult
from shiftbench.tables.fingerprint import sha256_json
from shiftbench.warehouse import cards
from shiftbench.warehouse.publishing import PublishOutcome, environment, publish_checked, stage_and_check

FAMILY = "erm"
CONFLICTS_FIGURE = "training_conflicts.png"  # the heatmap of a run with track_conflicts (MetaShift Figure 4)
CODE_VERSION = "erm-3"


@dataclass(frozen=True)
class RunPlan:
    run: str
    benchmark: str
    family: str
    dataset: str
    split_version: str
    split_dir: Path
    preset: str
    config: dict[str, Any]
    images: ImageSource
    n_train: int
    checkpoint: Path | None = None  # the verified file init_checkpoint names (shiftbench.erm.checkpoints)
    home: Path | None = None  # the warehouse: what lies inside it is named relative to it in a checkpoint's identity

    def job(self, out_dir: Path) -> dict[str, Any]:
        return {
            "split_dir": str(self.split_dir),
            "image_root": str(self.images.root),
            "path_template": self.images.template,
            "config": self.config,
            "out_dir": str(out_dir),
            **({"checkpoint": str(self.checkpoint)} if self.checkpoint else {}),
            **({"home": str(self.home)} if self.home else {}),
        }


def load_presets(extra: Path | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The shipped presets, then those of ``extra`` (``SHIFTBENCH_ERM_PRESETS``, same layout).

    A user's file adds presets and family defaults; reusing a shipped preset's name is an error
    naming both files (a preset name always means the same protocol).
    """
    parts: list[tuple[dict[str, dict[str, Any]], str]] = []
    defaults: dict[str, str] = {}
    for text, source in spec_texts("erm", extra, "SHIFTBENCH_ERM_PRESETS"):
        data = spec_document(text, source, {"presets": dict, "defaults": dict})
        presets: dict[str, dict[str, Any]] = {}
        for name, values in (data.get("presets") or {}).items():
            if not isinstance(values, dict):
                raise InputError(f"preset {name!r} must be a mapping of parameters", path=source)
            check_preset_name(str(name), source)
            presets[str(name)] = dict(values)
        parts.append((presets, source))
        defaults.update({str(k): str(v) for k, v in (data.get("defaults") or {}).items()})
    return merge_named(parts, "preset"), defaults


def check_preset_name(name: str, source: str) -> str:
    """Preset names become parts of run names (and so of paths): letters, digits, '-' and '_' only."""
    if not name or not all(c.isalnum() or c in "-_" for c in name) or name.startswith("-"):
        raise InputError(f"invalid preset name {name!r}: use letters, digits, '-' and '_'", path=source)
    return name


def _preset_for(settings: Settings, split: PublishedSplit, preset: str | None) -> tuple[str, dict[str, Any]]:
    """The preset asked for, else the family default: ``family/dataset``, then ``family/param=value``
    (a split parameter, e.g. ``breeds/level=5`` for BREEDS' 450-epoch tasks), then ``family``."""
    presets, defaults = load_presets(settings.erm_presets)
    params = split.manifest.get("params", {})
    by_param = [
        name
        for key, name in defaults.items()
        if key.startswith(f"{split.family}/") and "=" in key
        and str(params.get(key.split("/", 1)[1].split("=")[0])) == key.split("=", 1)[1]
    ]  # fmt: skip
    name = preset or defaults.get(f"{split.family}/{split.dataset}") or next(iter(by_param), defaults[split.family])
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; known: {', '.join(sorted(presets))}", parameter="preset")
    return name, dict(presets[name])


def resolve_config(values: Mapping[str, Any], n_train: int, given: Collection[str] = ()) -> dict[str, Any]:
    """A full, validated TrainConfig dict; epoch counts (:data:`EPOCH_PARAMETERS`) become iterations for this
    training split. What the user set (``given``: ``--set``, the launchpad) wins over the preset in either unit: a
    user's ``max_iters`` over a preset's ``max_epochs``, a user's ``max_epochs`` over a preset's ``max_iters`` (so
    for ``lr_drop_epochs`` and ``lr_milestones``); a user's pair in both units at once is refused.

    A batch larger than the training split is refused when the user set it (``given``: it would train a few
    iterations on the whole split each, silently); a preset's batch is capped at the split there.
    """
    values = model_rate(user_schedule(values, given), given)
    batch = coerce_value(values.get("batch_size", TrainConfig.batch_size), "int", "batch_size")
    if batch < 1:
        raise InputError(f"must be an integer >= 1, got {batch}", parameter="batch_size")
    if batch > n_train:
        if "batch_size" in given:
            raise InputError(
                f"{batch:,} is larger than the {n_train:,} training examples: at most {n_train:,}",
                parameter="batch_size",
            )
        batch = values["batch_size"] = n_train
    per_epoch = max(1, math.ceil(n_train / batch))
    for epochs, (iterations, kind) in EPOCH_PARAMETERS.items():
        if epochs in values:
            scaled = [count * per_epoch for count in epoch_counts(epochs, values.pop(epochs))]
            values[iterations] = scaled if kind.startswith("tuple") else scaled[0]
    return TrainConfig.from_mapping(values).as_dict()


def plan_run(
    settings: Settings,
    benchmark: str,
    *,
    version: str | None = None,
    seed: int = 0,
    preset: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    image_root: str | None = None,
    path_template: str | None = None,
) -> RunPlan:
    """Everything a run needs, checked before anything trains."""
    split = published_split(settings, benchmark, version, refusal=registry.unpublished_paper_name)
    name, preset_values = _preset_for(settings, split, preset)
    values = {**preset_values, **dict(overrides or {}), "seed": seed}
    train_split = str(values.get("train_split", "train"))
    n_train = split.examples.filter(pl.col("split") == train_split).height
    if n_train == 0:
        family = registry.find(split.family)
        hint = f" ({family.no_training_examples})" if family is not None and family.no_training_examples else ""
        raise InputError(
            f"{benchmark} version {split.version} has no {train_split!r} examples to train on{hint}",
            parameter="benchmark",
        )
    pinned = {k: v for k, v in (overrides or {}).items() if k not in SEARCH_KEYS}
    values, drawn = searched_config(values, pinned, n_train)
    config = resolve_config(values, n_train, given=set(overrides or {}) | drawn)
    if config.get("track_conflicts"):  # refused before anything trains: the subsets, and enough steps to separate them
        training = subset_descriptor(split.manifest, benchmark).training
        check_intervals(tracked_intervals(config["max_iters"], config["track_every"]), len(training))
    checkpoint = (
        checkpoints.resolve(config["init_checkpoint"], config["model"], settings.checkpoint_dir)
        if config.get("init_checkpoint")
        else None
    )
    images = split_images(settings, split, image_root, path_template)
    preset_config = resolve_config(
        {**preset_values, "model": config["model"], "seed": seed}, n_train
    )  # its protocol for the model
    run = run_name(benchmark, name, config, preset_config, images.kind)
    return RunPlan(
        run, benchmark, split.family, split.dataset, split.version, split.path, name, config, images, n_train,
        checkpoint, settings.home,
    )  # fmt: skip


def selection_label(split: str | None) -> str:
    """How a run's selection split reads where a user sees it: none, or the test split said to be a test-set choice."""
    if split is None:
        return "none (the last iterate)"
    return "test (test_oracle: a test-set choice, not a validation)" if split == "test" else split


def run_name(
    benchmark: str, preset: str, config: Mapping[str, Any], preset_config: Mapping[str, Any], image_source: str
) -> str:
    """``<benchmark>.<preset>.<model>.seed<N>`` (``<model>.<method>`` for methods beside ERM); a run that
    departs from its preset in anything it learns from is not that preset's run, so its name carries a
    hash of the changes: ``<preset>-<hash>``. A run on generated stand-in images is not a result on the
    split's images: its name is tagged ``...seed<N>@standin`` (``NAME@TAG``, as :mod:`shiftbench.specs.naming` tags
    benchmarks), so it never becomes the latest of, or is averaged with, the run on real images."""
    changed = {
        key: value
        for key, value in config.items()
        if key not in EXECUTION_ONLY | {"model", "method", "seed"} and value != preset_config.get(key)
    }
    protocol = f"{preset}-{sha256_json(changed)[:8]}" if changed else preset
    method = config.get("method", "erm")
    learner = config["model"] if method == "erm" else f"{config['model']}.{method}"
    name = f"{benchmark}.{protocol}.{learner}.seed{config['seed']}"
    return check_benchmark_name(tagged(name, STANDIN if image_source == STANDIN else None), "benchmark")


# Schedules a preset, ``--set`` or the launchpad may give in epochs of the training split: the iterations parameter
# of TrainConfig each becomes (resolve_config) and its type (``--set`` and launchpad values are read as it is).
EPOCH_PARAMETERS: dict[str, tuple[str, str]] = {
    "max_epochs": ("max_iters", "int"),
    "lr_drop_epochs": ("lr_milestones", "tuple[int, ...]"),
}


def user_schedule(values: Mapping[str, Any], given: Collection[str]) -> dict[str, Any]:
    """``values`` with the user's unit of each schedule kept and the preset's other unit dropped: the user's
    ``max_iters=2`` is never overwritten by a preset's ``max_epochs``."""
    kept = dict(values)
    for epochs, (iterations, _) in EPOCH_PARAMETERS.items():
        if epochs in given and iterations in given:
            raise InputError(f"give {epochs} or {iterations}, not both (the same schedule)", parameter=epochs)
        if iterations in given:
            kept.pop(epochs, None)
        elif epochs in given:
            kept.pop(iterations, None)
    return kept


def model_rate(values: Mapping[str, Any], given: Collection[str]) -> dict[str, Any]:
    """A preset's ``lr_by_model`` (BREEDS Table 13: 0.01 for AlexNet and VGG-11, 0.1 for the rest) applied to the run's
    model, unless the user set ``lr``; the key itself is the preset's, never a training parameter."""
    if "lr_by_model" in given:
        raise InputError("a preset's key, not a training parameter: set lr (and model)", parameter="lr_by_model")
    kept = dict(values)
    rates = kept.pop("lr_by_model", None) or {}
    if not isinstance(rates, Mapping) or not all(isinstance(r, int | float) and r > 0 for r in rates.values()):
        raise InputError(f"must map model names to learning rates > 0, got {rates!r}", parameter="lr_by_model")
    model = kept.get("model", TrainConfig.model)
    if model in rates and "lr" not in given:
        kept["lr"] = float(rates[model])
    return kept


def epoch_counts(name: str, value: Any) -> tuple[int, ...]:
    """An epoch parameter's value as whole epochs >= 1 (``max_epochs``: one count, ``lr_drop_epochs``: a list)."""
    kind = EPOCH_PARAMETERS[name][1]
    if kind.startswith("tuple") and isinstance(value, int) and not isinstance(value, bool):
        value = [value]  # --set lr_drop_epochs=100: one drop
    coerced = coerce_value(value, kind, name)
    counts: tuple[int, ...] = coerced if isinstance(coerced, tuple) else (coerced,)
    if any(count < 1 for count in counts):
        raise InputError(f"must be whole epochs >= 1, got {value!r}", parameter=name)
    return counts


def result_tables(plan: RunPlan, out_dir: Path) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """The run's tables from the job's outputs, and its summary (``run.json``)."""
    summary: dict[str, Any] = json.loads((out_dir / "run.json").read_text("utf-8"))
    if summary["split_version"] != plan.split_version or summary["benchmark"] != plan.benchmark:
        raise InputError(f"{out_dir}: outputs belong to another split", parameter="out_dir")
    common = {
        "run": plan.run,
        "split_version": plan.split_version,
        "family": plan.family,
        "model": plan.config["model"],
        "method": plan.config.get("method", "erm"),
        "preset": plan.preset,
        "seed": plan.config["seed"],
    }
    keyed = [pl.lit(v).alias(k) for k, v in common.items()]
    results = (
        pl.read_parquet(out_dir / "metrics.parquet").with_columns(keyed).with_columns(pl.col("seed").cast(pl.Int64))
    )
    curves = pl.read_parquet(out_dir / "curve.parquet").with_columns(
        pl.lit(plan.run).alias("run"), pl.lit(plan.split_version).alias("split_version")
    )
    config = summary["config"]
    if summary.get("init") is not None:  # what init_checkpoint loaded, recorded with the run
        config = {**config, "init": summary["init"]}
    runs = pl.DataFrame(
        [
            {
                **common,
                "benchmark": plan.benchmark,
                "dataset": plan.dataset,
                "selection_split": summary["selection_split"],
                "selection_metric": summary["selection_metric"],
                "best_iteration": summary["best_iteration"],
                "iterations": summary["iterations"],
                "stopped_early": summary["stopped_early"],
                "n_train": plan.n_train,
                "device": summary["device"],
                "precision": summary["precision"],
                "image_source": plan.images.kind,
                "config": json.dumps(config, sort_keys=True),
                "weights_sha256": summary["weights"]["sha256"],
            }
        ],
        schema_overrides={
            "seed": pl.Int64,
            "best_iteration": pl.Int64,
            "iterations": pl.Int64,
            "n_train": pl.Int64,
            "selection_split": pl.String,
        },
    )
    tables = {
        "erm_results": results.with_columns(pl.lit(plan.benchmark).alias("benchmark")),
        "erm_curves": curves.with_columns(pl.lit(plan.benchmark).alias("benchmark")),
        "erm_runs": runs,
    }
    if (out_dir / "conflicts.parquet").is_file():  # track_conflicts (shiftbench.scoring.training_conflicts)
        tables["erm_training_conflicts"] = pl.read_parquet(out_dir / "conflicts.parquet").with_columns(
            pl.lit(plan.benchmark).alias("benchmark"), pl.lit(plan.run).alias("run"),
            pl.lit(plan.split_version).alias("split_version"),
        )  # fmt: skip
    return tables, summary


def stage_run(
    settings: Settings, plan: RunPlan, out_dir: Path
) -> tuple[StagedVersion, dict[str, list[RuleResult]], dict[str, Any]]:
    """Stage the job's outputs as a version of the run and record its contract check (not published)."""
    tables, summary = result_tables(plan, out_dir)
    title = f"{plan.run} on {plan.benchmark} {plan.split_version}"
    attachments = {
        "model.pt": (out_dir / "model.pt").read_bytes(),
        "learning_curve.png": plots.erm_learning_curve(tables["erm_curves"], summary["best_iteration"], title),
        "id_vs_ood.png": plots.erm_id_vs_ood(tables["erm_results"], title),
    }
    if "erm_training_conflicts" in tables:
        attachments[CONFLICTS_FIGURE] = plots.training_conflicts(tables["erm_training_conflicts"], title)
    manifest = {
        "code_version": CODE_VERSION,
        "environment": {**environment(), "torch": summary["torch"]},
        "split": {"family": plan.family, "benchmark": plan.benchmark, "version": plan.split_version},
        "images": {
            "root": str(plan.images.root),
            "template": plan.images.template,
            "source": plan.images.kind,
            **({"generator": STANDIN_VERSION} if plan.images.kind == STANDIN else {}),
        },
        "params": plan.config,
        "preset": plan.preset,
        "execution": execution_record(out_dir),
        "weights": {"file": "files/model.pt", "sha256": summary["weights"]["sha256"]},
        "training": {
            **{
                k: summary[k]
                for k in ("device", "precision", "cached", "train_images_per_s", "timings", "selection_split", "splits")
            },
            # Which learning rate of the grid won, on which score; the groups the method trained on.
            "lr_grid_scores": summary.get("lr_grid_scores", {}),
            "training_groups": summary.get("training_groups", []),
            "step": summary.get("step", "eager"),  # eager | graph | static (shiftbench.erm.step)
            "threads": summary.get("threads"),  # torch's CPU threads: CPU results depend on the count
        },
    }
    described = cards.with_split_magnitudes(tables, plan.split_dir)
    from shiftbench.scoring import provenance  # whose images: real | generated | standin

    images = provenance.images_of(plan.images.kind, provenance.data_tag(plan.benchmark))
    grouping = str(plan.config.get("group_by", "group"))
    grouping = "the split's own groups" if grouping == "group" else f"the groups by {grouping}"
    info = cards.CardInfo(
        title=f"ERM baseline ({plan.config.get('model')}, seed {plan.config.get('seed')}) on {plan.benchmark}"
        + provenance.CARD_TITLES.get(images, ""),
        shift=f"Results of one training run on the split {plan.benchmark} (version {plan.split_version}); the shift "
        f"magnitudes below are that split's (table shift_magnitudes of the split version); worst-group accuracy "
        f"(acc_wg) is over {grouping}.{provenance.card_sentence(images)}",
        licences=("Model weights and results: MIT (shiftbench); the training images keep their own licence",),
        citation="Koh, Sagawa et al. WILDS: A Benchmark of in-the-Wild Distribution Shifts. ICML 2021 (evaluation).",
    )

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        shown = [f for f in figures if f.endswith(".png")]
        facts = cards.Version(plan.run, version, {**manifest, "family": FAMILY}, described, files, shown, info)
        return cards.documents(facts)

    staged, results = stage_and_check(
        settings, FAMILY, plan.run, tables, manifest_extra=manifest, attachments=attachments, documents=documents
    )
    return staged, results, summary


def publish_run(settings: Settings, plan: RunPlan, out_dir: Path) -> tuple[PublishOutcome, dict[str, Any]]:
    """Stage, check and publish the job's outputs in one call (library users, notebooks)."""
    staged, results, summary = stage_run(settings, plan, out_dir)
    return publish_checked(settings, staged, results), summary


def execution_record(out_dir: Path) -> dict[str, Any]:
    """Where the run trained: what its launcher recorded in ``execution.json`` (a Slurm job: backend, job id, node;
    shiftbench.erm.slurm), else this machine (a local process or the in-process path); with the attempts stopped on
    a signal, and how many of them were time limits and preemptions (shiftbench.erm.run_folder)."""
    path = out_dir / "execution.json"
    record = dict(json.loads(path.read_text("utf-8"))) if path.is_file() else {}
    record = record or {"backend": "local", "node": socket.gethostname()}
    return {**record, **run_folder.execution_attempts(out_dir)}


def record_execution(out_dir: str | Path, record: Mapping[str, Any]) -> None:
    """Say where a finished job ran (its manifest's ``execution``), for a launcher other than this process."""
    if Path(out_dir).is_dir():  # else the job wrote nothing, which staging reports
        (Path(out_dir) / "execution.json").write_text(json.dumps(dict(record), sort_keys=True), encoding="utf-8")


def job_error(out_dir: Path) -> str | None:
    """The message a failed job left in ``error.json`` (bad input), if any."""
    path = out_dir / "error.json"
    if not path.is_file():
        return None
    return str(json.loads(path.read_text("utf-8"))["error"])


def scratch_dir(settings: Settings, plan: RunPlan, *, restart: bool = False) -> Path:
    """The run's working folder, the same for every attempt of the run (``runs/<run>``): the job's outputs and
    the checkpoint an interrupted attempt left, which the same command resumes from (shiftbench.erm.resume).
    ``restart`` discards what an earlier attempt left. Removed by :func:`discard_scratch` once published."""
    path = settings.runs_dir / plan.run
    if restart and path.exists():
        shutil.rmtree(path)
    return path


def discard_scratch(out_dir: Path) -> None:
    """The run's working folder, once its results are in the store (the job removed its checkpoints already)."""
    shutil.rmtree(out_dir, ignore_errors=True)


class JobKilled(ShiftbenchError):
    """The training job died on a signal it could not answer (SIGKILL: out of memory, killed by hand): one line,
    not a traceback; its folder keeps what it finished."""


def job_killed(message: str) -> JobKilled | None:
    """The one-line failure of a job a Pipes client says ended with a negative code (killed by that signal)."""
    found = re.search(r"failed with code -(\d+)", message)
    if found is None:
        return None
    name = signal.Signals(int(found[1])).name if int(found[1]) in signal.valid_signals() else f"signal {found[1]}"
    return JobKilled(
        f"the training job was killed by {name} (out of memory, or killed by hand): what it finished is kept (its "
        "outputs, else its last checkpoint); run the same command again to complete it"
    )


def job_interrupted(out_dir: Path) -> dict[str, Any] | None:
    """What an interrupted job left in ``interrupted.json`` (its one line, exit code, checkpoint), if anything."""
    path = out_dir / "interrupted.json"
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text("utf-8")))


def headline(results: pl.DataFrame) -> dict[str, float | None]:
    """The few numbers a reader looks at first: average and worst-group accuracy per split, and gaps."""
    keep = results.filter(
        pl.col("metric").is_in(["acc_avg", "acc_wg"])
        | pl.col("metric").str.starts_with("acc_gap:")
        | pl.col("metric").str.starts_with("acc_relative:")
    )
    return {
        f"{row['eval_split']}/{row['metric']}": row["value"]
        for row in keep.sort("eval_split", "metric").iter_rows(named=True)
    }


def train_in_process(
    settings: Settings, plan: RunPlan, out_dir: Path, log: Callable[[str], None] = print
) -> tuple[PublishOutcome, dict[str, Any]]:
    """Train in this process and publish: for library users and notebooks (Dagster uses a subprocess)."""
    from shiftbench.erm.job import run_job

    run_job(plan.job(out_dir), log=log)
    published = publish_run(settings, plan, out_dir)
    discard_scratch(out_dir)
    return published

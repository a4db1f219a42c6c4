"""The training job's configuration: every knob of an ERM run, validated by name, without torch.

The Dagster code location, the CLI and the launcher import this module (never torch); only the job
(:mod:`shiftbench.erm.job`) and :mod:`shiftbench.erm.train` import torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from shiftbench.erm.protocols import TRANSFORMS
from shiftbench.errors import InputError
from shiftbench.scoring.method_names import METHODS  # the objectives of shiftbench.erm.methods (checked there)

# The architectures of shiftbench.erm.models (checked there against its builders).
MODELS = (
    "resnet18",
    "resnet50",
    "small_cnn",
    "mlp",
    "resnet34",
    "resnet101",
    "alexnet",
    "vgg11",
    "densenet121",
    "vit_b_16",
)
# The smallest input each architecture's pooling leaves at least one pixel of (AlexNet's three 3x3 stride-2 pools).
SMALLEST_IMAGE = {"alexnet": 63, "vgg11": 32, "densenet121": 32, "vit_b_16": 16}


# Knobs that change how a run executes, not what it learns: a run that sets them keeps its preset's name.
EXECUTION_ONLY = frozenset(
    {"device", "precision", "channels_last", "compile", "cache", "cache_budget_gib", "eval_batch_size"}
    | {"decode_workers", "step", "threads", "checkpoint_every", "track_conflicts", "track_every", "decode"}
)


# shiftbench.erm.augment; the last four are the ConDS paper's (shiftbench.erm.policies).
AUGMENTATIONS = ("none", "flip_rot90", "domainbed", "imagenet", "randaugment", "autoaugment", "augmix")
MAX_DECODE_WORKERS = 256
LOADERS = ("auto", "standard", "group_balanced", "groups")
# shiftbench.erm.data: the mean and std of each (the robustness library's CustomImageNet's for the second)
NORMALIZATIONS = ("imagenet", "robustness_custom_imagenet", "symmetric")
# BREEDS Table 14's robustness interventions (shiftbench.erm.interventions) and the settings each reads.
INTERVENTION_SETTINGS = {
    "none": (),
    "gaussian_noise": ("noise_std",),
    "random_erasing": ("erasing_p", "erasing_scale", "erasing_ratio"),
    "pgd_l2": ("pgd_eps", "pgd_step_size", "pgd_steps"),
}
INTERVENTIONS = tuple(INTERVENTION_SETTINGS)


# long: one field per knob of a run, each documented where it is declared; the checks are split into helpers
@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run; ``specs/erm.yaml`` presets fill it, ``--set``/Dagster config override it."""

    model: str = "small_cnn"
    method: str = "erm"  # erm | reweight | groupdro | irm | coral (shiftbench.erm.methods)
    group_by: str = "group"  # the split's metadata fields whose values are the training groups, comma-separated
    groupdro_eta: float = 0.01  # step size of the group weights (WILDS, DomainBed)
    irm_lambda: float = 100.0  # IRM penalty weight after the anneal (DomainBed)
    irm_anneal_iters: int = 500  # iterations at penalty weight 1 (DomainBed)
    coral_lambda: float = 1.0  # CORAL penalty weight (DomainBed's mmd_gamma)
    # CDANN (shiftbench.erm.methods.CDANN), DomainBed's defaults: the adversarial weight, discriminator steps per
    # generator step, gradient penalty, Adam's beta1 (both optimizers; beta2 0.9), the discriminator MLP, its decay.
    cdann_lambda: float = 1.0
    cdann_d_steps_per_g: int = 1
    cdann_grad_penalty: float = 0.0
    cdann_beta1: float = 0.5
    cdann_mlp_width: int = 256
    cdann_mlp_depth: int = 3
    cdann_mlp_dropout: float = 0.0
    cdann_weight_decay_d: float = 0.0
    causirl_mmd_gamma: float = 1.0  # CausIRL's penalty weight (DomainBed's mmd_gamma), causirl_coral and causirl_mmd
    mixup_alpha: float = 0.2  # Mixup's mixing weights ~ Beta(mixup_alpha, mixup_alpha) (DomainBed's default)
    sagnet_w_adv: float = 0.1  # SagNet's adversarial (style) loss weight (DomainBed's sag_w_adv and default)
    n_groups_per_batch: int = 2  # loader "groups": groups drawn per batch (WILDS)
    optimizer: str = "adam"  # adam | sgd
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    batch_size: int = 128
    max_iters: int = 10_000
    eval_every: int = 100
    patience: int = 20  # evaluations without improvement before stopping; 0 = never stop early
    lr_milestones: tuple[int, ...] = ()  # iterations where the learning rate is multiplied by lr_gamma
    lr_gamma: float = 0.1
    loader: str = "auto"  # auto (the method's) | standard | group_balanced | groups
    image_size: int = 64
    augment: str = "none"  # none | flip_rot90 | domainbed | imagenet | randaugment | autoaugment | augmix
    # square: the whole image resized to image_size, then `augment`; a paper's protocol (shiftbench.erm.protocols:
    # robustness_imagenet, domainbed): its training and evaluation transforms on the photographs themselves.
    transforms: str = "square"
    # A protocol's training images: decoded from their files every batch, or from a prepared copy decoded once
    # (shiftbench.erm.prepared) at their own resolution (prepared_side 0: the same pixels) or with the shorter side
    # at most prepared_side (faster, smaller; the crops then come from the smaller copy).
    decode: str = "files"
    prepared_side: int = 0
    normalization: str = "imagenet"  # a mean and std (NORMALIZATIONS) | symmetric (pixels in (-1, 1))
    # BREEDS Table 14 (shiftbench.erm.interventions): none | gaussian_noise | random_erasing | pgd_l2, on the training
    # batches in [0, 1] pixels; the settings default to the table's (pgd_l2's second row: pgd_eps 1, pgd_step_size 0.8).
    intervention: str = "none"
    noise_std: float = 0.2
    erasing_p: float = 0.5
    erasing_scale: tuple[float, ...] = (0.02, 0.33)  # of the image's area
    erasing_ratio: tuple[float, ...] = (0.3, 3.3)  # height / width
    pgd_eps: float = 0.5  # the l2 radius
    pgd_step_size: float = 0.4
    pgd_steps: int = 3
    lr_grid: tuple[float, ...] = ()  # train once per lr and keep the best on the selection split (ConDS)
    train_split: str = "train"
    # auto (val, else id_val, else the last iterate) | val | id_val | last | test_oracle (the test split: a test-set
    # choice, labelled so everywhere; BREEDS chose its linear probe's learning rate so)
    selection: str = "auto"
    selection_metric: str = "acc_avg"  # or acc_wg
    init_checkpoint: str | None = None
    init_partial: bool = False  # allow a checkpoint that covers only part of the model (the run records what loaded)
    linear_probe: bool = False  # retrain only the last layer (BREEDS Section 5.1)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 on cuda, fp32 on cpu) | bf16 | fp32
    channels_last: bool | None = None  # None: on for cuda
    compile: bool = False
    step: str = "auto"  # auto (a CUDA graph on a GPU when the method allows) | graph | eager (shiftbench.erm.step)
    cache: str = "auto"  # auto (when it fits cache_budget_gib) | on | off
    cache_budget_gib: float = 16.0
    eval_batch_size: int = 512
    decode_workers: int = 0  # 0: one per core, at most 16
    threads: int = 0  # CPU threads of torch's ops (0: torch's default, every core); CPU results depend on it
    checkpoint_every: int = 100  # iterations between checkpoints a stopped run resumes from (0: only on a signal)
    # After every step, each evaluation subset's loss and the batch's subsets, regressed into erm_training_conflicts
    # (MetaShift §4.3; a split that carries subsets only: shiftbench.erm.conflicts). The weights do not change.
    track_conflicts: bool = False
    track_every: int = 1  # steps between two tracked evaluations (1: after every step, the paper's)
    # A hyperparameter search's run (shiftbench.erm.search): the space its values were drawn from ("" for a run that
    # is no search's) and the draw's index (0: the preset's own values, as DomainBed's hparams_seed 0 is its defaults).
    search: str = ""
    search_draw: int = 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InputError(f"unknown training parameter; known: {', '.join(sorted(known))}", parameter=unknown[0])
        cleaned = {name: coerce_value(value, str(known[name].type), name) for name, value in values.items()}
        config = cls(**cleaned)
        config.validate()
        return config

    def validate(self) -> None:
        def need(ok: bool, parameter: str, message: str) -> None:
            if not ok:
                raise InputError(message, parameter=parameter)

        need(self.model in MODELS, "model", f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        self._check_model(need)
        self._check_methods(need)
        self._check_search(need)
        need(self.optimizer in {"adam", "sgd"}, "optimizer", "must be adam or sgd")
        need(self.lr > 0 and math.isfinite(self.lr), "lr", "must be a positive number")
        need(self.weight_decay >= 0 and math.isfinite(self.weight_decay), "weight_decay", "must be a number >= 0")
        need(0 <= self.momentum < 1, "momentum", "must be a number in [0, 1)")
        for name in ("batch_size", "max_iters", "eval_every", "image_size", "eval_batch_size"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, "must be an integer >= 1")
        need(isinstance(self.patience, int) and self.patience >= 0, "patience", "must be an integer >= 0")
        need(self.method in METHODS, "method", f"unknown method {self.method!r}; known: {', '.join(METHODS)}")
        need(self.loader in LOADERS, "loader", f"must be one of {', '.join(LOADERS)}")
        need(self.normalization in NORMALIZATIONS, "normalization", f"must be one of {', '.join(NORMALIZATIONS)}")
        need(bool(self.group_by.strip()), "group_by", "name at least one metadata field")
        need(self.groupdro_eta > 0 and math.isfinite(self.groupdro_eta), "groupdro_eta", "must be a number > 0")
        for name in ("irm_lambda", "coral_lambda"):
            value = getattr(self, name)
            need(value >= 0 and math.isfinite(value), name, "penalty weights must be numbers >= 0")
        need(isinstance(self.irm_anneal_iters, int) and self.irm_anneal_iters >= 0, "irm_anneal_iters", "must be >= 0")
        need(isinstance(self.n_groups_per_batch, int) and self.n_groups_per_batch >= 1, "n_groups_per_batch", ">= 1")
        need(all(v > 0 and math.isfinite(v) for v in self.lr_grid), "lr_grid", "must be positive numbers")
        need(self.augment in AUGMENTATIONS, "augment", f"must be one of {', '.join(AUGMENTATIONS)}")
        need(self.transforms in TRANSFORMS, "transforms", f"must be one of {', '.join(TRANSFORMS)}")
        need(
            self.transforms == "square" or self.augment == "none",
            "augment",
            f"the {self.transforms} protocol has its own training augmentation: drop augment (or transforms=square)",
        )
        need(self.decode in {"files", "prepared"}, "decode", "must be files or prepared")
        need(self.decode == "files" or self.transforms != "square", "decode", "prepared copies are a protocol's")
        need(isinstance(self.prepared_side, int) and self.prepared_side >= 0, "prepared_side", "must be >= 0")
        need(
            self.prepared_side == 0 or self.decode == "prepared",
            "prepared_side",
            "applies to a prepared copy: set decode=prepared too",
        )
        need(
            self.prepared_side == 0 or self.prepared_side >= self.image_size,
            "prepared_side",
            f"must be at least image_size ({self.image_size}): a crop would be cut from fewer pixels than it has",
        )
        need(
            self.transforms == "square" or self.normalization != "symmetric",
            "normalization",
            f"the {self.transforms} protocol feeds pixels normalised by a mean and std "
            "(imagenet or robustness_custom_imagenet)",
        )
        self._check_intervention(need)
        self._check_selection(need)
        need(self.precision in {"auto", "bf16", "fp32"}, "precision", "must be auto, bf16 or fp32")
        need(self.cache in {"auto", "on", "off"}, "cache", "must be auto, on or off")
        need(self.step in {"auto", "graph", "eager"}, "step", "must be auto, graph or eager")
        need(0 < self.lr_gamma <= 1, "lr_gamma", "must be in (0, 1]")
        need(all(m >= 1 for m in self.lr_milestones), "lr_milestones", "must be iterations >= 1")
        need(self.cache_budget_gib > 0 and math.isfinite(self.cache_budget_gib), "cache_budget_gib", "must be > 0")
        need(
            isinstance(self.decode_workers, int) and 0 <= self.decode_workers <= MAX_DECODE_WORKERS,
            "decode_workers",
            f"must be an integer in 0..{MAX_DECODE_WORKERS} (0: one per core)",
        )
        need(isinstance(self.threads, int) and 0 <= self.threads <= 1024, "threads", "must be an integer in 0..1024")
        need(
            isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 0,
            "checkpoint_every",
            "must be an integer >= 0 (0: checkpoint only when the run is stopped)",
        )
        need(self.device == "auto" or self.device.split(":")[0] in {"cpu", "cuda"}, "device", "auto, cpu or cuda[:N]")
        need(
            not (self.track_conflicts and self.lr_grid),
            "track_conflicts",
            "tracks one training run: it cannot be combined with a learning-rate grid (lr_grid)",
        )
        need(isinstance(self.track_every, int) and self.track_every >= 1, "track_every", "must be an integer >= 1")
        need(self.track_conflicts or self.track_every == 1, "track_every", "applies only with track_conflicts=true")

    def _check_selection(self, need: Any) -> None:
        need(
            self.selection in {"auto", "val", "id_val", "last", "test_oracle"},
            "selection",
            "must be auto, val, id_val, last or test_oracle",
        )
        need(self.selection_metric in {"acc_avg", "acc_wg"}, "selection_metric", "must be acc_avg or acc_wg")

    def _check_search(self, need: Any) -> None:
        need(isinstance(self.search_draw, int) and self.search_draw >= 0, "search_draw", "must be an integer >= 0")
        need(bool(self.search) or self.search_draw == 0, "search_draw", "belongs to a search: set search (a space)")

    def _check_model(self, need: Any) -> None:
        smallest = SMALLEST_IMAGE.get(self.model, 1)
        need(self.image_size >= smallest, "image_size", f"{self.model} needs images of at least {smallest} pixels")
        need(
            self.model != "vit_b_16" or self.image_size % 16 == 0,
            "image_size",
            "vit_b_16 cuts 16-pixel patches: a multiple of 16",
        )

    def _check_methods(self, need: Any) -> None:
        self._check_cdann(need)
        self._check_mixup(need)
        self._check_sagnet(need)

    def _check_mixup(self, need: Any) -> None:
        alpha = self.mixup_alpha
        need(math.isfinite(alpha) and alpha > 0, "mixup_alpha", "must be a number > 0 (Beta(alpha, alpha)'s)")

    def _check_sagnet(self, need: Any) -> None:
        need(self.method != "sagnet" or self.optimizer == "adam", "optimizer", "sagnet trains with Adam (DomainBed's)")
        need(math.isfinite(self.sagnet_w_adv) and self.sagnet_w_adv >= 0, "sagnet_w_adv", "must be a number >= 0")

    def _check_cdann(self, need: Any) -> None:
        need(self.method != "cdann" or self.optimizer == "adam", "optimizer", "cdann trains with Adam (DomainBed's)")
        need(math.isfinite(self.cdann_lambda) and self.cdann_lambda >= 0, "cdann_lambda", "must be a number >= 0")
        need(1 <= self.cdann_d_steps_per_g <= 100, "cdann_d_steps_per_g", "must be an integer in [1, 100]")
        need(
            math.isfinite(self.cdann_grad_penalty) and self.cdann_grad_penalty >= 0,
            "cdann_grad_penalty",
            "must be a number >= 0",
        )
        need(0 <= self.cdann_beta1 < 1, "cdann_beta1", "must be a number in [0, 1)")
        need(1 <= self.cdann_mlp_width <= 65536, "cdann_mlp_width", "must be an integer in [1, 65536]")
        need(2 <= self.cdann_mlp_depth <= 64, "cdann_mlp_depth", "must be an integer in [2, 64]")
        need(0 <= self.cdann_mlp_dropout < 1, "cdann_mlp_dropout", "must be a number in [0, 1)")
        need(self.cdann_weight_decay_d >= 0, "cdann_weight_decay_d", "must be a number >= 0")
        need(
            math.isfinite(self.causirl_mmd_gamma) and self.causirl_mmd_gamma >= 0,
            "causirl_mmd_gamma",
            "must be a number >= 0",
        )

    def _check_intervention(self, need: Any) -> None:
        need(self.intervention in INTERVENTIONS, "intervention", f"must be one of {', '.join(INTERVENTIONS)}")
        need(math.isfinite(self.noise_std) and self.noise_std > 0, "noise_std", "must be a number > 0")
        need(0 <= self.erasing_p <= 1, "erasing_p", "must be a probability in [0, 1]")
        for name, bounds, top in (
            ("erasing_scale", self.erasing_scale, 1.0),
            ("erasing_ratio", self.erasing_ratio, 1e6),
        ):
            need(
                len(bounds) == 2 and 0 < bounds[0] <= bounds[1] <= top,
                name,
                f"must be two numbers low,high with 0 < low <= high <= {top:g}",
            )
        need(math.isfinite(self.pgd_eps) and self.pgd_eps > 0, "pgd_eps", "must be a number > 0")
        need(math.isfinite(self.pgd_step_size) and self.pgd_step_size > 0, "pgd_step_size", "must be a number > 0")
        need(1 <= self.pgd_steps <= 1000, "pgd_steps", "must be an integer in [1, 1000]")
        need(
            self.intervention != "pgd_l2" or self.method == "erm",
            "intervention",
            f"pgd_l2 trains on the attack's images with the cross-entropy (method erm), not {self.method}",
        )

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["lr_milestones"] = list(self.lr_milestones)
        values["lr_grid"] = list(self.lr_grid)
        values["erasing_scale"], values["erasing_ratio"] = list(self.erasing_scale), list(self.erasing_ratio)
        for name, settings in INTERVENTION_SETTINGS.items():  # recorded only when on: older runs keep their ids
            for setting in settings if name != self.intervention else ():
                del values[setting]
        if self.intervention == "none":
            del values["intervention"]
        for prefix in ("cdann", "causirl", "mixup", "sagnet"):  # the same: runs of the other methods keep their ids
            for name in [k for k in values if k.startswith(prefix + "_") and not self.method.startswith(prefix)]:
                del values[name]
        if not self.track_conflicts:  # recorded only when on: runs from before the option keep their bytes and ids
            del values["track_conflicts"], values["track_every"]
        if self.transforms == "square":  # the same: runs on squares (the sprites, stand-ins) keep their version ids
            del values["transforms"], values["decode"]
        if not self.prepared_side:
            del values["prepared_side"]
        if not self.search:  # recorded only for a search's runs: the others keep their ids
            del values["search"], values["search_draw"]
        return values


def coerce_value(value: Any, kind: str, name: str) -> Any:
    """Values from YAML, ``--set`` or JSON to the field's type (``5e-5`` is a string to YAML 1.1)."""
    if value is None and "None" in kind:
        return None
    try:
        if kind.startswith("tuple"):
            items = value.split(",") if isinstance(value, str) else ([] if value is None else list(value))
            item_type = float if "float" in kind else int
            return tuple(item_type(v) for v in items if str(v).strip())
        if kind.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind.startswith("bool"):
            if isinstance(value, str) and value.lower() in {"true", "false"}:
                return value.lower() == "true"
            if not isinstance(value, bool):
                raise ValueError
            return value
        return str(value)
    except (TypeError, ValueError):
        raise InputError(f"expected {kind}, got {value!r}", parameter=name) from None

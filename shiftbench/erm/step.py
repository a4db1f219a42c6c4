"""One training iteration, eager or as a fixed-shape program captured in a CUDA graph.

Why a graph: a small model's eager step on a GPU is bound by the host launching a few hundred kernels
one by one (ResNet-18 at 64x64 on an H100: ~12 ms per step at batch 128 or 512 alike; the same step
captured in a graph: 2.8 ms at batch 128, BENCHMARKS.md). A graph replays every kernel of the step
(gather, augmentation, normalisation, forward, loss, backward, optimizer update and the running
sums) with one launch. It needs fixed shapes and addresses and no host synchronisation inside the
step, so :class:`GraphStep` keeps

- static inputs: a device tensor of cache positions and example rows (the images are gathered from
  the device cache inside the graph) or a static pixel buffer when images are decoded per batch,
  and the batch's augmentation draws (made on the host from the run's seeded generator, as the eager
  step makes them, applied on the device: :mod:`shiftbench.erm.augment`);
- a fused optimizer whose learning rate is a device tensor, filled when the schedule changes it;
- the method's state in tensors it updates in place (``Method.graphable``).

Evaluation runs outside the graph on the same parameters. The first ``WARMUP`` iterations run
eagerly (allocator, cuDNN's choices, the optimizer's state), then the step is captured and replayed.
On CPU, or with ``capture=False``, the same static program runs eagerly: the tests compare it with
:class:`EagerStep` there. A method that is not graphable (IRM, CORAL: per-group loops decided on the
host) and ``step: eager`` take :class:`EagerStep`, the step as it always was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shiftbench.erm import augment, interventions
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.data import Batches, normalize, pixel_constants, standardize
from shiftbench.erm.models import head_name
from shiftbench.erm.objective import Batch, Method, update
from shiftbench.erm.photos import PhotoBatches

WARMUP = 3  # eager iterations before capture (the PyTorch recipe warms up on a side stream)
Log = Callable[[str], None]


def autocast(device: torch.device, precision: str, *, cache: bool = True) -> Any:
    """bf16 autocast where asked; ``cache=False`` inside a captured graph (its weight casts must be
    recomputed on every replay, not reused from the capture)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return torch.autocast(device_type=device.type, enabled=False)


def make_optimizer(model: nn.Module, config: TrainConfig, *, lr: float | torch.Tensor) -> torch.optim.Optimizer:
    """The run's optimizer over its trainable parameters; a tensor ``lr`` makes the fused kernels
    (one launch for all parameters, capturable, the learning rate read on the device)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = isinstance(lr, torch.Tensor)
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay, fused=fused or None
        )
    betas = (config.cdann_beta1, 0.9) if config.method == "cdann" else (0.9, 0.999)  # DomainBed's gen_opt for CDANN
    return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=config.weight_decay, fused=fused or None)


def choose_step(config: TrainConfig, method: Method, device: torch.device) -> tuple[str, str]:
    """``(graph | eager, why)``: a graph on a GPU unless the run asks for eager or its method cannot be
    captured; ``step: graph`` off a GPU runs the static program uncaptured."""
    if config.step == "eager":
        return "eager", "step: eager"
    if not method.graphable:
        return "eager", f"{method.name} decides per batch on the host"
    if config.linear_probe:
        return "eager", "linear_probe"
    if config.intervention != "none":
        return "eager", f"{config.intervention} draws per image on the host"
    if config.step == "auto" and device.type != "cuda":
        return "eager", f"no graphs on {device.type}"
    return "graph", "captured" if device.type == "cuda" else "static, uncaptured off a GPU"


@dataclass
class StepInputs:
    """What every step reads: the model, the objective and the run's data, by example row."""

    model: nn.Module
    step_model: nn.Module
    method: Method
    config: TrainConfig
    batches: Batches | PhotoBatches
    labels: torch.Tensor  # int64 [N], host
    groups: torch.Tensor  # int64 [N], host
    augment_generator: torch.Generator
    device: torch.device
    precision: str
    channels_last: bool
    features: list[torch.Tensor]  # filled by the fc hook when the method needs features


class EagerStep:
    """The step launched op by op; its optimizer and schedule as ``torch.optim`` makes them."""

    kind = "eager"

    def __init__(self, inputs: StepInputs) -> None:
        self.inputs = inputs
        self.head = inputs.model.get_submodule(head_name(inputs.model))
        self.running_loss = torch.zeros((), device=inputs.device)
        self.running_correct = torch.zeros((), device=inputs.device, dtype=torch.long)
        self._reset(1)

    def _reset(self, iteration: int) -> None:
        """A fresh optimizer at ``iteration`` (IRM after its anneal); drops already taken stay taken."""
        config = self.inputs.config
        self.optimizer = make_optimizer(self.inputs.model, config, lr=config.lr)
        passed = sum(1 for m in config.lr_milestones if m < iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr * config.lr_gamma**passed
        milestones = [m - iteration + 1 for m in config.lr_milestones if m >= iteration]
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer, milestones, config.lr_gamma)

    def __call__(self, index: torch.Tensor, iteration: int) -> None:
        s = self.inputs
        if iteration > 1 and s.method.reset_optimizer(iteration):
            self._reset(iteration)
        x = training_batch(s, index)
        y = s.labels[index].to(s.device, non_blocking=True)
        g = s.groups[index].to(s.device, non_blocking=True)
        if s.config.intervention == "pgd_l2":
            x = interventions.attack(s.model, x, y, s.config.normalization, intervention_of(s.config))
        batch = Batch(s.step_model, self.head, x, y, g, iteration, s.features, lambda: autocast(s.device, s.precision))
        logits, scored, loss = update(s.method, batch, self.optimizer)
        self.scheduler.step()
        self.running_loss += loss.detach() * len(index)
        self.running_correct += (logits.detach().argmax(1) == scored).sum()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the step: the optimizer, the schedule and the running sums."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "running": [self.running_loss, self.running_correct],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        _load_running(self, state["running"])


def training_batch(s: StepInputs, index: torch.Tensor) -> torch.Tensor:
    """The eager step's normalised input: squares augmented on the device, or a protocol's training images (cropped
    and jittered per image by :class:`PhotoBatches`, the lighting noise added here); then Gaussian noise or random
    erasing when the run's intervention says so (pgd_l2 attacks in the step)."""
    if isinstance(s.batches, PhotoBatches):
        pixels, alphas = s.batches.train(index, s.augment_generator)
        lighting = alphas if s.batches.lighting else None
        x = normalize(pixels, channels_last=s.channels_last, kind=s.config.normalization, lighting=lighting)
    else:
        x = normalize(
            augment.augment(s.batches(index), s.config.augment, s.augment_generator),
            channels_last=s.channels_last,
            kind=s.config.normalization,
        )
    if s.config.intervention in ("gaussian_noise", "random_erasing"):
        mean, std = pixel_constants(s.config.normalization, x.device)
        pixels = interventions.perturb(x * std + mean, intervention_of(s.config), s.augment_generator)
        x = standardize(pixels, s.config.normalization).contiguous(
            memory_format=torch.channels_last if s.channels_last else torch.contiguous_format
        )
    return x


def intervention_of(config: TrainConfig) -> interventions.Intervention:
    """The run's intervention and its settings."""
    return interventions.Intervention(
        config.intervention, config.noise_std, config.erasing_p, (config.erasing_scale[0], config.erasing_scale[1]),
        (config.erasing_ratio[0], config.erasing_ratio[1]), config.pgd_eps, config.pgd_step_size, config.pgd_steps,
    )  # fmt: skip


def _load_running(step: EagerStep | GraphStep, running: list[torch.Tensor]) -> None:
    step.running_loss.copy_(running[0])
    step.running_correct.copy_(running[1])


class GraphStep:
    """The step as one static program: replayed from a CUDA graph on a GPU (see the module's docstring)."""

    def __init__(self, inputs: StepInputs, *, capture: bool, log: Log) -> None:
        s, device = inputs, inputs.device
        self.inputs, self.capture, self.log = s, capture, log
        self.running_loss = torch.zeros((), device=device)
        self.running_correct = torch.zeros((), device=device, dtype=torch.long)
        self.lr_value = s.config.lr
        self.lr = torch.tensor(self.lr_value, dtype=torch.float32, device=device)
        self.optimizer = make_optimizer(s.model, s.config, lr=self.lr)
        self.drops = Counter(s.config.lr_milestones)
        self.labels, self.groups = s.labels.to(device), s.groups.to(device)
        cache = s.batches.cache if isinstance(s.batches, Batches) else None  # a protocol crops every batch anew
        self.images = cache.images if cache is not None else None
        self.photos = s.batches if isinstance(s.batches, PhotoBatches) else None
        self.batch_size = 0  # fixed by the first batch: every loader yields one size (shiftbench.erm.data)
        self.graph: Any = None
        self.calls = 0  # steps taken by this process (a resumed run warms up and captures again)

    @property
    def kind(self) -> str:
        return "graph" if self.graph is not None else "static"

    def _allocate(self, batch_size: int) -> None:
        s, device = self.inputs, self.inputs.device
        n_draws = augment.draw(s.config.augment, 1, torch.Generator(), size=s.config.image_size).shape[0]
        self.batch_size = batch_size
        self.rows = torch.zeros((2, batch_size), dtype=torch.int64, device=device)  # cache positions, rows
        size = s.config.image_size
        self.pixels = None if self.images is not None else torch.zeros(
            (batch_size, 3, size, size), dtype=torch.uint8, device=device
        )  # fmt: skip
        self.draws = torch.zeros((n_draws, batch_size), device=device)
        lit = self.photos is not None and self.photos.lighting
        self.lighting = torch.zeros((batch_size, 3), device=device) if lit else None  # the PCA lighting draws

    def __call__(self, index: torch.Tensor, iteration: int) -> None:
        if not self.batch_size:
            self._allocate(len(index))
        if len(index) != self.batch_size:
            raise ValueError(f"a static step takes batches of {self.batch_size}, got {len(index)}")
        self._load(index)
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
        elif self.capture and self.calls == WARMUP + 1:
            self._capture_or_run()
        elif self.capture:
            self._on_side_stream()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            self._program()
        self._schedule(iteration)

    def _load(self, index: torch.Tensor) -> None:
        """This batch into the static inputs (host work and copies only, outside the graph)."""
        s = self.inputs
        positions = torch.from_numpy(s.batches.position[index.numpy()]) if self.images is not None else index
        self.rows.copy_(torch.stack([positions, index]), non_blocking=True)
        if self.photos is not None:
            assert self.pixels is not None
            pixels, alphas = self.photos.train(index, s.augment_generator)
            self.pixels.copy_(pixels, non_blocking=True)
            if self.lighting is not None:
                self.lighting.copy_(alphas, non_blocking=True)
            return
        if self.pixels is not None:
            self.pixels.copy_(s.batches(index), non_blocking=True)
        draws = augment.draw(s.config.augment, self.batch_size, s.augment_generator, size=s.config.image_size)
        self.draws.copy_(draws, non_blocking=True)

    def _program(self) -> None:
        """Gather, augment, normalise, forward, loss, backward, update, running sums: fixed shapes, no sync."""
        s = self.inputs
        pixels = self.images.index_select(0, self.rows[0]) if self.images is not None else self.pixels
        assert pixels is not None
        x = normalize(
            augment.apply(pixels, s.config.augment, self.draws), channels_last=s.channels_last,
            kind=s.config.normalization, lighting=self.lighting,
        )  # fmt: skip
        y, g = self.labels.index_select(0, self.rows[1]), self.groups.index_select(0, self.rows[1])
        with autocast(s.device, s.precision, cache=not self.capture):
            logits = s.step_model(x)
            loss = s.method.loss(logits.float(), None, y, g, 0)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.running_loss += loss.detach() * self.batch_size
        self.running_correct += (logits.detach().argmax(1) == y).sum()

    def _on_side_stream(self) -> None:
        """A warm-up iteration, eager, on a side stream as PyTorch's whole-network capture recipe does."""
        side = torch.cuda.Stream(self.inputs.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.inputs.device))
        with torch.cuda.stream(side):
            self.optimizer.zero_grad(set_to_none=True)
            self._program()
        torch.cuda.current_stream(self.inputs.device).wait_stream(side)

    def _capture_or_run(self) -> None:
        """Record this iteration's program once, then replay it (capture itself runs nothing, so when
        capture fails the iteration runs eagerly and the run goes on uncaptured, saying so)."""
        self.optimizer.zero_grad(set_to_none=True)  # gradients are allocated in the graph's pool
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._program()
        except RuntimeError as exc:
            self.log(f"CUDA graph capture failed ({str(exc).splitlines()[0]}); the static step runs uncaptured")
            self.capture = False
            self.optimizer.zero_grad(set_to_none=True)
            self._program()
            return
        graph.replay()
        self.graph = graph

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the step: the optimizer, the learning rate and the running sums."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "lr": self.lr_value,
            "running": [self.running_loss, self.running_correct],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's state, with the device tensor ``lr`` kept (the captured graph reads that tensor)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_value = float(state["lr"])
        self.lr.fill_(self.lr_value)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        _load_running(self, state["running"])

    def _schedule(self, iteration: int) -> None:
        """MultiStepLR's schedule on the device tensor: after iteration i the rate is lr * gamma^#{m <= i}."""
        if iteration in self.drops:
            self.lr_value *= self.inputs.config.lr_gamma ** self.drops[iteration]
            self.lr.fill_(self.lr_value)


def build_step(inputs: StepInputs, log: Log) -> EagerStep | GraphStep:
    kind, why = choose_step(inputs.config, inputs.method, inputs.device)
    log(f"training step: {kind} ({why})")
    if kind == "eager":
        return EagerStep(inputs)
    return GraphStep(inputs, capture=inputs.device.type == "cuda", log=log)

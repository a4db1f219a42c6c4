"""BREEDS Table 14's robustness interventions (Appendix A.7.3), applied to a run's training batches.

- ``gaussian_noise``: each training pixel plus a draw of N(0, ``noise_std``) (0.2), on the [0, 1] image after the
  protocol's transforms, unclipped (the paper says no more; the lighting noise is unclipped too).
- ``random_erasing``: torchvision's ``RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)`` (Zhong et
  al. 2020), which the paper used "from the PyTorch transforms": with probability ``erasing_p`` a rectangle of the
  [0, 1] image set to 0, its area and aspect drawn by ``RandomErasing.get_params``' rule (ten tries, else nothing).
- ``pgd_l2``: adversarial training with the robustness library's attacker (``robustness/attacker.py``,
  ``attack_steps.py`` ``L2Step``; 1.2.1.post2): the model in eval mode, ``pgd_steps`` (3) steps of ``pgd_step_size``
  (0.4 or 0.8) along the normalised gradient of the cross-entropy, each projected on the l2 ball of ``pgd_eps`` (0.5
  or 1) around the clean image and clipped to [0, 1], no random start, the worst iterate kept per image
  (``use_best``, the library's training default); the step then trains on those images.

All in pixel space, [0, 1], as the library attacks before its own normalisation: the batch the job normalised is taken
back to pixels by the normalisation's mean and std. Every draw comes from the run's augmentation generator on the host
(a checkpoint keeps it: a resumed run draws the same; a seed gives the same draws on any device).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from shiftbench.erm.data import pixel_constants, standardize

INTERVENTIONS = ("none", "pgd_l2", "gaussian_noise", "random_erasing")


@dataclass(frozen=True)
class Intervention:
    """One run's intervention and its settings (the TrainConfig fields of that name)."""

    name: str
    noise_std: float = 0.2
    erasing_p: float = 0.5
    erasing_scale: tuple[float, float] = (0.02, 0.33)
    erasing_ratio: tuple[float, float] = (0.3, 3.3)
    pgd_eps: float = 0.5
    pgd_step_size: float = 0.4
    pgd_steps: int = 3


def erasing_box(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], generator: torch.Generator
) -> tuple[int, int, int, int] | None:
    """``RandomErasing.get_params``' rectangle ``(top, left, height, width)`` for a value of 0, or None when none of
    its ten tries fits; the same draws from ``generator`` as it takes from torch's global one."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        erase_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.exp(
            torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1]), generator=generator)
        ).item()
        h, w = round(math.sqrt(erase_area * aspect)), round(math.sqrt(erase_area / aspect))
        if not (h < height and w < width):
            continue
        top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
        left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
        return top, left, h, w
    return None


def erasing_boxes(
    images: int, height: int, width: int, setting: Intervention, generator: torch.Generator
) -> list[tuple[int, int, int, int] | None]:
    """Each image's rectangle (None: not erased), in ``RandomErasing.forward``'s order: the coin, then the box."""
    boxes: list[tuple[int, int, int, int] | None] = []
    for _ in range(images):
        erased = bool(torch.rand(1, generator=generator) < setting.erasing_p)
        box = erasing_box(height, width, setting.erasing_scale, setting.erasing_ratio, generator) if erased else None
        boxes.append(box)
    return boxes


def erase(pixels: torch.Tensor, boxes: list[tuple[int, int, int, int] | None]) -> torch.Tensor:
    """Pixels ``[B, 3, H, W]`` in [0, 1] with each image's rectangle set to 0 (in place)."""
    for k, box in enumerate(boxes):
        if box is not None:
            top, left, h, w = box
            pixels[k, :, top : top + h, left : left + w] = 0.0
    return pixels


def perturb(pixels: torch.Tensor, setting: Intervention, generator: torch.Generator) -> torch.Tensor:
    """A training batch of [0, 1] pixels ``[B, 3, H, W]`` with Gaussian noise or random erasing, the draws from
    ``generator`` (on the host, then to the batch's device)."""
    if setting.name == "gaussian_noise":
        noise = torch.randn(pixels.shape, generator=generator).mul_(setting.noise_std)
        return pixels + noise.to(pixels.device, non_blocking=True)
    if setting.name == "random_erasing":
        return erase(
            pixels.clone(), erasing_boxes(pixels.shape[0], pixels.shape[-2], pixels.shape[-1], setting, generator)
        )
    return pixels


def pgd_l2(
    forward: Callable[[torch.Tensor], torch.Tensor], pixels: torch.Tensor, target: torch.Tensor, setting: Intervention
) -> torch.Tensor:
    """The robustness library's l2 PGD from ``pixels`` ([0, 1], ``[B, ...]``) against ``target``: the worst iterate per
    image by cross-entropy (``use_best``), detached. ``forward`` maps pixels to logits (normalising inside)."""
    origin = pixels.detach()
    x = origin
    best_loss: torch.Tensor | None = None
    best_x = origin.clone()
    for _ in range(setting.pgd_steps + 1):  # the last pass only scores the final iterate
        x = x.clone().detach().requires_grad_(True)
        losses = F.cross_entropy(forward(x), target, reduction="none")
        last = _ == setting.pgd_steps
        grad = None if last else torch.autograd.grad(losses.mean(), [x])[0]
        with torch.no_grad():
            if best_loss is None:
                best_loss, best_x = losses.clone().detach(), x.clone().detach()
            else:
                replace = best_loss < losses
                best_x[replace] = x[replace].clone().detach()
                best_loss[replace] = losses[replace]
            if grad is not None:
                x = _project(_ascend(x, grad, setting.pgd_step_size), origin, setting.pgd_eps)
    return best_x.detach()


def _ascend(x: torch.Tensor, grad: torch.Tensor, step_size: float) -> torch.Tensor:
    norm = grad.reshape(grad.shape[0], -1).norm(dim=1).view(-1, *[1] * (x.dim() - 1))
    stepped: torch.Tensor = x + grad / (norm + 1e-10) * step_size
    return stepped


def _project(x: torch.Tensor, origin: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.clamp(origin + (x - origin).renorm(p=2, dim=0, maxnorm=eps), 0, 1)


def attack(
    model: nn.Module, normalized: torch.Tensor, target: torch.Tensor, kind: str, setting: Intervention
) -> torch.Tensor:
    """The adversarial version of a batch normalised under ``kind``, normalised: attacked in pixel space with the model
    in eval mode (as the library's ``AttackerModel`` attacks), the model's mode restored after."""
    mean, std = pixel_constants(kind, normalized.device)
    was_training = model.training
    model.eval()
    try:
        adversarial = pgd_l2(lambda p: model(standardize(p, kind)), normalized * std + mean, target, setting)
    finally:
        model.train(was_training)
    return standardize(adversarial, kind)

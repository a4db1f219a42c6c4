"""The ConDS paper's four augmentations (its Table 3), batched on the device with each image's own draws.

``imagenet``: RandomResizedCrop with scale 0.08-1 (the paper's Table 9) and aspect 3/4-4/3, bilinear,
then a horizontal flip with probability 1/2. ``randaugment``: two operations per image drawn uniformly
from RandAugment's 14, at magnitude 9 of 31 bins, signed at random (Cubuk et al. 2020, torchvision's
defaults). ``autoaugment``: one of the 25 sub-policies of AutoAugment's CIFAR-10 policy per image, each
of its two operations applied with its probability (Cubuk et al. 2019; the paper's Table 9: "CIFAR10
policy for dSprites, Shapes3D and SmallNorb"). ``augmix``: three chains of one to three operations
(severity 3 of 10 bins) mixed with Dirichlet(1) weights, then with the image by a Beta(1, 1) weight
(Hendrycks et al. 2020, torchvision's defaults with every operation).

The operations follow the definitions of torchvision's tensor functions (the paper trained with
torchvision): blends clamp and truncate to uint8, geometry is nearest-neighbour with zero fill (shears
about the top-left corner, rotations about the centre), posterize masks bits, equalize is PIL's
histogram equalization. torchvision is not used because its transforms draw one set of parameters per
call (a batch would share one operation) and it does not import beside the CPU torch wheel. Every
operation is computed for the whole batch and each image keeps its own: fixed shapes and no host
synchronisation, so the step that applies them can be captured in a CUDA graph. Draws come from the
run's host generator (:func:`draw`), as for the other augmentations.
"""

from __future__ import annotations

import math

import torch

POLICIES = ("imagenet", "randaugment", "autoaugment", "augmix")
# RandAugment's operations, in torchvision's order (their indices are the draws' op codes).
OPS = ("identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness", "color",
       "contrast", "sharpness", "posterize", "solarize", "autocontrast", "equalize", "invert")  # fmt: skip
_CODE = {name: code for code, name in enumerate(OPS)}
_SIGNED = {"shear_x", "shear_y", "translate_x", "translate_y", "rotate", "brightness", "color", "contrast",
           "sharpness"}  # fmt: skip
_RANDAUGMENT_OPS = OPS[:14]  # every one but invert
_AUGMIX_OPS = ("autocontrast", "equalize", "posterize", "rotate", "solarize", "shear_x", "shear_y", "translate_x",
               "translate_y", "brightness", "color", "contrast", "sharpness")  # fmt: skip
# AutoAugment's CIFAR-10 policy: (op, probability, magnitude bin of 10) twice per sub-policy.
_CIFAR10 = (
    (("invert", 0.1, 0), ("contrast", 0.2, 6)), (("rotate", 0.7, 2), ("translate_x", 0.3, 9)),
    (("sharpness", 0.8, 1), ("sharpness", 0.9, 3)), (("shear_y", 0.5, 8), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.5, 0), ("equalize", 0.9, 0)), (("shear_y", 0.2, 7), ("posterize", 0.3, 7)),
    (("color", 0.4, 3), ("brightness", 0.6, 7)), (("sharpness", 0.3, 9), ("brightness", 0.7, 9)),
    (("equalize", 0.6, 0), ("equalize", 0.5, 0)), (("contrast", 0.6, 7), ("sharpness", 0.6, 5)),
    (("color", 0.7, 7), ("translate_x", 0.5, 8)), (("equalize", 0.3, 0), ("autocontrast", 0.4, 0)),
    (("translate_y", 0.4, 3), ("sharpness", 0.2, 6)), (("brightness", 0.9, 6), ("color", 0.2, 8)),
    (("solarize", 0.5, 2), ("invert", 0.0, 0)), (("equalize", 0.2, 0), ("autocontrast", 0.6, 0)),
    (("equalize", 0.2, 0), ("equalize", 0.6, 0)), (("color", 0.9, 9), ("equalize", 0.6, 0)),
    (("autocontrast", 0.8, 0), ("solarize", 0.2, 8)), (("brightness", 0.1, 3), ("color", 0.7, 0)),
    (("solarize", 0.4, 5), ("autocontrast", 0.9, 0)), (("translate_y", 0.9, 9), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.9, 0), ("solarize", 0.8, 3)), (("equalize", 0.8, 0), ("invert", 0.1, 0)),
    (("translate_y", 0.7, 9), ("autocontrast", 0.9, 0)),
)  # fmt: skip
_AUGMIX_WIDTH, _AUGMIX_DEPTH, _AUGMIX_SEVERITY = 3, 3, 3


def magnitude(op: str, fraction: float, size: int, *, augmix: bool = False) -> float:
    """An operation's strength at ``fraction`` of its range (bin / (bins - 1)), as torchvision's spaces
    define it: shear factor, pixels, degrees, enhancement offset, bits kept, or the solarize threshold."""
    if op in {"shear_x", "shear_y"}:
        return 0.3 * fraction
    if op in {"translate_x", "translate_y"}:
        return (size / 3.0 if augmix else 150.0 / 331.0 * size) * fraction
    if op == "rotate":
        return 30.0 * fraction
    if op in {"brightness", "color", "contrast", "sharpness"}:
        return 0.9 * fraction
    if op == "posterize":
        return float((4 if augmix else 8) - round(4 * fraction))
    if op == "solarize":
        return 255.0 * (1.0 - fraction)
    return 0.0


def draw(kind: str, n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Each image's draws, float32 ``[rows, n]``: op codes and magnitudes already resolved, so that
    :func:`apply` needs no table lookups the host would have to make."""
    if kind == "imagenet":
        ranges = ((0.08, 1.0), (math.log(3 / 4), math.log(4 / 3)), (0.0, 1.0), (0.0, 1.0), (0.0, 1.0))
        return torch.stack([lo + (hi - lo) * torch.rand(n, generator=generator) for lo, hi in ranges])
    if kind == "randaugment":
        rows = []
        for _ in range(2):
            ops = torch.randint(0, len(_RANDAUGMENT_OPS), (n,), generator=generator)
            rows += _resolved([_RANDAUGMENT_OPS[k] for k in ops.tolist()], 9 / 30, size, generator, n)
        return torch.stack(rows)
    if kind == "autoaugment":
        chosen = torch.randint(0, len(_CIFAR10), (n,), generator=generator).tolist()
        rows = []
        for position in range(2):
            steps = [_CIFAR10[k][position] for k in chosen]
            applied = torch.rand(n, generator=generator) <= torch.tensor([p for _, p, _ in steps])
            names = [name if on else "identity" for (name, _, _), on in zip(steps, applied.tolist(), strict=True)]
            fractions = torch.tensor([b / 9 for _, _, b in steps])
            rows += _resolved(names, fractions, size, generator, n)
        return torch.stack(rows)
    if kind == "augmix":
        return _augmix_draws(n, size, generator)
    raise ValueError(f"unknown augmentation {kind!r}")


def _resolved(
    names: list[str], fraction: float | torch.Tensor, size: int, generator: torch.Generator, n: int,
    *, augmix: bool = False,
) -> list[torch.Tensor]:  # fmt: skip
    """Two rows: each image's op code and its signed magnitude (a fair sign for the signed ops)."""
    fractions = fraction if isinstance(fraction, torch.Tensor) else torch.full((n,), fraction)
    signs = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
    values = [magnitude(name, float(f), size, augmix=augmix) * (float(s) if name in _SIGNED else 1.0)
              for name, f, s in zip(names, fractions.tolist(), signs.tolist(), strict=True)]  # fmt: skip
    return [torch.tensor([float(_CODE[name]) for name in names]), torch.tensor(values)]


def _augmix_draws(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """The mixing weight, the chains' Dirichlet(1) weights (normalised exponentials), then per chain and
    layer an op code and magnitude (identity beyond the chain's depth of 1-3)."""
    mix = torch.rand(n, generator=generator)  # Beta(1, 1)
    exponentials = -torch.log1p(-torch.rand(_AUGMIX_WIDTH, n, generator=generator))
    weights = exponentials / exponentials.sum(0, keepdim=True)
    rows = [mix, *weights]
    for _ in range(_AUGMIX_WIDTH):
        depth = torch.randint(1, _AUGMIX_DEPTH + 1, (n,), generator=generator)
        for layer in range(_AUGMIX_DEPTH):
            ops = torch.randint(0, len(_AUGMIX_OPS), (n,), generator=generator).tolist()
            bins = torch.randint(0, _AUGMIX_SEVERITY, (n,), generator=generator)
            names = [_AUGMIX_OPS[k] if layer < d else "identity" for k, d in zip(ops, depth.tolist(), strict=True)]
            rows += _resolved(names, bins / 9, size, generator, n, augmix=True)
    return torch.stack(rows)


def apply(batch: torch.Tensor, kind: str, draws: torch.Tensor) -> torch.Tensor:
    """The policy on a uint8 ``[B, 3, H, W]`` batch with :func:`draw`'s numbers (on the batch's device)."""
    if kind == "imagenet":
        return _resized_crop(batch, draws)
    if kind in {"randaugment", "autoaugment"}:
        out = batch
        for layer in range(2):
            out = operate(out, draws[2 * layer], draws[2 * layer + 1])
        return out
    mix, weights = draws[0], draws[1 : 1 + _AUGMIX_WIDTH]
    mixed = torch.zeros_like(batch, dtype=torch.float32)
    row = 1 + _AUGMIX_WIDTH
    for chain in range(_AUGMIX_WIDTH):
        out = batch
        for _ in range(_AUGMIX_DEPTH):
            out = operate(out, draws[row], draws[row + 1])
            row += 2
        mixed += weights[chain].view(-1, 1, 1, 1) * out.float()
    blended = mix.view(-1, 1, 1, 1) * batch.float() + (1 - mix.view(-1, 1, 1, 1)) * mixed
    return blended.clamp_(0, 255).to(torch.uint8)


def operate(batch: torch.Tensor, codes: torch.Tensor, magnitudes: torch.Tensor) -> torch.Tensor:
    """Each image through its own operation (``codes`` index :data:`OPS`), every family computed for the
    whole batch and selected per image: one resampling for the geometric ops, one blend for the
    enhancements, then the pixel maps."""
    codes = codes.to(batch.device).long()
    m = magnitudes.to(batch.device).float()
    out = _geometric(batch, codes, m)
    out = _enhanced(out, codes, m)
    return _pixel_maps(out, codes, m)


def _is(codes: torch.Tensor, *names: str) -> torch.Tensor:
    hit = torch.zeros_like(codes, dtype=torch.bool)
    for name in names:
        hit |= codes == _CODE[name]
    return hit.view(-1, 1, 1, 1)


def _geometric(batch: torch.Tensor, codes: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Shear (about the top-left corner), translate (pixels) and rotate (degrees, about the centre) as one
    inverse affine map per image, nearest-neighbour, zero fill; identity for every other op. (The sign
    of each is drawn fairly, so which way a positive magnitude turns does not matter.)"""
    n, _, h, w = batch.shape
    zero = torch.zeros_like(m)

    def where(name: str, value: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.where(codes == _CODE[name], value, other)

    angle = where("rotate", m, zero) * (math.pi / 180)
    cos, sin = torch.cos(angle), torch.sin(angle)
    # input = A output + t, in pixel coordinates (pixel i spans [i, i + 1]).
    a00, a01, a10, a11 = cos, where("shear_x", -m, sin), where("shear_y", -m, -sin), cos
    cx, cy = w / 2, h / 2
    t0 = where("translate_x", -m, where("rotate", cx - (a00 * cx + a01 * cy), zero))
    t1 = where("translate_y", -m, where("rotate", cy - (a10 * cx + a11 * cy), zero))
    # In grid_sample's coordinates (align_corners=False: u = 2 x / w - 1).
    theta = torch.stack(
        [a00, a01 * h / w, a00 + a01 * h / w + 2 * t0 / w - 1, a10 * w / h, a11, a10 * w / h + a11 + 2 * t1 / h - 1],
        1,
    ).view(n, 2, 3)
    grid = torch.nn.functional.affine_grid(theta, [n, 3, h, w], align_corners=False)
    moved = torch.nn.functional.grid_sample(batch.float(), grid, mode="nearest", padding_mode="zeros",
                                            align_corners=False)  # fmt: skip
    geometric = _is(codes, "shear_x", "shear_y", "translate_x", "translate_y", "rotate")
    return torch.where(geometric, moved.round().to(torch.uint8), batch)


_LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale


def _grey(x: torch.Tensor) -> torch.Tensor:
    """uint8 grey as torchvision makes it (weighted sum, truncated), float ``[B, 1, H, W]``."""
    r, g, b = x.float().unbind(1)
    return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).floor().unsqueeze(1)


def _enhanced(batch: torch.Tensor, codes: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Brightness, colour, contrast, sharpness: a blend of the image with its degenerate version by
    1 + magnitude, clamped and truncated to uint8 (torchvision's ``_blend``)."""
    x = batch.float()
    grey = _grey(batch)
    degenerate = torch.zeros_like(x)  # brightness blends with black
    degenerate = torch.where(_is(codes, "color"), grey.expand_as(x), degenerate)
    degenerate = torch.where(_is(codes, "contrast"), grey.mean((1, 2, 3), keepdim=True).expand_as(x), degenerate)
    degenerate = torch.where(_is(codes, "sharpness"), _smoothed(batch), degenerate)
    factor = (1.0 + m).view(-1, 1, 1, 1)
    blended = (factor * x + (1 - factor) * degenerate).clamp_(0, 255).to(torch.uint8)
    return torch.where(_is(codes, "brightness", "color", "contrast", "sharpness"), blended, batch)


def _smoothed(batch: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1, over 13), rounded, on the interior; borders unchanged."""
    kernel = torch.ones(3, 3, device=batch.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13).expand(3, 1, 3, 3)
    x = batch.float()
    blurred = torch.nn.functional.conv2d(x, kernel, groups=3).round()
    out = x.clone()
    out[..., 1:-1, 1:-1] = blurred
    return out


def _pixel_maps(batch: torch.Tensor, codes: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Posterize (keep ``m`` bits), solarize (invert at or above ``m``), autocontrast, equalize, invert."""
    x = batch
    bits = m.clamp(0, 8).long().view(-1, 1, 1, 1)
    mask = (255 - (2 ** (8 - bits) - 1)).to(torch.uint8)
    out = torch.where(_is(codes, "posterize"), x & mask, x)
    out = torch.where(_is(codes, "solarize") & (x.float() >= m.view(-1, 1, 1, 1)), 255 - x, out)
    out = torch.where(_is(codes, "invert"), 255 - x, out)
    out = torch.where(_is(codes, "autocontrast"), _autocontrast(x), out)
    return torch.where(_is(codes, "equalize"), equalize(x), out)


def _autocontrast(batch: torch.Tensor) -> torch.Tensor:
    """Each channel stretched to 0-255 (unchanged where it is flat), truncated (torchvision's tensor op)."""
    x = batch.float()
    low, high = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)
    flat = high == low
    scale = torch.where(flat, torch.ones_like(x[..., :1, :1]), 255.0 / (high - low).clamp(min=1))
    low = torch.where(flat, torch.zeros_like(low), low)
    return ((x - low) * scale).clamp_(0, 255).to(torch.uint8)


def equalize(batch: torch.Tensor) -> torch.Tensor:
    """PIL's histogram equalization of every channel of every image at once: step = (pixels - the count
    of the brightest value present) // 255; lut[v] = (step // 2 + pixels below v) // step."""
    n, c, h, w = batch.shape
    flat = batch.reshape(n * c, h * w).long()
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=batch.device).scatter_add_(1, flat, torch.ones_like(flat))
    brightest = flat.amax(1, keepdim=True)
    step = (h * w - hist.gather(1, brightest)) // 255
    below = torch.cumsum(hist, 1) - hist
    lut = ((step // 2 + below) // step.clamp(min=1)).clamp_(max=255)
    mapped = lut.gather(1, flat)
    out = torch.where(step == 0, flat, mapped)
    return out.to(torch.uint8).reshape(n, c, h, w)


def _resized_crop(batch: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """RandomResizedCrop (area 0.08-1 of the image, aspect 3/4-4/3, bilinear) and a horizontal flip."""
    n, _, h, w = batch.shape
    area, log_ratio, at_x, at_y, flip_draw = draws.unbind(0)
    ratio = torch.exp(log_ratio)
    crop_w = torch.sqrt(area * ratio).clamp(max=1.0)
    crop_h = torch.sqrt(area / ratio).clamp(max=1.0)
    centre_x = (at_x * (1 - crop_w) + crop_w / 2) * 2 - 1
    centre_y = (at_y * (1 - crop_h) + crop_h / 2) * 2 - 1
    flip = torch.where(flip_draw < 0.5, -1.0, 1.0)
    zero = torch.zeros_like(area)
    theta = torch.stack([crop_w * flip, zero, centre_x, zero, crop_h, centre_y], 1).view(n, 2, 3)
    grid = torch.nn.functional.affine_grid(theta, [n, 3, h, w], align_corners=False)
    x = torch.nn.functional.grid_sample(batch.float(), grid, mode="bilinear", padding_mode="border",
                                        align_corners=False)  # fmt: skip
    return x.round_().clamp_(0, 255).to(torch.uint8)

"""The ConDS paper's four augmentations: every pixel operation against PIL's (torchvision's tensor ops are
defined after PIL's: exact where both round alike, within a level or two where torchvision truncates and
PIL rounds), the geometry against exact turns and shifts, and the policies seeded per image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from shiftbench.erm import policies
from shiftbench.erm.augment import augment, draw
from shiftbench.erm.config import AUGMENTATIONS, TrainConfig

OPS = policies.OPS


def _images(n: int = 4, size: int = 24, seed: int = 0) -> torch.Tensor:
    """Smooth random colour fields with an edge: varied histograms, not noise."""
    rng = np.random.default_rng(seed)
    base = rng.integers(30, 220, size=(n, 3, 1, 1))
    ramp = np.linspace(0, 35, size)[None, None, :, None] * rng.uniform(-1, 1, size=(n, 3, 1, 1))
    noise = rng.integers(-12, 12, size=(n, 3, size, size))
    x = np.clip(base + ramp + noise, 0, 255)
    x[:, :, size // 3 : size // 2, size // 4 :] = 240
    return torch.from_numpy(x.astype(np.uint8))


def _one(batch: torch.Tensor, op: str, value: float) -> torch.Tensor:
    n = batch.shape[0]
    return policies.operate(batch, torch.full((n,), float(OPS.index(op))), torch.full((n,), value))


def _pil(batch: torch.Tensor, transform: object) -> torch.Tensor:
    out = [np.asarray(transform(Image.fromarray(img.permute(1, 2, 0).numpy()))) for img in batch]  # type: ignore[operator]
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)


@pytest.mark.parametrize(
    ("op", "value", "transform"),
    [
        ("posterize", 5.0, lambda im: ImageOps.posterize(im, 5)),
        ("solarize", 128.0, lambda im: ImageOps.solarize(im, 128)),
        ("equalize", 0.0, ImageOps.equalize),
        ("invert", 0.0, ImageOps.invert),
    ],
)
def test_pixel_maps_are_pil_s_exactly(op: str, value: float, transform: object) -> None:
    batch = _images()
    assert torch.equal(_one(batch, op, value), _pil(batch, transform))


def test_autocontrast_is_pil_s_within_a_level() -> None:
    """torchvision's tensor autocontrast truncates the stretched value; PIL's lookup table rounds."""
    batch = _images()
    difference = (_one(batch, "autocontrast", 0.0).int() - _pil(batch, ImageOps.autocontrast).int()).abs()
    assert difference.max() <= 1 and difference.float().mean() < 0.1


@pytest.mark.parametrize(
    ("op", "enhancer"),
    [("brightness", ImageEnhance.Brightness), ("color", ImageEnhance.Color), ("contrast", ImageEnhance.Contrast),
     ("sharpness", ImageEnhance.Sharpness)],
)  # fmt: skip
@pytest.mark.parametrize("offset", [-0.6, 0.45])
def test_enhancements_are_pil_s_within_rounding(op: str, enhancer: type, offset: float) -> None:
    batch = _images()
    ours = _one(batch, op, offset).int()
    theirs = _pil(batch, lambda im: enhancer(im).enhance(1 + offset)).int()
    difference = (ours - theirs).abs()
    assert difference.max() <= 3 and difference.float().mean() < 1.0, (op, int(difference.max()))


def test_geometry_turns_and_shifts_exactly_and_shears_about_the_corner() -> None:
    batch = _images(size=16)
    turned = _one(batch, "rotate", 90.0)
    assert torch.equal(turned, torch.rot90(batch, 1, (-2, -1))) or torch.equal(turned, torch.rot90(batch, 3, (-2, -1)))
    shifted = _one(batch, "translate_x", 5.0)
    right = torch.zeros_like(batch)
    right[..., 5:] = batch[..., :-5]
    left = torch.zeros_like(batch)
    left[..., :-5] = batch[..., 5:]
    assert torch.equal(shifted, right) or torch.equal(shifted, left)
    sheared = _one(batch, "shear_x", 0.3)
    assert torch.equal(sheared[..., 0, :], batch[..., 0, :])  # the top row stays, lower rows slide
    assert not torch.equal(sheared[..., -1, :], batch[..., -1, :])
    assert torch.equal(_one(batch, "identity", 0.0), batch)


def test_each_image_gets_its_own_operation() -> None:
    batch = _images(n=3)
    codes = torch.tensor([OPS.index("invert"), OPS.index("identity"), OPS.index("posterize")], dtype=torch.float32)
    out = policies.operate(batch, codes, torch.tensor([0.0, 0.0, 4.0]))
    assert torch.equal(out[0], 255 - batch[0]) and torch.equal(out[1], batch[1])
    assert torch.equal(out[2], batch[2] & 0xF0)


@pytest.mark.parametrize(("kind", "rows"), [("imagenet", 5), ("randaugment", 4), ("autoaugment", 4), ("augmix", 22)])
def test_policies_are_seeded_per_image_and_keep_the_batch_s_shape(kind: str, rows: int) -> None:
    batch = _images(n=16, size=32)
    assert draw(kind, 16, torch.Generator().manual_seed(0), size=32).shape == (rows, 16)
    first = augment(batch, kind, torch.Generator().manual_seed(1))
    assert torch.equal(first, augment(batch, kind, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, augment(batch, kind, torch.Generator().manual_seed(2)))
    assert first.shape == batch.shape and first.dtype == torch.uint8
    changed = [not torch.equal(a, b) for a, b in zip(first, batch, strict=True)]
    assert sum(changed) >= 8  # most images change (a sub-policy may leave one alone)


def test_randaugment_draws_every_operation_and_autoaugment_only_its_policy_s() -> None:
    generator = torch.Generator().manual_seed(0)
    rand = policies.draw("randaugment", 4000, 32, generator)
    assert set(rand[0].long().tolist()) == set(range(14))  # identity ... equalize, never invert
    auto = policies.draw("autoaugment", 4000, 32, generator)
    used = {OPS[int(c)] for c in torch.cat([auto[0], auto[2]]).tolist()}
    assert "invert" in used and "rotate" in used and "shear_x" not in used  # CIFAR-10's policy shears only in y
    assert torch.allclose(policies.draw("augmix", 500, 32, generator)[1:4].sum(0), torch.ones(500))


def test_the_paper_s_augmentations_are_training_parameters() -> None:
    assert set(policies.POLICIES) <= set(AUGMENTATIONS)
    for kind in policies.POLICIES:
        assert TrainConfig.from_mapping({"augment": kind}).augment == kind

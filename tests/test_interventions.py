"""BREEDS Table 14's interventions against their references, in the clients environment:

- ``random_erasing``: torchvision's ``RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)`` itself,
  image after image from the same seed: the same rectangles, the same pixels;
- ``pgd_l2``: the robustness library's own ``Attacker`` (1.2.1.post2, ``constraint='2'``, the library's training
  defaults: ``use_best``, no random start), on torchvision's ResNet-18 with fixed weights, at both of the table's
  settings: the same adversarial images as ours from the same weights (``.cuda()`` made a no-op and its logging
  package ``cox`` stubbed, to import it on a CPU without its experiment-logging dependencies). The images start
  inside [0.3, 0.7]: at exactly 0 or 1 the library's clamp has another gradient on torch 2.14 (the clients') than on
  2.13 (.venv's) and the BREEDS authors' torch, which ours follows on every version; ``use_best`` by a loss that
  overshoots;
- ``gaussian_noise``: N(0, 0.2) per pixel, by its moments;

then each through the training job (the step, the draws from the run's generator, a resumed run's draws).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.erm import interventions as iv
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.models import build_model
from shiftbench.errors import InputError

from .conftest import run_client

# Each case (seed, height, width) as a process of its own would compute it: the generators seeded afresh.
ERASING_REFERENCE = r"""
import sys
import numpy as np
import torch
from torchvision import transforms

out, images, cases = sys.argv[1], int(sys.argv[2]), [[int(v) for v in case.split(",")] for case in sys.argv[3:]]
arrays = {}
for seed, height, width in cases:
    erasing = transforms.RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)
    pixels = torch.rand(images, 3, height, width, generator=torch.Generator().manual_seed(99))
    torch.manual_seed(seed)
    erased = torch.stack([erasing(image.clone()) for image in pixels])
    arrays.update({f"pixels-{seed}": pixels.numpy(), f"erased-{seed}": erased.numpy()})
np.savez(out, **arrays)
print("ok")
"""

PGD_REFERENCE = r"""
import sys, types
import torch
import torchvision

cox = types.ModuleType("cox")
cox.store = types.ModuleType("cox.store")
cox.store.__getattr__ = lambda name: name
sys.modules.update({"cox": cox, "cox.store": cox.store})
torch.Tensor.cuda = lambda self, *args, **kwargs: self  # the attacker moves its input to the GPU; here, the CPU
from robustness.attacker import Attacker

def reference(eps, step_size):  # everything built afresh for each setting, as a process of its own would
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=4)
    g = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.copy_(0.5 + torch.rand(module.num_features, generator=g))
            module.running_var.copy_(0.5 + torch.rand(module.num_features, generator=g))
    model.eval()
    dataset = types.SimpleNamespace(mean=torch.tensor([0.4717, 0.4499, 0.3837]),
                                    std=torch.tensor([0.2600, 0.2516, 0.2575]))
    attacker = Attacker(model, dataset)
    pixels = 0.3 + 0.4 * torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(2))  # off the clip's ends
    target = torch.tensor([0, 1, 2, 3, 0, 1])
    kwargs = dict(constraint="2", eps=eps, step_size=step_size, iterations=3, random_start=False, use_best=True)
    adversarial = attacker(pixels, target, **kwargs)
    last = attacker(pixels, target, **{**kwargs, "use_best": False})
    return {"state_dict": model.state_dict(), "pixels": pixels, "target": target, "adversarial": adversarial,
            "last": last}

out, settings = sys.argv[1], [tuple(float(v) for v in setting.split(",")) for setting in sys.argv[2:]]
torch.save({f"{eps},{step_size}": reference(eps, step_size) for eps, step_size in settings}, out)
print("ok")
"""

STATS = (
    torch.tensor([0.4717, 0.4499, 0.3837]).view(1, 3, 1, 1),
    torch.tensor([0.2600, 0.2516, 0.2575]).view(1, 3, 1, 1),
)


ERASING_CASES = [(0, 224, 224), (1, 32, 32), (2, 40, 120)]
PGD_SETTINGS = [(0.5, 0.4), (1.0, 0.8)]


@pytest.fixture(scope="module")
def erasing_reference(clients_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision's erasing of every case, from one client process (each case seeded as a process of its own)."""
    out = tmp_path_factory.mktemp("erasing") / "erasing.npz"
    cases = [",".join(map(str, case)) for case in ERASING_CASES]
    assert run_client(clients_python, ERASING_REFERENCE, str(out), "200", *cases) == "ok\n"
    return out


@pytest.fixture(scope="module")
def pgd_reference(clients_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The robustness library's attack at every setting, from one client process (each built afresh)."""
    out = tmp_path_factory.mktemp("pgd") / "pgd.pt"
    settings = [f"{eps},{step_size}" for eps, step_size in PGD_SETTINGS]
    assert run_client(clients_python, PGD_REFERENCE, str(out), *settings) == "ok\n"
    return out


@pytest.mark.clients
@pytest.mark.parametrize(("seed", "height", "width"), ERASING_CASES)
def test_random_erasing_is_torchvisions(seed: int, height: int, width: int, erasing_reference: Path) -> None:
    with np.load(erasing_reference) as reference:
        pixels, erased = (torch.from_numpy(reference[f"{name}-{seed}"]) for name in ("pixels", "erased"))
    assert pixels.shape == (200, 3, height, width)
    setting = iv.Intervention("random_erasing")
    ours = iv.perturb(pixels, setting, torch.Generator().manual_seed(seed))
    assert torch.equal(ours, erased)
    touched = (erased != pixels).flatten(1).any(1).float().mean().item()
    assert 0.35 < touched < 0.65  # about half the images erased (p 0.5), so the test sees both branches


@pytest.mark.clients
@pytest.mark.parametrize(("eps", "step_size"), PGD_SETTINGS)
def test_pgd_l2_gives_the_robustness_librarys_adversarial_images(
    eps: float, step_size: float, pgd_reference: Path
) -> None:
    saved = torch.load(pgd_reference, weights_only=True)[f"{eps},{step_size}"]
    model = build_model("resnet18", 4, 32)
    model.load_state_dict(saved["state_dict"])
    model.train()  # the attack must run it in eval mode, and give it back in train mode
    mean, std = STATS
    setting = iv.Intervention("pgd_l2", pgd_eps=eps, pgd_step_size=step_size, pgd_steps=3)
    normalized = (saved["pixels"] - mean) / std
    ours = iv.attack(model, normalized, saved["target"], "robustness_custom_imagenet", setting) * std + mean
    assert model.training
    torch.testing.assert_close(ours, saved["adversarial"], rtol=0, atol=1e-4)
    moved = (saved["adversarial"] - saved["pixels"]).flatten(1).norm(dim=1)
    assert (moved > 0.1).all() and (moved <= eps + 1e-4).all()  # every image moved, within the ball
    torch.testing.assert_close(saved["last"], saved["adversarial"])  # here the last iterate is the worst: next test


def test_pgd_keeps_the_worst_iterate_not_the_last() -> None:
    """``use_best``: a loss whose maximum the fixed step overshoots (at 0.52, from 0.5 by steps of 0.4) is worst at the
    start; the iterates go 0.9, 0.5, 0.9 and the start (or its return) is kept, not the last."""

    def forward(p: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.zeros(p.shape[0]), -100 * ((p.flatten(1) - 0.52) ** 2).sum(1)], 1)

    setting = iv.Intervention("pgd_l2", pgd_eps=0.5, pgd_step_size=0.4, pgd_steps=3)
    kept = iv.pgd_l2(forward, torch.full((1, 1), 0.5), torch.tensor([0]), setting).item()
    assert kept == pytest.approx(0.5, abs=1e-5)  # the last iterate is 0.9 (0.5 comes back up to float rounding)
    one = iv.Intervention("pgd_l2", pgd_eps=0.5, pgd_step_size=0.4, pgd_steps=1)
    assert iv.pgd_l2(forward, torch.full((1, 1), 0.5), torch.tensor([0]), one).item() == 0.5
    near = iv.Intervention("pgd_l2", pgd_eps=0.5, pgd_step_size=0.01, pgd_steps=1)  # a step that gains: kept
    assert iv.pgd_l2(forward, torch.full((1, 1), 0.5), torch.tensor([0]), near).item() == pytest.approx(0.51)


def test_the_robustness_normalisation_clips_as_the_librarys_model_with_one_gradient_on_every_torch() -> None:
    """robustness/tools/helpers.py InputNormalize (lines 98-101) clamps to [0, 1] before normalising: so does ours for
    robustness_custom_imagenet, lighting included; the clip's gradient is 1 on [0, 1] (ends included) and 0 outside,
    written out (torch 2.14's clamp gives 0 at the ends, 2.13's 1: an attack would depend on the version)."""
    from shiftbench.erm.data import normalize, standardize

    pixels = torch.tensor([-0.2, 0.0, 0.5, 1.0, 1.3]).view(1, 1, 1, 5).expand(1, 3, 1, 5).clone().requires_grad_(True)
    standardize(pixels, "robustness_custom_imagenet").sum().backward()
    assert pixels.grad is not None
    assert pixels.grad[0, 0, 0].tolist() == pytest.approx([0.0, 1 / 0.26, 1 / 0.26, 1 / 0.26, 0.0])
    bright = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
    lit = normalize(bright, channels_last=False, kind="robustness_custom_imagenet", lighting=torch.full((1, 3), -5.0))
    mean, std = STATS
    assert torch.allclose(lit, ((1.0 - mean) / std).expand_as(lit))  # -5 sigma of lighting brightens past 1: clipped
    unclipped = normalize(bright, channels_last=False, kind="imagenet", lighting=torch.full((1, 3), -5.0))
    assert (
        unclipped * torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        + torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        > 1.01
    ).all()


def test_gaussian_noise_has_the_tables_spread() -> None:
    pixels = torch.full((8, 3, 64, 64), 0.5)
    noisy = iv.perturb(pixels, iv.Intervention("gaussian_noise"), torch.Generator().manual_seed(0))
    noise = noisy - pixels
    assert abs(noise.mean().item()) < 0.005 and abs(noise.std().item() - 0.2) < 0.005
    again = iv.perturb(pixels, iv.Intervention("gaussian_noise"), torch.Generator().manual_seed(0))
    assert torch.equal(noisy, again)


def _plan_values(**values: Any) -> dict[str, Any]:
    return TrainConfig.from_mapping(values).as_dict()


def test_an_intervention_is_recorded_only_when_on() -> None:
    """Runs without an intervention keep their config (and so their names and version ids); one with an intervention
    records it and its own settings only."""
    plain = _plan_values()
    assert not {"intervention", "noise_std", "erasing_p", "pgd_eps"} & set(plain)
    pgd = _plan_values(intervention="pgd_l2", pgd_eps=1, pgd_step_size=0.8)
    assert (pgd["intervention"], pgd["pgd_eps"], pgd["pgd_step_size"], pgd["pgd_steps"]) == ("pgd_l2", 1.0, 0.8, 3)
    assert "noise_std" not in pgd and "erasing_p" not in pgd
    assert json.loads(json.dumps(_plan_values(intervention="random_erasing")))["erasing_scale"] == [0.02, 0.33]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"intervention": "stylized"}, "parameter 'intervention': must be one of none, gaussian_noise, random_erasing"),
        ({"intervention": "pgd_l2", "method": "groupdro"}, "parameter 'intervention': pgd_l2 trains on the attack's"),
        ({"noise_std": 0}, "parameter 'noise_std': must be a number > 0"),
        ({"erasing_p": 1.5}, "parameter 'erasing_p': must be a probability in [0, 1]"),
        ({"erasing_scale": "0.3,0.1"}, "parameter 'erasing_scale': must be two numbers low,high"),
        ({"erasing_ratio": "1"}, "parameter 'erasing_ratio': must be two numbers low,high"),
        ({"pgd_eps": -1}, "parameter 'pgd_eps': must be a number > 0"),
        ({"pgd_step_size": "nan"}, "parameter 'pgd_step_size': must be a number > 0"),
        ({"pgd_steps": 0}, "parameter 'pgd_steps': must be an integer in [1, 1000]"),
    ],
    ids=["unknown", "pgd-method", "noise", "p", "scale", "ratio", "eps", "step", "steps"],
)
def test_an_intervention_setting_that_cannot_hold_is_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as refused:
        TrainConfig.from_mapping(values)
    assert str(refused.value).startswith(message), str(refused.value)


@pytest.fixture(scope="module")
def sprites(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from .conftest import small_sprites_home

    return small_sprites_home(tmp_path_factory.mktemp("interventions_home"), "sprites-uniform")


def _small_plan(sprites: Any, **values: Any) -> Any:
    from shiftbench.erm import launch

    small = {"model": "small_cnn", "image_size": 32, "batch_size": 8, "max_iters": 4, "eval_every": 2, "threads": 1,
             "optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "step": "auto", **values}  # fmt: skip
    return launch.plan_run(sprites, "sprites-uniform", preset="smoke", overrides=small)


def _job_outputs(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    import polars as pl

    summary = json.loads((folder / "run.json").read_text())
    return summary["weights"]["sha256"], pl.read_parquet(folder / "metrics.parquet").to_dicts()


@pytest.fixture(scope="module")
def plain_weights(sprites: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The weights of the same small run without an intervention (one run for every intervention's test)."""
    from shiftbench.erm.job import run_job

    folder = tmp_path_factory.mktemp("plain")
    run_job(_small_plan(sprites).job(folder), log=lambda _: None)
    return _job_outputs(folder)[0]


@pytest.mark.parametrize("intervention", ["gaussian_noise", "random_erasing", "pgd_l2"])
def test_an_intervention_trains_through_the_job_and_resumes_with_the_same_draws(
    intervention: str, sprites: Any, plain_weights: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``run_job`` with the eager step (named why); stopped after iteration 2 and resumed, the same weights
    and metrics as uninterrupted (the draws come from the run's checkpointed generator); not the plain run's."""
    from shiftbench.erm.interrupt import TEST_HOOK, Interrupted
    from shiftbench.erm.job import run_job

    plan = _small_plan(sprites, intervention=intervention)
    lines: list[str] = []
    run_job(plan.job(tmp_path / "whole"), log=lines.append)
    assert f"training step: eager ({intervention} draws per image on the host)" in lines
    monkeypatch.setenv(TEST_HOOK, "2")
    with pytest.raises(Interrupted):
        run_job(plan.job(tmp_path / "stopped"), log=lambda _: None)
    monkeypatch.delenv(TEST_HOOK)
    run_job(plan.job(tmp_path / "stopped"), log=lambda _: None)
    assert _job_outputs(tmp_path / "stopped") == _job_outputs(tmp_path / "whole")
    assert plain_weights != _job_outputs(tmp_path / "whole")[0]

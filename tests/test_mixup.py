"""Mixup against DomainBed's definition (``domainbed/algorithms.py`` at b93c22a, ``Mixup``, lines 791-820;
``lib/misc.py`` ``random_pairs_of_minibatches``, lines 180-194; ``hparams_registry.py`` lines 94-95), written out here
in numpy: the batch's groups paired along a permutation (each with the next, the last with the first, cut to the
smaller size), one Beta(alpha, alpha) weight per pair, the mixed inputs, the weighted cross-entropies summed over the
pairs and divided by the number of groups, and the gradient of a linear model by hand; then through the job, resumed
bit for bit."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.fit import method_params
from shiftbench.erm.methods import build_method
from shiftbench.erm.mixing import Mixup
from shiftbench.erm.objective import Batch
from shiftbench.errors import InputError

SEED = 7
ALPHA = 0.4


class Recording(torch.nn.Module):
    """A linear model that remembers the inputs of its forward passes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3).double()
        self.inputs: list[np.ndarray] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.detach().numpy().copy())
        out: torch.Tensor = self.fc(x)
        return out


def _method(seed: int = SEED, alpha: float = ALPHA) -> Mixup:
    params = {**method_params(TrainConfig(method="mixup", mixup_alpha=alpha)), "method_seed": float(seed)}
    method = build_method("mixup", np.array([1, 3, 5]), 6, params, torch.device("cpu"))
    assert isinstance(method, Mixup)
    return method


def _batch(model: Recording) -> Batch:
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(11, 4)))
    y = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1, 2, 0, 1])
    g = torch.tensor([3, 1, 3, 1, 3, 1, 3, 5, 5, 1, 3])  # group 1: 4 examples, 3: 5, 5: 2
    return Batch(model, model.fc, x, y, g, 1, [], contextlib.nullcontext)


def _by_hand(w: np.ndarray, b: np.ndarray, batch: Batch, seed: int, alpha: float) -> dict[str, Any]:
    """DomainBed's update for a linear model (logits x w^T + b), its loss and gradient written out."""
    x, y, g = batch.x.numpy(), batch.y.numpy(), batch.g.numpy()
    minibatches = [np.flatnonzero(g == code) for code in (1, 3, 5)]  # the domains in code order
    perm = torch.randperm(3, generator=torch.Generator().manual_seed(seed)).tolist()  # random_pairs_of_minibatches
    beta = np.random.RandomState(seed)  # np.random.beta, on the run's own RandomState
    objective, grad_w, grad_b = 0.0, np.zeros_like(w), np.zeros_like(b)
    inputs, scored = [], []
    for i in range(3):
        j = i + 1 if i < 2 else 0
        rows_i, rows_j = minibatches[perm[i]], minibatches[perm[j]]
        n = min(len(rows_i), len(rows_j))
        rows_i, rows_j = rows_i[:n], rows_j[:n]
        lam = beta.beta(alpha, alpha)
        mixed = lam * x[rows_i] + (1 - lam) * x[rows_j]
        logits = mixed @ w.T + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        objective += lam * -np.log(p[np.arange(n), y[rows_i]]).mean()
        objective += (1 - lam) * -np.log(p[np.arange(n), y[rows_j]]).mean()
        target = lam * np.eye(3)[y[rows_i]] + (1 - lam) * np.eye(3)[y[rows_j]]
        d_logits = (p - target) / n / 3  # the objective is divided by the number of domains
        grad_w += d_logits.T @ mixed
        grad_b += d_logits.sum(0)
        inputs.append(mixed)
        scored.append(y[rows_i] if lam >= 0.5 else y[rows_j])
    return {"loss": objective / 3, "grad_w": grad_w, "grad_b": grad_b, "inputs": inputs, "scored": scored}


def test_mixup_loss_and_gradient_are_domainbeds_by_hand() -> None:
    torch.manual_seed(0)
    model = Recording()
    batch = _batch(model)
    w, b = model.fc.weight.detach().numpy().copy(), model.fc.bias.detach().numpy().copy()
    expected = _by_hand(w, b, batch, SEED, ALPHA)
    logits, scored, loss = _method().forward(batch)
    # The cross-entropy is taken in float32 (the step's logits.float(): bf16 logits are scored in float32)
    assert loss.item() == pytest.approx(expected["loss"], rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert model.fc.weight.grad is not None and model.fc.bias.grad is not None
    np.testing.assert_allclose(model.fc.weight.grad.numpy(), expected["grad_w"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.fc.bias.grad.numpy(), expected["grad_b"], rtol=1e-5, atol=1e-7)
    # One forward pass per pair, on that pair's mixed inputs (BatchNorm would see each pair's statistics, as DomainBed)
    assert len(model.inputs) == 3
    for got, want in zip(model.inputs, expected["inputs"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert logits.shape == (sum(len(v) for v in expected["inputs"]), 3)
    assert scored.tolist() == np.concatenate(expected["scored"]).tolist()


def test_mixup_draws_come_from_its_seed_and_resume_from_its_state() -> None:
    torch.manual_seed(0)
    model = Recording()
    batch = _batch(model)
    first, again = _method(), _method()
    assert first.forward(batch)[2].item() == again.forward(batch)[2].item()  # the same seed: the same draws
    other = _method(seed=SEED + 1).forward(batch)[2].item()
    saved = first.state_dict()
    following = first.forward(batch)[2].item()
    assert following != other
    resumed = _method(seed=SEED + 1)
    resumed.load_state_dict(saved)  # a checkpoint keeps both generators
    assert resumed.forward(batch)[2].item() == following


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("inf")])
def test_a_mixup_alpha_that_cannot_hold_is_one_line(alpha: float) -> None:
    with pytest.raises(InputError) as refused:
        TrainConfig.from_mapping({"method": "mixup", "mixup_alpha": alpha})
    assert str(refused.value).startswith("parameter 'mixup_alpha': must be a number > 0"), str(refused.value)


def test_mixup_settings_are_recorded_only_for_mixup() -> None:
    assert "mixup_alpha" not in TrainConfig().as_dict()
    assert TrainConfig(method="mixup").as_dict()["mixup_alpha"] == 0.2


def test_mixup_trains_through_the_job_and_resumes_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shiftbench.erm.job import run_job

    from .conftest import assert_resumes_bit_for_bit, group_method_plan

    plan = group_method_plan(tmp_path, "mixup")
    assert plan.run.endswith(".small_cnn.mixup.seed0") and plan.config["mixup_alpha"] == 0.2
    lines: list[str] = []
    run_job(plan.job(tmp_path / "once"), log=lines.append)
    assert "training step: eager (mixup decides per batch on the host)" in lines, lines
    assert_resumes_bit_for_bit(plan, tmp_path, monkeypatch, stop_after=4)

"""CDANN against DomainBed's definition (``domainbed/algorithms.py`` at b93c22a, ``AbstractDANN`` with ``conditional``
and ``class_balance``, lines 477-562; ``networks.MLP``; ``hparams_registry.py`` lines 49-57, 235-248), written out
here independently of shiftbench.erm.methods: the discriminator's class-balanced loss and its gradient penalty by
hand (the MLP's backward pass too), the generator's loss, the gradients by finite differences, which steps are the
discriminator's, which parameters each step moves; then through the training job, resumed bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.fit import method_params
from shiftbench.erm.methods import CDANN, build_method
from shiftbench.errors import InputError


def _method(grad_penalty: float = 0.0, d_steps: int = 1, classes: int = 3, features: int = 5) -> CDANN:
    torch.manual_seed(0)
    params = {**method_params(TrainConfig(method="cdann", cdann_grad_penalty=grad_penalty,
                                          cdann_d_steps_per_g=d_steps, cdann_mlp_width=7)),
              "features": float(features), "classes": float(classes)}  # fmt: skip
    method = build_method("cdann", np.array([0, 2, 2, 5]), 6, params, torch.device("cpu"))
    assert isinstance(method, CDANN)
    return method


def _by_hand(method: CDANN, z: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> tuple[torch.Tensor, float]:
    """DomainBed's disc_loss and grad_penalty, every operation written out (no autograd)."""
    (w1, b1), (w2, b2), (w3, b3) = (
        (layer.weight.detach().double(), layer.bias.detach().double())
        for layer in (method.discriminator.input, method.discriminator.hiddens[0], method.discriminator.output)
    )
    h = z.double() + method.class_embeddings.weight.detach().double()[y]
    a1 = (h @ w1.T + b1).clamp(min=0)
    a2 = (a1 @ w2.T + b2).clamp(min=0)
    out = a2 @ w3.T + b3
    p = out.exp() / out.exp().sum(1, keepdim=True)
    ce = -torch.log(p[torch.arange(len(y)), domains])
    k = int(y.max()) + 1  # F.one_hot without num_classes: as many classes as the largest label says
    counts = torch.tensor([(y == c).sum().item() for c in range(k)], dtype=torch.float64)
    loss = (ce / (counts[y] * k)).sum()
    onehot = torch.zeros_like(p)
    onehot[torch.arange(len(y)), domains] = 1
    g2 = ((p - onehot) @ w3) * (a1 @ w2.T + b2 > 0)
    g1 = (g2 @ w2) * (h @ w1.T + b1 > 0)
    grad_h = g1 @ w1
    return loss, float((grad_h**2).sum(1).mean())


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(8, 5, generator=g)
    y = torch.tensor([0, 1, 1, 2, 2, 2, 0, 1])
    groups = torch.tensor([0, 2, 5, 0, 2, 5, 5, 0])
    logits = torch.randn(8, 3, generator=g)
    return z, y, groups, logits


def test_the_discriminator_loss_and_penalty_are_domainbeds() -> None:
    z, y, groups, _ = _batch()
    method = _method()
    domains = method.domain_of[groups]
    assert domains.tolist() == [0, 1, 2, 0, 1, 2, 2, 0]  # training groups 0, 2, 5 are domains 0, 1, 2
    loss, _ = _by_hand(method, z, y, domains)
    torch.testing.assert_close(method.discriminator_loss(z, y, domains).double(), loss, rtol=1e-5, atol=1e-6)
    with_penalty = _method(grad_penalty=0.7)
    expected = _by_hand(with_penalty, z, y, domains)
    got = with_penalty.discriminator_loss(z, y, domains).double()
    torch.testing.assert_close(got, expected[0] + 0.7 * expected[1], rtol=1e-5, atol=1e-6)


def test_the_generator_loss_is_the_cross_entropy_minus_lambda_times_the_discriminators_and_its_gradient_holds() -> None:
    z, y, groups, logits = _batch()
    method = _method()
    domains = method.domain_of[groups]
    got = method.loss(logits, z, y, groups, iteration=1)  # DomainBed's update 1: a generator step
    assert not method.discriminating
    ce = -torch.log_softmax(logits.double(), 1)[torch.arange(8), y].mean()
    torch.testing.assert_close(got.double(), ce - 1.0 * _by_hand(method, z, y, domains)[0], rtol=1e-5, atol=1e-6)
    method.discriminator.double(), method.class_embeddings.double()
    z64 = z.double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: method.loss(logits.double(), f, y, groups, 1), (z64,))
    method.discriminator.float(), method.class_embeddings.float()


@pytest.mark.parametrize(
    ("d_steps", "discriminating"), [(1, [False, True, False, True]), (2, [True, False, True, True, False])]
)
def test_steps_alternate_as_domainbeds_update_count(d_steps: int, discriminating: list[bool]) -> None:
    """DomainBed: ``update_count % (1 + d) < d`` is a discriminator step, counting updates from 1."""
    z, y, groups, logits = _batch()
    method = _method(d_steps=d_steps)
    seen = []
    for iteration in range(1, len(discriminating) + 1):
        method.loss(logits, z, y, groups, iteration)
        seen.append(method.discriminating)
    assert seen == discriminating


def test_a_discriminator_step_moves_only_the_discriminator_and_a_generator_step_only_the_model() -> None:
    """As the step runs it: the model's Adam (betas 0.5, 0.9) after the method's hook. On a discriminator step the
    features are detached, so the model gets no gradient and its optimizer skips it (DomainBed steps disc_opt only);
    on a generator step the discriminator's optimizer does not step (DomainBed steps gen_opt only)."""
    torch.manual_seed(1)
    featurizer, head = torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)
    model_opt = torch.optim.Adam([*featurizer.parameters(), *head.parameters()], lr=0.01, betas=(0.5, 0.9))
    method = _method()
    _, y, groups, _ = _batch()
    x = torch.randn(8, 4)

    def step(iteration: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        before_model = [p.detach().clone() for p in [*featurizer.parameters(), *head.parameters()]]
        before_disc = [p.detach().clone() for p in method.discriminator.parameters()]
        features = featurizer(x)
        loss = method.loss(head(features), features, y, groups, iteration)
        model_opt.zero_grad(set_to_none=True)
        loss.backward()
        method.after_backward()
        model_opt.step()
        moved_model = [
            not torch.equal(a, b)
            for a, b in zip(before_model, [*featurizer.parameters(), *head.parameters()], strict=True)
        ]
        moved_disc = [
            not torch.equal(a, b) for a, b in zip(before_disc, method.discriminator.parameters(), strict=True)
        ]
        return moved_model, moved_disc

    model, disc = step(1)  # generator
    assert all(model) and not any(disc)
    model, disc = step(2)  # discriminator
    assert not any(model) and all(disc)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"method": "cdann", "optimizer": "sgd"}, "parameter 'optimizer': cdann trains with Adam"),
        ({"cdann_lambda": -1}, "parameter 'cdann_lambda': must be a number >= 0"),
        ({"cdann_d_steps_per_g": 0}, "parameter 'cdann_d_steps_per_g': must be an integer in [1, 100]"),
        ({"cdann_mlp_depth": 1}, "parameter 'cdann_mlp_depth': must be an integer in [2, 64]"),
        ({"cdann_beta1": 1}, "parameter 'cdann_beta1': must be a number in [0, 1)"),
        ({"cdann_mlp_dropout": 1.5}, "parameter 'cdann_mlp_dropout': must be a number in [0, 1)"),
    ],
    ids=["sgd", "lambda", "d-steps", "depth", "beta1", "dropout"],
)
def test_a_cdann_setting_that_cannot_hold_is_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as refused:
        TrainConfig.from_mapping(values)
    assert str(refused.value).startswith(message), str(refused.value)


def test_cdann_settings_are_recorded_only_for_cdann() -> None:
    assert not [k for k in TrainConfig().as_dict() if k.startswith("cdann_")]
    assert TrainConfig(method="cdann").as_dict()["cdann_beta1"] == 0.5


def test_cdann_trains_through_the_job_and_resumes_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shiftbench.erm.job import run_job

    from .conftest import assert_resumes_bit_for_bit, group_method_plan

    plan = group_method_plan(tmp_path, "cdann")
    assert plan.run.endswith(".small_cnn.cdann.seed0") and plan.config["cdann_lambda"] == 1.0
    lines: list[str] = []
    run_job(plan.job(tmp_path / "once"), log=lines.append)
    assert "training step: eager (cdann decides per batch on the host)" in lines, lines
    assert_resumes_bit_for_bit(plan, tmp_path, monkeypatch, stop_after=4)

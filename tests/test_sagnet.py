"""SagNet against DomainBed's definition (``domainbed/algorithms.py`` at b93c22a, ``SagNet``, lines 1126-1245;
``networks.Classifier``; ``hparams_registry.py`` lines 86-87), written out here independently of
shiftbench.erm.mixing: the style and content randomization of a batch of features and the content loss and its
gradient on the last layer in numpy, the content randomization's gradient by hand (the partner's features detached),
the style randomization's by finite differences, and DomainBed's update (featurizer, content and style networks, each
with its own Adam, three forward passes) in plain torch against shiftbench's step; then through the job, resumed bit
for bit."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.fit import method_params
from shiftbench.erm.methods import build_method
from shiftbench.erm.mixing import SagNet
from shiftbench.erm.objective import Batch, update
from shiftbench.errors import InputError

SEED = 3
EPS = 1e-5
LR, WEIGHT_DECAY, W_ADV = 0.01, 1e-3, 0.7


class Featurizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(4, 6), nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(self.linear(x)))


class Tiny(nn.Module):
    """A featurizer (linear, batch norm, tanh) and a last layer ``fc``, in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.features = Featurizer()
        self.fc = nn.Linear(6, 3)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.features(x))
        return out


def _method() -> SagNet:
    config = TrainConfig(method="sagnet", lr=LR, weight_decay=WEIGHT_DECAY, sagnet_w_adv=W_ADV)
    params = {**method_params(config), "features": 6.0, "classes": 3.0, "method_seed": float(SEED)}
    method = build_method("sagnet", np.array([0, 1]), 2, params, torch.device("cpu"))
    assert isinstance(method, SagNet)
    method.style.double()
    return method


def _draws() -> torch.Generator:
    """The method's generator after the style network's initial weights were drawn."""
    generator = torch.Generator().manual_seed(SEED)
    torch.randint(2**62, (1,), generator=generator)
    return generator


def _randomize_by_hand(z: np.ndarray, alpha: np.ndarray, swap: np.ndarray, what: str) -> np.ndarray:
    """DomainBed's ``randomize`` on a batch of feature vectors: statistics over each example's own features."""
    mean, var = z.mean(1, keepdims=True), z.var(1, ddof=1, keepdims=True)
    normal = (z - mean) / np.sqrt(var + EPS)
    if what == "style":
        mean = alpha * mean + (1 - alpha) * mean[swap]
        var = alpha * var + (1 - alpha) * var[swap]
    else:
        normal = normal[swap]
    out: np.ndarray = normal * np.sqrt(var + EPS) + mean
    return out


def _features() -> torch.Tensor:
    return torch.tensor(np.random.default_rng(1).normal(size=(8, 6)) * 2 + 0.5)


def test_style_and_content_randomization_are_domainbeds_by_hand() -> None:
    method, draws, z = _method(), _draws(), _features()
    for what in ("style", "content"):
        alpha = torch.rand(8, 1, generator=draws).double().numpy()  # DomainBed draws alpha, then the partners
        swap = torch.randperm(8, generator=draws).numpy()
        got = method.randomize(z, mix_style=what == "style")
        np.testing.assert_allclose(got.numpy(), _randomize_by_hand(z.numpy(), alpha, swap, what), rtol=1e-12)


def test_content_randomization_passes_gradient_only_through_the_examples_own_statistics() -> None:
    """out_i = n_p(i) * s_i + m_i with n_p(i) the partner's standardised features, detached: d(c . out_i)/dz_i is
    (c_i . n_p(i)) (z_i - m_i) / ((d - 1) s_i) + sum(c_i) / d, and nothing reaches the partner."""
    method, draws = _method(), _draws()
    z = _features().requires_grad_(True)
    c = torch.tensor(np.random.default_rng(2).normal(size=(8, 6)))
    (method.randomize(z, mix_style=False) * c).sum().backward()  # type: ignore[no-untyped-call]
    torch.rand(8, 1, generator=draws)
    swap = torch.randperm(8, generator=draws).numpy()
    x, cn, d = z.detach().numpy(), c.numpy(), 6
    mean, std = x.mean(1, keepdims=True), np.sqrt(x.var(1, ddof=1, keepdims=True) + EPS)
    normal = (x - mean) / std
    by_hand = (cn * normal[swap]).sum(1, keepdims=True) * (x - mean) / ((d - 1) * std) + cn.sum(1, keepdims=True) / d
    assert z.grad is not None
    np.testing.assert_allclose(z.grad.numpy(), by_hand, rtol=1e-9, atol=1e-12)


def test_style_randomization_gradient_holds() -> None:
    method = _method()
    start = method.generator.get_state()

    def randomized(z: torch.Tensor) -> torch.Tensor:
        method.generator.set_state(start)  # the same draws at every evaluation
        return method.randomize(z, mix_style=True)

    assert torch.autograd.gradcheck(randomized, (_features().requires_grad_(True),))


def _batch(model: Tiny, captured: list[torch.Tensor]) -> Batch:
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(8, 4)))
    y = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1])
    return Batch(model, model.fc, x, y, torch.zeros(8, dtype=torch.long), 1, captured, contextlib.nullcontext)


def test_the_content_loss_and_its_last_layer_gradient_are_domainbeds_by_hand() -> None:
    torch.manual_seed(0)
    model, captured = Tiny(), []
    model.fc.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    batch = _batch(model, captured)
    method, draws = _method(), _draws()
    _, _, loss = method.forward(batch)
    loss.backward()  # type: ignore[no-untyped-call]
    w1, b1 = (t.detach().numpy() for t in (model.features.linear.weight, model.features.linear.bias))
    h = batch.x.numpy() @ w1.T + b1
    h = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-5)  # training-mode batch norm: the batch's biased variance
    z = np.tanh(h * model.features.norm.weight.detach().numpy() + model.features.norm.bias.detach().numpy())
    alpha = torch.rand(8, 1, generator=draws).double().numpy()
    swap = torch.randperm(8, generator=draws).numpy()
    randomized = _randomize_by_hand(z, alpha, swap, "style")
    logits = randomized @ model.fc.weight.detach().numpy().T + model.fc.bias.detach().numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = batch.y.numpy()
    assert loss.item() == pytest.approx(-np.log(p[np.arange(8), y]).mean(), rel=1e-6)
    d_logits = (p - np.eye(3)[y]) / 8
    assert model.fc.weight.grad is not None
    np.testing.assert_allclose(model.fc.weight.grad.numpy(), d_logits.T @ randomized, rtol=1e-5, atol=1e-7)


def _domainbed_update(nets: dict[str, nn.Module], opts: dict[str, Any], batch: Batch, draws: torch.Generator) -> float:
    """DomainBed's ``SagNet.update``: three forward passes, three Adams, written out in plain torch."""

    def randomize(x: torch.Tensor, what: str) -> torch.Tensor:
        alpha = torch.rand(len(x), 1, generator=draws).double()
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
        x = (x - mean) / (var + EPS).sqrt()
        swap = torch.randperm(len(x), generator=draws)
        if what == "style":
            mean, var = alpha * mean + (1 - alpha) * mean[swap], alpha * var + (1 - alpha) * var[swap]
        else:
            x = x[swap].detach()
        return x * (var + EPS).sqrt() + mean

    f, c, s = nets["f"], nets["c"], nets["s"]
    opts["f"].zero_grad(), opts["c"].zero_grad()
    loss_c = nn.functional.cross_entropy(c(randomize(f(batch.x), "style")), batch.y)
    loss_c.backward()  # type: ignore[no-untyped-call]
    opts["f"].step(), opts["c"].step()
    opts["s"].zero_grad()
    nn.functional.cross_entropy(s(randomize(f(batch.x), "content")), batch.y).backward()  # type: ignore[no-untyped-call]
    opts["s"].step()
    opts["f"].zero_grad()
    loss_adv = -nn.functional.log_softmax(s(randomize(f(batch.x), "content")), dim=1).mean(1).mean() * W_ADV
    loss_adv.backward()  # type: ignore[no-untyped-call]
    opts["f"].step()
    return loss_c.item()


def test_a_step_is_domainbeds_update_with_three_adams() -> None:
    """Through shiftbench.erm.objective.update with the model's one Adam (as the step makes it: the run's lr and
    weight decay, betas 0.9, 0.999), three steps; DomainBed's three Adams on copies of the same networks, with the
    same draws, end at the same weights, batch-norm statistics (three passes a step) and content losses."""
    torch.manual_seed(0)
    model, captured = Tiny(), []
    model.fc.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    method = _method()
    nets = {"f": copy.deepcopy(model.features), "c": copy.deepcopy(model.fc), "s": copy.deepcopy(method.style)}
    opts = {k: torch.optim.Adam(v.parameters(), lr=LR, weight_decay=WEIGHT_DECAY) for k, v in nets.items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    draws = _draws()
    for _ in range(3):
        batch = _batch(model, captured)
        _, _, loss = update(method, batch, optimizer)
        assert loss.item() == pytest.approx(_domainbed_update(nets, opts, batch, draws), rel=1e-6)
    ours = {**model.features.state_dict(), **{f"fc.{k}": v for k, v in model.fc.state_dict().items()}}
    ours |= {f"style.{k}": v for k, v in method.style.state_dict().items()}
    theirs = {**nets["f"].state_dict(), **{f"fc.{k}": v for k, v in nets["c"].state_dict().items()}}
    theirs |= {f"style.{k}": v for k, v in nets["s"].state_dict().items()}
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    assert model.features.norm.num_batches_tracked is not None
    assert int(model.features.norm.num_batches_tracked) == 9  # three forward passes a step


def test_the_method_resumes_from_its_state() -> None:
    method, z = _method(), _features()
    method.randomize(z, mix_style=True)
    again = build_method("sagnet", np.array([0, 1]), 2, {**method.params, "method_seed": 99.0}, torch.device("cpu"))
    assert isinstance(again, SagNet)
    again.style.double()
    again.load_state_dict(method.state_dict())  # the generator, the style network and its Adam
    assert torch.equal(again.style.weight, method.style.weight)
    assert torch.equal(again.randomize(z, mix_style=False), method.randomize(z, mix_style=False))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"method": "sagnet", "optimizer": "sgd"}, "parameter 'optimizer': sagnet trains with Adam"),
        ({"sagnet_w_adv": -0.1}, "parameter 'sagnet_w_adv': must be a number >= 0"),
    ],
    ids=["sgd", "w_adv"],
)
def test_a_sagnet_setting_that_cannot_hold_is_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as refused:
        TrainConfig.from_mapping(values)
    assert str(refused.value).startswith(message), str(refused.value)


def test_sagnet_settings_are_recorded_only_for_sagnet() -> None:
    assert not [k for k in TrainConfig().as_dict() if k.startswith("sagnet_")]
    assert TrainConfig(method="sagnet").as_dict()["sagnet_w_adv"] == 0.1


def test_sagnet_trains_through_the_job_and_resumes_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shiftbench.erm.job import run_job

    from .conftest import assert_resumes_bit_for_bit, group_method_plan

    plan = group_method_plan(tmp_path, "sagnet")
    assert plan.run.endswith(".small_cnn.sagnet.seed0") and plan.config["sagnet_w_adv"] == 0.1
    lines: list[str] = []
    run_job(plan.job(tmp_path / "once"), log=lines.append)
    assert "training step: eager (sagnet decides per batch on the host)" in lines, lines
    assert_resumes_bit_for_bit(plan, tmp_path, monkeypatch, stop_after=4)

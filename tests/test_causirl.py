"""CausIRL with CORAL's and with the MMD's distance against DomainBed's definition (``domainbed/algorithms.py`` at
b93c22a, ``AbstractCausIRL``, lines 2272-2350; ``mmd_gamma`` 1), written out here in numpy: each group's cross-entropy
averaged over the groups, each group's features cut at a random point, the firsts against the seconds (means and
covariances, or a sum of seven Gaussian kernels); then through the job, resumed bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.fit import method_params
from shiftbench.erm.methods import build_method

GAMMAS = [0.001, 0.01, 0.1, 1, 10, 100, 1000]


def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    shifted = logits - logits.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def _coral(x: np.ndarray, z: np.ndarray) -> float:
    mean_x, mean_z = x.mean(0), z.mean(0)
    cov_x = (x - mean_x).T @ (x - mean_x) / (len(x) - 1)
    cov_z = (z - mean_z).T @ (z - mean_z) / (len(z) - 1)
    return float(((mean_x - mean_z) ** 2).mean() + ((cov_x - cov_z) ** 2).mean())


def _mmd(x: np.ndarray, z: np.ndarray) -> float:
    def gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        squared = np.array([[max(((u - v) ** 2).sum(), 1e-30) for v in b] for u in a])
        return sum(np.exp(-gamma * squared) for gamma in GAMMAS)

    return float(gram(x, x).mean() + gram(z, z).mean() - 2 * gram(x, z).mean())


@pytest.mark.parametrize(("name", "distance"), [("causirl_coral", _coral), ("causirl_mmd", _mmd)])
def test_causirl_is_domainbeds_by_hand(name: str, distance: Any) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(12, 4))
    logits = rng.normal(size=(12, 3))
    y = rng.integers(0, 3, 12)
    g = np.array([3, 1, 3, 1, 3, 1, 3, 1, 5, 5, 5, 5])
    params = {**method_params(TrainConfig(method=name, causirl_mmd_gamma=0.5)), "method_seed": 11.0}
    method = build_method(name, g, 6, params, torch.device("cpu"))
    got = method.loss(torch.tensor(logits), torch.tensor(features), torch.tensor(y), torch.tensor(g), 1)
    generator = torch.Generator().manual_seed(11)  # the cut points the method draws, in group order 1, 3, 5
    firsts, seconds, objectives = [], [], []
    for group in (1, 3, 5):
        members = g == group
        cut = int(torch.randint(0, int(members.sum()), (1,), generator=generator).item())
        firsts.append(features[members][:cut])
        seconds.append(features[members][cut:])
        objectives.append(_cross_entropy(logits[members], y[members]))
    first, second = np.concatenate(firsts), np.concatenate(seconds)
    penalty = distance(first, second) if len(first) > 1 and len(second) > 1 else 0.0
    assert float(got) == pytest.approx(np.mean(objectives) + 0.5 * penalty, rel=1e-9)
    again = build_method(name, g, 6, params, torch.device("cpu"))
    again.load_state_dict(method.state_dict())  # a checkpoint keeps the cut points' generator
    args = (torch.tensor(logits), torch.tensor(features), torch.tensor(y), torch.tensor(g), 2)
    assert float(again.loss(*args)) == float(method.loss(*args))


def test_causirl_settings_are_recorded_only_for_causirl() -> None:
    assert "causirl_mmd_gamma" not in TrainConfig().as_dict()
    assert TrainConfig(method="causirl_mmd").as_dict()["causirl_mmd_gamma"] == 1.0


def test_causirl_trains_through_the_job_and_resumes_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import assert_resumes_bit_for_bit, group_method_plan

    plan = group_method_plan(tmp_path, "causirl_mmd")
    assert_resumes_bit_for_bit(plan, tmp_path, monkeypatch, stop_after=4)

"""The training objectives that run the model themselves (:meth:`shiftbench.erm.objective.Method.forward`) on
inputs or features mixed across the batch, as DomainBed defines them (``domainbed/algorithms.py`` at b93c22a; their
default hyperparameters, ``hparams_registry.py``); :mod:`shiftbench.erm.methods` registers them:

- ``mixup``: inter-domain Mixup (Yan et al. 2020), DomainBed's ``Mixup`` (lines 791-820, with ``lib/misc.py``
  ``random_pairs_of_minibatches``, lines 180-194; ``mixup_alpha`` 0.2): :class:`Mixup`;
- ``sagnet``: style-agnostic networks (Nam et al. 2021), DomainBed's ``SagNet`` (lines 1126-1245; ``sag_w_adv``
  0.1): :class:`SagNet`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from shiftbench.erm.objective import Batch, Method


class RunsModel(Method):
    """A method that runs the model itself (inputs of its own, several passes a step): :meth:`forward`, not
    :meth:`loss`. Its draws come from generators seeded with the run's ``method_seed`` and kept in checkpoints."""

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        self.generator = torch.Generator().manual_seed(int(params.get("method_seed", 0)))

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} runs the model itself: Method.forward (objective.update calls it)")


class Mixup(RunsModel):
    """DomainBed's ``Mixup``: the batch's groups are its domains (in code order), paired along a random permutation
    of them, each with the next and the last with the first, both cut to the smaller one's size; for each pair,
    lambda ~ Beta(``mixup_alpha``, ``mixup_alpha``), one forward pass of the model on lambda x_i + (1 - lambda) x_j and
    lambda CE(y_i) + (1 - lambda) CE(y_j); the loss is their sum over the pairs divided by the number of groups.

    The permutation is ``torch.randperm`` on :attr:`generator` (DomainBed: torch's global generator) and lambda is
    ``RandomState.beta``, DomainBed's sampler (``np.random.beta``), on a ``RandomState`` of its own seeded with
    ``method_seed``; both are kept in checkpoints. The running training accuracy scores each mixed example against
    the label of its larger share (y_i when lambda >= 0.5)."""

    name = "mixup"
    default_loader = "groups"  # DomainBed's batch: one minibatch of the same size per training domain

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        self.beta = np.random.RandomState(int(params.get("method_seed", 0)))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        members = [torch.nonzero(batch.g == code).flatten() for code in torch.unique(batch.g).tolist()]
        order = torch.randperm(len(members), generator=self.generator).tolist()
        alpha = self.params["mixup_alpha"]
        objective = torch.zeros((), device=batch.x.device)
        predictions, scored = [], []
        for position, first in enumerate(order):
            second = order[(position + 1) % len(order)]
            size = min(len(members[first]), len(members[second]))
            rows_i, rows_j = members[first][:size], members[second][:size]
            lam = float(self.beta.beta(alpha, alpha))
            logits = batch.model(lam * batch.x[rows_i] + (1 - lam) * batch.x[rows_j])
            y_i, y_j = batch.y[rows_i], batch.y[rows_j]
            objective = objective + lam * nn.functional.cross_entropy(logits.float(), y_i)
            objective = objective + (1 - lam) * nn.functional.cross_entropy(logits.float(), y_j)
            predictions.append(logits)
            scored.append(y_i if lam >= 0.5 else y_j)
        return torch.cat(predictions), torch.cat(scored), objective / len(members)

    def state_dict(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, gauss = self.beta.get_state(legacy=True)
        beta = [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), position, has_gauss, gauss]
        return {"generator": self.generator.get_state(), "beta": beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        kind, keys, position, has_gauss, gauss = state["beta"]
        self.beta.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))


class SagNet(RunsModel):
    """DomainBed's ``SagNet``: the model up to its last layer is the featurizer, its last layer the content network,
    and a style network of the same shape (DomainBed's ``Classifier``: one linear layer) is the method's, with an Adam
    of its own (the run's ``lr`` and ``weight_decay``). On the features of the whole batch (the last layer's input, a
    vector per example, as DomainBed's featurizers give theirs), each step makes DomainBed's three updates:

    1. content (:meth:`forward`): the cross-entropy of the content network on style-randomized features; the
       model's Adam steps (DomainBed's ``optimizer_f`` and ``optimizer_c``);
    2. style (:meth:`after_step`): a second forward pass; the cross-entropy of the style network on
       content-randomized features; the style network's Adam steps;
    3. adversarial: a third forward pass; ``sagnet_w_adv`` times minus the mean over examples and classes of the
       style network's log-softmax on content-randomized features; the model's Adam steps again, on the featurizer
       alone (the content network gets no gradient and Adam skips it: DomainBed's ``optimizer_f``).

    Randomizing (:meth:`randomize`) standardises each example's features over their own dimension (a feature map's
    over its positions); style randomization mixes each example's mean and variance with those of a random partner
    (weight alpha ~ U(0, 1) per example), content randomization puts the partner's standardised features, detached,
    under this example's mean and variance. Alpha, the partners and the style network's initial weights come from
    :attr:`generator` (DomainBed: torch's global one). The step's running loss is the content loss and its running
    accuracy the model's own predictions (DomainBed's ``predict``) on the batch."""

    name = "sagnet"
    needs_features = True
    EPS = 1e-5

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        init_seed = int(torch.randint(2**62, (1,), generator=self.generator).item())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.style = nn.Linear(int(params["features"]), int(params["classes"]))
        self.style.to(device)
        self.optimizer = torch.optim.Adam(
            self.style.parameters(), lr=params["lr"], weight_decay=params.get("weight_decay", 0.0)
        )

    def randomize(self, features: torch.Tensor, *, mix_style: bool) -> torch.Tensor:
        """Style randomization (``mix_style``) or content randomization of a batch of features."""
        n = features.shape[0]
        weight = torch.rand(n, 1, generator=self.generator).to(features.device)
        flat = features
        if features.dim() == 4:  # a feature map: statistics over its positions, per channel
            flat, weight = features.reshape(n, features.shape[1], -1), weight[..., None]
        mean, variance = flat.mean(-1, keepdim=True), flat.var(-1, keepdim=True)
        standardised = (flat - mean) / torch.sqrt(variance + self.EPS)
        partner = torch.randperm(n, generator=self.generator).to(features.device)
        if mix_style:
            mean = weight * mean + (1 - weight) * mean[partner]
            variance = weight * variance + (1 - weight) * variance[partner]
        else:
            standardised = standardised[partner].detach()
        return (standardised * torch.sqrt(variance + self.EPS) + mean).reshape(features.shape)

    @staticmethod
    def _passed(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A forward pass of the model on the batch: its predictions and its features, these at least in float32
        (randomized in DomainBed's precision under bf16 autocast too)."""
        batch.features.clear()
        logits = batch.model(batch.x)
        features = batch.features[0]
        return logits, features.to(torch.promote_types(features.dtype, torch.float32))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, features = self._passed(batch)
        content = batch.head(self.randomize(features, mix_style=True))
        return logits, batch.y, nn.functional.cross_entropy(content.float(), batch.y)

    def after_step(self, batch: Batch, optimizer: torch.optim.Optimizer) -> None:
        with batch.precision():
            # The style network's gradient does not go through the features: DomainBed's loss_s reaches the
            # featurizer too, and those gradients are zeroed before its next use; the pass is the same.
            with torch.no_grad():
                features = self._passed(batch)[1]
            style_loss = nn.functional.cross_entropy(
                self.style(self.randomize(features, mix_style=False)).float(), batch.y
            )
        self.optimizer.zero_grad(set_to_none=True)
        style_loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        with batch.precision():
            guesses = self.style(self.randomize(self._passed(batch)[1], mix_style=False)).float()
            adversarial = -nn.functional.log_softmax(guesses, dim=1).mean(1).mean() * self.params["sagnet_w_adv"]
        optimizer.zero_grad(set_to_none=True)
        adversarial.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # the adversarial loss's gradient on the style network is unused

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "style": self.style.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.style.load_state_dict(state["style"])
        self.optimizer.load_state_dict(state["optimizer"])

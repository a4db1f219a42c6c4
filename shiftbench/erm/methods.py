"""Training objectives beside ERM, one registry (DomainBed-style): the loss of a batch given its groups.

Every method sees the same batch: logits, the features the last layer (``fc``) read, labels and the
batch's training group codes (``group_by`` fields of the split). Definitions follow the papers, with
DomainBed's and WILDS' hyperparameter defaults:

- ``erm``: mean cross-entropy.
- ``reweight``: cross-entropy weighted by 1 / n_g (the group's training count), normalised so every
  training group carries the same total weight (importance weighting; Sagawa et al. 2020, Section 3).
- ``groupdro``: online group DRO (Sagawa et al. 2020, Algorithm 1): a distribution q over groups,
  q_g <- q_g * exp(eta * loss_g), normalised; the loss is sum_g q_g * loss_g over the groups in the batch.
- ``irm``: IRMv1 (Arjovsky et al. 2019, Section 3.1): the squared gradient of each group's risk with
  respect to a dummy scale w = 1 on the logits, estimated without bias from the two halves of the
  group's examples (as DomainBed does); penalty weight 1 until ``irm_anneal_iters``, then
  ``irm_lambda``, when the optimizer is reset (its moments were fitted to a different objective).
- ``coral``: Deep CORAL (Sun and Saenko 2016): squared differences of feature means and covariances
  between every pair of groups in the batch, averaged over pairs, weighted by ``coral_lambda``.
- ``cdann``: conditional domain-adversarial training (Li et al. 2018) as DomainBed defines it (``domainbed/
  algorithms.py`` at b93c22a, ``AbstractDANN`` with ``conditional`` and ``class_balance``, lines 477-562;
  ``networks.MLP``; its default hyperparameters, ``hparams_registry.py`` lines 49-57 and 235-248): :class:`CDANN`.
- ``causirl_coral``, ``causirl_mmd``: CausIRL (Chevalley et al. 2022) as DomainBed defines it (``algorithms.py``
  ``AbstractCausIRL``, lines 2272-2350; ``mmd_gamma`` 1): the mean over the batch's groups of their cross-entropy,
  plus ``causirl_mmd_gamma`` times the distance between two halves of the batch (each group's features cut at a
  random point, the firsts against the seconds): CORAL's means and covariances, or a Gaussian-kernel MMD.
- ``mixup``, ``sagnet``: DomainBed's Mixup and SagNet, which run the model themselves (on mixed inputs; three
  passes a step): :mod:`shiftbench.erm.mixing`.

What a method is, and the updates of a step, are :mod:`shiftbench.erm.objective`.

Group-based methods need several groups in a batch: their default loader (``loader: auto``) is
``group_balanced`` for GroupDRO (WILDS ``uniform_over_groups``) and ``groups`` for IRM and
CORAL (``n_groups_per_batch`` groups per batch, equal examples each; WILDS' GroupSampler).
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from shiftbench.erm.mixing import Mixup, SagNet
from shiftbench.erm.objective import Method
from shiftbench.errors import InputError
from shiftbench.scoring.method_names import METHODS as METHOD_NAMES


class ERM(Method):
    name = "erm"
    graphable = True

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, y)


class Reweight(Method):
    name = "reweight"
    graphable = True

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        present = self.counts > 0
        # n / (G * n_g): every present group sums to n / G, the weights average 1 over the training set.
        weights = torch.zeros(n_groups, dtype=torch.float32, device=device)
        weights[present] = float(self.counts.sum()) / (int(present.sum()) * self.counts[present].float())
        self.weights = weights

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        losses = nn.functional.cross_entropy(logits, y, reduction="none")
        w = self.weights[g]
        return (losses * w).sum() / w.sum()


def group_means(values: torch.Tensor, g: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group means of ``values`` (0 for groups absent from the batch) and the per-group counts.
    Sums of ones, not ``bincount``, whose output size depends on the data (a host sync)."""
    counts = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add(0, g, torch.ones_like(values))
    sums = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add(0, g, values)
    return sums / counts.clamp(min=1), counts


class GroupDRO(Method):
    name = "groupdro"
    default_loader = "group_balanced"
    graphable = True

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        present = (self.counts > 0).float()
        self.q = present / present.sum()  # groups never seen in training keep q = 0 (WILDS)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"q": self.q}

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        losses = nn.functional.cross_entropy(logits, y, reduction="none")
        group_loss, _ = group_means(losses, g, self.n_groups)
        with torch.no_grad():
            q = self.q * torch.exp(self.params["groupdro_eta"] * group_loss.detach())
            self.q.copy_(q / q.sum())  # in place: a captured step reads and writes the same tensor
        return (self.q * group_loss).sum()


class IRM(Method):
    name = "irm"
    default_loader = "groups"

    def penalty_weight(self, iteration: int) -> float:
        return self.params["irm_lambda"] if iteration > self.params["irm_anneal_iters"] else 1.0

    def reset_optimizer(self, iteration: int) -> bool:
        anneal = int(self.params["irm_anneal_iters"])
        return anneal > 0 and iteration == anneal + 1 and self.params["irm_lambda"] != 1.0

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        nll = nn.functional.cross_entropy(logits, y)
        penalties = []
        for group in torch.unique(g).tolist():
            rows = torch.nonzero(g == group).flatten()
            if rows.numel() < 2:
                continue
            scale = torch.ones((), device=logits.device, requires_grad=True)
            first, second = rows[0::2], rows[1::2]
            loss_1 = nn.functional.cross_entropy(logits[first] * scale, y[first])
            loss_2 = nn.functional.cross_entropy(logits[second] * scale, y[second])
            grad_1 = torch.autograd.grad(loss_1, [scale], create_graph=True)[0]
            grad_2 = torch.autograd.grad(loss_2, [scale], create_graph=True)[0]
            penalties.append(grad_1 * grad_2)
        penalty = torch.stack(penalties).mean() if penalties else torch.zeros((), device=logits.device)
        weight = self.penalty_weight(iteration)
        # Arjovsky et al.'s reference code divides by the weight once it exceeds 1: gradients keep their scale.
        return (nll + weight * penalty) / max(1.0, weight)


class CORAL(Method):
    name = "coral"
    default_loader = "groups"
    needs_features = True

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        assert features is not None
        nll = nn.functional.cross_entropy(logits, y)
        moments = []
        for group in torch.unique(g).tolist():
            x = features[g == group].float()
            if x.shape[0] < 2:
                continue
            mean = x.mean(0, keepdim=True)
            centred = x - mean
            moments.append((mean, centred.t() @ centred / (x.shape[0] - 1)))
        pairs = list(itertools.combinations(moments, 2))
        if not pairs:
            return nll
        penalty = torch.stack(
            [(m1 - m2).pow(2).mean() + (c1 - c2).pow(2).mean() for (m1, c1), (m2, c2) in pairs]
        ).mean()
        return nll + self.params["coral_lambda"] * penalty


class CausIRL(Method):
    """DomainBed's ``AbstractCausIRL``: its random cut points drawn from this run's own generator (DomainBed draws
    them from numpy's global one), kept in checkpoints."""

    default_loader = "groups"
    needs_features = True
    kernel: ClassVar[str]
    GAMMAS = (0.001, 0.01, 0.1, 1, 10, 100, 1000)

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        self.generator = torch.Generator().manual_seed(int(params.get("method_seed", 0)))

    def distance(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.kernel == "gaussian":
            return self._gram(x, x).mean() + self._gram(y, y).mean() - 2 * self._gram(x, y).mean()
        mean_x, mean_y = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
        cov_x = (x - mean_x).t() @ (x - mean_x) / (len(x) - 1)
        cov_y = (y - mean_y).t() @ (y - mean_y) / (len(y) - 1)
        return (mean_x - mean_y).pow(2).mean() + (cov_x - cov_y).pow(2).mean()

    def _gram(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        squared = (x.pow(2).sum(-1, keepdim=True) - 2 * x @ y.t() + y.pow(2).sum(-1, keepdim=True).t()).clamp_min(1e-30)
        return sum((torch.exp(-gamma * squared) for gamma in self.GAMMAS), torch.zeros_like(squared))

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        assert features is not None
        objectives, firsts, seconds = [], [], []
        for group in torch.unique(g).tolist():
            members = g == group
            objectives.append(nn.functional.cross_entropy(logits[members], y[members]))
            part = features[members]
            cut = int(torch.randint(0, len(part), (1,), generator=self.generator).item())
            firsts.append(part[:cut])
            seconds.append(part[cut:])
        first, second = torch.cat(firsts), torch.cat(seconds)
        penalty = torch.zeros((), device=logits.device)
        if len(first) > 1 and len(second) > 1:
            penalty = torch.nan_to_num(self.distance(first, second))
        return torch.stack(objectives).mean() + self.params["causirl_mmd_gamma"] * penalty

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


class CausIRLCORAL(CausIRL):
    name = "causirl_coral"
    kernel = "mean_cov"


class CausIRLMMD(CausIRL):
    name = "causirl_mmd"
    kernel = "gaussian"


class DomainMLP(nn.Module):
    """DomainBed's ``networks.MLP``: a linear layer to ``width``, ``depth - 2`` more, each followed by dropout and a
    ReLU, and a linear output."""

    def __init__(self, inputs: int, outputs: int, width: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.input = nn.Linear(inputs, width)
        self.dropout = nn.Dropout(dropout)
        self.hiddens = nn.ModuleList([nn.Linear(width, width) for _ in range(depth - 2)])
        self.output = nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu(self.dropout(self.input(x)))
        for hidden in self.hiddens:
            x = nn.functional.relu(self.dropout(hidden(x)))
        out: torch.Tensor = self.output(x)
        return out


class CDANN(Method):
    """A discriminator (:class:`DomainMLP` on the features plus a learned embedding of the label) guesses each
    example's training domain (its group). Steps alternate: ``cdann_d_steps_per_g`` discriminator steps (its class-
    balanced cross-entropy, plus ``cdann_grad_penalty`` times the squared gradient of the summed cross-entropy with
    respect to its input; its own Adam) then one generator step (the model: cross-entropy minus ``cdann_lambda``
    times that loss), as DomainBed's ``update`` counts them (a step is the discriminator's when
    ``iteration % (1 + d) < d``). The features are detached on the discriminator's steps, so the model's optimizer
    finds no gradient there and skips it, as DomainBed steps only ``disc_opt``."""

    name = "cdann"
    default_loader = "groups"
    needs_features = True

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        super().__init__(train_groups, n_groups, params, device)
        present = np.unique(train_groups)  # the training domains, in code order: the discriminator's classes
        self.domain_of = torch.full((n_groups,), -1, dtype=torch.long)
        self.domain_of[torch.from_numpy(present)] = torch.arange(len(present))
        self.domain_of = self.domain_of.to(device)
        features, width = int(params["features"]), int(params["cdann_mlp_width"])
        self.discriminator = DomainMLP(
            features, len(present), width, int(params["cdann_mlp_depth"]), params["cdann_mlp_dropout"]
        ).to(device)
        self.class_embeddings = nn.Embedding(int(params["classes"]), features).to(device)
        self.optimizer = torch.optim.Adam(
            [*self.discriminator.parameters(), *self.class_embeddings.parameters()], lr=params["lr"],
            weight_decay=params["cdann_weight_decay_d"], betas=(params["cdann_beta1"], 0.9),
        )  # fmt: skip
        self.discriminating = False

    def discriminator_loss(self, features: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """DomainBed's ``disc_loss``: the class-balanced cross-entropy of the domain guesses, plus the penalty."""
        disc_input = features + self.class_embeddings(y)
        disc_out = self.discriminator(disc_input)
        y_counts = nn.functional.one_hot(y).sum(dim=0)
        weights = 1.0 / (y_counts[y] * y_counts.shape[0]).float()
        loss = (weights * nn.functional.cross_entropy(disc_out, domains, reduction="none")).sum()
        if self.params["cdann_grad_penalty"]:
            summed = nn.functional.cross_entropy(disc_out, domains, reduction="sum")
            (input_grad,) = torch.autograd.grad(summed, [disc_input], create_graph=True)
            loss = loss + self.params["cdann_grad_penalty"] * input_grad.pow(2).sum(dim=1).mean(dim=0)
        return loss

    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor:
        assert features is not None
        d = int(self.params["cdann_d_steps_per_g"])
        self.discriminating = iteration % (1 + d) < d
        self.optimizer.zero_grad(set_to_none=True)
        domains = self.domain_of[g]
        if self.discriminating:
            return self.discriminator_loss(features.detach(), y, domains)
        disc_loss = self.discriminator_loss(features, y, domains)
        return nn.functional.cross_entropy(logits, y) - self.params["cdann_lambda"] * disc_loss

    def after_backward(self) -> None:
        if self.discriminating:
            self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "discriminator": self.discriminator.state_dict(),
            "class_embeddings": self.class_embeddings.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.discriminator.load_state_dict(state["discriminator"])
        self.class_embeddings.load_state_dict(state["class_embeddings"])
        self.optimizer.load_state_dict(state["optimizer"])


METHODS: dict[str, type[Method]] = {
    m.name: m for m in (ERM, Reweight, GroupDRO, IRM, CORAL, CDANN, CausIRLCORAL, CausIRLMMD, Mixup, SagNet)
}
assert tuple(METHODS) == METHOD_NAMES, "shiftbench.scoring.method_names.METHODS must list the methods"


def build_method(
    name: str, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device
) -> Method:
    if name not in METHODS:
        raise InputError(f"unknown method {name!r}; known: {', '.join(METHODS)}", parameter="method")
    return METHODS[name](train_groups, n_groups, params, device)

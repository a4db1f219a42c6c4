"""What a training objective is (:class:`Method`; the objectives themselves are :mod:`shiftbench.erm.methods`), the
batch a method that runs the model itself sees (:class:`Batch`) and one training step's updates (:func:`update`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn


@dataclass
class Batch:
    """A training step's batch as :meth:`Method.forward` sees it, with the model the step runs."""

    model: nn.Module  # the module the step runs (compiled or not)
    head: nn.Module  # its last layer (shiftbench.erm.models.head_name), whose input are the features
    x: torch.Tensor  # the normalised (augmented) inputs
    y: torch.Tensor
    g: torch.Tensor  # the training group codes
    iteration: int
    features: list[torch.Tensor]  # a forward pass leaves the last layer's input here (``needs_features``)
    precision: Callable[[], AbstractContextManager[Any]]  # the step's autocast


def update(
    method: Method, batch: Batch, optimizer: torch.optim.Optimizer
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training step's updates: the method's forward pass and loss under the step's precision, the gradient, the
    method's hook, the model's optimizer, then the method's further updates (SagNet's). Returns the predictions, the
    labels the running accuracy scores them against, and the loss."""
    with batch.precision():
        logits, scored, loss = method.forward(batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    method.after_backward()
    optimizer.step()
    method.after_step(batch, optimizer)
    return logits, scored, loss


class Method(ABC):
    """One training objective; ``loss`` is called once per step with the batch's groups."""

    name: ClassVar[str]
    default_loader: ClassVar[str] = "standard"
    needs_features: ClassVar[bool] = False
    # The loss has fixed shapes, no host synchronisation and no dependence on the iteration, and keeps
    # its state in tensors it updates in place: the training step can be captured in a CUDA graph.
    graphable: ClassVar[bool] = False

    def __init__(self, train_groups: np.ndarray, n_groups: int, params: dict[str, float], device: torch.device):
        self.n_groups, self.params, self.device = n_groups, params, device
        self.counts = torch.from_numpy(np.bincount(train_groups, minlength=n_groups)).to(device)

    @abstractmethod
    def loss(
        self, logits: torch.Tensor, features: torch.Tensor | None, y: torch.Tensor, g: torch.Tensor, iteration: int
    ) -> torch.Tensor: ...

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's predictions, the labels its running accuracy scores them against, and the loss: the model on
        the batch, then :meth:`loss` (a method that runs the model itself overrides this)."""
        batch.features.clear()
        logits = batch.model(batch.x)
        features = batch.features[0] if batch.features else None
        return logits, batch.y, self.loss(logits.float(), features, batch.y, batch.g, batch.iteration)

    def after_step(self, batch: Batch, optimizer: torch.optim.Optimizer) -> None:  # noqa: B027 (a hook, as below)
        """After the model's optimizer stepped: a method with more updates per step (SagNet) makes them here."""

    def after_backward(self) -> None:  # noqa: B027 (a hook: most methods have nothing to do)
        """After the step's backward pass, before the model's optimizer steps: a method with parameters of its own
        steps them here."""

    def reset_optimizer(self, iteration: int) -> bool:
        """Whether the optimizer's state must start afresh before this iteration's step."""
        return False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors the method changes while training (a checkpoint keeps them; shiftbench.erm.resume)."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Back to a checkpoint's state, in place (a captured step reads the same tensors)."""
        for name, value in state.items():
            getattr(self, name).copy_(value)

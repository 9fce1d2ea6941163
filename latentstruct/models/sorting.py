"""The sorting task's networks (Mena et al. 2018; seed 002 App. C.1): the μ-network that scores each number at every
sorted position, and the σ-network of a learned noise scale."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import nn

from latentstruct.ranges import AtLeast

__all__ = ["RankScorer", "LinearSigmaNet"]


class RankScorer(nn.Sequential):
    """The μ-network: ``[batch, d]`` → ``[batch, d, d]``, row i = f(x_i) = the scores of placing the number x_i at
    each of the d sorted positions, with f = Linear(1 → hidden) → ReLU → Linear(hidden → d) applied to each number on
    its own (Mena et al. 2018).

    Args:
        hidden: units of the μ-network's hidden layer (seed 002 App. C.1, Mena et al. 2018: 32).
    """

    FROM_DATA = ("num_items",)  # given by the task, from the data

    def __init__(self, num_items: int, hidden: Annotated[int, AtLeast(1)] = 32):
        super().__init__(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_items))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.unsqueeze(-1))


class LinearSigmaNet(nn.Sequential):
    """A σ-network on a whole input vector: ``[batch, in_features]`` → σ = softplus(w·x + b) ``[batch, 1]`` > 0
    (seed 002 App. C.1's for sorting: one σ per sequence)."""

    FROM_DATA = ("in_features",)  # given by the task, from the data

    def __init__(self, in_features: int):
        super().__init__(nn.Linear(in_features, 1), nn.Softplus())

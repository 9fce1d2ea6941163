"""Decoders: (features, latent z or μ) → class logits. A decoder must accept points of conv(Z), not only
vertices, so that relaxations and pulled-back losses are defined (seed 001 §4)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Bilinear", "Linear"]


class Bilinear(nn.Module):
    """ŷ = zᵀ W_g x + b_g per class: ``[batch, latent_dim]`` × ``[batch, in_features]`` → ``[batch, num_classes]``.

    If z = e_k this selects the k-th linear model (seed 001 §7.1).
    """

    uses_latent = True

    FROM_DATA = ("in_features", "latent_dim", "num_classes")  # given by the task, from the data

    def __init__(self, in_features: int, latent_dim: int, num_classes: int):
        super().__init__()
        # Same parameters and initialisation as nn.Bilinear(latent_dim, in_features, num_classes), but computed as
        # one matmul then a contraction with z: ~3x faster on CPU when z needs a gradient (pulled-back steps).
        self.weight = nn.Parameter(torch.empty(num_classes, latent_dim, in_features))
        self.bias = nn.Parameter(torch.empty(num_classes))
        bound = 1 / math.sqrt(latent_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, features, z):
        c, k, d = self.weight.shape
        per_latent = (features @ self.weight.reshape(c * k, d).T).view(-1, c, k)  # [batch, classes, latent]
        return (per_latent * z.to(features.dtype).unsqueeze(1)).sum(-1) + self.bias


class Linear(nn.Module):
    """The no-latent baseline: ŷ = W x + b; ``z`` is ignored."""

    uses_latent = False

    FROM_DATA = ("in_features", "latent_dim", "num_classes")  # given by the task, from the data

    def __init__(self, in_features: int, latent_dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, features, z=None):
        return self.linear(features)

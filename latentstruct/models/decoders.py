"""Decoders: (features, latent z or μ) → class logits. A decoder must accept points of conv(Z), not only
vertices, so that relaxations and pulled-back losses are defined (seed 001 §4)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Bilinear", "KnownReadout", "Linear"]


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


class KnownReadout(nn.Module):
    """A fixed read-out the data gives (the planted structures, issue #38): ŷ = [0, α xᵀ V vec(z) + β] for two
    classes, ``[batch, in_features]`` × ``[batch, latent_dim]`` → ``[batch, 2]``.

    V ``[in_features, latent_dim]`` is the read-out that made the labels (``latentstruct/data/planted.py``: y =
    1[xᵀ V vec(z*) > b]), frozen; only the scale α and the offset β (two scalars) are learned, so the decoder cannot
    fit a relabelled latent the way a learned bilinear read-out can: a latent moved by a symmetry of the structure
    reads out differently. α starts at 1/sqrt(in_features), which puts xᵀ V vec(z) for a few parts near unit scale.
    """

    uses_latent = True

    FROM_DATA = ("in_features", "latent_dim", "num_classes", "readout")  # given by the task, from the data

    def __init__(self, in_features: int, latent_dim: int, num_classes: int, readout: torch.Tensor):
        super().__init__()
        if num_classes != 2:
            raise ValueError(f"KnownReadout reads out one score for 2 classes, got num_classes={num_classes}")
        if tuple(readout.shape) != (in_features, latent_dim):
            raise ValueError(f"the read-out is {tuple(readout.shape)}, expected ({in_features}, {latent_dim})")
        self.register_buffer("readout", readout.detach().clone(), persistent=False)  # rebuilt from the data
        self.scale = nn.Parameter(torch.tensor(1 / math.sqrt(in_features)))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, features, z):
        u = ((features @ self.readout.to(features.dtype)) * z.to(features.dtype)).sum(-1)
        logit = self.scale * u + self.bias
        return torch.stack([torch.zeros_like(logit), logit], -1)


class Linear(nn.Module):
    """The no-latent baseline: ŷ = W x + b; ``z`` is ignored."""

    uses_latent = False

    FROM_DATA = ("in_features", "latent_dim", "num_classes")  # given by the task, from the data

    def __init__(self, in_features: int, latent_dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, features, z=None):
        return self.linear(features)

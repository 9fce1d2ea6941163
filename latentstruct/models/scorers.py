"""Scorers: features → part scores s for the latent structure."""

from __future__ import annotations

from torch import nn

__all__ = ["Linear"]


class Linear(nn.Linear):
    """s = W_f h + b_f, ``[batch, in_features]`` → ``[batch, num_parts]`` (the paper's "linear encoder" f_φ).

    Args:
        bias: learn a bias b_f.
    """

    FROM_DATA = ("in_features", "num_parts")  # given by the task, from the data

    def __init__(self, in_features: int, num_parts: int, bias: bool = True):
        super().__init__(in_features, num_parts, bias=bias)

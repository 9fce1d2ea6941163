"""Encoders: input → features that both the scorer and the decoder see."""

from __future__ import annotations

from torch import nn

__all__ = ["Identity"]


class Identity(nn.Module):
    """Features = the input vector ``[batch, input_dim]`` (the synthetic experiment, seed 001 §7.1)."""

    FROM_DATA = ("input_dim",)  # given by the task, from the data

    def __init__(self, input_dim: int):
        super().__init__()
        self.output_dim = input_dim

    def forward(self, x):
        return x

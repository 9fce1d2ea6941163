"""Masks over right-padded batches, shared by every model that reads sequences.

A batch of sequences is ``[B, n, ...]`` with ``lengths`` ``[B]`` (each in 1..n) the number of real positions;
positions ``≥ lengths[b]`` are padding and must never influence the outputs of example b.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["check_lengths", "length_mask", "masked_softmax", "masked_sum"]


def check_lengths(lengths: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """``lengths`` as int64 ``[batch]`` on ``device``, each checked to lie in 1..n; None means every example has
    all n positions."""
    if lengths is None:
        return torch.full((batch,), n, dtype=torch.long, device=device)
    lengths = torch.as_tensor(lengths, device=device).long()
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
    if bool(((lengths < 1) | (lengths > n)).any()):
        raise ValueError(f"lengths must lie in 1..{n}, got {lengths.tolist()}")
    return lengths


def length_mask(lengths: torch.Tensor, n: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``[B, n]``, true at the real positions: ``mask[b, i] = i < lengths[b]``."""
    lengths = torch.as_tensor(lengths, device=device)
    return torch.arange(n, device=lengths.device).view(1, -1) < lengths.view(-1, 1)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax of ``scores`` along ``dim`` restricted to the entries where ``mask`` (broadcastable bool) is true.

    Masked entries get exactly 0 (whatever they held, even NaN or ±inf); a slice with no valid entry is all zeros,
    and its gradient is 0, not NaN.
    """
    mask = mask.bool()
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return F.softmax(filled, dim=dim) * mask.to(scores.dtype)


def masked_sum(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Σ over the real positions of ``x`` ``[B, n, d]`` → ``[B, d]``."""
    mask = length_mask(lengths, x.shape[1], x.device)
    return (x * mask.unsqueeze(-1).to(x.dtype)).sum(1)

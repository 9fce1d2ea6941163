"""Vertices as lists of parts: the sparse form of a 0/1 vertex that the SparseMAP solver works with.

A vertex z ∈ {0, 1}^d of a structure with d parts (the flattened trailing dimensions of its scores) has few ones:
n arcs of a tree over (n+1)² arcs, n of the n·T² parts of a tag sequence. ``Structure.map_parts`` returns a batch of
vertices as (``parts`` ``[B, K]`` int64: flat part indices; ``on`` ``[B, K]`` bool: which entries are parts), K the
most parts of a vertex in the batch; entries with ``on`` False are padding (index 0, never read). This module
converts between the two forms. It imports nothing else from the package, so both the structures and the solver
can use it.
"""

from __future__ import annotations

import torch

__all__ = ["dense_to_parts", "parts_to_dense"]


def dense_to_parts(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 vertices ``[m, d]`` → (parts ``[m, K]``, on ``[m, K]``), K = the most ones in a row (at least 1).

    Parts are listed in increasing index order; shorter rows are padded with (0, False).
    """
    m, d = z.shape
    nonzero = z != 0
    count = nonzero.sum(-1)
    width = max(int(count.max()), 1) if m else 1
    if bool((count == width).all()):  # the common case: every vertex has the same number of parts
        return nonzero.nonzero()[:, 1].view(m, width), torch.ones(m, width, dtype=torch.bool, device=z.device)
    rank = nonzero.cumsum(-1) - 1  # the slot of each part in its row
    slot = torch.where(nonzero, rank, width)  # every other position lands in a spare column
    parts = torch.zeros(m, width + 1, dtype=torch.long, device=z.device)
    parts.scatter_(1, slot, torch.arange(d, device=z.device).expand(m, d))
    on = torch.arange(width, device=z.device) < count.unsqueeze(-1)
    return parts[:, :width] * on, on


def parts_to_dense(parts: torch.Tensor, on: torch.Tensor, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(parts ``[m, K]``, on ``[m, K]``) → 0/1 vertices ``[m, d]`` in ``dtype``."""
    out = torch.zeros(parts.shape[0], d, dtype=dtype, device=parts.device)
    return out.scatter_add_(1, parts, on.to(dtype))

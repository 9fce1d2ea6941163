"""Composition functions for latent-tree classification (ListOps, Nangia & Bowman, 2018): a binary Tree-LSTM run over
a hard or relaxed bracketing, and the sequence LSTM of the baseline. A composer maps word vectors ``[B, n, input_dim]``,
``lengths`` ``[B]`` and a bracketing ``z`` ``[B, n, n]`` to one vector per example ``[B, dim]`` (the ``composer`` config
group; the merge parser of :mod:`latentstruct.models.tree_parsers` composes as it parses).

* :class:`BinaryTreeLSTMCell`: the N-ary Tree-LSTM of Tai et al. (2015) with N = 2, and its leaves.
* :class:`ChartTreeLSTM`: the expected Tree-LSTM over ``z`` in the layout of
  :class:`~latentstruct.structures.BinaryTree`, a hard tree or any relaxation (marginals, SparseMAP): bottom-up,
  each span's state mixes the cell over its splits k with weights ∝ z(i, k) · z(k+1, j). For a hard tree the root
  is exactly the Tree-LSTM over that tree; for a relaxation a smooth function of ``z``.
* :class:`SequenceLSTM`: the baseline, an LSTM's state after the last real word (reads no tree).
* :func:`classifier_mlp`: the MLP that classifies the composed vector (ListOps' answer).

Example::

    >>> from latentstruct.structures import BinaryTree
    >>> z = BinaryTree().marginals(torch.randn(2, 4, 4))                     # a relaxed bracketing
    >>> ChartTreeLSTM(input_dim=3, dim=5)(torch.randn(2, 4, 3), None, z).shape
    torch.Size([2, 5])

The cell's equations and the chart recursion: docs/models.md#composition.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.checkpoint import checkpoint as _checkpoint

from latentstruct.models.masks import check_lengths, length_mask

__all__ = ["BinaryTreeLSTMCell", "ChartTreeLSTM", "SequenceLSTM", "classifier_mlp"]


# ---------------------------------------------------------------------------------------------------------- cell


class BinaryTreeLSTMCell(nn.Module):
    """Binary (N = 2) Tree-LSTM of Tai et al. (2015); equations: docs/models.md#composition.

    ``forward(h_l, c_l, h_r, c_r)`` (each ``[..., dim]``) → ``(h, c)``; ``leaf(x)`` (``[..., dim_in]``) → ``(h, c)``.
    ``dim_in`` defaults to ``dim``.
    """

    def __init__(self, dim: int, dim_in: int | None = None):
        super().__init__()
        self.dim = dim
        self.dim_in = dim if dim_in is None else dim_in
        self.gates = nn.Linear(2 * dim, 5 * dim)  # [h_l; h_r] → (i, f_l, f_r, o, u)
        self.leaf_proj = nn.Linear(self.dim_in, 2 * dim)  # x → (c, o)

    def leaf(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Leaf state: c = first half of Linear(x), h = σ(second half) ⊙ tanh(c)."""
        c, o = self.leaf_proj(x).chunk(2, dim=-1)
        return torch.sigmoid(o) * torch.tanh(c), c

    def combine(self, pre: torch.Tensor, c_l: torch.Tensor, c_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, c) from the gate pre-activations ``pre`` ``[..., 5·dim]`` (= ``gates([h_l; h_r])``) and c_l, c_r."""
        i, f_l, f_r, o, u = pre.chunk(5, dim=-1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward(
        self, h_l: torch.Tensor, c_l: torch.Tensor, h_r: torch.Tensor, c_r: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.combine(self.gates(torch.cat([h_l, h_r], dim=-1)), c_l, c_r)

    def split_projections(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``gates([h_l; h_r]) = P_l(h_l) + P_r(h_r)``: the two halves of the gate map applied to one state ``h``
        (bias in the left half), so that each span is projected once rather than once per split it takes part in."""
        w = self.gates.weight  # [5d, 2d]
        both = h @ torch.cat([w[:, : self.dim], w[:, self.dim :]], dim=0).t()  # [..., 10d]
        left, right = both.split(5 * self.dim, dim=-1)
        return left + self.gates.bias, right


# ------------------------------------------------------------------------------------------------- chart Tree-LSTM


class ChartTreeLSTM(nn.Module):
    """Expected Tree-LSTM over a (relaxed) bracketing: ``forward(x [B, n, input_dim], lengths [B], z [B, n, n])`` →
    root h ``[B, dim]`` (the recursion: docs/models.md#composition).

    ``z`` may be a hard tree (0/1) or any nonnegative relaxation; only its strict upper triangle inside each example's
    length is read (the diagonal, the lower triangle and padding may hold anything, even NaN). Padded words of ``x``
    are replaced by 0 and never reach a real span, so an example's output does not depend on what it is batched with.

    Spans with no mass on any split (Σ_k a = 0) mix their splits uniformly, through a ``where``: a zero, never NaN,
    gradient. Memory: autograd keeps O(B n³ dim) floats (measured peak RSS ≈ 4.5 GB at B = 32, n = 50, dim = 128);
    ``checkpoint=True`` keeps O(B n² dim) (≈ 1.5 GB) for a backward about 2× slower; use it (or smaller batches)
    for n ≈ 130 (≈ 70 GB without). Details: docs/models.md#composition.

    Args:
        checkpoint: recompute the chart per width in the backward pass (O(B n² dim) memory, not O(B n³ dim)).
    """

    uses_tree = True
    FROM_DATA = ("input_dim", "dim")  # the word and state sizes, given by the task

    def __init__(self, input_dim: int, dim: int, checkpoint: bool = False):
        super().__init__()
        self.input_dim = input_dim
        self.dim = dim
        self.checkpoint = checkpoint
        self.cell = BinaryTreeLSTMCell(dim, input_dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, z: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must be [B, n, {self.input_dim}], got {tuple(x.shape)}")
        batch, n, _ = x.shape
        if z.shape != (batch, n, n):
            raise ValueError(f"z must be [{batch}, {n}, {n}] for x {tuple(x.shape)}, got {tuple(z.shape)}")
        lengths = check_lengths(lengths, batch, n, x.device)
        mask = length_mask(lengths, n, x.device)  # [B, n]
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        pos = torch.arange(n, device=x.device)
        upper = pos.view(-1, 1) < pos.view(1, -1)
        z = z.to(x.dtype).masked_fill(~(upper & mask.unsqueeze(1)), 0.0)  # parts inside the length only

        h0, c0 = self.cell.leaf(x)  # [B, n, dim]
        hs, cs = [h0], [c0]  # hs[w][b, i] = h of span (i, i+w)
        pl0, pr0 = self.cell.split_projections(h0)
        pls, prs = [pl0], [pr0]
        zs = [torch.ones(batch, n, dtype=x.dtype, device=x.device)] + [z.diagonal(w, 1, 2) for w in range(1, n)]
        for w in range(1, n):
            m = n - w
            # split offset t = k - i: left (i, i+t) = width t, start i; right (i+t+1, i+w) = width w-1-t, start i+t+1
            args = (
                [pls[t][:, :m] for t in range(w)]
                + [prs[w - 1 - t][:, t + 1 : t + 1 + m] for t in range(w)]
                + [cs[t][:, :m] for t in range(w)]
                + [cs[w - 1 - t][:, t + 1 : t + 1 + m] for t in range(w)]
                + [zs[t][:, :m] for t in range(w)]
                + [zs[w - 1 - t][:, t + 1 : t + 1 + m] for t in range(w)]
            )
            if self.checkpoint and torch.is_grad_enabled():
                h, c = _checkpoint(self._width, w, *args, use_reentrant=False)
            else:
                h, c = self._width(w, *args)
            hs.append(h)
            cs.append(c)
            if w < n - 1:
                pl, pr = self.cell.split_projections(h)
                pls.append(pl)
                prs.append(pr)
        roots = torch.stack([hw[:, 0] for hw in hs], dim=1)  # [B, n, dim]: roots[b, w] = h of span (0, w)
        index = (lengths - 1).view(-1, 1, 1).expand(batch, 1, self.dim)
        return roots.gather(1, index).squeeze(1)

    def _width(self, w: int, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All spans of width ``w``: the split-mixed (h, c) ``[B, n-w, dim]`` from the children, listed by split."""
        # split-major [w, B, m, ...]: each child slice is copied as one block
        pl, pr, cl, cr, zl, zr = (torch.stack(args[g * w : (g + 1) * w]) for g in range(6))
        h, c = self.cell.combine(pl + pr, cl, cr)  # [w, B, m, dim]
        a = zl * zr  # [w, B, m]
        total = a.sum(0, keepdim=True)
        positive = total > 0
        p = torch.where(positive, a / torch.where(positive, total, torch.ones_like(total)), 1.0 / w)
        return torch.einsum("tbm,tbmd->bmd", p, h), torch.einsum("tbm,tbmd->bmd", p, c)


# ---------------------------------------------------------------------------------------------------- baseline


class SequenceLSTM(nn.Module):
    """The ListOps sequence baseline's composer: ``forward(x [B, n, input_dim], lengths [B], z=None)`` → ``[B, dim]``,
    one LSTM layer over time, packed by the lengths, and its state after the last real word. ``z`` is not read."""

    uses_tree = False
    FROM_DATA = ("input_dim", "dim")  # the word and state sizes, given by the task

    def __init__(self, input_dim: int, dim: int):
        super().__init__()
        self.input_dim, self.dim = input_dim, dim
        self.lstm = nn.LSTM(input_dim, dim, num_layers=1, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        batch, n, _ = x.shape
        cpu_lengths = check_lengths(torch.as_tensor(lengths).detach().cpu(), batch, n, torch.device("cpu"))
        packed = pack_padded_sequence(x, cpu_lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # h_n [1, B, dim], in the original batch order
        return h_n[0]


def classifier_mlp(dim: int, hidden: int, num_classes: int, dropout: float) -> nn.Sequential:
    """The classifier of a composed vector ``[B, dim]``: dropout → Linear(dim → hidden) → ReLU → dropout →
    Linear(hidden → num_classes)."""
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, num_classes))

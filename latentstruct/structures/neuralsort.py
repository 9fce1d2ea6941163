"""NeuralSort (Grover et al. 2019): a continuous relaxation of the sorting permutation, and the relaxed top-k.

:func:`neuralsort` returns the unimodal row-stochastic P̂[i, :] = softmax(((n + 1 − 2i) s − A 1) / τ),
A[i, j] = |s_i − s_j|, whose row i tends to the indicator of the i-th largest score as τ → 0; :func:`relaxed_topk`
sums its first k rows (the relaxed k-hot of the dKNN loss), with ``stochastic=True`` on s + Gumbel noise (a relaxed
Plackett-Luce sample). O(n log n) for A 1 and O(k n) for the k rows, batched over any leading dimensions.

Example::

    >>> relaxed_topk(torch.tensor([[0.1, 3.0, 2.0, -1.0]]), k=2, tau=1e-3)
    tensor([[0., 1., 1., 0.]])

Derivation: docs/structures.md#neuralsort.
"""

from __future__ import annotations

import torch

from latentstruct.structures.base import gumbel_like

__all__ = ["neuralsort", "relaxed_topk"]


def neuralsort(scores: torch.Tensor, tau: float, rows: int | None = None) -> torch.Tensor:
    """The first ``rows`` rows (default all n) of the NeuralSort relaxation of ``scores`` ``[..., n]``:
    ``[..., rows, n]``, row i (0-based) relaxing the indicator of the (i+1)-th largest score."""
    if not tau > 0:
        raise ValueError(f"NeuralSort needs a temperature tau > 0, got {tau}")
    n = scores.shape[-1]
    rows = n if rows is None else rows
    if not 1 <= rows <= n:
        raise ValueError(f"rows must be in [1, {n}], got {rows}")
    spread = _abs_deviation_sums(scores)  # [..., n]: (A 1)_j
    weight = n - 1 - 2 * torch.arange(rows, device=scores.device, dtype=scores.dtype)  # n + 1 − 2i, i = 1..rows
    logits = weight.unsqueeze(-1) * scores.unsqueeze(-2) - spread.unsqueeze(-2)  # [..., rows, n]
    return torch.softmax(logits / tau, dim=-1)


def _abs_deviation_sums(scores: torch.Tensor) -> torch.Tensor:
    """(A 1)_j = Σ_m |s_j − s_m| ``[..., n]`` in O(n log n): with t the ascending sort of s and s_j = t_r (1-based
    rank r), it is t_r (2r − n) − 2 Σ_{m ≤ r} t_m + Σ_m t_m. Differentiable: its gradient is Σ_m sign(s_j − s_m)."""
    n = scores.shape[-1]
    t, order = scores.sort(-1)
    rank = torch.arange(1, n + 1, device=scores.device, dtype=scores.dtype)
    sums = t * (2 * rank - n) - 2 * t.cumsum(-1) + t.sum(-1, keepdim=True)
    return torch.empty_like(sums).scatter(-1, order, sums)


def relaxed_topk(scores: torch.Tensor, k: int, tau: float, stochastic: bool = False) -> torch.Tensor:
    """Σ of the first k NeuralSort rows ``[..., n]``: a relaxed k-hot vector of the k largest scores; with
    ``stochastic`` the scores are first perturbed by standard Gumbel noise (a relaxed Plackett-Luce sample)."""
    if stochastic:
        scores = scores + gumbel_like(scores)
    return neuralsort(scores, tau, rows=k).sum(-2)

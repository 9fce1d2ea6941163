"""k-subsets of n positions: vertices are k-hot vectors, M = conv(Z) is the capped simplex {0 ≤ μ ≤ 1, Σμ = k}.

``scores[b, i]`` (``[batch, n]``) is the score of choosing position i; a vertex has exactly k ones. All exact and
batched:

* ``map``: ``torch.topk``.
* ``log_partition``: log e_k(exp s), the k-subset dynamic program over prefixes in log space, O(n k);
  ``marginals``: its gradient (twice differentiable).
* ``exact_sample``: the dynamic program sampled backwards (perturb-and-MAP, ``sample``, is Gumbel top-k: *not* this
  distribution).
* ``sparsemap``: closed form, μ = clip(s - τ, 0, 1), τ found by a batched binary search over the breakpoints.

Example::

    >>> z = TopK(k=2).map(torch.tensor([[0.1, 3.0, 2.0, -1.0]]))
    >>> z
    tensor([[0., 1., 1., 0.]])

Derivation and references: docs/structures.md#topk.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated

import torch

from latentstruct.ranges import AtLeast
from latentstruct.structures.base import Structure

__all__ = ["TopK"]


class TopK(Structure):
    """k-subsets of n positions (k-hot vectors), ``k ≥ 1``.

    Scores ``[batch, n]``. ``lengths`` ``[batch]`` (integer, k ≤ lengths[b] ≤ n; default n): only the first
    ``lengths[b]`` positions are candidates; the rest are padding, may hold any value (even ±inf or NaN), are
    ignored, get no gradient and are 0 in every output.

    Args:
        k: size of the selected subset (scores [batch, n], vertices k-hot).
    """

    has = frozenset({"map", "marginals", "exact_samples", "enumerate", "k"})  # latentstruct.capabilities

    def __init__(self, k: Annotated[int, AtLeast(1)]):
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"TopK needs an integer k >= 1, got {k!r}")
        self.k = int(k)

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The k highest-scoring positions: k-hot ``[batch, n]`` in the scores' dtype and device, no gradient."""
        valid = self._valid(scores, lengths)
        s = scores.detach()
        # Padding strictly below every candidate (a candidate's -inf becomes the lowest finite value).
        key = torch.where(valid, s.clamp_min(torch.finfo(s.dtype).min), torch.full_like(s, float("-inf")))
        return torch.zeros_like(s).scatter_(-1, key.topk(self.k, dim=-1).indices, 1.0)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log e_k(exp s) = log Σ_{|S|=k} exp Σ_{i∈S} s_i, shape ``[batch]``; differentiable (twice)."""
        valid = self._valid(scores, lengths)
        s = scores.masked_fill(~valid, 0.0)
        return _prefix_tables(s, valid, self.k)[-1][:, self.k]

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """z ~ p(z) ∝ exp <s, z> over k-subsets, exactly: k-hot ``[batch, n]`` in the scores' dtype, no gradient.

        Backward through the prefix tables E[j, ·]; one uniform per position from ``generator`` (which must live on
        the scores' device). ``num_samples`` M: ``[M, batch, ...]`` (the batch repeated M times,
        ``Structure.repeat_samples``).
        """
        if num_samples is not None:
            return self.repeat_samples(self.exact_sample, scores, lengths, generator, num_samples)
        valid = self._valid(scores, lengths)
        batch, n = scores.shape
        k = self.k
        with torch.no_grad():
            s = scores.detach().masked_fill(~valid, 0.0)
            # tables[j] = E[j, 0..k] for prefixes j = 0..n, -inf where m > j.
            tables = torch.stack([_pad_to(t, k + 1) for t in _prefix_tables(s, valid, k)], dim=1)  # [B, n+1, k+1]
            u = torch.rand(batch, n, generator=generator, dtype=s.dtype, device=s.device)
            z = torch.zeros_like(s)
            left = torch.full((batch,), k, dtype=torch.long, device=s.device)  # still to choose
            for j in range(n, 0, -1):  # position j (1-based) = column j - 1
                prev, cur = tables[:, j - 1], tables[:, j]
                r = left.clamp_min(1)
                log_p = s[:, j - 1] + prev.gather(1, (r - 1)[:, None])[:, 0] - cur.gather(1, r[:, None])[:, 0]
                # With r ≥ j left every remaining position must be taken (p = 1 exactly, kept exact here).
                take = valid[:, j - 1] & (left > 0) & ((left >= j) | (u[:, j - 1] < log_p.exp()))
                z[:, j - 1] = take.to(s.dtype)
                left = left - take.long()
        return z

    def sparsemap(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The Euclidean projection onto {0 ≤ μ ≤ 1, Σμ = k} (closed form, docs/structures.md#topk), ``[batch, n]``;
        differentiable with Jacobian I_F - 1_F 1_Fᵀ / |F| on the free set F = {0 < μ_i < 1}, 0 elsewhere.

        The candidate positions must hold finite scores.
        """
        valid = self._valid(scores, lengths)
        s = scores.masked_fill(~valid, 0.0)
        with torch.no_grad():
            upper, free = _capped_simplex_sets(s.detach(), valid, self.k)
        count = free.sum(-1, keepdim=True).to(s.dtype)  # ≥ 1 (see _capped_simplex_sets)
        tau = ((s * free).sum(-1, keepdim=True) + upper.sum(-1, keepdim=True).to(s.dtype) - self.k) / count
        inner = s - tau
        # Round-off may put s_F - τ a hair outside [0, 1]: clip the value, keep the exact (affine) gradient.
        inner = inner + (inner.clamp(0.0, 1.0) - inner).detach()
        return torch.where(free, inner, upper.to(s.dtype))

    def enumerate(self, n: int) -> torch.Tensor:
        """Every k-hot vector of length n, ``[C(n, k), n]``, in lexicographic order of the chosen positions."""
        z = torch.zeros(math.comb(n, self.k), n)
        for row, subset in enumerate(itertools.combinations(range(n), self.k)):
            z[row, list(subset)] = 1.0
        return z

    # --------------------------------------------------------------------------------------------------- helpers

    def _valid(self, scores: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """Check shapes and lengths; True on candidate positions, ``[batch, n]``."""
        if scores.dim() != 2:
            raise ValueError(f"TopK expects scores [batch, n], got {tuple(scores.shape)}")
        if not scores.is_floating_point():
            raise TypeError(f"TopK expects floating-point scores, got {scores.dtype}")
        batch, n = scores.shape
        if n < self.k:
            raise ValueError(f"TopK(k={self.k}) needs at least k positions, got scores with n = {n}")
        if lengths is None:
            return torch.ones(batch, n, dtype=torch.bool, device=scores.device)
        lengths = torch.as_tensor(lengths, device=scores.device).long().reshape(-1)
        if lengths.shape[0] != batch:
            raise ValueError(f"lengths has {lengths.shape[0]} entries for a batch of {batch}")
        if batch and int(lengths.min()) < self.k:
            raise ValueError(
                f"TopK(k={self.k}) needs lengths >= k (a k-subset of fewer positions does not exist), "
                f"got lengths {lengths.tolist()}"
            )
        if batch and int(lengths.max()) > n:
            raise ValueError(f"lengths must be <= n = {n}, got {lengths.tolist()}")
        return torch.arange(n, device=scores.device).view(1, -1) < lengths.view(-1, 1)


def _prefix_tables(s: torch.Tensor, valid: torch.Tensor, k: int) -> list[torch.Tensor]:
    """E[j, 0..min(j, k)] = log e_m of the first j positions, for j = 0..n: a list of n + 1 tensors ``[B, ≤ k+1]``.

    ``s`` must be finite on ``valid`` and hold finite values (e.g. 0) elsewhere; positions outside ``valid`` are
    skipped (E[j] = E[j-1]). Only the entries m ≤ j (finite) are formed. Since every example has at least k valid
    positions and padding only follows them, a position j ≤ k is valid in every example.
    """
    batch, n = s.shape
    table = s.new_zeros(batch, 1)  # E[0, 0] = log 1
    tables = [table]
    for j in range(1, n + 1):
        x = s[:, j - 1 : j]
        width = table.shape[1]
        parts = [table[:, :1]]  # m = 0: the empty subset
        if width > 1:
            parts.append(torch.logaddexp(table[:, 1:], table[:, :-1] + x))
        if width <= k:
            parts.append(table[:, -1:] + x)  # m = j: every position so far taken
            table = torch.cat(parts, dim=1)  # j ≤ k: valid in every example
        else:
            table = torch.where(valid[:, j - 1 : j], torch.cat(parts, dim=1), table)
        tables.append(table)
    return tables


def _pad_to(table: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad ``[B, w]`` with -inf to ``[B, width]`` (no gradient needed)."""
    return torch.cat([table, table.new_full((table.shape[0], width - table.shape[1]), float("-inf"))], dim=1)


def _capped_simplex_sets(s: torch.Tensor, valid: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sets U (μ = 1) and F (0 < μ < 1) of the projection of ``s`` onto the capped simplex, ``[B, n]`` bool each.

    f(t) = Σ_valid clip(s_i - t, 0, 1) is nonincreasing, piecewise linear with breakpoints T = {s_i} ∪ {s_i - 1}.
    Binary search over T sorted (padding = +inf, at the end) for consecutive t_a < t_b with f(t_a) ≥ k > f(t_b):
    f(min T) = lengths ≥ k and f(max T) = 0 < k make the initial bracket. No breakpoint lies strictly between t_a
    and t_b, so every position is in exactly one of U = {s_i - 1 ≥ t_b}, {s_i ≤ t_a} (μ = 0) and F (the rest), and
    F ≠ ∅ because f drops on [t_a, t_b].
    """
    batch, n = s.shape
    inf = torch.full_like(s, float("inf"))
    lower = s - 1.0
    breaks = torch.cat([torch.where(valid, s, inf), torch.where(valid, lower, inf)], dim=1).sort(dim=1).values
    lo = torch.zeros(batch, 1, dtype=torch.long, device=s.device)
    hi = torch.full((batch, 1), 2 * n - 1, dtype=torch.long, device=s.device)
    for _ in range(math.ceil(math.log2(2 * n)) + 1):
        mid = (lo + hi) // 2
        t = breaks.gather(1, mid)
        f = ((s - t).clamp(0.0, 1.0) * valid).sum(-1, keepdim=True)
        above = f >= k
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    t_a, t_b = breaks.gather(1, lo), breaks.gather(1, hi)
    upper = valid & (lower >= t_b)
    free = valid & ~upper & (s > t_a)
    return upper, free

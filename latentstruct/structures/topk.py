r"""k-subsets of n positions: vertices are k-hot vectors, M = conv(Z) is the capped simplex {0 ≤ μ ≤ 1, Σμ = k}.

Parts are the n positions; ``scores[b, i]`` is the score of choosing position i, and a vertex z ∈ {0, 1}^n has exactly
k ones. Everything is exact and batched:

* ``map``: the k highest scores (``torch.topk``), on any device.
* ``log_partition``: log Σ_{|S| = k} exp Σ_{i ∈ S} s_i = log e_k(exp s), the k-th elementary symmetric polynomial of
  exp(s), by the k-subset dynamic program over prefixes, in log space (O(n k), one step per position, batched):

      E[j, m] = log e_m(exp s_1, ..., exp s_j),   E[0, 0] = 0,
      E[j, m] = logaddexp(E[j-1, m], E[j-1, m-1] + s_j)          (position j left out / taken).

  E[j, m] = -inf for m > j; those entries are never formed (the table of prefix j has min(j, k) + 1 columns), since
  the backward of a log-sum-exp of -inf terms is NaN even when multiplied by a zero gradient.
* ``marginals``: the gradient of the log-partition (the base class's autograd), twice differentiable.
* ``exact_sample``: z ~ p(z) ∝ exp <s, z> over k-subsets, by sampling the dynamic program backwards: with r positions
  still to choose among the first j, position j is taken with probability exp(s_j + E[j-1, r-1] - E[j, r]) (the
  prefixes play the role of the suffix tables of a front-to-back sampler). Note that perturb-and-MAP (``sample``,
  Gumbel top-k) is *not* this distribution: it samples k positions without replacement.
* ``sparsemap``: closed form. The projection onto the capped simplex is μ = clip(s - τ, 0, 1) with τ the root of
  the nonincreasing piecewise-linear f(τ) = Σ_i clip(s_i - τ, 0, 1) = k, whose breakpoints are {s_i} ∪ {s_i - 1}.
  A batched binary search over the sorted breakpoints (O(n log n)) finds consecutive breakpoints t_a < t_b with
  f(t_a) ≥ k > f(t_b); on (t_a, t_b) the sets U = {s_i - 1 ≥ t_b} (μ_i = 1), F = {s_i - 1 ≤ t_a, s_i ≥ t_b}
  (0 < μ_i < 1) and the rest (μ_i = 0) are fixed and read off by exact comparisons, and then, exactly,

      τ = (Σ_F s_i + |U| - k) / |F|,     μ_F = s_F - τ,   μ_U = 1,   μ = 0 elsewhere.

  Autograd through this formula gives the Jacobian I_F - 1_F 1_Fᵀ / |F| on F and 0 elsewhere (Niculae et al., 2018;
  the capped simplex is the k-subset marginal polytope).

References: V. Niculae, A. F. T. Martins, M. Blondel, C. Cardie (2018), "SparseMAP: Differentiable sparse structured
inference", ICML. W. Wang, C. Lu (2015), "Projection onto the capped simplex", arXiv:1503.01002. A. Kulesza,
B. Taskar (2012), "Determinantal point processes for machine learning", §5.2 (elementary symmetric polynomials,
k-subset sampling).
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
        """The Euclidean projection onto {0 ≤ μ ≤ 1, Σμ = k} (closed form, module docstring), ``[batch, n]``;
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

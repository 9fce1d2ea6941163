"""Perfect bipartite matchings: vertices are permutation matrices, M = conv(Z) is the Birkhoff polytope.

``scores[b, i, j]`` (``[batch, n, n]``) is the score of matching row i to column j; a vertex is a permutation matrix.

* ``map``: the linear assignment problem by ``scipy.optimize.linear_sum_assignment`` (O(n³)), on the CPU, one
  example at a time, the result copied back to the scores' device.
* ``marginals`` and ``log_partition`` raise ``NotImplementedError``: log Z is the log-permanent of exp(s), #P-hard.
* :func:`sinkhorn`: alternating row and column normalisation of exp(s / τ) in log space (a nearly doubly-stochastic
  matrix, the MAP permutation as τ → 0); :func:`gumbel_sinkhorn`: Sinkhorn on Gumbel-perturbed scores.
* ``sample`` (perturb-and-MAP) and ``sparsemap`` (the active-set solver, one Hungarian call per iteration) come from
  the base class.

Example::

    >>> scores = torch.randn(2, 4, 4)
    >>> Matching().map(scores).sum(-1)                     # one column per row
    tensor([[1., 1., 1., 1.],
            [1., 1., 1., 1.]])
    >>> sinkhorn(scores, tau=0.1, n_iter=20).shape
    torch.Size([2, 4, 4])

Derivation, timings, the batched alternatives left out, references: docs/structures.md#matching.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from latentstruct.structures.base import Structure, gumbel_like

__all__ = ["Matching", "sinkhorn", "gumbel_sinkhorn"]

_HARD = (
    "exact {what} of the Gibbs distribution over permutations is a permanent, which is #P-hard (Valiant, 1979); "
    "use Matching.sinkhorn(scores, tau, n_iter) (Sinkhorn normalisation, Mena et al. 2018) as the approximation, "
    "or sparsemap"
)


class Matching(Structure):
    """Perfect matchings of n rows with n columns (n×n permutation matrices).

    Scores ``[batch, n, n]``, ``scores[b, i, j]`` = score of matching row i to column j. ``lengths`` ``[batch]``
    (integer, 0 ≤ lengths[b] ≤ n; default n) restricts example b to the top-left ``lengths[b] × lengths[b]`` block:
    the other entries are padding, may hold any value (even ±inf or NaN), are ignored, and are 0 in every output.

    ``map`` (Hungarian algorithm, on the CPU), ``sample`` (perturb-and-MAP, from the base class), ``sparsemap``
    (generic active-set solver) and ``enumerate`` are exact; ``marginals`` and ``log_partition`` are #P-hard and
    raise ``NotImplementedError``: :meth:`sinkhorn` is the approximation.
    """

    has = frozenset({"map", "enumerate"})  # no marginals, no exact samples: #P-hard (latentstruct.capabilities)

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A maximum-weight perfect matching: 0/1 ``[batch, n, n]`` in the scores' dtype and device, no gradient.

        Solved on the CPU by ``scipy.optimize.linear_sum_assignment(maximize=True)``, one example at a time: SciPy's
        compiled solver is the cost (the loop around it adds a few µs per example), and batched alternatives in torch
        were far slower (docs/structures.md#matching).
        """
        cols, sizes = self._assign(scores, lengths)
        batch, n, _ = scores.shape
        rows = np.arange(n)
        z = np.zeros((batch, n * n))
        np.put_along_axis(z, rows * n + cols, rows < np.asarray(sizes)[:, None], axis=1)  # padded rows: a 0 in place
        return torch.from_numpy(z.reshape(batch, n, n)).to(device=scores.device, dtype=scores.dtype)

    def map_parts(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP matching as its parts (``Structure.map_parts``): row i's pair is the flat index i n + σ(i),
        ``[batch, n]``, on for the rows i < lengths[b]."""
        cols, sizes = self._assign(scores, lengths)
        n = scores.shape[-1]
        parts = torch.from_numpy(np.arange(n) * n + cols).to(scores.device)
        return parts, torch.arange(n, device=scores.device) < torch.tensor(sizes, device=scores.device).view(-1, 1)

    @staticmethod
    def _assign(scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[np.ndarray, list[int]]:
        """σ(i) for every row of every example (``[batch, n]`` int64, 0 past lengths[b]) and the sizes, by SciPy."""
        _check(scores)
        batch, n, _ = scores.shape
        sizes = [n] * batch if lengths is None else _lengths(scores, lengths).tolist()
        from scipy.optimize import linear_sum_assignment  # here: 0.6 s of every process's start otherwise

        host = scores.detach().to("cpu", torch.float64).numpy()
        cols = np.zeros((batch, n), dtype=np.int64)
        for b, size in enumerate(sizes):
            # rows come back as 0..size-1 in order (a perfect matching of a square block)
            cols[b, :size] = linear_sum_assignment(host[b, :size, :size], maximize=True)[1]
        return cols, sizes

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Not available: the log-permanent of exp(scores) is #P-hard to compute (see :meth:`sinkhorn`)."""
        raise NotImplementedError(_HARD.format(what="log-partition (log-permanent)"))

    def marginals(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Not available: exact marginals over permutations are #P-hard (see :meth:`sinkhorn`)."""
        raise NotImplementedError(_HARD.format(what="marginals"))

    def sparsemap(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The Euclidean projection onto the Birkhoff polytope (doubly-stochastic matrices), by the generic
        active-set solver; differentiable (sparse active-set Jacobian).

        Padding is replaced by 0 before the solver sees it (the solver rejects non-finite scores), so it may hold
        anything; it gets no gradient and is 0 in the output. The block in use must be finite.
        """
        _check(scores)
        lengths = _lengths(scores, lengths)
        return super().sparsemap(scores.masked_fill(~_mask(scores, lengths), 0.0), lengths)

    def enumerate(self, n: int) -> torch.Tensor:
        """Every n×n permutation matrix, ``[n!, n, n]``, in lexicographic order of (σ(0), ..., σ(n-1))."""
        eye = torch.eye(n)
        return torch.stack([eye[list(perm)] for perm in itertools.permutations(range(n))])

    # ------------------------------------------------------------------------------------------ the relaxation

    def sinkhorn(
        self,
        scores: torch.Tensor,
        tau: float = 1.0,
        n_iter: int = 20,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """See :func:`sinkhorn`."""
        return sinkhorn(scores, tau, n_iter, lengths)

    def gumbel_sinkhorn(
        self,
        scores: torch.Tensor,
        tau: float = 1.0,
        n_iter: int = 20,
        generator: torch.Generator | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """See :func:`gumbel_sinkhorn`."""
        return gumbel_sinkhorn(scores, tau, n_iter, generator, lengths)


def sinkhorn(
    scores: torch.Tensor,
    tau: float = 1.0,
    n_iter: int = 20,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Sinkhorn operator S(scores / tau): ``n_iter`` rounds of row then column normalisation in log space.

    Args:
        scores: ``[batch, n, n]``, float32 or float64, any device.
        tau: temperature > 0; small tau pushes the result towards the MAP permutation matrix (more iterations
            are then needed to converge).
        n_iter: number of (row, column) normalisation rounds, ≥ 0 (0 returns exp(scores / tau)).
        lengths: ``[batch]`` or None: only the top-left ``lengths[b] × lengths[b]`` block is normalised; the rest
            is padding (any value, NaN included), gets no gradient and is 0 in the output.

    Returns:
        ``[batch, n, n]`` nonnegative, columns summing to 1 (after at least one round) and rows approximately, in
        the scores' dtype and device; differentiable (by automatic differentiation through the iterations).
    """
    _check(scores)
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    lengths = _lengths(scores, lengths)
    n = scores.shape[-1]
    used = _mask(scores, lengths)
    # The padding block becomes the identity (0 on its diagonal, -inf elsewhere) and the cross blocks -inf: the
    # padding rows and columns are then already normalised and never mix with the block in use, and no
    # logsumexp ever runs over an all -inf (or NaN) slice, whose gradient would be NaN.
    pos = torch.arange(n, device=scores.device)
    pad = pos.view(1, -1) >= lengths.view(-1, 1)  # [B, n]
    pad_diag = pad.unsqueeze(2) & (pos.view(-1, 1) == pos.view(1, -1))
    log_alpha = (scores / tau).masked_fill(~used, float("-inf")).masked_fill(pad_diag, 0.0)
    for _ in range(n_iter):
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=2, keepdim=True)
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=1, keepdim=True)
    return log_alpha.exp().masked_fill(~used, 0.0)


def gumbel_sinkhorn(
    scores: torch.Tensor,
    tau: float = 1.0,
    n_iter: int = 20,
    generator: torch.Generator | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gumbel-Sinkhorn (Mena et al., 2018): ``sinkhorn(scores + G, tau, n_iter, lengths)`` with i.i.d. standard
    Gumbel noise G on every entry, drawn from ``generator`` exactly as :meth:`Structure.sample` draws it (so with the
    same generator state, small tau and enough iterations it approaches ``Matching().sample(scores, lengths)``).
    """
    return sinkhorn(scores + gumbel_like(scores, generator), tau, n_iter, lengths)


# ------------------------------------------------------------------------------------------------------- helpers


def _check(scores: torch.Tensor) -> None:
    if scores.dim() != 3 or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"Matching expects scores [batch, n, n], got {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"Matching expects floating-point scores, got {scores.dtype}")


def _lengths(scores: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """``lengths`` as a long tensor on the scores' device (default: n for every example), range-checked."""
    batch, n, _ = scores.shape
    if lengths is None:
        return torch.full((batch,), n, dtype=torch.long, device=scores.device)
    lengths = torch.as_tensor(lengths, device=scores.device).long().reshape(-1)
    if lengths.shape[0] != batch:
        raise ValueError(f"lengths has {lengths.shape[0]} entries for a batch of {batch}")
    if batch and (int(lengths.min()) < 0 or int(lengths.max()) > n):
        raise ValueError(f"lengths must lie in [0, {n}], got {lengths.tolist()}")
    return lengths


def _mask(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """True on the parts in use: ``[B, n, n]``, the top-left lengths[b] × lengths[b] block."""
    n = scores.shape[-1]
    inside = torch.arange(n, device=scores.device).view(1, -1) < lengths.view(-1, 1)
    return inside.unsqueeze(2) & inside.unsqueeze(1)

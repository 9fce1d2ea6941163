"""Binary bracketings (unlabelled full binary trees over n leaves): CKY, the inside algorithm, top-down sampling.

``scores[b, i, j]`` (``[batch, n, n]``) for ``i < j`` is the score of a constituent spanning the leaves ``i..j``; the
diagonal and the lower triangle are never parts (0 in every output). A vertex is the set of the n - 1 internal nodes
of a full binary tree over the leaves in order (always including (0, n-1) when n ≥ 2; z = 0 for n = 1): Catalan(n-1)
vertices. Spans with ``j ≥ lengths[b]`` are padding (anything, even NaN; 0 in every output, zero gradient); a part of
-inf is a forbidden constituent (floored at a huge finite negative value).

* ``map``: CKY with back-pointers and a batched top-down backtrack.
* ``log_partition``: the inside algorithm in log space, plain autograd (differentiable to any order).
* ``marginals``: a hand-written outside pass in probability space, differentiable once (its backward is a tangent
  inside pass and its top-down tangent).
* ``exact_sample``: top-down from the inside chart, every span's split drawn by Gumbel-max during the inside pass.

Example::

    >>> z = BinaryTree().map(torch.randn(2, 5, 5))         # [2, 5, 5]
    >>> z.sum((1, 2)).tolist()                             # n - 1 constituents
    [4.0, 4.0]

Derivation (chart, outside, tangent passes, the two chart layouts, references): docs/structures.md#binary_tree.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from latentstruct.structures.base import Structure, gumbel_like

__all__ = ["BinaryTree"]


class BinaryTree(Structure):
    """Binary bracketings of ``n`` leaves (see the module docstring for the part layout).

    Scores ``[batch, n, n]``, ``scores[b, i, j]`` (i < j) = score of the constituent over leaves i..j. ``lengths``
    ``[batch]`` (integer, each in 1..n; default n) is the number of leaves; padding may hold any value and is 0 in
    every output. ``map`` is CKY in O(n³) with back-pointers, ``log_partition`` the inside algorithm in log space
    (differentiable to any order), ``marginals`` its gradient by inside-outside (differentiable once, by a tangent
    inside-outside pass).
    """

    has = frozenset({"map", "marginals", "exact_samples", "enumerate"})  # latentstruct.capabilities

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring bracketing: 0/1 tensor ``[batch, n, n]`` in the scores' dtype, no gradient."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            pointers, _ = _cky(s, "max")
            return _backtrack(pointers, lengths, scores.dtype)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over bracketings (the inside algorithm), shape ``[batch]``; differentiable (any order)."""
        return _log_partition(*_prepare(scores, lengths))

    def marginals(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """μ = E_p[z] ``[batch, n, n]`` by inside-outside; differentiable once (its backward is the tangent pass)."""
        return _Marginals.apply(*_prepare(scores, lengths))

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """z ~ p(z | s) ∝ exp <s, z> exactly (top-down sampling from the inside chart); 0/1 like ``map``.

        ``num_samples`` M: ``[M, batch, ...]`` (the batch repeated M times, ``Structure.repeat_samples``).
        """
        if num_samples is not None:
            return self.repeat_samples(self.exact_sample, scores, lengths, generator, num_samples)
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            pointers, _ = _cky(s, "sample", generator)
            return _backtrack(pointers, lengths, scores.dtype)

    def enumerate(self, n: int) -> torch.Tensor:
        """Every bracketing of ``n`` leaves, ``[Catalan(n-1), n, n]`` (recursively over the root's split)."""
        if n < 1:
            raise ValueError(f"BinaryTree.enumerate needs n >= 1, got {n}")
        trees = _bracketings(0, n - 1)
        z = torch.zeros(len(trees), n, n)
        for v, spans in enumerate(trees):
            for i, j in spans:
                z[v, i, j] = 1.0
        return z

    @staticmethod
    def spans(z: torch.Tensor) -> list[list[tuple[int, int]]]:
        """The constituents (i, j) (inclusive, sorted) of each vertex in ``z`` ``[batch, n, n]``, as Python lists."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(z.shape[0])]
        for b, i, j in (z != 0).nonzero().tolist():
            out[b].append((i, j))
        return out


# ------------------------------------------------------------------------------------------------------- helpers


def _prepare(scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes; replace every non-part (diagonal, lower triangle, padding) by 0; floor −inf.

    Zeroing rather than leaving them means junk there (NaN, ±inf) reaches neither the value nor the gradient.
    −inf on a part (a forbidden constituent) is raised to finfo.min / (4 n): a tree's score, a sum of n - 1 parts,
    stays finite, a tree with a forbidden constituent still has probability exp(−huge) = 0, and a span whose every
    bracketing is forbidden gets marginal 0 instead of a NaN gradient (the backward of a log-sum-exp over an all
    −inf slice is NaN).
    """
    if scores.dim() != 3 or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"BinaryTree expects scores [batch, n, n], got {tuple(scores.shape)}")
    batch, n, _ = scores.shape
    if n < 1:
        raise ValueError("BinaryTree needs at least one leaf (scores [batch, n, n] with n >= 1)")
    if lengths is None:
        lengths = torch.full((batch,), n, dtype=torch.long, device=scores.device)
    else:
        lengths = torch.as_tensor(lengths, device=scores.device).long()
    pos = torch.arange(n, device=scores.device)
    upper = pos.view(-1, 1) < pos.view(1, -1)  # [n, n]
    inside = pos.view(1, 1, -1) < lengths.view(-1, 1, 1)  # [B, 1, n]: column j < L (so i < j < L)
    s = scores.masked_fill(~(upper & inside), 0.0)
    return s.clamp_min(torch.finfo(s.dtype).min / (4 * n)), lengths


def _by_width(s: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Span scores by start and width, ``span[w][b, i] = s[b, i, i+w]`` (rows i ≥ n - w hold junk, never read)."""
    batch, n, _ = s.shape
    pos = torch.arange(n, device=s.device)
    # One gather and one unbind, so the backward is one scatter rather than a zero-filled [B, n, n] per width.
    return s.gather(2, (pos.view(-1, 1) + pos).clamp_max(n - 1).expand(batch, n, n)).unbind(-1)


def _append(layout: torch.Tensor, values: torch.Tensor, width: int, by_end: bool) -> torch.Tensor:
    """Add the width-``width`` column to a chart layout ``[B, n, width]`` → ``[B, n, width+1]``.

    ``values[b, i]`` is the item (i, i+width); by start it sits at row i, by end at row i+width. The other rows are
    never read, so they are padded with 0.
    """
    padded = F.pad(values, (width, 0) if by_end else (0, width))
    return torch.cat([layout, padded.unsqueeze(-1)], dim=-1)


def _log_partition(s: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """β[0, L-1] ``[B]`` over prepared scores ``[B, n, n]``: the inside algorithm built functionally (no in-place
    writes) in the grown by-start / by-end layouts, hence differentiable any number of times."""
    # Width 0: single leaves, β = 0. Taken from the (zeroed) diagonal so that the value is a function of the scores
    # even when no span is a part (n = 1), which autograd needs.
    by_start = by_end = s.diagonal(0, 1, 2).unsqueeze(-1)
    span = _by_width(s)
    n = s.shape[-1]
    for w in range(1, n):
        m = n - w  # spans (i, i+w), i = 0..m-1
        # Split offset t = k - i in 0..w-1: left (i, i+t) by start, right (i+t+1, i+w) by end at width w-1-t.
        value = torch.logsumexp(by_start[:, :m, :w] + by_end[:, w:, :w].flip(-1), -1) + span[w][:, :m]
        by_start = _append(by_start, value, w, by_end=False)
        by_end = _append(by_end, value, w, by_end=True)
    return by_start[:, 0].gather(1, (lengths - 1).view(-1, 1)).squeeze(1)


# ------------------------------------------------------------------------------- the batch-last chart, in place


def _diagonal(chart: torch.Tensor, w: int) -> torch.Tensor:
    """The items (i, i+w) of a contiguous batch-last chart ``[n, n, B]`` → a view ``[n-w, B]``."""
    n, _, batch = chart.shape
    return chart.as_strided((n - w, batch), ((n + 1) * batch, 1), chart.storage_offset() + w * batch)


def _children(chart: torch.Tensor, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two children of every split of the spans of width ``w``, as views ``[n-w, w, B]`` of a contiguous
    batch-last chart ``[n, n, B]``: at [i, t] the left child (i, i+t) and the right child (i+t+1, i+w)."""
    n, _, batch = chart.shape
    col, row, at = batch, n * batch, chart.storage_offset()  # strides from (i, j) to (i, j+1) and to (i+1, j)
    shape = (n - w, w, batch)
    left = chart.as_strided(shape, (row + col, col, 1), at)
    right = chart.as_strided(shape, (row + col, row, 1), at + row + w * col)
    return left, right


def _cky(
    s: torch.Tensor, semiring: str, generator: torch.Generator | None = None
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """The chart over prepared scores ``[B, n, n]``, batch last and in place, without autograd.

    ``max``: returns the split pointers by width ``[n, n, B]`` (int64; at [w, i, b] the offset t = k - i of the
    best split of the span (i, i+w), w ≥ 1; ties to the smallest) and no weights. ``sample``: the same with splits
    drawn by Gumbel-max from the log-space chart. ``logsumexp``: no pointers, and the split probabilities
    p(k | i, i+w) per width w = 1..n-1, ``weights[w-1]`` ``[n-w, w, B]`` at [i, k - i].
    """
    batch, n, _ = s.shape
    # [n, n, B]; holds s[i, j] until the span's turn, when its ⊕ over the splits is added; β[i, i] = s[i, i] = 0.
    chart = _batch_last(s)
    pointers = None if semiring == "logsumexp" else s.new_zeros(n, n, batch, dtype=torch.long)
    weights = []
    for w in range(1, n):
        left, right = _children(chart, w)
        x = left + right  # [m, w, B]: β[i, i+t] + β[i+t+1, i+w]
        if semiring == "max":
            value, split = x.max(1)
        else:
            if semiring == "sample":
                split = (x + gumbel_like(x, generator)).max(1).indices  # (argmax over dim 1 is ~5x slower)
            top = x.amax(1, keepdim=True)
            p = x.sub_(top).exp_()
            total = p.sum(1, keepdim=True)
            if semiring == "logsumexp":
                weights.append(p.div_(total))
            value = total.log_().add_(top).squeeze(1)
        _diagonal(chart, w).add_(value)
        if pointers is not None:
            pointers[w, : n - w] = split
    return pointers, weights


def _top_down(chart: torch.Tensor, share) -> torch.Tensor:
    """Push a quantity down the chart ``[n, n, B]`` in place, from the widest spans to the narrowest: every span of
    width w adds ``share(w, chart's width-w items)`` ``[n-w, w, B]`` at [i, t] to both children of its split t."""
    for w in range(chart.shape[0] - 1, 0, -1):
        part = share(w, _diagonal(chart, w).unsqueeze(1))
        left, right = _children(chart, w)
        left.add_(part)
        right.add_(part)
    return chart


def _root(chart: torch.Tensor, lengths: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Write ``value`` ``[B]`` at the full span (0, L-1) of each example of a batch-last chart ``[n, n, B]``."""
    return chart[0].scatter_(0, (lengths - 1).view(1, -1), value.view(1, -1).to(chart.dtype))


def _batch_last(x: torch.Tensor) -> torch.Tensor:
    """``[B, n, n]`` → a new contiguous batch-last chart ``[n, n, B]`` (with storage of its own: written in place)."""
    return x.permute(1, 2, 0).clone(memory_format=torch.contiguous_format)


def _by_example(chart: torch.Tensor) -> torch.Tensor:
    """Batch-last chart ``[n, n, B]`` → ``[B, n, n]`` (contiguous), only the parts (i < j) kept."""
    return chart.permute(2, 0, 1).triu(1)


class _Marginals(torch.autograd.Function):
    """μ = ∇ log Z by inside-outside without autograd; backward H g by the tangent pass
    (docs/structures.md#binary_tree)."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        _, weights = _cky(s, "logsumexp")
        mu = s.new_zeros(s.shape[1], s.shape[2], s.shape[0])
        _root(mu, lengths, torch.ones_like(lengths))
        _top_down(mu, lambda w, parent: weights[w - 1] * parent)
        ctx.save_for_backward(lengths, mu, *weights)
        return _by_example(mu)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lengths, mu, *weights = ctx.saved_tensors
        n = mu.shape[0]
        # Junk in the gradient of padding spans (which get no share of the tree) must not reach the real ones.
        g = _batch_last(grad.masked_fill(torch.arange(n, device=grad.device) >= lengths.view(-1, 1, 1), 0.0))
        tangent = torch.zeros_like(g)  # β̇, then μ̇
        centred = []  # β̇[i, k] + β̇[k+1, j] - Σ_k' p(k' | i, j) (β̇[i, k'] + β̇[k'+1, j]) per width
        for w in range(1, n):
            left, right = _children(tangent, w)
            x = left + right
            mean = (weights[w - 1] * x).sum(1, keepdim=True)
            torch.add(mean.squeeze(1), _diagonal(g, w), out=_diagonal(tangent, w))
            centred.append(x.sub_(mean))
        tangent.zero_()

        def share(w, parent):
            return torch.addcmul(parent, _diagonal(mu, w).unsqueeze(1), centred[w - 1]).mul_(weights[w - 1])

        return _by_example(_top_down(tangent, share)), None


def _backtrack(pointers: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Follow the split pointers by width ``[n, n, B]`` (as ``_cky`` returns them) top-down, whole batch at once,
    widths from widest to narrowest → 0/1 ``[B, n, n]`` in ``dtype``.

    ``on`` (a batch-last chart flattened to ``[n·n, B]``) marks the spans of example b's tree: every span of width w
    adds its mark (0 or 1) to both children of its split, which are strictly narrower (each has one parent).
    """
    n, _, batch = pointers.shape
    on = torch.zeros(n * n, batch, dtype=dtype, device=pointers.device)
    _root(on.view(n, n, batch), lengths, lengths >= 2)  # a single leaf has no span
    # Flat indices of both children of the span (i, j = i+w) split at k = i + t: (i, k) and (k+1, j), by width.
    width = torch.arange(n, device=pointers.device).view(-1, 1, 1)
    start = width.view(1, -1, 1)
    left = start * (n + 1) + pointers
    right = left + pointers * (n - 1) + (n + width)
    chart, lefts, rights = on.view(n, n, batch), left.unbind(0), right.unbind(0)
    for w in range(n - 1, 0, -1):
        parent = _diagonal(chart, w).clone()  # a copy: the scatters' source may not overlap their target
        on.scatter_add_(0, lefts[w][: n - w], parent)
        on.scatter_add_(0, rights[w][: n - w], parent)
    return _by_example(on.view(n, n, batch))


@functools.cache
def _bracketings(i: int, j: int) -> tuple[frozenset[tuple[int, int]], ...]:
    """Every bracketing of the leaves i..j as the set of its internal spans."""
    if i == j:
        return (frozenset(),)
    return tuple(
        frozenset({(i, j)}) | left | right
        for k in range(i, j)
        for left in _bracketings(i, k)
        for right in _bracketings(k + 1, j)
    )

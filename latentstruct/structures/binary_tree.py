"""Binary bracketings (unlabelled full binary trees over n leaves): CKY, the inside algorithm, top-down sampling.

Part layout. ``scores[b, i, j]`` (shape ``[batch, n, n]``) for ``i < j`` is the score of a constituent spanning the
leaves ``i..j`` (inclusive). The diagonal (single leaves, present in every tree) and the lower triangle are never parts:
they are 0 in every output. A vertex z ∈ {0, 1}^{n×n} is the set of internal nodes of a full binary tree whose leaves
are 0..n-1 in order: it has exactly n - 1 ones, always including the full span (0, n-1) when n ≥ 2 (for n = 1 the only
tree is a single leaf and z = 0). There are Catalan(n-1) vertices: 1, 1, 2, 5, 14, 42, … for n = 1, 2, 3, …
``lengths[b]`` (≥ 1, default n) is the number of leaves of example b; spans with ``j ≥ lengths[b]`` are padding:
they may hold anything (even NaN or ±inf), are ignored, are 0 in every output and get zero gradient. A part may be
−inf (a forbidden constituent): it is floored at a huge finite negative value, so trees containing it get probability
0 and spans left without any allowed bracketing give zero rather than NaN gradients (some tree must stay allowed).

The chart (Cocke; Kasami, 1965; Younger, 1967) holds β[i, j] = the ⊕ over the bracketings of the leaves i..j:

    β[i, i] = 0,     β[i, j] = s[i, j] ⊗ ⊕_{i≤k<j} β[i, k] ⊗ β[k+1, j],     value = β[0, L-1].

(⊕, ⊗) is (max, +) for ``map`` (CKY with back-pointers, then a batched top-down backtrack) and (logsumexp, +) for
``log_partition``: the inside algorithm (Baker, 1979; Lari & Young, 1990), whose gradient — the marginals, from the
base class — is the outside pass (Eisner, 2016). ``exact_sample`` draws a tree top-down from the inside chart: the
full span, then recursively a split k of every chosen span (i, j) with probability ∝ exp(β[i, k] + β[k+1, j])
(Johnson, Griffiths & Goldwater, 2007). The split of every span is drawn up front by Gumbel-max during the inside
pass and then followed like CKY's back-pointers, which samples the same distribution since each span's split is
drawn independently of the others.

Every dynamic program loops over the span width only: all spans of one width, for the whole batch, are one set of
tensor ops. The chart is kept in two layouts, by start ``X[b, i, w] = β[i, i+w]`` and by end ``X[b, j, w] =
β[j-w, j]``, so that both factors of every split are plain slices (the second one flipped).

References: T. Kasami (1965), "An efficient recognition and syntax-analysis algorithm for context-free languages".
D. Younger (1967), "Recognition and parsing of context-free languages in time n³", Information and Control.
J. Baker (1979), "Trainable grammars for speech recognition". K. Lari, S. Young (1990), "The estimation of stochastic
context-free grammars using the inside-outside algorithm", Computer Speech and Language. M. Johnson, T. Griffiths,
S. Goldwater (2007), "Bayesian inference for PCFGs via Markov chain Monte Carlo", NAACL. J. Eisner (2016),
"Inside-outside and forward-backward algorithms are just backprop".
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from latentstruct.structures.base import Structure, gumbel_like

__all__ = ["BinaryTree"]


class BinaryTree(Structure):
    """Binary bracketings of ``n`` leaves (see the module docstring for the part layout).

    Scores ``[batch, n, n]``, ``scores[b, i, j]`` (i < j) = score of the constituent over leaves i..j. ``lengths``
    ``[batch]`` (integer, each in 1..n; default n) is the number of leaves; padding may hold any value and is 0 in
    every output. ``map`` is CKY in O(n³) with back-pointers, ``log_partition`` the inside algorithm in log space,
    ``marginals`` (base class) its gradient (inside-outside), twice differentiable.
    """

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring bracketing: 0/1 tensor ``[batch, n, n]`` in the scores' dtype, no gradient."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            _, pointers = _inside(s, lengths, semiring="max")
            z = _backtrack(pointers, lengths)
        return z.to(scores.dtype)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over bracketings (the inside algorithm), shape ``[batch]``; differentiable (twice)."""
        s, lengths = _prepare(scores, lengths)
        value, _ = _inside(s, lengths, semiring="logsumexp")
        return value

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """z ~ p(z | s) ∝ exp <s, z> exactly (top-down sampling from the inside chart); 0/1 like ``map``."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            _, pointers = _inside(s, lengths, semiring="sample", generator=generator)
            z = _backtrack(pointers, lengths)
        return z.to(scores.dtype)

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


def _append(layout: torch.Tensor, values: torch.Tensor, width: int, by_end: bool) -> torch.Tensor:
    """Add the width-``width`` column to a chart layout ``[B, n, width]`` → ``[B, n, width+1]``.

    ``values[b, i]`` is the item (i, i+width); by start it sits at row i, by end at row i+width. The other rows are
    never read, so they are padded with 0.
    """
    padded = F.pad(values, (width, 0) if by_end else (0, width))
    return torch.cat([layout, padded.unsqueeze(-1)], dim=-1)


def _inside(
    s: torch.Tensor, lengths: torch.Tensor, semiring: str, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chart over prepared scores ``[B, n, n]`` in the given semiring, vectorised over the width.

    Returns the value β[0, L-1] ``[B]`` and, for ``max`` (argmax splits) and ``sample`` (log-space chart, splits
    drawn by Gumbel-max), the split pointers ``[B, n, n]`` by start: ``pointers[b, i, w] = k - i`` for the span
    (i, i+w) split into (i, k) and (k+1, i+w); width 0 is never split.
    """
    batch, n, _ = s.shape
    # Width 0: single leaves, β = 0. Taken from the (zeroed) diagonal so that the value is a function of the scores
    # even when no span is a part (n = 1), which the autograd marginals need.
    by_start = by_end = s.diagonal(0, 1, 2).unsqueeze(-1)
    pointers = [torch.zeros(batch, n, dtype=torch.long, device=s.device)]
    # Span scores by start, span[w][b, i] = s[b, i, i+w] (rows i ≥ n - w hold junk, never read): one gather and one
    # unbind, so the backward is one scatter rather than a zero-filled [B, n, n] per width.
    pos = torch.arange(n, device=s.device)
    span = s.gather(2, (pos.view(-1, 1) + pos).clamp_max(n - 1).expand(batch, n, n)).unbind(-1)
    for w in range(1, n):
        m = n - w  # spans (i, i+w), i = 0..m-1
        # Split offset t = k - i in 0..w-1: left (i, i+t) by start, right (i+t+1, i+w) by end at width w-1-t.
        x = by_start[:, :m, :w] + by_end[:, w:, :w].flip(-1)  # [B, m, w]
        if semiring == "max":
            value, split = x.max(-1)
        else:
            value = torch.logsumexp(x, -1)
            split = (x + gumbel_like(x, generator)).argmax(-1) if semiring == "sample" else None
        value = value + span[w][:, :m]
        by_start = _append(by_start, value, w, by_end=False)
        by_end = _append(by_end, value, w, by_end=True)
        if split is not None:
            pointers.append(F.pad(split, (0, w)))
    value = by_start[:, 0].gather(1, (lengths - 1).view(-1, 1)).squeeze(1)  # β[0, L-1]
    return value, (torch.stack(pointers, -1) if semiring != "logsumexp" else None)


def _backtrack(pointers: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Follow the split pointers top-down, whole batch at once, widths from widest to narrowest → bool ``[B, n, n]``.

    ``active[b, i, w]`` marks the spans (i, i+w) of example b's tree (flattened, with one spare slot at the end that
    absorbs the writes of inactive spans); every span splits into two strictly narrower ones.
    """
    batch, n, _ = pointers.shape
    device = pointers.device
    slots = n * n
    active = torch.zeros(batch, slots + 1, dtype=torch.bool, device=device)
    chart = active[:, :slots].view(batch, n, n)  # a view: sees later marks
    z = torch.zeros(batch, n, n, dtype=torch.bool, device=device)

    def mark(start: torch.Tensor, width: torch.Tensor, where: torch.Tensor) -> None:
        index = torch.where(where, start * n + width, torch.full_like(start, slots))
        active.scatter_(1, index.view(batch, -1), True)

    mark(torch.zeros_like(lengths), lengths - 1, lengths >= 2)  # the full span (0, L-1); a single leaf has none
    for w in range(n - 1, 0, -1):
        m = n - w
        start = torch.arange(m, device=device).expand(batch, m)
        on, t = chart[:, :m, w].clone(), pointers[:, :m, w]
        z.diagonal(w, 1, 2).copy_(on)
        mark(start, t, on)  # left child (i, i+t)
        mark(start + t + 1, w - 1 - t, on)  # right child (i+t+1, i+w)
    return z


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

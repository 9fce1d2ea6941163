"""Projective dependency trees: Eisner's cubic-time dynamic program, in the max and the log-sum-exp semirings.

Parts are arcs. ``scores[b, h, m]`` is the score of the arc head ``h`` → modifier ``m`` over positions ``0..n``,
where position 0 is the root symbol and ``1..n`` are the words. A vertex z ∈ {0, 1}^{(n+1)×(n+1)} is a projective
dependency tree: every word has exactly one head, the arcs form a tree rooted at 0, and no two arcs cross when drawn
above the sentence with the root at the far left. Column 0 (arcs into the root) and the diagonal (self-loops) are never
parts, so they are always 0 in z and in the marginals μ.

The chart (Eisner, 1996; Eisner, 2000 §4) holds four kinds of span items over positions ``i < j``:

* complete right  C→[i, j]: i heads a finished subtree whose yield is ``i..j``;
* complete left   C←[i, j]: the same with head j;
* incomplete right I→[i, j]: the arc i → j is in, j's inside dependents are still to come;
* incomplete left  I←[i, j]: the arc j → i, likewise.

    I→[i, j] = s[i, j] ⊕_{i≤k<j} C→[i, k] ⊗ C←[k+1, j]      I←[i, j] = s[j, i] ⊕_{i≤k<j} C→[i, k] ⊗ C←[k+1, j]
    C→[i, j] = ⊕_{i<k≤j} I→[i, k] ⊗ C→[k, j]                C←[i, j] = ⊕_{i≤k<j} C←[i, k] ⊗ I←[k, j]

with C[i, i] = 0 and the tree's value C→[0, n]. (⊕, ⊗) is (max, +) for ``map`` and (logsumexp, +) for
``log_partition`` — the inside algorithm; the marginals are its gradient (Eisner, 2016). Items C←[0, ·] and
I←[0, ·] would need an arc into the root; they are computed like the others but never reach C→[0, n], so the scores
of column 0 get neither value nor gradient.

Single root (``multiroot=False``): the root has exactly one child j, whose subtree spans all the words, so

    value = ⊕_{1≤j≤n} C←[1, j] ⊗ s[0, j] ⊗ C→[j, n],

where C←[1, j] and C→[j, n] are the same chart items, which never involve the root. This is exact (every single-rooted
projective tree decomposes this way in exactly one way); it is the projective counterpart of the single-root
constraint of Koo et al. (2007).

Every dynamic program loops over the span width only: all spans of one width, for the whole batch, are one set of
tensor ops. The chart is kept in two layouts, by start ``X[b, i, w] = X[i, i+w]`` and by end
``X[b, j, w] = X[j-w, j]``, so that both factors of every split are plain slices (one of them flipped).

References: J. Eisner (1996), "Three new probabilistic models for dependency parsing: an exploration", COLING.
J. Eisner (2000), "Bilexical grammars and their cubic-time parsing algorithms". T. Koo, A. Globerson, X. Carreras,
M. Collins (2007), "Structured prediction models via the matrix-tree theorem", EMNLP. J. Eisner (2016),
"Inside-outside and forward-backward algorithms are just backprop".
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from latentstruct.structures.base import Structure

__all__ = ["ProjectiveDepTree"]


class ProjectiveDepTree(Structure):
    """Projective dependency trees over ``n`` words with a root symbol at position 0.

    Scores ``[batch, n+1, n+1]``, ``scores[b, h, m]`` = score of the arc h → m. ``lengths`` ``[batch]`` (integer,
    each ≥ 1; default n for every example) is the number of words; positions past it are padding: they may hold any
    value (even ±inf or NaN), are ignored, and are 0 in every output. ``multiroot=False`` restricts the vertices to
    trees in which the root has exactly one child.

    ``map`` is Eisner's O(n³) algorithm with back-pointers; ``log_partition`` the inside algorithm in log space;
    ``marginals`` (from the base class) its gradient, twice differentiable.
    """

    def __init__(self, multiroot: bool = True):
        self.multiroot = bool(multiroot)

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring projective tree: 0/1 tensor ``[batch, n+1, n+1]`` in the scores' dtype, no gradient."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            chart = _inside(s, lengths, self.multiroot, semiring="max")
            z = _backtrack(chart, lengths, self.multiroot)
        return z.to(scores.dtype)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over projective trees, shape ``[batch]``; differentiable (twice)."""
        s, lengths = _prepare(scores, lengths)
        return _inside(s, lengths, self.multiroot, semiring="logsumexp")["value"]

    def enumerate(self, n: int) -> torch.Tensor:
        """Every projective tree over ``n`` words, ``[V, n+1, n+1]`` (brute force over the n^n head assignments).

        V is 1, 3, 12, 55, 273, 1428 for n = 1..6 with ``multiroot=True``, binom(3n, n) / (2n + 1).
        """
        trees = []
        for heads in itertools.product(range(n + 1), repeat=n):
            heads = (-1, *heads)  # heads[m] for m = 1..n; position 0 has none
            if not _is_tree(heads) or not _is_projective(heads):
                continue
            if not self.multiroot and sum(h == 0 for h in heads[1:]) != 1:
                continue
            z = torch.zeros(n + 1, n + 1)
            for m in range(1, n + 1):
                z[heads[m], m] = 1.0
            trees.append(z)
        return torch.stack(trees)


# ------------------------------------------------------------------------------------------------------- helpers


def _prepare(scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes; replace every non-part (column 0, diagonal, padding) by 0.

    Zeroing rather than leaving them means junk there (−inf from a masked scorer, NaN) can reach neither the value
    nor the gradient: the backward of a log-sum-exp over a NaN or all −inf slice is NaN even when multiplied by 0.
    """
    if scores.dim() != 3 or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"ProjectiveDepTree expects scores [batch, n+1, n+1], got {tuple(scores.shape)}")
    batch, size, _ = scores.shape
    if size < 2:
        raise ValueError("ProjectiveDepTree needs at least one word (scores [batch, n+1, n+1] with n >= 1)")
    if lengths is None:
        lengths = torch.full((batch,), size - 1, dtype=torch.long, device=scores.device)
    else:
        lengths = torch.as_tensor(lengths, device=scores.device).long()
    pos = torch.arange(size, device=scores.device)
    inside = pos.view(1, -1) <= lengths.view(-1, 1)  # [B, n+1]
    part = inside.unsqueeze(2) & inside.unsqueeze(1) & (pos.view(-1, 1) != pos.view(1, -1)) & (pos.view(1, -1) > 0)
    return scores.masked_fill(~part, 0.0), lengths


def _reduce(x: torch.Tensor, semiring: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """⊕ over the last (split) dimension; with max also the arg (the back-pointer)."""
    if semiring == "max":
        return x.max(-1)
    return torch.logsumexp(x, -1), None


def _append(layout: torch.Tensor, values: torch.Tensor, width: int, by_end: bool) -> torch.Tensor:
    """Add the width-``width`` column to a chart layout ``[B, N, width]`` → ``[B, N, width+1]``.

    ``values[b, i]`` is the item (i, i+width); by start it sits at row i, by end at row i+width. The other rows are
    never read (every slice taken in ``_inside`` stays within the filled rows), so they are padded with 0.
    """
    padded = F.pad(values, (width, 0) if by_end else (0, width))
    return torch.cat([layout, padded.unsqueeze(-1)], dim=-1)


def _inside(s: torch.Tensor, lengths: torch.Tensor, multiroot: bool, semiring: str) -> dict:
    """Eisner's chart in the given semiring over scores ``[B, N, N]`` (N = n+1), vectorised over the width.

    Returns ``value`` ``[B]`` (the tree value for each example's own length) and, for ``max``, the back-pointers
    ``[B, N, N]`` by start (``bp_*[b, i, w]`` = split offset of item (i, i+w)) and the root's child ``root_child``
    ``[B]`` (single root only).
    """
    batch, size, _ = s.shape
    zero = s.new_zeros(batch, size, 1)  # the width-0 column: complete items are empty spans; incomplete unused
    cr_s, cl_s, ir_s = zero, zero, zero  # by start
    cr_e, cl_e, il_e = zero, zero, zero  # by end
    bp_i, bp_cr, bp_cl = [], [], []
    for w in range(1, size):
        m = size - w  # spans (i, i+w), i = 0..m-1
        # Incomplete: split i ≤ k < j into C→[i, k] ⊗ C←[k+1, j]; offset t = k - i runs 0..w-1.
        split, bp = _reduce(cr_s[:, :m, :w] + cl_e[:, w:, :w].flip(-1), semiring)
        ir_s = _append(ir_s, split + s.diagonal(w, 1, 2), w, by_end=False)
        il_e = _append(il_e, split + s.diagonal(-w, 1, 2), w, by_end=True)
        # Complete right: I→[i, k] ⊗ C→[k, j], k = i + t for t = 1..w (the width-w incomplete item is t = w).
        cr, bp_r = _reduce(ir_s[:, :m, 1 : w + 1] + cr_e[:, w:, :w].flip(-1), semiring)
        # Complete left: C←[i, k] ⊗ I←[k, j], k = i + t for t = 0..w-1.
        cl, bp_l = _reduce(cl_s[:, :m, :w] + il_e[:, w:, 1 : w + 1].flip(-1), semiring)
        cr_s, cr_e = _append(cr_s, cr, w, by_end=False), _append(cr_e, cr, w, by_end=True)
        cl_s, cl_e = _append(cl_s, cl, w, by_end=False), _append(cl_e, cl, w, by_end=True)
        if semiring == "max":
            bp_i.append(F.pad(bp, (0, w)))
            bp_cr.append(F.pad(bp_r + 1, (0, w)))
            bp_cl.append(F.pad(bp_l, (0, w)))

    out: dict = {}
    if multiroot:
        out["value"] = cr_s[:, 0].gather(1, lengths.view(-1, 1)).squeeze(1)  # C→[0, L]
    else:
        words = torch.arange(1, size, device=s.device)
        # C→[j, L] sits by start at [j, L - j]; j > L is not a word of this example.
        offset = (lengths.view(-1, 1) - words).clamp_min(0)  # [B, n]
        right = cr_s[:, 1:].gather(2, offset.unsqueeze(-1)).squeeze(-1)
        cand = cl_s[:, 1, : size - 1] + s[:, 0, 1:] + right  # C←[1, j] ⊗ s[0, j] ⊗ C→[j, L]
        cand = cand.masked_fill(words > lengths.view(-1, 1), float("-inf"))
        value, child = _reduce(cand, semiring)
        out["value"] = value
        if semiring == "max":
            out["root_child"] = child + 1
    if semiring == "max":
        out["bp_i"], out["bp_cr"], out["bp_cl"] = _by_width(bp_i), _by_width(bp_cr), _by_width(bp_cl)
        out["size"] = size
    return out


def _by_width(pointers: list[torch.Tensor]) -> torch.Tensor:
    """Per-width back-pointers ``[B, N]`` for widths 1..N-1 → ``[B, N, N]`` by start (width 0 never split)."""
    return torch.stack([torch.zeros_like(pointers[0]), *pointers], dim=-1)


# Item kinds in the backtracking mask.
_CR, _CL, _IR, _IL = range(4)


def _backtrack(chart: dict, lengths: torch.Tensor, multiroot: bool) -> torch.Tensor:
    """Follow the back-pointers from the top item, whole batch at once, widths from widest to narrowest.

    Every item splits into items of smaller width, except a complete item whose incomplete part has its full width,
    so at each width the complete items are expanded before the incomplete ones. ``active[b, kind, i, w]`` marks the
    items of example b's best derivation; one spare slot at the end absorbs the writes of inactive items.
    Returns a bool tensor ``[B, N, N]`` of arcs.
    """
    size = chart["size"]
    batch = lengths.shape[0]
    device = lengths.device
    slots = 4 * size * size
    active = torch.zeros(batch, slots + 1, dtype=torch.bool, device=device)
    z = torch.zeros(batch, size, size, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)

    def mark(kind: int, start: torch.Tensor, width: torch.Tensor, where: torch.Tensor) -> None:
        index = (kind * size + start) * size + width
        index = torch.where(where, index, torch.full_like(index, slots))
        active.scatter_(1, index.view(batch, -1), True)

    if multiroot:
        mark(_CR, torch.zeros_like(lengths), lengths, torch.ones_like(lengths, dtype=torch.bool))
    else:
        child = chart["root_child"]
        everyone = torch.ones_like(lengths, dtype=torch.bool)
        mark(_CL, torch.ones_like(child), child - 1, everyone)  # C←[1, j]
        mark(_CR, child, lengths - child, everyone)  # C→[j, L]
        z[rows, 0, child] = True

    kinds = active[:, :slots].view(batch, 4, size, size)  # a view: sees later marks
    for w in range(size - 1, 0, -1):
        m = size - w
        start = torch.arange(m, device=device).expand(batch, m)
        full = torch.full_like(start, w)
        # Complete right (i, i+w) → I→(i, t) and C→(i+t, w-t).
        on, t = kinds[:, _CR, :m, w].clone(), chart["bp_cr"][:, :m, w]
        mark(_IR, start, t, on)
        mark(_CR, start + t, full - t, on)
        # Complete left (i, i+w) → C←(i, t) and I←(i+t, w-t).
        on, t = kinds[:, _CL, :m, w].clone(), chart["bp_cl"][:, :m, w]
        mark(_CL, start, t, on)
        mark(_IL, start + t, full - t, on)
        # Incomplete (i, i+w) → the arc, C→(i, t) and C←(i+t+1, w-1-t).
        on_r, on_l, t = kinds[:, _IR, :m, w], kinds[:, _IL, :m, w], chart["bp_i"][:, :m, w]
        z.diagonal(w, 1, 2).logical_or_(on_r)
        z.diagonal(-w, 1, 2).logical_or_(on_l)
        on = on_r | on_l
        mark(_CR, start, t, on)
        mark(_CL, start + t + 1, full - 1 - t, on)
    return z


def _is_tree(heads: tuple[int, ...]) -> bool:
    """Every word reaches the root 0 by following heads (no cycles, no self-loops)."""
    n = len(heads) - 1
    for m in range(1, n + 1):
        node, steps = m, 0
        while node != 0:
            if heads[node] == node or steps > n:
                return False
            node, steps = heads[node], steps + 1
    return True


def _is_projective(heads: tuple[int, ...]) -> bool:
    """No two arcs cross: spans (a, b) and (c, d) with a < c < b < d (root at position 0)."""
    spans = [tuple(sorted((heads[m], m))) for m in range(1, len(heads))]
    return not any(a < c < b < d for (a, b), (c, d) in itertools.permutations(spans, 2))

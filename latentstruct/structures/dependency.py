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
tensor ops. The two semirings keep the chart differently:

* log-sum-exp (``log_partition``; ``marginals`` is its gradient, and must itself be differentiable): the chart is
  built functionally, in two layouts, by start ``X[b, i, w] = X[i, i+w]`` and by end ``X[b, j, w] = X[j-w, j]``,
  each grown by one column per width, so that both factors of every split are plain slices (one of them flipped).
* max (``map``, no gradient): one chart ``[4, N, N, B]`` allocated once, the item X[i, j] (i ≤ j) of kind X at
  ``[X, i, j, b]``, with the planes ordered C→, I→, C←, I← and the batch last (contiguous, so that the elementwise
  ops vectorise). Each width's items are written in place on the w-th diagonal, and the factors of all the splits
  are read as strided views (``as_strided``) of the chart, without copies; the two complete kinds share one view per
  factor (their planes are a fixed distance apart), so they are reduced together. The back-pointers are written the
  same way into ``[3, N, N, B]``. The log-sum-exp pass does not do this because, under autograd, the backward of
  every write into and every read from a view of a preallocated chart touches the whole chart: measured, that made
  the marginals slower (up to 2x at n = 60), whereas the grown layouts touch only what each width needs.

``map`` then follows the back-pointers down from the top item(s) on the host, one example at a time (see
``_backtrack``).

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

    def __init__(self, multiroot: bool = True, sparsemap_max_iter: int | None = None):
        self.multiroot = bool(multiroot)
        if sparsemap_max_iter is not None and sparsemap_max_iter < 1:
            raise ValueError(f"sparsemap_max_iter must be None or >= 1, got {sparsemap_max_iter}")
        self.sparsemap_max_iter = sparsemap_max_iter

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring projective tree: 0/1 tensor ``[batch, n+1, n+1]`` in the scores' dtype, no gradient."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            pointers, root_child = _eisner_max(s, lengths, self.multiroot)
            z = _backtrack(pointers, root_child, lengths)
        return z.to(device=scores.device, dtype=scores.dtype)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over projective trees, shape ``[batch]``; differentiable (twice)."""
        s, lengths = _prepare(scores, lengths)
        return _inside(s, lengths, self.multiroot)

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
    """Check shapes; replace every non-part (column 0, diagonal, padding) by 0 (see :func:`arc_parts`)."""
    s, lengths, _ = arc_parts(scores, lengths, "ProjectiveDepTree")
    return s, lengths


def arc_parts(
    scores: torch.Tensor, lengths: torch.Tensor | None, name: str, check_lengths: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The arc layout shared by both dependency structures: check the shapes (and, with ``check_lengths``, that
    ``lengths`` is ``[B]`` within 1..n, which costs a device sync); return (scores with every non-part replaced by 0,
    lengths, part mask ``[B, N, N]``).

    Non-parts are column 0, the diagonal and every arc touching a padded position. Zeroing rather than leaving them
    means junk there (−inf from a masked scorer, NaN) can reach neither the value nor the gradient: the backward of a
    log-sum-exp over a NaN or all −inf slice is NaN even when multiplied by 0.
    """
    if scores.dim() != 3 or scores.shape[1] != scores.shape[2]:
        raise ValueError(f"{name} expects scores [batch, n+1, n+1], got {tuple(scores.shape)}")
    batch, size, _ = scores.shape
    if size < 2:
        raise ValueError(f"{name} needs at least one word (scores [batch, n+1, n+1] with n >= 1)")
    if lengths is None:
        lengths = torch.full((batch,), size - 1, dtype=torch.long, device=scores.device)
    else:
        lengths = torch.as_tensor(lengths, device=scores.device).long()
        if check_lengths and lengths.shape != (batch,):
            raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        if check_lengths and bool(((lengths < 1) | (lengths > size - 1)).any()):
            raise ValueError(f"lengths must lie in 1..{size - 1}, got {lengths.tolist()}")
    pos = torch.arange(size, device=scores.device)
    inside = pos.view(1, -1) <= lengths.view(-1, 1)  # [B, n+1]
    part = inside.unsqueeze(2) & inside.unsqueeze(1) & (pos.view(-1, 1) != pos.view(1, -1)) & (pos.view(1, -1) > 0)
    return scores.masked_fill(~part, 0.0), lengths, part


def _append(layout: torch.Tensor, values: torch.Tensor, width: int, by_end: bool) -> torch.Tensor:
    """Add the width-``width`` column to a chart layout ``[B, N, width]`` → ``[B, N, width+1]``.

    ``values[b, i]`` is the item (i, i+width); by start it sits at row i, by end at row i+width. The other rows are
    never read (every slice taken in ``_inside`` stays within the filled rows), so they are padded with 0.
    """
    padded = F.pad(values, (width, 0) if by_end else (0, width))
    return torch.cat([layout, padded.unsqueeze(-1)], dim=-1)


def _root_candidates(
    left: torch.Tensor, root_arcs: torch.Tensor, right: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Single root: C←[1, j] ⊗ s[0, j] ⊗ C→[j, L] for j = 1..n, ``[B, n]``; −inf for the words past L."""
    words = torch.arange(1, left.shape[1] + 1, device=left.device)
    return (left + root_arcs + right).masked_fill(words > lengths.view(-1, 1), float("-inf"))


def _inside(s: torch.Tensor, lengths: torch.Tensor, multiroot: bool) -> torch.Tensor:
    """The log-partition ``[B]``: Eisner's chart in the log-sum-exp semiring over scores ``[B, N, N]`` (N = n+1).

    Functional (no in-place writes), hence differentiable twice; vectorised over the width, with the chart in the
    by-start (``*_s``) and by-end (``*_e``) layouts of the module docstring.
    """
    batch, size, _ = s.shape
    zero = s.new_zeros(batch, size, 1)  # the width-0 column: complete items are empty spans; incomplete unused
    cr_s, cl_s, ir_s = zero, zero, zero  # by start
    cr_e, cl_e, il_e = zero, zero, zero  # by end
    for w in range(1, size):
        m = size - w  # spans (i, i+w), i = 0..m-1
        # Incomplete: split i ≤ k < j into C→[i, k] ⊗ C←[k+1, j]; offset t = k - i runs 0..w-1.
        split = torch.logsumexp(cr_s[:, :m, :w] + cl_e[:, w:, :w].flip(-1), -1)
        ir_s = _append(ir_s, split + s.diagonal(w, 1, 2), w, by_end=False)
        il_e = _append(il_e, split + s.diagonal(-w, 1, 2), w, by_end=True)
        # Complete right: I→[i, k] ⊗ C→[k, j], k = i + t for t = 1..w (the width-w incomplete item is t = w).
        cr = torch.logsumexp(ir_s[:, :m, 1 : w + 1] + cr_e[:, w:, :w].flip(-1), -1)
        # Complete left: C←[i, k] ⊗ I←[k, j], k = i + t for t = 0..w-1.
        cl = torch.logsumexp(cl_s[:, :m, :w] + il_e[:, w:, 1 : w + 1].flip(-1), -1)
        cr_s, cr_e = _append(cr_s, cr, w, by_end=False), _append(cr_e, cr, w, by_end=True)
        cl_s, cl_e = _append(cl_s, cl, w, by_end=False), _append(cl_e, cl, w, by_end=True)

    if multiroot:
        return cr_s[:, 0].gather(1, lengths.view(-1, 1)).squeeze(1)  # C→[0, L]
    # C→[j, L] sits by start at [j, L - j]; j > L is not a word of this example (its candidate is −inf anyway).
    offset = (lengths.view(-1, 1) - torch.arange(1, size, device=s.device)).clamp_min(0)  # [B, n]
    right = cr_s[:, 1:].gather(2, offset.unsqueeze(-1)).squeeze(-1)
    return torch.logsumexp(_root_candidates(cl_s[:, 1, : size - 1], s[:, 0, 1:], right, lengths), -1)


# Planes of the max pass's chart [4, N, N, B] (the item X[i, j], i ≤ j, of kind X sits at [X, i, j, b]). The order
# matters: the two operands of the complete step are each one strided view over two planes, which needs the plane
# of I→ before that of C← and the plane of C→ before that of I← (``_eisner_max``).
_CR, _IR, _CL, _IL = range(4)


def _diagonal(x: torch.Tensor, w: int) -> torch.Tensor:
    """The items (i, i+w) of a batch-last chart ``[..., N, N, B]`` → a view ``[..., N-w, B]``."""
    return x.diagonal(w, -3, -2).transpose(-1, -2)


def _eisner_max(s: torch.Tensor, lengths: torch.Tensor, multiroot: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eisner's chart in the max semiring over scores ``[B, N, N]``, in place, vectorised over the width.

    The chart is ``[4, N, N, B]`` (module docstring): batch last, so that every operand is a strided view whose
    innermost dimension is the contiguous batch (the additions run ~3x faster than with the batch first).

    Returns the back-pointers ``[3, N, N, B]`` (int64, at [·, i, j, b] for i < j; the rest is never written), as
    split offsets t: plane 0 for I→[i, j] and I←[i, j] (the same split, k = i + t), plane 1 for C→[i, j]
    (k = i + 1 + t), plane 2 for C←[i, j] (k = i + t); and, for a single root, the root's child ``[B]``. Ties go to
    the first (smallest) split, and to the first child, as ``max`` breaks them.
    """
    batch, size, _ = s.shape
    # Strides in the chart from the item (i, j): to (i, j+1), to (i+1, j), and to (i+1, j+1), the next span of the
    # same width; and from one plane to the next.
    next_col, next_row = batch, size * batch
    next_span, plane = next_row + next_col, size * next_row
    chart = s.new_zeros(4, size, size, batch)  # C[i, i] = 0; contiguous with storage offset 0, as as_strided needs
    incomplete, complete = chart[_IR::2], chart[_CR::2]  # (I→, I←) and (C→, C←)
    by_batch = s.permute(1, 2, 0)
    arcs = torch.stack([by_batch, by_batch.transpose(0, 1)])  # diagonal w: s[i, i+w] in [0], s[i+w, i] in [1]
    pointers = torch.empty(3, size, size, batch, dtype=torch.long, device=s.device)
    split = s.new_empty(size, batch)
    for w in range(1, size):
        m = size - w  # spans (i, i+w), i = 0..m-1; the split offset t is the dimension reduced
        # Incomplete: C→[i, i+t] ⊗ C←[i+t+1, i+w], t = 0..w-1.
        left = chart.as_strided((m, w, batch), (next_span, next_col, 1), _CR * plane)
        right = chart.as_strided((m, w, batch), (next_span, next_row, 1), _CL * plane + next_row + w * next_col)
        torch.max(left + right, 1, out=(split[:m], _diagonal(pointers[0], w)))
        torch.add(split[:m], _diagonal(arcs, w), out=_diagonal(incomplete, w))
        # Complete, both kinds at once ([0] right, [1] left), t = 0..w-1:
        #   C→[i, i+w] = max_t I→[i, i+1+t] ⊗ C→[i+1+t, i+w]     C←[i, i+w] = max_t C←[i, i+t] ⊗ I←[i+t, i+w]
        first = chart.as_strided(
            (2, m, w, batch), ((_CL - _IR) * plane - next_col, next_span, next_col, 1), _IR * plane + next_col
        )
        second = chart.as_strided(
            (2, m, w, batch),
            ((_IL - _CR) * plane - next_row, next_span, next_row, 1),
            _CR * plane + next_row + w * next_col,
        )
        torch.max(first + second, 2, out=(_diagonal(complete, w), _diagonal(pointers[1:], w)))

    if multiroot:
        return pointers, None
    by_example = chart.permute(0, 3, 1, 2)  # [4, B, N, N]
    # C→[j, L] for j = 1..n (for j > L the entry was never written, 0, and the candidate is −inf).
    right = by_example[_CR, :, 1:].gather(2, lengths.view(-1, 1, 1).expand(-1, size - 1, 1)).squeeze(-1)
    candidates = _root_candidates(by_example[_CL, :, 1, 1:], s[:, 0, 1:], right, lengths)
    return pointers, candidates.max(-1).indices + 1


def _backtrack(pointers: torch.Tensor, root_child: torch.Tensor | None, lengths: torch.Tensor) -> torch.Tensor:
    """Follow the back-pointers down from the top item(s), one example at a time on the host → bool ``[B, N, N]``.

    A derivation over L words has at most 2L items of positive width (one incomplete item per arc below the root,
    and one complete item above each), so this is O(B · n) Python steps, after one copy of the back-pointers to the
    host (on CUDA, a synchronisation). A traversal vectorised over the batch, widths from widest to narrowest, needs
    several tensor ops per width and touches every item of the chart: on CPU (B = 32) the one this replaced, with six
    scatters per width, took 8-15x longer for n = 10..60, and a leaner one with two scatters per width ~6x longer at
    n = 30. The trade-off: the host work grows with B · n (not with n³), so a vectorised traversal could win only for
    very large batches on an accelerator. Returns a CPU tensor.
    """
    _, size, _, batch = pointers.shape
    flat = memoryview(pointers.cpu().numpy().reshape(-1))  # indexing gives Python ints
    next_row, plane = size * batch, size * size * batch  # strides (module docstring); a column's is batch
    arcs: list[tuple[int, int, int]] = []  # (b, head, modifier)
    children = None if root_child is None else root_child.tolist()
    for b, length in enumerate(lengths.tolist()):
        if children is None:
            todo = [(_CR, 0, length)]
        else:
            j = children[b]
            arcs.append((b, 0, j))
            todo = [(_CL, 1, j), (_CR, j, length)]
        while todo:
            kind, i, j = todo.pop()
            if i >= j:  # an empty span: nothing below it
                continue
            at = i * next_row + j * batch + b
            if kind == _CR:  # I→[i, k] ⊗ C→[k, j]
                k = i + 1 + flat[plane + at]
                todo += ((_IR, i, k), (_CR, k, j))
            elif kind == _CL:  # C←[i, k] ⊗ I←[k, j]
                k = i + flat[2 * plane + at]
                todo += ((_CL, i, k), (_IL, k, j))
            else:  # the arc, then C→[i, k] ⊗ C←[k+1, j]
                arcs.append((b, i, j) if kind == _IR else (b, j, i))
                k = i + flat[at]
                todo += ((_CR, i, k), (_CL, k + 1, j))
    z = torch.zeros(batch, size, size, dtype=torch.bool)
    z[torch.tensor(arcs, dtype=torch.long).view(-1, 3).unbind(1)] = True
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

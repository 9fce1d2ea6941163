"""Projective dependency trees: Eisner's cubic-time dynamic program, in the max and the log-sum-exp semirings.

Parts are arcs: ``scores[b, h, m]`` (``[batch, n+1, n+1]``) is the score of the arc head ``h`` → modifier ``m``,
position 0 the root symbol and ``1..n`` the words. A vertex is a projective dependency tree rooted at 0 (every word
has one head, no two arcs cross). Column 0 and the diagonal are never parts: they are 0 in z and in μ. With
``multiroot=False`` the root has exactly one child.

* ``map``: Eisner (1996) with back-pointers, backtracked on the scores' device; ties go to the smallest split point
  and the smallest root child.
* ``log_partition``: the inside algorithm in log space (differentiable twice); ``marginals``: a hand-written
  inside-outside (differentiable once: its backward is a forward-mode tangent pass).
* ``exact_sample``: top-down sampling from the inside chart, O(n³) per sample after one inside pass.

Every pass loops over the span width only, on one chart ``[4, n+1, n+1, batch]`` read through strided views.

Example::

    >>> scores = torch.randn(2, 6, 6)                      # 2 sentences of 5 words
    >>> tree = ProjectiveDepTree().map(scores)             # [2, 6, 6], one head per word
    >>> tree.sum((1, 2)).tolist()
    [5.0, 5.0]

Derivation (chart items, outside and tangent recursions, sampling, references): docs/structures.md#dependency.
"""

from __future__ import annotations

import itertools
from typing import Annotated

import torch

from latentstruct.ranges import AtLeast
from latentstruct.structures.base import Structure, check_num_samples

__all__ = ["ProjectiveDepTree", "tree_parts"]


class ProjectiveDepTree(Structure):
    """Projective dependency trees over ``n`` words with a root symbol at position 0.

    Scores ``[batch, n+1, n+1]``, ``scores[b, h, m]`` = score of the arc h → m. ``lengths`` ``[batch]`` (integer,
    each ≥ 1; default n for every example) is the number of words; positions past it are padding: they may hold any
    value (even ±inf or NaN), are ignored, and are 0 in every output. A real arc may score −inf (forbidden): it gets
    marginal 0 and is in no MAP tree, as long as some tree avoids every forbidden arc. ``multiroot=False`` restricts
    the vertices to trees in which the root has exactly one child.

    ``map`` is Eisner's O(n³) algorithm with back-pointers; ``log_partition`` the inside algorithm in log space
    (differentiable twice); ``marginals`` its gradient by inside-outside (differentiable once); ``exact_sample``
    top-down sampling from the inside chart (docs/structures.md#dependency).

    Args:
        multiroot: allow several children of the root (false: exactly one).
        sparsemap_max_iter: SparseMAP active-set iterations: null = solve exactly (gap <= 1e-6); n = stop after n
            and use the iterate (the seed 001 authors ran lp-sparsemap with 50).
    """

    has = frozenset({"map", "marginals", "exact_samples", "enumerate"})  # latentstruct.capabilities

    def __init__(self, multiroot: bool = True, sparsemap_max_iter: Annotated[int | None, AtLeast(1)] = None):
        self.multiroot = bool(multiroot)
        if sparsemap_max_iter is not None and sparsemap_max_iter < 1:
            raise ValueError(f"sparsemap_max_iter must be None or >= 1, got {sparsemap_max_iter}")
        self.sparsemap_max_iter = sparsemap_max_iter

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring projective tree: 0/1 tensor ``[batch, n+1, n+1]`` in the scores' dtype, no gradient."""
        z, _ = self._best_tree(scores, lengths)
        return z.to(device=scores.device, dtype=scores.dtype)

    def map_parts(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP tree as its arcs, one per word (``Structure.map_parts``, :func:`tree_parts`)."""
        z, lengths = self._best_tree(scores, lengths)
        return tree_parts(z[:, :, 1:].argmax(1), lengths)  # a word's head: the only nonzero of its column

    def _best_tree(self, scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Eisner's MAP tree, 0/1 ``[batch, n+1, n+1]`` (uint8), and the lengths."""
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            choices, root_child = _eisner_max(s, lengths, self.multiroot)
            return _backtrack(choices, root_child, lengths), lengths

    def marginals(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """E_p[z] ``[batch, n+1, n+1]`` by inside-outside; differentiable once (its backward is H g, exact)."""
        s, lengths = _prepare(scores, lengths)
        return _Marginals.apply(s, lengths, self.multiroot)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over projective trees, shape ``[batch]``; differentiable (twice)."""
        s, lengths = _prepare(scores, lengths)
        return _LogPartition.apply(s, lengths, self.multiroot)

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """z ~ p(z | s) ∝ exp <s, z> over projective trees, exactly: 0/1 ``[batch, n+1, n+1]`` in the scores' dtype
        (``[M, batch, n+1, n+1]`` for ``num_samples`` M), no gradient.

        Top-down sampling from the inside chart (docs/structures.md#dependency): one inside pass for the batch, then
        every item's split is drawn from its softmax weights, M times, and :func:`_backtrack` keeps the splits of the
        items the drawn tree uses. ``generator`` must live on the scores' device.
        """
        with torch.no_grad():
            s, lengths = _prepare(scores.detach(), lengths)
            m = 1 if num_samples is None else check_num_samples(num_samples)
            _, root_weights, steps = _log_inside(s, lengths, self.multiroot)
            choices = [(_draw(e_in, m, generator), _draw(e_c, m, generator)) for e_in, _, e_c, _ in steps]
            root_child = None
            if root_weights is not None:  # [n, B] → [1, n, 1, B]: a split dimension of size n
                root_child = _draw(root_weights.view(1, *root_weights.shape[:1], 1, -1).transpose(1, 2), m, generator)
                root_child = root_child.view(-1) + 1
            z = _backtrack(choices, root_child, lengths.repeat(m)).to(scores.dtype)
            if num_samples is None:
                return z
            return z.view(m, *scores.shape)

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


def tree_parts(heads: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Trees given by the heads of words 1..n, ``[B, n]``, → their arcs as parts (``Structure.map_parts``), shared
    by both dependency structures: word m's arc h → m is the flat part h·(n+1) + m, on where m ≤ lengths[b]."""
    size = heads.shape[-1] + 1
    words = torch.arange(1, size, device=heads.device)
    return heads * size + words, words <= lengths.view(-1, 1)


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


# Planes of the chart [4, N, N, B] (the item X[i, j], i ≤ j, of kind X sits at [X, i, j, b]). The order matters: the
# two factors of the complete step are each one strided view over two planes, which needs the plane of I→ before that
# of C← and the plane of C→ before that of I← (``_split_views``); and I→, I← (like C→, C←) are two planes apart.
_CR, _IR, _CL, _IL = range(4)


def _diagonal(chart: torch.Tensor, w: int, plane: int, planes: int = 1, step: int = 1) -> torch.Tensor:
    """The items (i, i+w) of ``planes`` planes, ``step`` apart from ``plane`` on, of a batch-last chart
    ``[P, N, N, B]`` (contiguous, storage offset 0) → a view ``[planes, N-w, 1, B]``, shaped to broadcast against the
    split views. One ``as_strided``: on small problems, making the views is most of the time."""
    _, size, _, batch = chart.shape
    return chart.as_strided(
        (planes, size - w, 1, batch),
        (step * size * size * batch, (size + 1) * batch, 0, 1),
        w * batch + plane * size * size * batch,
    )


def _split_views(chart: torch.Tensor, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The factors of every split of the width-``w`` items as strided views of a chart ``[4, N, N, B]`` (contiguous,
    storage offset 0), by kind, span start i = 0..N-w-1 and split offset t = 0..w-1, batch last:

    * ``left``, ``right`` ``[1, N-w, w, B]``: C→[i, i+t] and C←[i+t+1, i+w], the factors of I→[i, i+w] and I←[i, i+w]
      (one split for both);
    * ``first``, ``second`` ``[2, N-w, w, B]``: [0] I→[i, i+1+t] and C→[i+1+t, i+w], the factors of C→[i, i+w];
      [1] C←[i, i+t] and I←[i+t, i+w], those of C←[i, i+w].

    No two elements of one view share memory, so each can be written in place.
    """
    _, size, _, batch = chart.shape
    # Strides from the item (i, j): to (i, j+1), to (i+1, j) and to (i+1, j+1), the next span of the same width; and
    # from one plane to the next. The two kinds of ``first`` and ``second`` are one plane stride apart, less a shift.
    next_col, next_row = batch, size * batch
    next_span, plane = next_row + next_col, size * next_row
    m = size - w
    left = chart.as_strided((1, m, w, batch), (0, next_span, next_col, 1), _CR * plane)
    right = chart.as_strided((1, m, w, batch), (0, next_span, next_row, 1), _CL * plane + next_row + w * next_col)
    first = chart.as_strided(
        (2, m, w, batch), ((_CL - _IR) * plane - next_col, next_span, next_col, 1), _IR * plane + next_col
    )
    second = chart.as_strided(
        (2, m, w, batch),
        ((_IL - _CR) * plane - next_row, next_span, next_row, 1),
        _CR * plane + next_row + w * next_col,
    )
    return left, right, first, second


def _arc_diagonal(s: torch.Tensor, w: int) -> torch.Tensor:
    """The arcs of the width-``w`` spans, s[i, i+w] in [0] and s[i+w, i] in [1] (what I→[i, i+w] and I←[i, i+w]
    add to their split), as a view ``[2, N-w, 1, B]`` of contiguous scores ``[B, N, N]``."""
    batch, size, _ = s.shape
    return s.as_strided((2, size - w, 1, batch), (w * (size - 1), size + 1, 0, size * size), s.storage_offset() + w)


def _to_arcs(chart: torch.Tensor) -> torch.Tensor:
    """The incomplete planes of a chart ``[4, N, N, B]`` → arcs ``[B, N, N]``: I→[i, j] at [i, j], I←[i, j] at
    [j, i] (the planes' lower triangles and diagonals are never written, so they add 0)."""
    return (chart[_IR] + chart[_IL].transpose(0, 1)).permute(2, 0, 1)


def _root_factors(chart: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Single root: C←[1, j] and C→[j, L] for j = 1..n, each ``[n, B]`` (for j > L the second is not an item)."""
    n = chart.shape[1] - 1
    right = chart[_CR, 1:].gather(1, lengths.view(1, 1, -1).expand(n, 1, -1)).squeeze(1)
    return chart[_CL, 1, 1:], right


def _not_words(lengths: torch.Tensor, n: int) -> torch.Tensor:
    """``[n, B]``: True where j = 1..n is past the example's length."""
    return torch.arange(1, n + 1, device=lengths.device).view(-1, 1) > lengths


def _seed_root_child(chart: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor) -> None:
    """Single root: add ``value`` ``[n, B]`` (of the child j = 1..n) to C←[1, j] and to C→[j, L], in place."""
    n = chart.shape[1] - 1
    chart[_CL, 1, 1:] += value
    chart[_CR, 1:].scatter_add_(1, lengths.view(1, 1, -1).expand(n, 1, -1), value.unsqueeze(1))


# ---------------------------------------------------------------------------------------------------- max semiring


def _eisner_max(s: torch.Tensor, lengths: torch.Tensor, multiroot: bool) -> tuple[list, torch.Tensor | None]:
    """Eisner's chart in the max semiring over scores ``[B, N, N]``, in place, vectorised over the width.

    Returns the back-pointers, per width w = 1..n the split offsets t (those of :func:`_split_views`, int64) of the
    incomplete items ``[1, N-w, 1, B]`` (I→[i, i+w] and I←[i, i+w] share k = i + t) and of the complete ones
    ``[2, N-w, 1, B]`` (C→[i, i+w]: k = i + 1 + t; C←[i, i+w]: k = i + t); and, for a single root, the root's
    child ``[B]``. Ties go to the first (smallest) split, and to the first child, as ``max`` breaks them.
    """
    s = s.contiguous()  # for the views of _arc_diagonal
    batch, size, _ = s.shape
    chart = s.new_zeros(4, size, size, batch)  # C[i, i] = 0
    choices = []
    for w in range(1, size):
        left, right, first, second = _split_views(chart, w)
        split, t_in = torch.max(left + right, 2, keepdim=True)
        torch.add(split, _arc_diagonal(s, w), out=_diagonal(chart, w, _IR, 2, 2))
        value, t_c = torch.max(first + second, 2, keepdim=True)
        _diagonal(chart, w, _CR, 2, 2).copy_(value)
        choices.append((t_in, t_c))
    if multiroot:
        return choices, None
    left, right = _root_factors(chart, lengths)
    candidates = (left + s[:, 0, 1:].T + right).masked_fill(_not_words(lengths, size - 1), float("-inf"))
    return choices, candidates.max(0).indices + 1


def _backtrack(choices: list, root_child: torch.Tensor | None, lengths: torch.Tensor) -> torch.Tensor:
    """The arcs of the derivation the back-pointers pick, 0/1 ``[B, N, N]`` (uint8), found top-down for the whole
    batch at once.

    ``used[X, i, j, b]`` (``[4, N, N, B]``, as the chart) counts the uses of the item X[i, j] in example b's best
    derivation: 1 for the top item(s); then, widest spans first, every item of width w passes its count to the two
    factors of the split its back-pointer (``choices``, from :func:`_eisner_max`) names: a ``scatter_add`` along the
    split dimension of the strided views of :func:`_split_views`, indexed by the back-pointers themselves. The
    factors are narrower, except I→[i, j] in C→[i, j] (t = w - 1) and I←[i, j] in C←[i, j] (t = 0), so at each width
    the complete items go first; I→[i, j] and I←[i, j] share their split, and at most one of them is used. Unused
    items pass 0, so the walk needs neither a host copy nor a per-example loop: four scatters per width, each over
    every item of the width. In a derivation every count is 0 or 1; the arcs are the used incomplete items.

    Measured on CPU (one thread) against the host walk this replaced (back-pointers copied to the host, then
    O(B · n) Python steps): for a few examples the ~11 tensor calls per width cost ~20 µs per width (1.2 ms at
    n = 60), where the host walk took < 0.1 ms in all; at B = 32 this walk costs 1-1.3x the host walk (3 ms at
    n = 60, next to 13 ms for the max pass).
    """
    size, batch = len(choices) + 1, lengths.shape[0]
    used = torch.zeros(4, size, size, batch, dtype=torch.uint8, device=lengths.device)
    ones = used.new_ones(1, batch)
    if root_child is None:
        used[_CR, 0].scatter_(0, lengths.view(1, -1), ones)
    else:
        used[_CL, 1].scatter_(0, root_child.view(1, -1), ones)
        used[_CR].view(-1, batch).scatter_(0, (root_child * size + lengths).view(1, -1), ones)
    for w in range(size - 1, 0, -1):
        left, right, first, second = _split_views(used, w)
        t_in, t_c = choices[w - 1]
        counts = _diagonal(used, w, _CR, 2, 2)
        first.scatter_add_(2, t_c, counts)
        second.scatter_add_(2, t_c, counts)
        counts = _diagonal(used, w, _IR, 2, 2).amax(0, keepdim=True)
        left.scatter_add_(2, t_in, counts)
        right.scatter_add_(2, t_in, counts)
    arcs = _to_arcs(used)
    if root_child is not None:
        arcs[:, 0].scatter_(1, root_child.view(-1, 1), 1)
    return arcs


# ------------------------------------------------------------------------------------------- log-sum-exp semiring


def _softmax_(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-sum-exp over the splits (dim 2) and their softmax weights, overwriting ``x``: x ← e = exp(x - max);
    returns (e, r = 1 / Σ e, log Σ exp x), the last two with dim 2 of size 1; the weights are p = e · r.

    A slice that is all −inf gets the value −inf and weights 0 (e = 0, r = 1) rather than NaN.
    """
    top = x.amax(2, keepdim=True).clamp_min_(torch.finfo(x.dtype).min)
    total = x.sub_(top).exp_().sum(2, keepdim=True)
    value = total.log().add_(top)
    return x, total.clamp_min_(1.0).reciprocal_(), value


def _log_inside(s: torch.Tensor, lengths: torch.Tensor, multiroot: bool):
    """The inside pass in log space over scores ``[B, N, N]``, in place in a chart ``[4, N, N, B]``.

    Returns (log Z ``[B]``, the weights q ``[n, B]`` of the root's child (single root; else None), and
    per width w = 1..n the split weights (e, r) of :func:`_softmax_`, of the incomplete items (``[1, N-w, w, B]``,
    ``[1, N-w, 1, B]``) and of the complete ones (``[2, N-w, w, B]``, ``[2, N-w, 1, B]``)).
    """
    s = s.contiguous()  # for the views of _arc_diagonal
    batch, size, _ = s.shape
    chart = s.new_zeros(4, size, size, batch)
    steps = []
    for w in range(1, size):
        left, right, first, second = _split_views(chart, w)
        e_in, r_in, split = _softmax_(left + right)
        torch.add(split, _arc_diagonal(s, w), out=_diagonal(chart, w, _IR, 2, 2))
        e_c, r_c, value = _softmax_(first + second)
        _diagonal(chart, w, _CR, 2, 2).copy_(value)
        steps.append((e_in, r_in, e_c, r_c))
    if multiroot:
        return chart[_CR, 0].gather(0, lengths.view(1, -1)).squeeze(0), None, steps
    left, right = _root_factors(chart, lengths)
    candidates = (left + s[:, 0, 1:].T + right).masked_fill(_not_words(lengths, size - 1), float("-inf"))
    return torch.logsumexp(candidates, 0), torch.softmax(candidates, 0), steps


def _draw(weights: torch.Tensor, m: int, generator: torch.Generator | None) -> torch.Tensor:
    """For every item of split weights ``[P, K, w, B]`` (nonnegative, unnormalised: the e of :func:`_softmax_`), m
    independent split offsets drawn ∝ the weights, ``[P, K, 1, m B]`` int64 (sample j of example b at j B + b).

    Inverse CDF: the first t with cumsum_t ≥ u · total, u uniform on (0, 1]. With u > 0 a zero weight is never
    drawn, and u · total ≤ total (the last cumsum) keeps t < w. An item whose weights are all 0 gets t = 0 (such
    items belong to no tree of positive probability).
    """
    cdf = weights.cumsum(2).unsqueeze(3)  # [P, K, w, 1, B]
    shape = (*weights.shape[:2], 1, m, weights.shape[3])
    u = 1.0 - torch.rand(shape, generator=generator, dtype=weights.dtype, device=weights.device)
    t = (cdf < u * cdf[:, :, -1:]).sum(2, keepdim=True)  # [P, K, 1, m, B]
    return t.view(*weights.shape[:2], 1, m * weights.shape[3])


def _outside(adjoint: torch.Tensor, steps: list) -> torch.Tensor:
    """The outside pass in normalised form (docs/structures.md#dependency): the items' marginals ā ``[4, N, N, B]``,
    seeded at the top, handed down to every item in place, widest first, with the split weights p = e · r of
    ``steps``."""
    size = adjoint.shape[1]
    for w in range(size - 1, 0, -1):
        e_in, r_in, e_c, r_c = steps[w - 1]
        left, right, first, second = _split_views(adjoint, w)
        share = _diagonal(adjoint, w, _CR, 2, 2) * r_c  # ā_R r, then times e_k
        first.addcmul_(e_c, share)
        second.addcmul_(e_c, share)
        share = _diagonal(adjoint, w, _IR, 2, 2).sum(0, keepdim=True) * r_in
        left.addcmul_(e_in, share)
        right.addcmul_(e_in, share)
    return adjoint


class _Marginals(torch.autograd.Function):
    """μ = ∇ log Z ``[B, N, N]`` by inside-outside (forward), and H g (backward), H = ∇² log Z = ∂μ/∂s being
    symmetric, by the tangent passes of docs/structures.md#dependency. ``inside``: the result of :func:`_log_inside`
    on these scores when the caller has it (the backward of :class:`_LogPartition`).

    The forward's state (the split weights, ā) is kept on ``ctx`` for the backward; autograd records nothing in either.
    """

    @staticmethod
    def forward(ctx, s: torch.Tensor, lengths: torch.Tensor, multiroot: bool, inside=None) -> torch.Tensor:
        _, root_weights, steps = _log_inside(s, lengths, multiroot) if inside is None else inside
        adjoint = s.new_zeros(4, *s.shape[1:], s.shape[0])  # ā, the items' marginals
        if root_weights is None:
            adjoint[_CR, 0].scatter_(0, lengths.view(1, -1), 1.0)
        else:
            _seed_root_child(adjoint, root_weights, lengths)
        mu = _to_arcs(_outside(adjoint, steps)).contiguous()
        if root_weights is not None:
            mu[:, 0, 1:] = root_weights.T
        ctx.state = (lengths, adjoint, root_weights, steps)
        return mu

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if torch.is_grad_enabled():  # create_graph: the result would silently be a constant in s
            raise RuntimeError(
                "ProjectiveDepTree.marginals is differentiable once: its backward (H g) is not itself "
                "differentiable, so a third derivative of log Z (create_graph=True) is not supported"
            )
        lengths, adjoint, root_weights, steps = ctx.state
        size = adjoint.shape[1]
        grad = grad.contiguous()  # for the views of _arc_diagonal
        # Inside tangents α̇ (chart ``tangent``) and, per width, the tangents ẋ = α̇_A + α̇_B of the split terms.
        tangent = torch.zeros_like(adjoint)
        terms = []
        for w in range(1, size):
            e_in, r_in, e_c, r_c = steps[w - 1]
            left, right, first, second = _split_views(tangent, w)
            x_in = left + right
            split = (x_in * e_in).sum(2, keepdim=True).mul_(r_in)  # α̇ of the split shared by I→ and I←
            torch.add(split, _arc_diagonal(grad, w), out=_diagonal(tangent, w, _IR, 2, 2))
            x_c = first + second
            torch.mul((x_c * e_c).sum(2, keepdim=True), r_c, out=_diagonal(tangent, w, _CR, 2, 2))
            terms.append((x_in, split, x_c))
        # Outside tangents ȧ (chart ``dadjoint``), widest first. What R hands its factors is
        # p_k (ȧ_R + ā_R (ẋ_k − α̇_R)) = e_k (u + v ẋ_k) with v = r ā_R and u = r ȧ_R − v α̇_R, per item.
        dadjoint = torch.zeros_like(adjoint)
        if root_weights is not None:
            left, right = _root_factors(tangent, lengths)
            x_root = left + grad[:, 0, 1:].T + right
            droot = root_weights * (x_root - (root_weights * x_root).sum(0))
            _seed_root_child(dadjoint, droot, lengths)
        for w in range(size - 1, 0, -1):
            e_in, r_in, e_c, r_c = steps[w - 1]
            x_in, split, x_c = terms[w - 1]
            left, right, first, second = _split_views(dadjoint, w)
            v = _diagonal(adjoint, w, _CR, 2, 2) * r_c
            u = _diagonal(dadjoint, w, _CR, 2, 2) * r_c - v * _diagonal(tangent, w, _CR, 2, 2)
            share = x_c.mul_(v).add_(u).mul_(e_c)
            first.add_(share)
            second.add_(share)
            v = _diagonal(adjoint, w, _IR, 2, 2).sum(0, keepdim=True) * r_in
            u = _diagonal(dadjoint, w, _IR, 2, 2).sum(0, keepdim=True) * r_in - v * split
            share = x_in.mul_(v).add_(u).mul_(e_in)
            left.add_(share)
            right.add_(share)
        hvp = _to_arcs(dadjoint).contiguous()
        if root_weights is not None:
            hvp[:, 0, 1:] = droot.T
        return hvp, None, None, None


class _LogPartition(torch.autograd.Function):
    """log Z by the inside pass; its backward is the marginals (the outside pass on the saved inside weights), as a
    :class:`_Marginals` node, so that log Z is twice differentiable."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, lengths: torch.Tensor, multiroot: bool) -> torch.Tensor:
        inside = _log_inside(s, lengths, multiroot)
        ctx.save_for_backward(s, lengths)
        ctx.multiroot, ctx.inside = multiroot, inside
        return inside[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        s, lengths = ctx.saved_tensors
        return grad.view(-1, 1, 1) * _Marginals.apply(s, lengths, ctx.multiroot, ctx.inside), None, None


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

"""Non-projective dependency trees: Chu-Liu-Edmonds for the MAP, the Matrix-Tree theorem for the partition function.

Parts are arcs, laid out as in :mod:`latentstruct.structures.dependency`: ``scores[b, h, m]`` (``[batch, n+1, n+1]``)
is the score of the arc ``h`` → ``m``, position 0 the root. A vertex is any spanning arborescence rooted at 0
(projective or not); column 0 and the diagonal are never parts. With ``multiroot=False`` the root has exactly one
child (exact: every root arc is lowered by a constant larger than any tree's score range).

* ``map``: Chu-Liu-Edmonds by rounds over the whole batch, cycles found by pointer jumping, without building the
  contracted graphs (O(n²) per round, at most n rounds); NumPy on the CPU, torch on other devices, same trees.
* ``log_partition``: the directed Matrix-Tree theorem, one batched float64 ``slogdet`` with a per-column max-shift;
  examples whose determinant would cancel (n ε κ₁(L) > 1e-9) are recomputed by an exact log-space elimination.
* ``marginals``: the closed form through the inverse Laplacian (Koo et al., 2007), differentiable twice.
* ``exact_sample``: Wilson's cycle popping (single root: the root child from its marginal first); the chain rule
  over the marginals where the walks would be slow (more than 20 expected draws per word).

Arc scores of -inf are "forbidden unless unavoidable"; padding (past ``lengths``) is ignored and 0 in every output.

Example::

    >>> scores = torch.randn(2, 6, 6)
    >>> s = NonProjectiveDepTree(multiroot=False)
    >>> mu = s.marginals(scores)                            # [2, 6, 6], differentiable twice
    >>> torch.allclose(mu[:, 0].sum(-1), torch.ones(2))    # one root child
    True

Derivation (contraction rounds, root penalty, Laplacians, accuracy at large score gaps, Wilson's algorithm,
references): docs/structures.md#nonprojective.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated

import numpy as np
import torch

from latentstruct.ranges import AtLeast
from latentstruct.structures.base import Structure, check_num_samples
from latentstruct.structures.dependency import _is_tree, arc_parts, tree_parts

__all__ = ["NonProjectiveDepTree"]


# Examples whose slogdet has an estimated error n ε κ₁(L) above this (in log Z) are recomputed by elimination.
_MAX_ERROR = 1e-9
# Wilson's algorithm runs where its expected number of successor draws, tr (I - Q)⁻¹, is at most this many per word;
# elsewhere (peaked scores, where random walks get stuck in cycles) the chain rule over the marginals does.
_WILSON_DRAWS_PER_WORD = 20.0
# log of a weight that is exactly 0 in float64 (non-parts in the elimination); finite, so that no gradient is NaN.
_LOG_ZERO = -1e30


class NonProjectiveDepTree(Structure):
    """Dependency trees (projective or not) over ``n`` words with a root symbol at position 0.

    Scores ``[batch, n+1, n+1]``, ``scores[b, h, m]`` = score of the arc h → m. ``lengths`` ``[batch]`` (integer,
    each in 1..n; default n for every example) is the number of words; positions past it are padding: they may hold
    any value (even ±inf or NaN), are ignored, and are 0 in every output (with zero gradient). ``multiroot=False``
    restricts the vertices to trees in which the root has exactly one child.

    ``map`` is Chu-Liu-Edmonds by rounds over the whole batch (O(n²) per round, at most n rounds); ``log_partition``
    the Matrix-Tree theorem (batched ``slogdet`` in float64 with a per-column max-shift, O(n³), with an exact
    log-space elimination for the examples where the determinant would cancel); ``marginals`` the closed form through
    the inverse Laplacian (the elimination's gradient for those examples), differentiable twice; ``exact_sample``
    Wilson's algorithm (the chain rule over the marginals where it would be slow). ``sample``
    (perturb-and-MAP) and ``sparsemap`` (the generic active-set solver) come from the base class. Formulas and
    accuracy: docs/structures.md#nonprojective.

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
        """A highest-scoring tree: 0/1 tensor ``[batch, n+1, n+1]`` in the scores' dtype and device, no gradient.

        Chu-Liu-Edmonds in float64, all examples together (NumPy on the CPU, torch on other devices). Ties between
        trees are broken deterministically (the same tree on every device; docs/structures.md#nonprojective).
        """
        with torch.no_grad():
            s, lengths, part = _prepare(scores.detach(), lengths)
            heads = _chu_liu_edmonds(_incoming_scores(s, lengths, part, self.multiroot))
            words = part[:, 0].to(scores.dtype)  # [B, N]: 1 on the words (the parts of the root row)
            return torch.zeros_like(s).scatter_(1, heads.unsqueeze(1), words.unsqueeze(1))

    def map_parts(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The MAP tree as its arcs, one per word (``Structure.map_parts``,
        :func:`~latentstruct.structures.dependency.tree_parts`)."""
        with torch.no_grad():
            s, lengths, part = _prepare(scores.detach(), lengths)
            return tree_parts(_chu_liu_edmonds(_incoming_scores(s, lengths, part, self.multiroot))[:, 1:], lengths)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z> over all trees, shape ``[batch]``, in the scores' dtype; differentiable (twice)."""
        s, lengths, part = _prepare(scores, lengths)
        laplacian, offset, _, _ = _laplacian(s, part, lengths, self.multiroot)
        inexact = _inexact(laplacian)
        laplacian = _identity_where(inexact, laplacian)  # keep those out of slogdet (and its backward) entirely
        log_z = torch.linalg.slogdet(laplacian)[1] + offset
        if inexact.any():
            rows = inexact.nonzero().squeeze(1)
            exact = _log_partition_elimination(s[rows], part[rows], lengths[rows], self.multiroot)
            log_z = log_z.index_put((rows,), exact)
        return log_z.to(scores.dtype)

    def marginals(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """E_p[z] (arc marginals), shaped like ``scores``, from the inverse Laplacian; differentiable (twice).

        Equal to the gradient of ``log_partition``; 0 on column 0, the diagonal and padding.
        """
        s, lengths, part = _prepare(scores, lengths)
        laplacian, _, root, arcs = _laplacian(s, part, lengths, self.multiroot)
        inexact = _inexact(laplacian)
        x = torch.linalg.inv(_identity_where(inexact, laplacian))  # X = L⁻¹, [B, n, n]
        diag = x.diagonal(dim1=1, dim2=2)  # X[m, m]
        xt = x.transpose(1, 2)  # xt[h, m] = X[m, h]
        if self.multiroot:
            mu_root = root * diag
            mu_arcs = arcs * (diag.unsqueeze(1) - xt)
        else:
            not_first = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
            not_first[0] = 0.0  # [m ≠ 1] and [h ≠ 1] in the 1-based word numbering of docs/structures.md#nonprojective
            mu_root = root * x[:, :, 0]
            mu_arcs = arcs * ((diag * not_first).unsqueeze(1) - xt * not_first.view(-1, 1))
        mu = torch.cat([mu_root.unsqueeze(1), mu_arcs], dim=1)  # rows: heads 0..n; columns: words 1..n
        mu = torch.cat([torch.zeros_like(mu[:, :, :1]), mu], dim=2).to(scores.dtype)  # column 0: never a part
        if inexact.any():
            rows = inexact.nonzero().squeeze(1)
            with torch.enable_grad():
                sub = s[rows] if scores.requires_grad else s[rows].detach().requires_grad_(True)
                log_z = _log_partition_elimination(sub, part[rows], lengths[rows], self.multiroot)
                (exact,) = torch.autograd.grad(log_z.sum(), sub, create_graph=scores.requires_grad)
            mu = mu.index_put((rows,), exact.to(scores.dtype))
        return mu

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """z ~ p(z | s) ∝ exp <s, z> over all trees, exactly: 0/1 ``[batch, n+1, n+1]`` in the scores' dtype
        (``[M, batch, n+1, n+1]`` for ``num_samples`` M), no gradient.

        Wilson's algorithm (cycle popping) rooted at 0; for a single root, the root's child is drawn first from its
        marginal and the rest is a random arborescence of the words rooted at it. Examples whose expected number of
        draws is large (peaked scores) use the chain rule over the Matrix-Tree marginals instead
        (docs/structures.md#nonprojective, "Exact sampling"). Part scores must be finite or −inf, with some tree of
        finite score. ``generator`` must live on the scores' device; everything runs on it.
        """
        with torch.no_grad():
            s, lengths, part = _prepare(scores.detach(), lengths)
            m = 1 if num_samples is None else check_num_samples(num_samples)
            heads = _sample_heads(self, s, lengths, part, m, generator)
            words = part[:, 0].to(scores.dtype).repeat(m, 1)  # [mB, N]: 1 on the words
            z = torch.zeros(heads.shape[0], *s.shape[1:], dtype=scores.dtype, device=s.device)
            z.scatter_(1, heads.unsqueeze(1), words.unsqueeze(1))
            return z if num_samples is None else z.view(m, *scores.shape)

    def enumerate(self, n: int) -> torch.Tensor:
        """Every tree over ``n`` words, ``[V, n+1, n+1]`` (brute force over the (n+1)^n head assignments).

        V = (n+1)^(n-1) with ``multiroot=True`` (Cayley: 1, 3, 16, 125, 1296 for n = 1..5), n^(n-1) with
        ``multiroot=False`` (1, 2, 9, 64, 625): the root's single child times the trees over the words rooted at it.
        """
        trees = []
        for heads in itertools.product(range(n + 1), repeat=n):
            heads = (-1, *heads)  # heads[m] for m = 1..n; position 0 has none
            if not _is_tree(heads):
                continue
            if not self.multiroot and sum(h == 0 for h in heads[1:]) != 1:
                continue
            z = torch.zeros(n + 1, n + 1)
            z[list(heads[1:]), list(range(1, n + 1))] = 1.0
            trees.append(z)
        return torch.stack(trees)


# ------------------------------------------------------------------------------------------------------- helpers


def _prepare(scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes and lengths; return (scores with every non-part replaced by 0, lengths, part mask ``[B, N, N]``),
    the arc layout shared with ProjectiveDepTree (:func:`latentstruct.structures.dependency.arc_parts`)."""
    return arc_parts(scores, lengths, "NonProjectiveDepTree", check_lengths=True)


def _padded(lengths: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, n]`` bool: word m (column m - 1) is padding."""
    return torch.arange(1, n + 1, device=lengths.device).view(1, -1) > lengths.view(-1, 1)


def _laplacian(
    s: torch.Tensor, part: torch.Tensor, lengths: torch.Tensor, multiroot: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (Koo) Laplacian of the shifted weights, float64, from prepared scores (see ``_prepare``).

    Returns (L ``[B, n, n]`` over the words, with an identity block on padded words; the offset ``[B]`` with
    log Z = log det L + offset; the root weights r ``[B, n]``; the word-to-word weights A ``[B, n, n]``,
    ``A[b, h-1, m-1]`` for the arc h → m). r and A are exactly 0 on non-parts. Column m of the weights is shifted by
    c[m] = the largest part score into m; for a single root the root row is further shifted so that its largest
    weight is 1 (Z is linear in that row, which keeps the determinant's scale and the condition estimate sensible
    when every root arc is poor). Shifts are detached: the identity holds for any constant shift.
    """
    s = s.to(torch.float64)
    column_max = s.detach().masked_fill(~part, -torch.inf).amax(1)[:, 1:]  # [B, n]
    shift = torch.where(torch.isfinite(column_max), column_max, torch.zeros_like(column_max))
    logits = torch.where(part[:, :, 1:], s[:, :, 1:] - shift.unsqueeze(1), -torch.inf)  # [B, N, n]
    offset = shift.sum(-1)
    if not multiroot:
        root_max = logits[:, 0].detach().amax(-1)
        root_max = torch.where(torch.isfinite(root_max), root_max, torch.zeros_like(root_max))
        logits = torch.cat([logits[:, :1] - root_max.view(-1, 1, 1), logits[:, 1:]], dim=1)
        offset = offset + root_max
    weights = torch.exp(logits)
    root, arcs = weights[:, 0], weights[:, 1:]  # [B, n], [B, n, n]
    padded = _padded(lengths, arcs.shape[-1]).to(s.dtype)
    incoming = arcs.sum(1)  # Σ_h A[h, m]
    if multiroot:
        laplacian = torch.diag_embed(root + incoming + padded) - arcs
    else:
        rest = torch.diag_embed(incoming + padded) - arcs
        laplacian = torch.cat([root.unsqueeze(1), rest[:, 1:]], dim=1)  # first row (word 1, never padded) := r
    return laplacian, offset, root, arcs


def _inexact(laplacian: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the examples whose determinant has an estimated error n ε κ₁(L) above ``_MAX_ERROR``."""
    with torch.no_grad():
        lap = laplacian.detach()
        inverse, info = torch.linalg.inv_ex(lap)
        kappa = torch.linalg.matrix_norm(lap, ord=1) * torch.linalg.matrix_norm(inverse, ord=1)
        error = lap.shape[-1] * torch.finfo(lap.dtype).eps * kappa
        return (info != 0) | ~(error <= _MAX_ERROR)  # NaN counts as inexact


def _identity_where(rows: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """``matrices`` with the batch entries flagged in ``rows`` replaced by the identity (out of place)."""
    eye = torch.eye(matrices.shape[-1], dtype=matrices.dtype, device=matrices.device)
    return torch.where(rows.view(-1, 1, 1), eye, matrices)


def _log_partition_elimination(
    s: torch.Tensor, part: torch.Tensor, lengths: torch.Tensor, multiroot: bool
) -> torch.Tensor:
    """log Z ``[B]`` (float64) by Gaussian elimination of the Laplacian in log space, from prepared scores.

    Exact at any score scale, slower than slogdet (n sequential batched steps); docs/structures.md#nonprojective.
    Words are eliminated from n down to 1: the arrays are reversed so that the word to eliminate is always at index 0.
    """
    s = s.to(torch.float64)
    n = s.shape[-1] - 1
    with torch.no_grad():  # the floor for -inf part scores (a constant)
        finite = part & torch.isfinite(s)
        hi = s.masked_fill(~finite, -torch.inf).flatten(1).amax(-1)
        lo = s.masked_fill(~finite, torch.inf).flatten(1).amin(-1)
        floor = lo - n * (hi - lo) - n * math.log(n + 1) - 40.0
        floor = torch.where(torch.isfinite(floor), floor, torch.zeros_like(floor))
    s = torch.maximum(s, floor.view(-1, 1, 1)).masked_fill(~part, _LOG_ZERO)
    log_arcs = s[:, 1:, 1:].flip(1, 2)  # log A, reversed
    log_root = s[:, 0, 1:].flip(-1)
    padded = _padded(lengths, n).flip(-1)
    ones = torch.zeros_like(log_root)  # log 1: the excess of a padded word (its pivot)
    if multiroot:
        excess, first_order = torch.where(padded, ones, log_root), None
    else:  # zeroth order: no root weight; the root weights are carried to first order
        excess, first_order = ones.masked_fill(~padded, _LOG_ZERO), log_root.masked_fill(padded, _LOG_ZERO)
    total = s.new_zeros(s.shape[0])
    for m in range(n, 1, -1):  # m words left; eliminate index 0
        into = log_arcs[:, 1:, 0]  # log A[i, k], i remaining
        pivot = torch.logsumexp(torch.cat([excess[:, :1], into], dim=-1), dim=-1, keepdim=True)  # log p_k
        out = log_arcs[:, 0, 1:] - pivot  # log (A[k, j] / p_k)
        log_arcs = _logaddexp(log_arcs[:, 1:, 1:], into.unsqueeze(2) + out.unsqueeze(1))
        log_arcs = log_arcs.masked_fill(torch.eye(m - 1, dtype=torch.bool, device=s.device), _LOG_ZERO)
        excess = _logaddexp(excess[:, 1:], excess[:, :1] + out)
        if first_order is not None:
            first_order = _logaddexp(first_order[:, 1:], first_order[:, :1] + out)
        total = total + pivot.squeeze(1)
    return total + (excess[:, 0] if multiroot else first_order[:, 0])


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp a + exp b) = max(a, b) + log1p(exp(-|a - b|)).

    Unlike ``torch.logaddexp``, whose double backward is NaN once |a - b| exceeds ~710 (inf / inf), every derivative
    of this form stays finite.
    """
    return torch.maximum(a, b) + torch.log1p(torch.exp(-(a - b).abs()))


def _incoming_scores(s: torch.Tensor, lengths: torch.Tensor, part: torch.Tensor, multiroot: bool) -> torch.Tensor:
    """The arc scores ready for Chu-Liu-Edmonds, transposed: ``t[b, m, h]`` = score of h → m, float64, contiguous.

    ``s``, ``lengths``, ``part`` from :func:`_prepare` (s is 0 on non-parts). Non-parts (column 0, the diagonal,
    padding) become -inf: never chosen, since every word keeps its finite arc from the root. A part scored -inf or
    NaN becomes lo - big and +inf becomes hi + big, with lo/hi the extreme finite part scores of the example (0 if
    none) and big = (n+1)(hi - lo + 1) > n (hi - lo): a tree then uses as few -inf arcs (and as many +inf arcs) as
    possible, as in the limit. For a single root every root arc is lowered by P = (n+1)(max - min + 1), max and min
    over the parts and 0, so P > n (max - min): that makes the root's having one child dominate.
    """
    t = s.transpose(1, 2).to(torch.float64, memory_format=torch.contiguous_format)
    part = part.transpose(1, 2)
    size = (lengths + 1).to(torch.float64)
    if not bool(s.sum().isfinite()):  # some part may be ±inf or NaN (a finite sum rules them out, cheaply)
        finite = torch.isfinite(t) & part
        lo = t.masked_fill(~finite, torch.inf).amin((1, 2))
        hi = t.masked_fill(~finite, -torch.inf).amax((1, 2))
        lo, hi = torch.where(lo <= hi, lo, 0.0), torch.where(lo <= hi, hi, 0.0)  # no finite part: 0
        big = size * (hi - lo + 1.0)
        limit = torch.where(t == torch.inf, (hi + big).view(-1, 1, 1), (lo - big).view(-1, 1, 1))
        t = torch.where(finite | ~part, t, limit)
    if not multiroot:
        spread = t.amax((1, 2)) - t.amin((1, 2))  # (aminmax stalls on a busy CPU with 2+ threads)
        t[:, :, 0] -= (size * (spread + 1.0)).view(-1, 1)  # the arcs from the root (column 0 of t)
    return t.masked_fill_(~part, -torch.inf)


def _chu_liu_edmonds(t: torch.Tensor) -> torch.Tensor:
    """Heads ``[B, N]`` (long, on t's device) of a maximum spanning arborescence rooted at 0, for every example.

    ``t`` from :func:`_incoming_scores`; ``heads[b, 0]`` and the heads of padded positions are 0. The rounds
    (docs/structures.md#nonprojective) run in NumPy on the CPU (a round is ~50 operations on arrays of B N numbers,
    where NumPy's overhead per call is about half of torch's) and in torch on any other device: the same operations,
    the same tree.
    """
    if t.device.type == "cpu":
        return torch.from_numpy(_rounds(t.numpy(), _NumPyOps()))
    return _rounds(t, _TorchOps(t.device))


class _NumPyOps:
    """The array operations of :func:`_rounds`, on NumPy arrays: ``take(x, i)`` = x[i] (along the first axis), ``put``
    a copy of x with x[i] = values, ``pick(x, j)`` = x[k, j[k]] for every row k, ``mark(i, n)`` the bool [n] that is
    True at i, ``segment_max(init, seg, values)`` a copy of init with init[k] = max(init[k], max values[seg == k])
    (``segment_min`` likewise)."""

    where, minimum = staticmethod(np.where), staticmethod(np.minimum)
    arange, flatnonzero = staticmethod(np.arange), staticmethod(np.flatnonzero)

    @staticmethod
    def full(n, value):
        return np.full(n, value)

    @staticmethod
    def take(x, i):
        return x[i]

    @staticmethod
    def pick(x, j):
        return x[np.arange(len(j)), j]

    @staticmethod
    def put(x, i, values):
        x = x.copy()
        x[i] = values
        return x

    @staticmethod
    def mark(i, n):
        out = np.zeros(n, dtype=bool)
        out[i] = True
        return out

    @staticmethod
    def segment_max(init, segment, values):
        out = init.copy()
        np.maximum.at(out, segment, values)
        return out

    @staticmethod
    def segment_min(init, segment, values):
        out = init.copy()
        np.minimum.at(out, segment, values)
        return out


class _TorchOps:
    """The same operations on torch tensors of one device (every one out of place, deterministic)."""

    where, minimum = staticmethod(torch.where), staticmethod(torch.minimum)

    def __init__(self, device: torch.device):
        self.device = device

    def arange(self, n):
        return torch.arange(n, device=self.device)

    def full(self, n, value):
        return torch.full((n,), value, dtype=torch.float64, device=self.device)

    @staticmethod
    def take(x, i):
        return x.index_select(0, i)

    @staticmethod
    def pick(x, j):
        return x.gather(1, j.unsqueeze(1)).squeeze(1)

    @staticmethod
    def put(x, i, values):
        return x.index_copy(0, i, values)

    def mark(self, i, n):
        return torch.zeros(n, dtype=torch.bool, device=self.device).index_fill_(0, i, True)

    @staticmethod
    def flatnonzero(mask):
        return mask.nonzero().squeeze(1)

    @staticmethod
    def segment_max(init, segment, values):
        return init.scatter_reduce(0, segment, values, "amax")

    @staticmethod
    def segment_min(init, segment, values):
        return init.scatter_reduce(0, segment, values, "amin")


def _rounds(t, xp):
    """Chu-Liu-Edmonds on all the examples at once, by rounds (docs/structures.md#nonprojective); heads ``[B, N]``.

    ``t`` ``[B, N, N]`` float64 (NumPy or torch, as ``xp``), ``t[b, v, h]`` = score of h → v. The nodes of the
    examples still contracting are numbered g = b N + v. ``comp[g]``: the supernode containing g, named by one of its
    nodes; ``m[g]``: the best score of an arc into g from outside comp[g], from node ``head[g]``, before subtracting
    ``off[g]``: the scores of the cycle arcs dropped by the contractions that g went through.
    """
    batch, size, _ = t.shape
    n_all = batch * size
    rows = t.reshape(n_all, size)  # rows[g]: the scores of the arcs into g, by head (numbered within the example)
    ids = xp.arange(n_all)
    first = ids - ids % size  # the root of g's example
    not_root, last, unset = ids != first, first + (size - 1), xp.full(n_all, -np.inf)
    doublings = max(1, (size - 2).bit_length())  # 2^doublings ≥ N - 1 ≥ every path and cycle length
    head = rows.argmax(1) + first
    m = xp.take(rows.reshape(-1), ids * size + head - first)
    off = xp.full(n_all, 0.0)
    comp = ids
    best, enter_u, enter_v = m, head, ids  # round 0: every node is a supernode, entered by its best arc
    history = []
    while True:
        parent = xp.take(comp, enter_u)  # the greedy head of every supernode (the root's is itself)
        # Pointer jumping: after k doublings jump = parent^(2^k) and low = the smallest node among the first 2^k of
        # each orbit. The nodes on cycles are the image of parent^(2^k); a cycle is named by its smallest node.
        jump, low = xp.take(parent, parent), xp.minimum(ids, parent)
        for _ in range(doublings - 1):
            low = xp.minimum(low, xp.take(low, jump))
            jump = xp.take(jump, jump)
        on_cycle = xp.mark(jump, n_all) & not_root
        if not bool(on_cycle.any()):
            break
        if batch > 1:
            busy = on_cycle.reshape(batch, size).any(1)
            n_busy = int(busy.sum())
            if 2 * n_busy <= batch:  # drop the examples without a cycle (their entering arcs are final), renumber
                kept = xp.flatnonzero(xp.take(busy, ids // size))
                history.append((kept, enter_u, enter_v))
                new = xp.put(ids, kept, xp.arange(n_busy * size))
                comp, head, enter_u, enter_v, low = (
                    xp.take(new, xp.take(a, kept)) for a in (comp, head, enter_u, enter_v, low)
                )
                on_cycle, not_root, m, off, best, rows = (
                    xp.take(a, kept) for a in (on_cycle, not_root, m, off, best, rows)
                )
                batch, n_all = n_busy, n_busy * size
                ids = xp.arange(n_all)
                first = ids - ids % size
                last, unset = first + (size - 1), xp.full(n_all, -np.inf)
        rep = xp.where(on_cycle, low, ids)
        history.append((enter_u, enter_v, on_cycle, rep, comp, ids))
        # Contract. Entering a cycle at its supernode X drops X's cycle arc, whose score is best[X].
        off = off + xp.take(xp.where(on_cycle, best, 0.0), comp)
        comp = xp.take(rep, comp)
        # Arcs from inside a node's new supernode no longer count: rescan the rows whose best arc became one.
        stale = xp.flatnonzero((xp.take(comp, head) == comp) & not_root)
        scan = xp.take(rows, stale)
        scan = xp.where(
            xp.take(comp.reshape(batch, size), stale // size) == xp.take(comp, stale)[:, None], -np.inf, scan
        )
        best_head = scan.argmax(1)
        head = xp.put(head, stale, best_head + xp.take(first, stale))
        m = xp.put(m, stale, xp.pick(scan, best_head))
        # Each supernode's best entering arc: the best over its nodes (ties: the smallest node).
        score = m - off
        best = xp.segment_max(unset, comp, score)
        enter_v = xp.segment_min(last, comp, xp.where(score == xp.take(best, comp), ids, n_all))
        enter_u = xp.take(head, enter_v)
    # Expand, last round first: the supernodes of a cycle keep their own entering arcs, except the one containing the
    # endpoint of the arc that entered the contracted cycle: that one takes this arc.
    into_u, into_v = enter_u, enter_v
    for entry in reversed(history):
        if len(entry) == 3:  # back to the numbering before examples were dropped
            kept, enter_u, enter_v = entry
            into_u, into_v = xp.put(enter_u, kept, xp.take(kept, into_u)), xp.put(enter_v, kept, xp.take(kept, into_v))
            continue
        enter_u, enter_v, on_cycle, rep, comp, ids = entry
        got_u, got_v = xp.take(into_u, rep), xp.take(into_v, rep)
        own = on_cycle & (xp.take(comp, got_v) != ids)
        into_u, into_v = xp.where(own, enter_u, got_u), xp.where(own, enter_v, got_v)
    return (into_u % size).reshape(-1, size)


# ---------------------------------------------------------------------------------------------------- sampling


def _categorical(cdf: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``cdf`` ``[R, K]`` (cumulative nonnegative weights), drawn ∝ the weights: the first k
    with cdf[k] ≥ u · cdf[-1], u uniform on (0, 1], so a zero weight is never drawn; ``[R]`` int64."""
    u = 1.0 - torch.rand(cdf.shape[0], 1, generator=generator, dtype=cdf.dtype, device=cdf.device)
    return (cdf < u * cdf[:, -1:]).sum(-1).clamp_max(cdf.shape[-1] - 1)


def _sample_heads(
    structure: NonProjectiveDepTree,
    s: torch.Tensor,
    lengths: torch.Tensor,
    part: torch.Tensor,
    m: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Heads ``[m B, N]`` (long; 0 for the root symbol and padding) of m exact samples per example (sample j of
    example b in row j B + b), from prepared scores; the algorithms of docs/structures.md#nonprojective, "Exact
    sampling"."""
    batch, size, _ = s.shape
    rows = batch * m
    example = torch.arange(rows, device=s.device) % batch
    nodes = torch.arange(size, device=s.device)
    s = s.to(torch.float64)
    logits = s.masked_fill(~part, -torch.inf)
    column_max = logits.amax(1, keepdim=True)
    weights = torch.exp(logits - torch.where(torch.isfinite(column_max), column_max, 0.0))  # w[b, h, v], 0 off parts
    fixed = (nodes.view(1, -1) > lengths.view(-1, 1))[example]  # [rows, N]: padding; then the root(s)
    fixed[:, 0] = True
    child = None
    if not structure.multiroot:  # the root's child j ~ μ[0, ·]; the rest is a tree of the words rooted at j
        root_marginals = structure.marginals(s, lengths)[:, 0].clamp_min(0.0)
        child = _categorical(root_marginals.cumsum(-1)[example], generator)
        fixed[torch.arange(rows, device=s.device), child] = True
        weights = weights.clone()
        weights[:, 0] = 0.0  # the walk never steps to the root symbol
    cdf = weights.transpose(1, 2).cumsum(-1)  # cdf[b, v, h]: the successor (head) distribution of v, cumulative
    slow = _expected_draws(cdf[..., -1][example], weights.transpose(1, 2)[example], fixed) > (
        _WILSON_DRAWS_PER_WORD * lengths[example]
    )
    parent = _cycle_popping(cdf, example, fixed | slow.view(-1, 1), generator)
    if bool(slow.any()):
        rows_slow = slow.nonzero().squeeze(1)
        sub = s[example[rows_slow]].masked_fill(~part[example[rows_slow]], -torch.inf)
        if child is not None:  # condition on the root child already drawn
            keep = torch.zeros_like(sub[:, 0], dtype=torch.bool).scatter_(1, child[rows_slow].view(-1, 1), True)
            sub[:, 0] = sub[:, 0].masked_fill(~keep, -torch.inf)
        parent[rows_slow] = _chain_rule(structure, sub, lengths[example[rows_slow]], generator)
    return torch.where(parent == nodes, 0, parent)


def _expected_draws(total: torch.Tensor, into: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
    """The expected number of successor draws of Wilson's algorithm, tr (I - Q)⁻¹ over the nodes not ``fixed``
    (Q[v, h] = w[h, v] / total[v] the walk's transitions), ``[rows]`` (inf where the system is singular).

    (I - Q)⁻¹ = K⁻¹ diag(total) with K = diag(total) - Wᵀ over the free nodes (the fixed ones get an identity row
    and column), so the trace is Σ_v K⁻¹[v, v] total[v]."""
    free = ~fixed
    pair = free.unsqueeze(2) & free.unsqueeze(1)
    eye = torch.eye(total.shape[-1], dtype=total.dtype, device=total.device)
    k = torch.where(pair, torch.diag_embed(total) - into, 0.0) + torch.where(fixed.unsqueeze(2), eye, 0.0)
    inverse, info = torch.linalg.inv_ex(k)
    draws = (inverse.diagonal(dim1=1, dim2=2) * total * free).sum(-1)
    return torch.where((info == 0) & (draws >= 0), draws, torch.inf)  # NaN or negative (round-off): too slow


def _cycle_popping(
    cdf: torch.Tensor, example: torch.Tensor, fixed: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Wilson's algorithm in its cycle-popping form: every free node draws a successor (head) from its row of
    ``cdf``; while the successor graph has cycles, every node on a cycle draws again. Fixed nodes point to
    themselves (they end the walks). Returns the successors ``[rows, N]``."""
    rows, size = fixed.shape
    parent = torch.arange(size, device=cdf.device).repeat(rows, 1)
    flat_cdf = cdf.reshape(-1, size)
    doublings = max(1, (size - 1).bit_length())  # 2^doublings ≥ N: parent^(2^k) maps every node onto a cycle
    redraw = ~fixed
    while True:
        row, node = redraw.nonzero(as_tuple=True)
        if row.numel() == 0:
            return parent
        parent[row, node] = _categorical(flat_cdf[example[row] * size + node], generator)
        jump = parent
        for _ in range(doublings):
            jump = jump.gather(1, jump)
        redraw = torch.zeros_like(fixed).scatter_(1, jump, True) & ~fixed  # the nodes on cycles


def _chain_rule(
    structure: NonProjectiveDepTree, sub: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Heads ``[R, N]`` of one exact sample per row of scores ``sub`` ``[R, N, N]`` (−inf where forbidden): word by
    word, draw v's head from its marginal given the heads drawn so far, then forbid v's other heads."""
    size = sub.shape[-1]
    parent = torch.zeros(sub.shape[:2], dtype=torch.long, device=sub.device)
    for v in range(1, size):
        mu = structure.marginals(sub, lengths)[:, :, v].clamp_min(0.0)  # [R, N]: v's head distribution
        head = _categorical(mu.cumsum(-1), generator)
        parent[:, v] = head
        keep = torch.zeros_like(mu, dtype=torch.bool).scatter_(1, head.view(-1, 1), True)
        sub[:, :, v] = sub[:, :, v].masked_fill(~keep, -torch.inf)
    return parent

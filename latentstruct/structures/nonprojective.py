"""Non-projective dependency trees: Chu-Liu-Edmonds for the MAP, the Matrix-Tree theorem for the partition function.

Parts are arcs, laid out as in :mod:`latentstruct.structures.dependency`. ``scores[b, h, m]`` is the score of the arc
head ``h`` → modifier ``m`` over positions ``0..n``, where position 0 is the root symbol and ``1..n`` are the words. A
vertex z ∈ {0, 1}^{(n+1)×(n+1)} is a dependency tree, projective or not: every word has exactly one head and the arcs
form a tree rooted at 0 (a spanning arborescence of the complete digraph on 0..n). Column 0 (arcs into the root) and
the diagonal (self-loops) are never parts, so they are always 0 in z and in the marginals μ. With ``multiroot=False``
the root has exactly one child.

MAP — Chu-Liu-Edmonds (Chu & Liu, 1965; Edmonds, 1967; McDonald et al., 2005). Give every word its best incoming arc;
if that is a tree it is optimal. Otherwise take a cycle C, contract it into one node c and recurse on the smaller
graph with the arc scores

    s'[u, c] = max_{v ∈ C} s[u, v] - s[π(v), v]      (enter the cycle at v, dropping the cycle arc π(v) → v)
    s'[c, w] = max_{v ∈ C} s[v, w]                   (leave the cycle from its best node),

then expand: the cycle keeps all its arcs but the one into the node where the chosen entering arc lands. Each level
is O(N²) and there are fewer than N levels, so a tree costs O(N³) (N = n + 1) in the worst case and a handful of O(N²)
levels on typical scores. The recursion is inherently sequential, so ``map`` moves the scores to the CPU (NumPy,
float64), loops over the batch and moves the 0/1 result back to the scores' device and dtype.

Single root (``multiroot=False``): every root arc is lowered by the same constant P > n · (max s - min s) over the
parts. A tree with k root children loses k · P, so any single-rooted tree beats any tree with k ≥ 2 while the order
among single-rooted trees (all lose exactly P) is unchanged: the unconstrained MAP of the penalised scores is the
exact single-root MAP. (Gabow & Tarjan, 1984, and Zmigrod et al., 2020, give an O(N²) refinement of the same idea;
the constant shift is simpler and costs round-off of order P · 2⁻⁵³ only.) Arc scores of -inf (or NaN) on parts are
treated as "forbidden unless unavoidable": they are replaced by a finite score below every tree without them.

Partition function — the directed Matrix-Tree theorem (Tutte, 1948; Koo et al., 2007; McDonald & Satta, 2007; Smith
& Smith, 2007). With arc weights A[h, m] = exp s[h, m] between words and root weights r[m] = exp s[0, m], the
Laplacian over the words 1..n

    L[m, m] = r[m] + Σ_{h ≠ m} A[h, m],      L[h, m] = -A[h, m]  (h ≠ m)

has det L = Σ_z exp <s, z> over all trees rooted at 0 (``multiroot=True``). For a single root (Koo et al., 2007, §3.3)
take the Laplacian without the root, L₀ (the same with r = 0), and replace its first row by r: det L̂ = Σ_j r[j] T_j,
where T_j is the total weight of the trees over the words rooted at j, i.e. of the single-rooted trees whose root
child is j.

Every entry of column m of L (or L̂) is the weight of an arc into m, and every tree has exactly one such arc, so
scaling column m by exp(-c[m]) scales det by exp(-c[m]) and each tree's weight likewise. We use c[m] = max_h s[h, m]
(a per-column max-shift, in float64): every column's largest weight is 1, nothing overflows, no column underflows to
0, and log Z = log det L(s - c) + Σ_m c[m] exactly. For a single root the first row of L̂ (the root weights, in which
det L̂ is linear) is also scaled to a largest entry of 1. The determinants come from one batched
``torch.linalg.slogdet``. Padded words get an identity row and column (their weights are 0 and their diagonal entry
1), so the determinant factorises into the example's own Laplacian times 1.

Marginals (Koo et al., 2007, §3.2; ``marginals`` overrides the base class with this closed form): with X = L⁻¹,

    μ[0, m] = r[m] X[m, m],      μ[h, m] = A[h, m] (X[m, m] - X[m, h]),

and for a single root (X = L̂⁻¹) μ[0, m] = r[m] X[m, 1] and μ[h, m] = A[h, m] ([m ≠ 1] X[m, m] - [h ≠ 1] X[m, h])
(words numbered 1..n). These are differentiable torch expressions (twice and more).

Accuracy at large score gaps. The diagonal of L is a sum and det L a signed sum of products, so when the trees are
much worse than the column maxima det L cancels catastrophically in float64 however the scores are shifted, and
slogdet returns garbage or -inf: e.g. when two words are each other's best head and every way of breaking that cycle
costs ≳ 30 nats (typical of random scores scaled by 30 or more), or, with several roots allowed, when every root arc
is ≳ 30 nats worse than the arcs between words (L is then nearly the singular L₀). The error of a backward-stable
log-determinant is about n ε κ₁(L) (κ₁ the 1-norm condition number; measured: within a factor 5 of the actual error,
usually far above it), so every example with n ε κ₁(L) > 1e-9 — none for moderate scores, e.g. unit-variance random
ones — is recomputed exactly by elimination in log space instead (about 15 times slower than slogdet on the CPU).
Eliminating word k from L (Gaussian elimination without pivoting: the Schur complement of a Laplacian is the
Laplacian of the graph without k) gives

    A'[i, j] = A[i, j] + A[i, k] A[k, j] / p_k,    r'[j] = r[j] + r[k] A[k, j] / p_k,    p_k = r[k] + Σ_{i≠k} A[i, k]

and det L = Π_k p_k over the elimination order. The new diagonal is never formed by subtraction: every quantity is a
sum of products of nonnegative weights, so it has small relative error (the trick of Grassmann, Taksar & Heyman,
1985, for Markov chains), and in log space (logsumexp, logaddexp) nothing overflows or underflows at any score scale.
For a single root, scale r by t: det(L₀ + t diag r) = t Z₁ + O(t²). The pivots at t = 0, p⁰_k = Σ_i A[i, k], do not
involve r, and propagating r to first order (r'[j] = r[j] + r[k] A[k, j] / p⁰_k) gives Z₁ = Π_{k<last} p⁰_k · r[last]
(the last pivot p⁰ is 0: L₀ is singular). Words are eliminated from n down to 1, so that padding (pivot 1) goes first
and word 1, never padding, is last. O(n³) in n batched steps; its marginals are its autograd gradient (twice
differentiable). Part scores of -inf are floored there at lo - n (hi - lo) - n log(n+1) - 40 (lo, hi: the extreme
finite part scores), which changes Z by a relative e^-40 at most when some tree has a finite score (and gives a
finite, very low value instead of -inf when none has).

References: Y. J. Chu, T. H. Liu (1965), "On the shortest arborescence of a directed graph". J. Edmonds (1967),
"Optimum branchings". W. Tutte (1948), "The dissection of equilateral triangles into equilateral triangles".
H. Gabow, R. Tarjan (1984), "Efficient algorithms for a family of matroid intersection problems". W. Grassmann,
M. Taksar, D. Heyman (1985), "Regenerative analysis and steady state distributions for Markov chains", Operations
Research. R. McDonald, F. Pereira, K. Ribarov, J. Hajič (2005), "Non-projective dependency parsing using spanning tree
algorithms", HLT-EMNLP. T. Koo, A. Globerson, X. Carreras, M. Collins (2007), "Structured prediction models via the
matrix-tree theorem", EMNLP. R. McDonald, G. Satta (2007), "On the complexity of non-projective data-driven dependency
parsing", IWPT. D. Smith, N. Smith (2007), "Probabilistic models of nonprojective dependency trees", EMNLP.
R. Zmigrod, T. Vieira, R. Cotterell (2020), "Please mind the root: decoding arborescences for dependency parsing",
EMNLP.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from latentstruct.structures.base import Structure
from latentstruct.structures.dependency import _is_tree, arc_parts

__all__ = ["NonProjectiveDepTree"]


# Examples whose slogdet has an estimated error n ε κ₁(L) above this (in log Z) are recomputed by elimination.
_MAX_ERROR = 1e-9
# log of a weight that is exactly 0 in float64 (non-parts in the elimination); finite, so that no gradient is NaN.
_LOG_ZERO = -1e30


class NonProjectiveDepTree(Structure):
    """Dependency trees (projective or not) over ``n`` words with a root symbol at position 0.

    Scores ``[batch, n+1, n+1]``, ``scores[b, h, m]`` = score of the arc h → m. ``lengths`` ``[batch]`` (integer,
    each in 1..n; default n for every example) is the number of words; positions past it are padding: they may hold
    any value (even ±inf or NaN), are ignored, and are 0 in every output (with zero gradient). ``multiroot=False``
    restricts the vertices to trees in which the root has exactly one child.

    ``map`` is Chu-Liu-Edmonds on the CPU (O(n³) worst case per example, a loop over the batch); ``log_partition``
    the Matrix-Tree theorem (batched ``slogdet`` in float64 with a per-column max-shift, O(n³), with an exact
    log-space elimination for the examples where the determinant would cancel); ``marginals`` the closed form through
    the inverse Laplacian (the elimination's gradient for those examples), differentiable twice. ``sample``
    (perturb-and-MAP) and ``sparsemap`` (the generic active-set solver) come from the base class. Formulas and
    accuracy: see the module docstring.
    """

    def __init__(self, multiroot: bool = True, sparsemap_max_iter: int | None = None):
        self.multiroot = bool(multiroot)
        if sparsemap_max_iter is not None and sparsemap_max_iter < 1:
            raise ValueError(f"sparsemap_max_iter must be None or >= 1, got {sparsemap_max_iter}")
        self.sparsemap_max_iter = sparsemap_max_iter

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """A highest-scoring tree: 0/1 tensor ``[batch, n+1, n+1]`` in the scores' dtype and device, no gradient.

        Chu-Liu-Edmonds per example, on the CPU in float64 (NumPy), the result moved back to the scores' device.
        """
        with torch.no_grad():
            _, lengths, _ = _prepare(scores.detach(), lengths)
            s = scores.detach().to(device="cpu", dtype=torch.float64).numpy()
            z = np.zeros(s.shape, dtype=np.float64)
            for b, length in enumerate(lengths.tolist()):
                heads = _chu_liu_edmonds(_clean_block(s[b, : length + 1, : length + 1], self.multiroot))
                z[b, heads[1:], np.arange(1, length + 1)] = 1.0
        return torch.from_numpy(z).to(device=scores.device, dtype=scores.dtype)

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
            not_first[0] = 0.0  # [m ≠ 1] and [h ≠ 1] in the 1-based word numbering of the module docstring
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

    Exact at any score scale, slower than slogdet (n sequential batched steps); see the module docstring. Words are
    eliminated from n down to 1: the arrays are reversed so that the word to eliminate is always at index 0.
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


def _clean_block(s: np.ndarray, multiroot: bool) -> np.ndarray:
    """One example's scores ``[L+1, L+1]`` (a copy) ready for Chu-Liu-Edmonds.

    Non-parts (column 0, diagonal) become -inf (never chosen: every node keeps its finite arc from the root). A part
    scored -inf or NaN becomes lo - big and +inf becomes hi + big, with lo/hi the extreme finite part scores and
    big > n (hi - lo): a tree then uses as few -inf arcs (and as many +inf arcs) as possible, as in the limit. For a
    single root every root arc is lowered by P > n (max - min), which makes the root's having one child dominate.
    """
    size = s.shape[0]
    part = ~np.eye(size, dtype=bool)
    part[:, 0] = False
    values = s[part]
    finite = np.isfinite(values)
    lo, hi = (values[finite].min(), values[finite].max()) if finite.any() else (0.0, 0.0)
    big = size * (hi - lo + 1.0)
    values = np.where(np.isposinf(values), hi + big, np.where(finite, values, lo - big))
    out = np.full((size, size), -np.inf)
    out[part] = values
    if not multiroot:
        penalty = size * (values.max() - values.min() + 1.0)
        out[0, 1:] -= penalty
    return out


def _chu_liu_edmonds(s: np.ndarray) -> np.ndarray:
    """Heads ``[N]`` (``heads[0] = -1``) of a maximum spanning arborescence rooted at 0 of the dense digraph ``s``.

    ``s[h, m]`` is the arc score, -inf for no arc; every node m ≥ 1 must have a finite arc from 0 (then every node of
    every contracted graph does too: the root is never contracted). Recursive contraction (module docstring).
    """
    size = s.shape[0]
    heads = s.argmax(0)
    heads[0] = -1
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    in_cycle = np.zeros(size, dtype=bool)
    in_cycle[cycle] = True
    outside = np.flatnonzero(~in_cycle)  # the kept nodes, root first; the cycle becomes node k
    k = outside.size
    rows = np.arange(k)
    contracted = np.full((k + 1, k + 1), -np.inf)
    contracted[:k, :k] = s[np.ix_(outside, outside)]
    enter = s[np.ix_(outside, cycle)] - s[heads[cycle], cycle]  # [k, |C|]: u → v replaces the cycle arc into v
    enter_at = enter.argmax(1)
    contracted[:k, k] = enter[rows, enter_at]
    leave = s[np.ix_(cycle, outside)]  # [|C|, k]
    leave_from = leave.argmax(0)
    contracted[k, :k] = leave[leave_from, rows]
    sub = _chu_liu_edmonds(contracted)
    # Expand: kept nodes take their head in the contracted tree (the cycle node stands for its best leaving node);
    # cycle nodes keep their cycle arcs except the one where the entering arc lands.
    result = heads.copy()
    for i in range(1, k):
        result[outside[i]] = cycle[leave_from[i]] if sub[i] == k else outside[sub[i]]
    u = sub[k]
    result[cycle[enter_at[u]]] = outside[u]
    return result


def _find_cycle(heads: np.ndarray) -> np.ndarray | None:
    """The nodes of one cycle of the head function (``heads[0] = -1``), or None if following heads always reaches 0."""
    heads = heads.tolist()
    state = [0] * len(heads)  # 0: unseen, 1: on the current path, 2: known to reach the root
    state[0] = 2
    for start in range(1, len(heads)):
        path, node = [], start
        while state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node]
        if state[node] == 1:
            return np.asarray(path[path.index(node) :])
        for p in path:
            state[p] = 2
    return None

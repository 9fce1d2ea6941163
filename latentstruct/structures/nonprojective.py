"""Non-projective dependency trees: Chu-Liu-Edmonds for the MAP, the Matrix-Tree theorem for the partition function.

Parts are arcs, laid out as in :mod:`latentstruct.structures.dependency`. ``scores[b, h, m]`` is the score of the arc
head ``h`` → modifier ``m`` over positions ``0..n``, where position 0 is the root symbol and ``1..n`` are the words. A
vertex z ∈ {0, 1}^{(n+1)×(n+1)} is a dependency tree, projective or not: every word has exactly one head and the arcs
form a tree rooted at 0 (a spanning arborescence of the complete digraph on 0..n). Column 0 (arcs into the root) and
the diagonal (self-loops) are never parts, so they are always 0 in z and in the marginals μ. With ``multiroot=False``
the root has exactly one child.

MAP — Chu-Liu-Edmonds (Chu & Liu, 1965; Edmonds, 1967; McDonald et al., 2005). Give every word its best incoming arc;
if that is a tree it is optimal. Otherwise contract every cycle C of these arcs into one node (the cycles are
disjoint: all of them at once, in every example of the batch) with the arc scores

    s'[u, C] = max_{v ∈ C} s[u, v] - s[π(v), v]      (enter the cycle at v, dropping the cycle arc π(v) → v)
    s'[C, w] = max_{v ∈ C} s[v, w]                   (leave the cycle from its best node),

and start a new round on the contracted graph. When the best incoming arcs form a tree, expand the contractions, last
first: a cycle keeps all its arcs but the one into the node where the arc entering the contracted cycle lands.

The contracted graphs are never built (as in Tarjan, 1977). The nodes stay the N = n + 1 original ones, grouped into
supernodes comp[v], and the arc u → v (comp[u] ≠ comp[v]) has the current score s[u, v] - off[v], where off[v] adds
s[π(X), X] — the best entering score of v's supernode X — whenever X is contracted; arcs inside a supernode no longer
count. Both equations above then hold by construction: the best arc into a supernode is the best over its nodes v of

    m[v] - off[v],      m[v] = max_{u : comp[u] ≠ comp[v]} s[u, v],

and its head is whatever supernode contains u. A round: (1) rescan m[v] for the nodes whose best arc fell inside their
new supernode (the first round scans all, O(N²)); (2) give every supernode its best entering arc (ties: the smallest
head, then the smallest node v), its head supernode being the parent; (3) find the cycles of the parent map of every
example at once by pointer jumping (Wyllie, 1979): after ⌈log₂(N - 1)⌉ doublings of parent^(2^k), and of the smallest
node among the first 2^k of every orbit, the supernodes on cycles are the image of parent^(2^k), each cycle named by its
smallest supernode; (4) contract them: comp and off as above. A round costs O(N log N) per example plus O(N) per
rescanned node, so O(N²) at most; the number of rounds is the nesting depth of the contractions, at most n, and a batch
takes as many rounds as its slowest example (measured on batches of 32 with i.i.d. Gaussian scores: 13-21 rounds at n =
30, 24-37 at n = 60, 18-22 and 35-39 with a single root); the examples without a cycle drop out once they are half the
batch. A round is ~50 calls on arrays of B N numbers, where the per-call overhead dominates: the rounds run in NumPy on
the CPU (about half of torch's overhead per call) and in torch on the scores' device otherwise (a host sync per round).
Both do the same float64 maxima and subtractions with the same deterministic ties, so they return the same tree.

Single root (``multiroot=False``): every root arc is lowered by the same constant P = (n + 1)(max s - min s + 1), max
and min over the parts and 0, so P > n · (max s - min s). A tree with k root children loses k · P, so any
single-rooted tree beats any tree with k ≥ 2 while the order among single-rooted trees (all lose exactly P) is
unchanged: the unconstrained MAP of the penalised scores is the exact single-root MAP. (Gabow & Tarjan, 1984, and
Zmigrod et al., 2020, give an O(N²) refinement of the same idea; the constant shift is simpler and costs round-off of
order P · 2⁻⁵³ only.) Arc scores of -inf (or NaN) on parts are treated as "forbidden unless unavoidable": they are
replaced by a finite score below every tree without them (and +inf by one above every tree without them).

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

Exact sampling (``exact_sample``). Multiple roots: Wilson's algorithm (Wilson, 1996) in its cycle-popping form
(Propp & Wilson, 1998). Every word v has a walk step to a head h drawn with probability
Q[v, h] = w[h, v] / Σ_h' w[h', v]
(w = exp s, shifted per column); the root 0 (and padding) are absorbing. Every word draws a head; while the head graph
has cycles, every word on a cycle draws again (all cycles of all examples at once: found by pointer jumping, as in
the MAP). Wilson's cycle-popping theorem: the popped cycles and the final tree do not depend on the order of the pops,
and the tree has probability ∝ Π_v Q[v, head(v)] = Π_v w[head(v), v] / Π_v Σ_h w[h, v] ∝ exp <s, z>, exactly the
Gibbs distribution. Expected cost: tr (I − Q)⁻¹ head draws in all (the expected number of visits of the words by the
walks before absorption; Wilson, 1996), each O(N), and as many rounds as the deepest stack of pops.
Single root: the root's child j is drawn first from its exact marginal μ[0, j] (the Matrix-Tree marginals above;
P(child = j) = μ[0, j] for single-rooted trees); given j, the tree minus the arc 0 → j is a random arborescence of the
words rooted at j with weight Π w, sampled by the same cycle popping with j absorbing and no root arcs. No rejection.

Wilson's cost blows up when the scores are peaked (two words that prefer each other by Δ nats over every way out make
walks of ~e^Δ steps). So each example (each sample, given its root child) first computes its expected number of draws
tr (I − Q)⁻¹ = Σ_v (K⁻¹)[v, v] D_v, K = diag(D) − Wᵀ over the free words, D_v = Σ_h w[h, v] (one batched ``inv_ex``);
where it exceeds 20 draws per word, or cannot be computed, it samples by the chain rule instead: word by word, v's head
is drawn from its marginal given the heads already drawn (the Matrix-Tree marginals of the scores with v's other
heads forbidden, −inf), n marginal calls, O(n⁴). The choice depends on the scores (and the drawn root child) only,
never on the walks, so both paths are exact; it changes only the cost. Forbidden arcs get weight 0 on both paths
(in the log-space elimination they are floored as above: a relative e^-40 on Z at most).

References: Y. J. Chu, T. H. Liu (1965), "On the shortest arborescence of a directed graph". J. Edmonds (1967), "Optimum
branchings". W. Tutte (1948), "The dissection of equilateral triangles into equilateral triangles". H. Gabow, R. Tarjan
(1984), "Efficient algorithms for a family of matroid intersection problems". R. Tarjan (1977), "Finding optimum
branchings", Networks. J. Wyllie (1979), "The complexity of parallel computations", PhD thesis, Cornell. W. Grassmann,
M. Taksar, D. Heyman (1985), "Regenerative analysis and steady state distributions for Markov chains", Operations
Research. R. McDonald, F. Pereira, K. Ribarov, J. Hajič (2005), "Non-projective dependency parsing using spanning tree
algorithms", HLT-EMNLP. T. Koo, A. Globerson, X. Carreras, M. Collins (2007), "Structured prediction models via the
matrix-tree theorem", EMNLP. R. McDonald, G. Satta (2007), "On the complexity of non-projective data-driven dependency
parsing", IWPT. D. Smith, N. Smith (2007), "Probabilistic models of nonprojective dependency trees", EMNLP. R. Zmigrod,
T. Vieira, R. Cotterell (2020), "Please mind the root: decoding arborescences for dependency parsing", EMNLP.
D. B. Wilson (1996), "Generating random spanning trees more quickly than the cover time", STOC. J. G. Propp,
D. B. Wilson (1998), "How to get a perfectly random sample from a generic Markov chain and generate a random spanning
tree of a directed graph", Journal of Algorithms. R. Zmigrod, T. Vieira, R. Cotterell (2021), "Efficient sampling of
dependency structures", EMNLP (Wilson's algorithm and the chain rule for dependency trees).
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
    accuracy: see the module docstring.

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
        trees are broken deterministically (the same tree on every device; see the module docstring).
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
        draws is large (peaked scores) use the chain rule over the Matrix-Tree marginals instead (module docstring,
        "Exact sampling"). Part scores must be finite or −inf, with some tree of finite score. ``generator`` must live
        on the scores' device; everything runs on it.
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

    ``t`` from :func:`_incoming_scores`; ``heads[b, 0]`` and the heads of padded positions are 0. The rounds of the
    module docstring run in NumPy on the CPU (a round is ~50 operations on arrays of B N numbers, where NumPy's
    overhead per call is about half of torch's) and in torch on any other device: the same operations, the same tree.
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
    """Chu-Liu-Edmonds on all the examples at once, by rounds (module docstring); returns heads ``[B, N]``.

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
    example b in row j B + b), from prepared scores; the algorithms of the module docstring, "Exact sampling"."""
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

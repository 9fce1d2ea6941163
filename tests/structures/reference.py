"""The one brute-force module of the structure and estimator tests (torch-struct's layout): every expectation by
enumeration, and the shared test inputs.

* ``CASES``: every structure once, with its parts' shape and the sizes small enough to enumerate; ``STRUCTURES`` the
  same by name (the contract test and the estimator tests run over them).
* ``tol``, ``scores_maker``, ``random_scores``: the tolerances by dtype and the seeded Gaussian scores that every
  structure file uses; ``thirty_words``: the longer-inputs run every parser shares.
* ``enumerated``: ``structure.enumerate(n)`` once per structure and size (float64, checked for repeats; each
  structure's own test file checks ``enumerate`` against an independent brute force).
* ``vertex_scores``, ``gibbs``, ``brute_log_partition``, ``brute_marginals``, ``brute_max``: the expectations over an
  explicit vertex list; ``qp_over_vertices``, ``distance_to_hull``, ``total_variation``,
  ``capped_simplex_projection`` by general-purpose solvers; ``recursive_chu_liu_edmonds``: the textbook MAP of
  non-projective trees (one cycle contracted per recursion, one example at a time), for sizes where enumeration is out
  of reach.

Only ``enumerated`` calls the code under test (``enumerate``); the rest takes the vertices as an explicit list.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import nnls

from latentstruct.structures import (
    BinaryTree,
    BinaryVector,
    Categorical,
    Matching,
    NonProjectiveDepTree,
    ProjectiveDepTree,
    SequenceTagging,
    Structure,
    TopK,
)

# ------------------------------------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    name: str
    structure: Structure
    part_shape: Callable[[int], tuple[int, ...]]  # n → the parts' shape
    sizes: tuple[int, ...]  # sizes small enough to enumerate
    crop: Callable[[torch.Tensor, int], torch.Tensor] | None = None  # parts of a length-L example; None: no lengths
    min_length: int = 1
    has_marginals: bool = True  # False where they are #P-hard (Matching)
    sample_size: int = 3  # a size with few vertices, for the statistical tests


def _square(x, length, offset=0):
    return x[..., : length + offset, : length + offset]


def _prefix(x, length):
    return x[:, :length]


def arcs(n):
    """The parts' shape of a dependency tree over n words: [n+1, n+1], scores[h, m] the arc h → m, 0 the root."""
    return (n + 1, n + 1)


def spans(n):
    """The parts' shape of a bracketing of n words: [n, n], scores[i, j] the span i..j."""
    return (n, n)


CASES = [
    Case("categorical", Categorical(), lambda n: (n,), (1, 2, 5), sample_size=4),
    *(
        Case(
            f"{kind}_{tag}",
            cls(root),
            arcs,
            (1, 2, 3, 4, 5),
            crop=functools.partial(_square, offset=1),
        )
        for kind, cls in (("projective", ProjectiveDepTree), ("nonprojective", NonProjectiveDepTree))
        for root, tag in ((True, "multiroot"), (False, "single_root"))
    ),
    Case("sequence", SequenceTagging(3), lambda n: (n, 3, 3), (1, 2, 3), crop=_prefix, sample_size=2),
    Case("binary_tree", BinaryTree(), spans, (1, 2, 3, 4, 5, 6), crop=_square, sample_size=4),
    Case("matching", Matching(), spans, (1, 2, 3, 4, 5), crop=_square, has_marginals=False),
    Case("topk", TopK(2), lambda n: (n,), (2, 3, 5), crop=_prefix, min_length=2, sample_size=5),
    Case("binary_vector", BinaryVector(), lambda n: (n, 2), (1, 2, 4), crop=_prefix, sample_size=3),
]
STRUCTURES = {case.name: case.structure for case in CASES}


# ----------------------------------------------------------------------------------------- tolerances and scores


def tol(dtype: torch.dtype, double: float | tuple[float, float] = 1e-8, single: float | tuple[float, float] = 1e-5):
    """``assert_close`` tolerances for ``dtype``: ``double`` in float64, ``single`` in float32, each an (atol, rtol)
    pair or one number for both."""
    atol, rtol = _pair(single if dtype == torch.float32 else double)
    return {"atol": atol, "rtol": rtol}


def _pair(x):
    return (x, x) if isinstance(x, float) else x


def random_scores(shape: tuple[int, ...], dtype=torch.float64, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """scale · N(0, 1) scores of ``shape``, drawn in float64 from a generator seeded with ``seed``, cast to dtype."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def scores_maker(part_shape: Callable[..., tuple[int, ...]], scale: float = 2.0):
    """A structure file's ``_scores(batch, *sizes, dtype=float64, seed=0, scale=scale)``: ``random_scores`` of shape
    ``[batch, *part_shape(*sizes)]``."""

    def make(batch, *sizes, dtype=torch.float64, seed=0, scale=scale):
        return random_scores((batch, *part_shape(*sizes)), dtype, seed, scale)

    return make


def thirty_words(structure: Structure, make_scores):
    """The longer-inputs check every parser shares: 32 sentences of 1..30 words (the first of 30), float32 scores
    ``make_scores(32, 30, dtype=float32, seed=1)``; MAP, marginals and a backward of the marginals, whose gradient
    must be finite. Returns lengths, the scores (with their ``.grad``), z and μ for the structure's own checks."""
    lengths = torch.randint(1, 31, (32,), generator=torch.Generator().manual_seed(0))
    lengths[0] = 30
    scores = make_scores(32, 30, dtype=torch.float32, seed=1).requires_grad_(True)
    z = structure.map(scores, lengths)
    mu = structure.marginals(scores, lengths)
    (mu * torch.randn_like(mu)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    return lengths, scores, z, mu


# -------------------------------------------------------------------------------------------------- enumeration


def enumerated(structure: Structure, n: int) -> torch.Tensor:
    """``structure.enumerate(n)`` in float64, computed once per structure (its class and settings) and size; a vertex
    listed twice fails. Read only: the tensor is shared between tests."""
    key = (type(structure), tuple(sorted(vars(structure).items())), n)
    if key not in _ENUMERATED:
        out = structure.enumerate(n).to(torch.float64)
        assert torch.unique(out.flatten(1), dim=0).shape[0] == out.shape[0], "enumerate repeats a vertex"
        _ENUMERATED[key] = out
    return _ENUMERATED[key]


_ENUMERATED: dict = {}


# ------------------------------------------------------------------------------- dependency trees, independently


def heads(z: torch.Tensor) -> tuple[int, ...]:
    """Head tuple of a 0/1 tree [n+1, n+1] (each column 1..n has exactly one 1)."""
    assert torch.all(z.sum(0)[1:] == 1)
    return tuple(int(z[:, m].argmax()) for m in range(1, z.shape[-1]))


@functools.cache
def projective_trees(n: int, multiroot: bool) -> set[tuple[int, ...]]:
    """Projective trees as head tuples, by a brute force that shares no code with the module under test: every word
    strictly between a head and its modifier descends from the head."""
    trees = set()
    for head_list in itertools.product(range(n + 1), repeat=n):
        head = dict(zip(range(1, n + 1), head_list, strict=True))
        if any(head[m] == m for m in head):
            continue

        def ancestors(m, head=head):
            seen = []
            while m != 0 and m not in seen and len(seen) <= n:
                seen.append(m)
                m = head[m]
            return seen if m == 0 else None

        chains = {m: ancestors(m) for m in head}
        if any(c is None for c in chains.values()):
            continue  # a cycle: not a tree
        # Projective: every word strictly between h and m is a descendant of h (h is on its ancestor chain or is 0).
        if not all(
            head[m] == 0 or head[m] in chains[k] for m in head for k in range(min(head[m], m) + 1, max(head[m], m))
        ):
            continue
        if not multiroot and sum(h == 0 for h in head_list) != 1:
            continue
        trees.add(head_list)
    return trees


def reaches_every_word(head_list: tuple[int, ...]) -> bool:
    """head_list[m - 1] = head of word m; True iff a BFS from 0 along the arcs h → m visits every word."""
    n = len(head_list)
    children = {h: [m for m in range(1, n + 1) if head_list[m - 1] == h] for h in range(n + 1)}
    seen, frontier = {0}, [0]
    while frontier:
        frontier = [c for h in frontier for c in children[h] if c not in seen]
        seen.update(frontier)
    return len(seen) == n + 1


@functools.cache
def spanning_trees(n: int, multiroot: bool) -> set[tuple[int, ...]]:
    """All (non-projective) trees as head tuples, by a brute force that shares no code with the module under test: a
    head assignment is a tree iff a breadth-first search from the root along its arcs reaches every word."""
    return {
        head_list
        for head_list in itertools.product(range(n + 1), repeat=n)
        if reaches_every_word(head_list) and (multiroot or head_list.count(0) == 1)
    }


def assert_valid_tree(z: torch.Tensor, multiroot: bool, length: int | None = None, projective: bool = True):
    """z [n+1, n+1] is a (projective) tree over its first ``length`` words and 0 elsewhere; a non-projective one is
    also checked to leave column 0 and the diagonal empty and to reach every word from the root."""
    n = z.shape[-1] - 1
    length = n if length is None else length
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    assert torch.all(z[:, length + 1 :] == 0) and torch.all(z[length + 1 :, :] == 0)
    if projective:
        assert heads(z[: length + 1, : length + 1]) in projective_trees(length, multiroot)
        return
    assert torch.all(z[:, 0] == 0) and torch.all(z.diagonal() == 0)
    head_list = heads(z[: length + 1, : length + 1])
    assert reaches_every_word(head_list)
    if not multiroot:
        assert head_list.count(0) == 1


# ------------------------------------------------------------------------------------------ over listed vertices


def vertex_scores(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """<s_b, v> for every example b and vertex v: ``[B, *parts]`` × ``[V, *parts]`` → ``[B, V]`` in the scores' dtype,
    summing only the parts each vertex uses (±inf or NaN on a part it does not use is never multiplied by 0)."""
    used = vertices.to(scores).flatten(1).bool()
    return torch.where(used, scores.flatten(1).unsqueeze(1), 0.0).sum(-1)


def gibbs(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """p(v | s_b) ∝ exp <s_b, v> over the listed vertices, ``[B, V]``."""
    return torch.softmax(vertex_scores(scores, vertices), -1)


def brute_log_partition(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """log Σ_v exp <s_b, v> over the listed vertices, ``[B]``."""
    return torch.logsumexp(vertex_scores(scores, vertices), -1)


def brute_marginals(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """Σ_v p(v | s_b) v over the listed vertices, shaped like ``scores``."""
    return (gibbs(scores, vertices) @ vertices.flatten(1).to(scores)).view_as(scores)


def brute_max(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """max_v <s_b, v> over the listed vertices, ``[B]``: the score of a MAP."""
    return vertex_scores(scores, vertices).max(-1).values


def qp_over_vertices(vertices: torch.Tensor, s: torch.Tensor, weight: float = 1e4) -> torch.Tensor:
    """min_{α ∈ simplex} ½ ||Vᵀα - s||² (one example): an independent solve of the projection onto conv(V).

    Non-negative least squares (Lawson-Hanson) with the constraint 1ᵀα = 1 appended as a heavily weighted row; the
    constraint's violation is O(||s|| / weight²) and the returned point Vᵀα is renormalised by 1ᵀα.
    """
    v, s = vertices.flatten(1).double().numpy(), s.flatten().double().numpy()
    scale = weight * (1.0 + np.abs(s).max())
    a = np.concatenate([v.T, np.full((1, v.shape[0]), scale)])
    alpha = nnls(a, np.concatenate([s, [scale]]), maxiter=50 * a.shape[1])[0]
    return torch.from_numpy(alpha @ v / alpha.sum())


def distance_to_hull(vertices: torch.Tensor, mu: torch.Tensor) -> float:
    """min_{α ≥ 0} ||Vᵀα - μ|| + |1ᵀα - 1| (non-negative least squares): 0 iff μ ∈ conv(V) (one example)."""
    v, m = vertices.flatten(1).double().numpy(), mu.flatten().double().numpy()
    a = np.concatenate([v.T, np.ones((1, v.shape[0]))])
    b = np.concatenate([m, [1.0]])
    return float(nnls(a, b, maxiter=50 * a.shape[1])[1])


def total_variation(samples: torch.Tensor, vertices: torch.Tensor, p: torch.Tensor) -> float:
    """½ Σ_v |freq(v) - p(v)| for samples ``[N, *parts]`` that must all be vertices, one distribution ``p [V]``."""
    flat, verts = samples.flatten(1).to(vertices), vertices.flatten(1)
    match = (flat[:, None, :] == verts[None]).all(-1)  # [N, V]
    assert match.any(-1).all(), "a sample is not a vertex"
    freq = match.double().mean(0)
    return 0.5 * float((freq - p.double()).abs().sum())


def capped_simplex_projection(s: torch.Tensor, k: int, n_bisect: int = 200) -> torch.Tensor:
    """argmin ||μ - s||² s.t. 0 ≤ μ ≤ 1, Σμ = k: μ = clip(s - τ, 0, 1) with τ found by bisection, rows of s."""
    lo = s.min(-1, keepdim=True).values - 1.0
    hi = s.max(-1, keepdim=True).values
    for _ in range(n_bisect):
        mid = (lo + hi) / 2
        too_big = (s - mid).clamp(0, 1).sum(-1, keepdim=True) > k
        lo, hi = torch.where(too_big, mid, lo), torch.where(too_big, hi, mid)
    return (s - (lo + hi) / 2).clamp(0, 1)


def recursive_chu_liu_edmonds(scores: torch.Tensor, lengths: torch.Tensor, multiroot: bool) -> torch.Tensor:
    """Maximum dependency trees ``[B, n+1, n+1]`` (0/1, float64; scores[b, h, m] = score of h → m, position 0 the root,
    ``lengths`` words per example) by the textbook recursive Chu-Liu-Edmonds, one example at a time, in NumPy."""
    s = scores.detach().double().numpy()
    z = torch.zeros(s.shape, dtype=torch.float64)
    for b, length in enumerate(lengths.tolist()):
        heads = _cle_heads(_cle_scores(s[b, : length + 1, : length + 1], multiroot))
        z[b, heads[1:], torch.arange(1, length + 1)] = 1.0
    return z


def _cle_scores(s, multiroot):
    """One example's scores [L+1, L+1] (NumPy, float64, a copy) as the reference CLE wants them: non-parts -inf,
    ±inf / NaN parts replaced as NonProjectiveDepTree documents, and for a single root the root arcs lowered by
    (L+1)(max - min + 1) over the parts."""
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
        out[0, 1:] -= size * (values.max() - values.min() + 1.0)
    return out


def _cle_heads(s):
    """Heads [N] (heads[0] = -1) of a maximum arborescence rooted at 0 of the dense digraph s[h, m] (-inf: no arc):
    the textbook recursion (contract one cycle, recurse on the smaller graph, expand), one example at a time."""
    size = s.shape[0]
    heads = s.argmax(0)
    heads[0] = -1
    cycle = _cle_cycle(heads)
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
    sub = _cle_heads(contracted)
    result = heads.copy()
    for i in range(1, k):
        result[outside[i]] = cycle[leave_from[i]] if sub[i] == k else outside[sub[i]]
    result[cycle[enter_at[sub[k]]]] = outside[sub[k]]
    return result


def _cle_cycle(heads):
    """The nodes of one cycle of the head function (heads[0] = -1), or None if following heads always reaches 0."""
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

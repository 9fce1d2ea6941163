"""Independent reference computations shared by the structure tests: nothing here calls latentstruct.

Every function takes the vertices of a structure as an explicit list (from ``enumerate``, itself checked against a
brute force in each structure's own test file) and computes by enumeration or by a general-purpose solver, except
``recursive_chu_liu_edmonds``: the textbook MAP of non-projective trees (one cycle contracted per recursion, one example
at a time), for sizes where enumeration is out of reach.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import nnls


def vertex_scores(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """<s_b, v> for every example b and vertex v: ``[B, *parts]`` × ``[V, *parts]`` → ``[B, V]``."""
    return scores.flatten(1) @ vertices.flatten(1).to(scores).T


def gibbs(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """p(v | s_b) ∝ exp <s_b, v> over the listed vertices, ``[B, V]``."""
    return torch.softmax(vertex_scores(scores, vertices), -1)


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

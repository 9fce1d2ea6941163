"""Independent reference computations shared by the structure tests: nothing here calls latentstruct.

Every function takes the vertices of a structure as an explicit list (from ``enumerate``, itself checked against a
brute force in each structure's own test file) and computes by enumeration or by a general-purpose solver.
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

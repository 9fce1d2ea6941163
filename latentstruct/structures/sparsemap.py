r"""Generic SparseMAP: the Euclidean projection onto a marginal polytope, using only a MAP oracle.

Niculae, Martins, Blondel & Cardie (2018), "SparseMAP: Differentiable Sparse Structured Inference", ICML.

For part scores s ∈ R^d and a structure with vertices Z ⊂ {0, 1}^d, SparseMAP is (Mihaylova et al., 2020, eq. 4)

    μ*(s) = argmin_{μ ∈ M} ½ ||μ - s||²,        M = conv(Z).

Writing μ = Σ_i α_i z_i = Z_Aᵀ α over an *active set* A of vertices with α in the simplex, this module solves the
problem with the active-set method used by Niculae et al. (a.k.a. Wolfe's min-norm-point method, 1976; Nocedal &
Wright, 2006, §16.5), touching the structure only through ``structure.map``:

1. Solve the equality-constrained QP restricted to the active set,
       min_α ½ ||Z_Aᵀ α - s||²   s.t.  1ᵀα = 1,
   i.e. the KKT system   [ G  1 ] [α]   [Z_A s]
                         [ 1ᵀ 0 ] [τ] = [  1  ],     G = Z_A Z_Aᵀ (the Gram matrix of the active vertices).
   If the solution α̂ has negative weights, move from α towards α̂ by the largest feasible step and drop the vertex
   whose weight reaches zero; repeat step 1.
2. Otherwise μ = Z_Aᵀ α̂ is optimal on the face; ask MAP for the most violated vertex z = argmax_z <s - μ, z>. μ is
   optimal iff <s - μ, v - μ> ≤ 0 for every vertex v (first-order optimality of a projection), so the *gap*
   <s - μ, z - μ> (the Frank-Wolfe duality gap, an upper bound on ½||μ - s||² - ½||μ* - s||²) is the stopping
   criterion. If it exceeds the tolerance, add z to the active set and go to 1.

The backward pass uses the final active set only (the paper's sparse Jacobian: O(d · |A|) per example). On the
active face the KKT system above determines α (and μ = Z_Aᵀ α) as an affine function of s; block inversion with
M = G⁻¹ gives

    ∂μ/∂s = J = Z_Aᵀ (M - M 1 1ᵀ M / (1ᵀ M 1)) Z_A,

which is symmetric, so the vector-Jacobian product is J g. Geometrically J is the orthogonal projector onto the
direction space span{z_i - z_j : i, j ∈ A} of the active face. We never form J (d × d) nor M: J g = Z_Aᵀ β where
(β, ν) solves the same KKT matrix with right-hand side (Z_A g, 0). This form needs only the KKT matrix to be
invertible (affinely independent active vertices), not G (linearly independent ones: a vertex may be 0, as for the
hypercube); and the KKT systems are solved by LU with a fall-back to the pseudo-inverse, so that an affinely
*dependent* active set (which round-off could produce) still gives the least-squares solution: β is then not
unique, but Z_Aᵀ β — the projection of g onto the direction space — is.

Tensor conventions: ``scores`` is ``[batch, *part_shape]``; the parts are the flattened trailing dimensions
(``d = prod(part_shape)``); vertices are stored as ``[batch, A_max, d]`` with a boolean mask ``[batch, A_max]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["sparsemap", "sparsemap_active_set", "SparseMAPSolution", "SparseMAPConvergenceError"]

# The solver works in float64 whatever the input dtype (scores, vertices, weights, KKT systems, and the scores handed
# to MAP): the gap <s - μ, z - μ> is a difference of numbers of size ~ ||s||_∞ ||z||_1, so in float32 its round-off
# is already close to a tolerance of 1e-6, and the active-set logic (signs of weights, the ratio test) is where
# round-off turns into cycling. μ and the gradient are cast back to the input dtype.
_WORK_DTYPE = torch.float64
# Weights above -_NEG_TOL count as nonnegative (clamped to 0) rather than triggering a drop step.
_NEG_TOL = 1e3 * torch.finfo(_WORK_DTYPE).eps
_INITIAL_CAPACITY = 8
# KKT systems amplifying their right-hand side by more than _MAX_COND are treated as singular (see _solve_kkt); the
# pseudo-inverse then drops singular values below _PINV_RTOL · σ_max. A genuinely singular system (duplicate or
# affinely dependent 0/1 vertices, integer Gram matrix) has σ_min / σ_max ~ eps, far below both.
_MAX_COND = 1e8
_PINV_RTOL = 1e-12


class SparseMAPConvergenceError(RuntimeError):
    """The active-set solver did not reach the requested duality gap within ``max_iter`` iterations."""


class SparseMAPSolution(NamedTuple):
    """The result of the active-set solver.

    mu: ``[batch, *part_shape]``, in the dtype of the scores: Σ_i weights[b, i] vertices[b, i].
    vertices: ``[batch, A, *part_shape]`` 0/1: the active set (rows where ``weights == 0`` are unused slots).
    weights: ``[batch, A]``, float64, nonnegative, summing to 1 over each example: the convex combination α.
    gap: ``[batch]``, float64: the final duality gap max_v <s - μ, v - μ> (≤ tol · scale for each example).
    iterations: number of iterations of the loop (the slowest example's).
    """

    mu: torch.Tensor
    vertices: torch.Tensor
    weights: torch.Tensor
    gap: torch.Tensor
    iterations: int


def _kkt(gram: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The KKT matrix of min ½||Z_Aᵀα - s||² s.t. 1ᵀα = 1, restricted to the active slots.

    gram ``[n, A, A]``, mask ``[n, A]`` → (K ``[n, A+1, A+1]``, c ``[n]``). Inactive slots get an identity row so that
    their weight is decoupled and solves to 0. The constraint row is scaled by c (the mean active diagonal of G,
    i.e. the mean number of parts of a vertex) so that both blocks have comparable magnitude: the unknowns become
    (α, τ / c), the right-hand side of the constraint row c · 1.
    """
    n, a = mask.shape
    m = mask.to(gram.dtype)
    g = gram * m[:, :, None] * m[:, None, :]
    c = (torch.diagonal(g, dim1=-2, dim2=-1).sum(-1) / m.sum(-1).clamp_min(1)).clamp_min(1.0)
    kkt = gram.new_zeros(n, a + 1, a + 1)
    kkt[:, :a, :a] = g + torch.diag_embed((1 - m) * c[:, None])
    kkt[:, :a, a] = c[:, None] * m
    kkt[:, a, :a] = c[:, None] * m
    return kkt, c


def _solve_kkt(gram: torch.Tensor, mask: torch.Tensor, rhs: torch.Tensor, total: float) -> torch.Tensor:
    """Solve [G 1; 1ᵀ 0] [x; ν] = [rhs; total] on the active slots; returns x ``[n, A]`` (0 on inactive slots).

    LU first (fast); the examples whose system is singular to working precision — an affinely dependent active set,
    recognised by a failed factorisation or by an amplification ||K||·||x|| / ||b|| (a lower bound on cond(K))
    above _MAX_COND — are re-solved with the pseudo-inverse, which returns the minimum-norm least-squares solution
    instead of one blown up by a tiny pivot.
    """
    kkt, c = _kkt(gram, mask)
    m = mask.to(gram.dtype)
    b = torch.cat([rhs * m, (total * c)[:, None]], dim=-1)
    x, info = torch.linalg.solve_ex(kkt, b.unsqueeze(-1))
    x = x.squeeze(-1)
    k_norm = kkt.abs().sum(-1).amax(-1)
    bad = (info != 0) | ~torch.isfinite(x).all(-1) | (k_norm * x.abs().amax(-1) > _MAX_COND * b.abs().amax(-1))
    if bad.any():
        pinv = torch.linalg.pinv(kkt[bad], rtol=_PINV_RTOL, hermitian=True)
        x[bad] = (pinv @ b[bad].unsqueeze(-1)).squeeze(-1)
    return x[:, :-1] * m


def _take(lengths: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if lengths is None else lengths[idx.to(lengths.device)]


def _map_flat(structure, scores_flat, part_shape, lengths) -> torch.Tensor:
    """MAP on flattened scores ``[n, d]`` → vertices ``[n, d]`` in the working dtype."""
    z = structure.map(scores_flat.reshape(-1, *part_shape), lengths)
    return z.reshape(scores_flat.shape[0], -1).to(_WORK_DTYPE)


def sparsemap_active_set(
    structure,
    scores: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_iter: int | None = None,
    tol: float = 1e-6,
    strict: bool = True,
) -> SparseMAPSolution:
    r"""Solve SparseMAP, argmin_{μ ∈ conv(Z)} ½||μ - s||², by the batched active-set method; no gradient.

    Args:
        structure: any object with ``map(scores, lengths)`` = argmax_{z ∈ Z} <scores, z> (batched, 0/1, shaped like
            ``scores``).
        scores: ``[batch, *part_shape]`` finite part scores s (float32 or float64, any device).
        lengths: ``[batch]`` or None, passed to ``map`` unchanged. Parts that no vertex uses (padding) come out 0.
        max_iter: iterations of the loop; one iteration is one KKT solve followed either by a drop step or by one
            MAP call for the examples still working. Examples that converge leave the batch. Default (None):
            ``100 + 2 d`` for d parts. Each MAP step adds one vertex, and a solution can need as many as the
            polytope's dimension + 1 (Carathéodory), so a fixed cap would fail on large structures: projective trees
            with n = 60 words and N(0, 1) scores use ~160 iterations (~75 vertices in the support). Round-off
            cycling is caught separately (``stalled``), so a generous cap costs nothing when the solver converges.
        tol: stop an example when its gap <s - μ, z - μ> ≤ tol · scale, scale = max(1, ||s||_∞ ||ẑ||_1) with
            ẑ = MAP(s) (the size of a vertex's score, so the criterion is invariant to rescaling s and to the
            number of parts per vertex). ½||μ - μ*||² ≤ gap.

        strict: raise when an example has not converged; with ``strict=False`` return the last iterate instead (a
            truncated active set: a point of the polytope, the convex combination of its active vertices, whose
            remaining gap is in ``gap``).

    Returns:
        :class:`SparseMAPSolution`.

    Raises:
        SparseMAPConvergenceError: (``strict`` only) if an example has not reached the tolerance after ``max_iter``
            iterations (or stalled: MAP returned a vertex already active while the gap exceeds the tolerance).
    """
    if max_iter is None:
        max_iter = 100 + 2 * math.prod(scores.shape[1:])
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be floating point, got {scores.dtype}")
    batch, part_shape = scores.shape[0], tuple(scores.shape[1:])
    d = math.prod(part_shape)
    device = scores.device
    if batch == 0 or d == 0:
        return SparseMAPSolution(
            mu=torch.zeros_like(scores),
            vertices=scores.new_zeros(batch, 1, *part_shape),
            weights=scores.new_zeros(batch, 1, dtype=_WORK_DTYPE),
            gap=scores.new_zeros(batch, dtype=_WORK_DTYPE),
            iterations=0,
        )
    s = scores.detach().reshape(batch, d).to(_WORK_DTYPE)
    if not torch.isfinite(s).all():
        raise ValueError("sparsemap needs finite scores (padding positions included: any finite value is fine)")

    z0 = _map_flat(structure, s, part_shape, lengths)
    cap = min(_INITIAL_CAPACITY, max_iter + 1)
    vertices = s.new_zeros(batch, cap, d)
    vertices[:, 0] = z0
    mask = torch.zeros(batch, cap, dtype=torch.bool, device=device)
    mask[:, 0] = True
    alpha = s.new_zeros(batch, cap)
    alpha[:, 0] = 1.0
    # G and Z_A s are updated one row at a time as vertices enter: G is integer-valued, so it never drifts.
    gram = s.new_zeros(batch, cap, cap)
    gram[:, 0, 0] = (z0 * z0).sum(-1)
    zs = s.new_zeros(batch, cap)
    zs[:, 0] = (z0 * s).sum(-1)

    scale = (s.abs().amax(-1) * z0.abs().sum(-1)).clamp_min(1.0)
    threshold = tol * scale
    gap = torch.full((batch,), math.inf, dtype=_WORK_DTYPE, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    stalled = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)

    iterations = 0
    for _ in range(max_iter):
        work = rows[~(done | stalled)]
        if work.numel() == 0:
            break
        iterations += 1
        # Work on the slots up to the highest one in use, plus one: a new vertex goes to the first free slot, so the
        # slots past it are empty. (Drops leave holes that later vertices refill; the capacity grows by doubling.)
        span = min(int(mask.any(0).nonzero().max()) + 2, mask.shape[1])
        m_w = mask[work, :span]
        a_w = alpha[work, :span]
        a_hat = _solve_kkt(gram[work, :span, :span], m_w, zs[work, :span], 1.0)

        infeasible = ((a_hat < -_NEG_TOL) & m_w).any(-1)
        if infeasible.any():
            # Largest step t ∈ [0, 1) from α towards α̂ that keeps α ≥ 0; the blocking vertex leaves the active set.
            idx = work[infeasible]
            a, ah, m = a_w[infeasible], a_hat[infeasible], m_w[infeasible]
            blocking = m & (ah < -_NEG_TOL)
            ratio = torch.where(blocking, a / torch.where(blocking, a - ah, torch.ones_like(a)), math.inf)
            t, j = ratio.min(-1)
            t = t.clamp(0.0, 1.0)
            # t = 0 means the blocking vertex is the one just added (the only weight that can be 0). In exact
            # arithmetic its weight in α̂ is positive (α̂ moves μ along the part of z - μ orthogonal to the face,
            # by <s - μ, z - μ> > 0), so this is round-off: dropping it would re-add it forever.
            stalled[idx[t <= 0]] = True
            a_new = a + t[:, None] * (ah - a)
            a_new[torch.arange(idx.numel(), device=device), j] = 0.0
            a_new = a_new.clamp_min(0.0) * m
            mask[idx, :span] = m & (a_new > 0)
            alpha[idx, :span] = a_new / a_new.sum(-1, keepdim=True)

        feasible = ~infeasible
        if not feasible.any():
            continue
        idx = work[feasible]
        ah = a_hat[feasible].clamp_min(0.0) * m_w[feasible]
        mask[idx, :span] = m_w[feasible] & (ah > 0)
        alpha[idx, :span] = ah / ah.sum(-1, keepdim=True)

        # Most violated vertex: argmax_z <s - μ, z>; μ is optimal iff its gap is ≤ 0.
        # (While every example works, use the stored vertices as they are: gathering [batch, A, d] is not free.)
        active_vertices = vertices[:, :span] if idx.numel() == batch else vertices[idx, :span]
        mu = torch.bmm(alpha[idx, :span].unsqueeze(1), active_vertices).squeeze(1)
        resid = s[idx] - mu
        z_new = _map_flat(structure, resid, part_shape, _take(lengths, idx))
        g = (resid * (z_new - mu)).sum(-1)
        gap[idx] = g
        converged = g <= threshold[idx]
        done[idx[converged]] = True

        grow = ~converged
        if not grow.any():
            continue
        inner = torch.bmm(active_vertices, z_new.unsqueeze(-1)).squeeze(-1)  # <z_i, z_new> for every slot i < span
        idx, z_new, inner = idx[grow], z_new[grow], inner[grow]
        # In exact arithmetic a vertex with positive gap is never already active (every active vertex has gap 0 at
        # the face optimum); if round-off says otherwise the method cannot progress: report it, do not loop.
        # 0/1 vectors are equal iff <z_i, z> = |z_i|² = |z|² (integers, exact in float64).
        size = z_new.sum(-1, keepdim=True)
        same = (inner == size) & (torch.diagonal(gram[idx, :span, :span], dim1=-2, dim2=-1) == size)
        duplicate = (same & mask[idx, :span]).any(-1)
        stalled[idx[duplicate]] = True
        keep = ~duplicate
        idx, z_new, inner, size = idx[keep], z_new[keep], inner[keep], size[keep]
        if idx.numel() == 0:
            continue
        free = ~mask[idx, :span]
        if not free.any(-1).all():  # only when span is the whole capacity
            # Double the capacity of every example (cheap relative to MAP; keeps the batch a single tensor).
            extra = mask.shape[1]
            vertices = torch.cat([vertices, vertices.new_zeros(batch, extra, d)], 1)
            mask = torch.cat([mask, mask.new_zeros(batch, extra)], 1)
            alpha = torch.cat([alpha, alpha.new_zeros(batch, extra)], 1)
            zs = torch.cat([zs, zs.new_zeros(batch, extra)], 1)
            gram = torch.nn.functional.pad(gram, (0, extra, 0, extra))
            inner = torch.nn.functional.pad(inner, (0, 1))  # the next slot holds a zero vector
            free = ~mask[idx, : inner.shape[1]]
        width = inner.shape[1]  # every live slot lies below it
        slot = free.to(torch.int8).argmax(-1)  # the first free slot
        vertices[idx, slot] = z_new
        mask[idx, slot] = True
        alpha[idx, slot] = 0.0
        inner[torch.arange(idx.numel(), device=device), slot] = size.squeeze(-1)  # the slot now holds z_new
        gram[idx, slot, :width] = inner
        gram[idx, :width, slot] = inner
        zs[idx, slot] = (z_new * s[idx]).sum(-1)

    mu = torch.bmm(alpha.unsqueeze(1), vertices).squeeze(1)
    pending = ~done
    if pending.any():
        # The last iteration may have been a drop step (or a vertex was added): measure the gap of the current μ.
        idx = rows[pending]
        resid = s[idx] - mu[idx]
        z_new = _map_flat(structure, resid, part_shape, _take(lengths, idx))
        g = (resid * (z_new - mu[idx])).sum(-1)
        gap[idx] = g
        done[idx[g <= threshold[idx]]] = True
        failed = ~done
        if strict and failed.any():
            n_stalled = int((failed & stalled).sum())
            worst = (gap / scale)[failed].max().item()
            raise SparseMAPConvergenceError(
                f"SparseMAP active set did not converge for {int(failed.sum())} of {batch} examples after "
                f"{max_iter} iterations ({n_stalled} of them stalled on round-off); largest remaining gap "
                f"<s - mu, z - mu> / scale = {worst:.3e} > tol = {tol:.1e}. Raise max_iter or tol."
            )

    # Keep only the support (α > 0) and compact it to the left, so that the active set is as small as possible.
    mask = mask & (alpha > 0)
    order = torch.argsort(mask.to(torch.int8), dim=-1, descending=True, stable=True)
    width = max(int(mask.sum(-1).max()), 1)
    order = order[:, :width]
    vertices = vertices.gather(1, order[:, :, None].expand(-1, -1, d))
    alpha = alpha.gather(1, order) * mask.gather(1, order)
    vertices = vertices * (alpha > 0)[:, :, None]
    return SparseMAPSolution(
        mu=mu.to(scores.dtype).reshape(scores.shape),
        vertices=vertices.to(scores.dtype).reshape(batch, width, *part_shape),
        weights=alpha,
        gap=gap,
        iterations=iterations,
    )


def _active_face_jvp(vertices: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """J g for J = Z_Aᵀ (M - M11ᵀM / 1ᵀM1) Z_A, M = (Z_A Z_Aᵀ)⁻¹: the projection of g onto the active face's
    direction space, computed as Z_Aᵀ β with [G 1; 1ᵀ 0] [β; ν] = [Z_A g; 0] (module docstring).

    vertices ``[n, A, d]``, mask ``[n, A]``, grad ``[n, d]`` (all float64) → ``[n, d]``.
    """
    gram = torch.bmm(vertices, vertices.transpose(1, 2))
    zg = torch.bmm(vertices, grad.unsqueeze(-1)).squeeze(-1)
    beta = _solve_kkt(gram, mask, zg, 0.0)
    return torch.bmm(beta.unsqueeze(1), vertices).squeeze(1)


class _SparseMAPFunction(torch.autograd.Function):
    """μ = SparseMAP(s) with the sparse active-set backward J g (module docstring)."""

    @staticmethod
    def forward(ctx, scores, structure, lengths, max_iter, tol, strict):
        sol = sparsemap_active_set(structure, scores, lengths, max_iter=max_iter, tol=tol, strict=strict)
        ctx.save_for_backward(sol.vertices, sol.weights > 0)
        return sol.mu

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mu):
        vertices, support = ctx.saved_tensors
        batch = vertices.shape[0]
        z = vertices.reshape(batch, vertices.shape[1], -1).to(_WORK_DTYPE)
        g = grad_mu.reshape(batch, -1).to(_WORK_DTYPE)
        grad_scores = _active_face_jvp(z, support, g)
        return grad_scores.to(grad_mu.dtype).reshape(grad_mu.shape), None, None, None, None, None


def sparsemap(
    structure,
    scores: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_iter: int | None = None,
    tol: float = 1e-6,
    strict: bool = True,
) -> torch.Tensor:
    r"""SparseMAP for any structure with a MAP oracle: argmin_{μ ∈ conv(Z)} ½||μ - s||² (Niculae et al., 2018).

    Args:
        structure: provides ``map(scores, lengths)``; nothing else is called.
        scores: ``[batch, *part_shape]`` part scores s, float32 or float64, CPU or CUDA; must be finite.
        lengths: ``[batch]`` or None, forwarded to ``map``.
        max_iter, tol, strict: see :func:`sparsemap_active_set`. With ``strict=False`` the backward uses the last
            iterate's active set (the Jacobian of the projection onto that face).

    Returns:
        μ ``[batch, *part_shape]``, same dtype and device as ``scores``, differentiable w.r.t. ``scores``: the
        backward applies J = Z_Aᵀ (M - M11ᵀM / 1ᵀM1) Z_A, M = (Z_A Z_Aᵀ)⁻¹, over the final active set Z_A (a
        symmetric projector, never materialised).

    Raises:
        SparseMAPConvergenceError: (``strict`` only) the tolerance was not met within ``max_iter`` iterations.
    """
    return _SparseMAPFunction.apply(scores, structure, lengths, max_iter, tol, strict)

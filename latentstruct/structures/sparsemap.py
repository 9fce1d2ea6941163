"""Generic SparseMAP: the Euclidean projection onto a marginal polytope, using only a MAP oracle.

μ*(s) = argmin_{μ ∈ M} ½ ||μ - s||², M = conv(Z) (Niculae et al., 2018), by the active-set method (Wolfe's
min-norm point): solve the KKT system of the active face; drop a vertex while the face solution has a negative
weight; else ask MAP for the most violated vertex and stop when the Frank-Wolfe gap is ≤ 1e-6 × the scale of a
vertex's score, raising :class:`SparseMAPConvergenceError` rather than returning an inexact point.

The solver touches a structure only through ``map_parts`` and keeps each active vertex as its K part indices, so its
own work is O(A K + A²) per iteration for A active vertices (the inverse of the KKT matrix is updated, never
refactorised, and checked every ``_CHECK_EVERY`` iterations). The batch progresses together, in float64. The backward
is the projection of the gradient onto the directions of the final active face (the sparse Jacobian), through the
same KKT matrix. ``init`` warm-starts from a previous :class:`SparseMAPSolution`.

``scores`` is ``[batch, *part_shape]``; the parts are its flattened trailing dimensions (d = prod(part_shape)).

Example::

    >>> from latentstruct.structures import ProjectiveDepTree
    >>> mu = sparsemap(ProjectiveDepTree(), torch.randn(2, 6, 6))          # [2, 6, 6], a sparse mix of trees

Algorithm, updates, backward and warm start in full: docs/structures.md#sparsemap.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from latentstruct.structures.parts import dense_to_parts, parts_to_dense

__all__ = ["sparsemap", "sparsemap_active_set", "SparseMAPSolution", "SparseMAPConvergenceError"]

_WORK_DTYPE = torch.float64
# Weights above -_NEG_TOL count as nonnegative (clamped to 0) rather than triggering a drop step.
_NEG_TOL = 1e3 * torch.finfo(_WORK_DTYPE).eps
_INITIAL_CAPACITY = 8
# KKT systems amplifying their right-hand side by more than _MAX_COND are treated as singular (see _lu_or_pinv); the
# pseudo-inverse then drops singular values below _PINV_RTOL · σ_max. A genuinely singular system (duplicate or
# affinely dependent 0/1 vertices, integer Gram matrix) has σ_min / σ_max ~ eps, far below both.
_MAX_COND = 1e8
_PINV_RTOL = 1e-12
# A vertex whose squared distance to the affine hull of the active set is below _DEPENDENT · |z|² is treated as
# affinely dependent on it (for 0/1 vertices a genuinely independent one is at distance ≳ 1 / (number of parts)).
_DEPENDENT = 1e-9
# Every _CHECK_EVERY iterations the face solutions are checked against the KKT system; one whose residual exceeds
# _REFRESH_TOL (relative to the right-hand side) gets its inverse recomputed from the exact Gram matrix.
_CHECK_EVERY = 4
_REFRESH_TOL = 1e-9


class SparseMAPConvergenceError(RuntimeError):
    """The active-set solver did not reach the requested duality gap within ``max_iter`` iterations."""


class SparseMAPSolution(NamedTuple):
    """The result of the active-set solver.

    mu: ``[batch, *part_shape]``, in the dtype of the scores: Σ_i weights[b, i] z_i.
    indices: ``[batch, A, K]`` int64: the parts of each active vertex z_i as flat indices into ``part_shape``,
        padded with -1 (a vertex with fewer than K parts, and unused slots).
    weights: ``[batch, A]``, float64, nonnegative, summing to 1 over each example: the convex combination α, the
        support (α > 0) first; 0 on unused slots.
    gram: ``[batch, A, A]``, float64: <z_i, z_j> (integers) over the support, 0 elsewhere.
    gap: ``[batch]``, float64: the final duality gap max_v <s - μ, v - μ> (≤ tol · scale for each example).
    iterations: number of iterations of the loop (the slowest example's): a drop step or a MAP call each.
    map_calls: the number of batched MAP calls made by the loop, besides the first one at s (and, for examples that
        did not converge, one at the end to measure their gap).
    """

    mu: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor
    gram: torch.Tensor
    gap: torch.Tensor
    iterations: int
    map_calls: int = 0

    @property
    def vertices(self) -> torch.Tensor:
        """The active vertices as dense 0/1 tensors ``[batch, A, *part_shape]`` in μ's dtype (built on demand)."""
        batch, width, k = self.indices.shape
        flat = self.indices.reshape(batch * width, k)
        dense = parts_to_dense(flat.clamp_min(0), flat >= 0, math.prod(self.mu.shape[1:]), self.mu.dtype)
        return dense.reshape(batch, width, *self.mu.shape[1:])

    @property
    def support_size(self) -> torch.Tensor:
        """``[batch]``: the number of vertices with positive weight."""
        return (self.weights > 0).sum(-1)


# ------------------------------------------------------------------------------------------------ sparse vertices


def _oracle(structure, scores: torch.Tensor, part_shape, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """MAP on flattened scores ``[m, d]`` → its parts (indices ``[m, K]``, which entries are parts ``[m, K]``).

    ``structure.map_parts`` when the structure has it (every :class:`~latentstruct.structures.Structure`), else the
    dense ``structure.map``.
    """
    batched = scores.reshape(-1, *part_shape)
    if hasattr(structure, "map_parts"):
        return structure.map_parts(batched, lengths)
    return dense_to_parts(structure.map(batched, lengths).reshape(scores.shape[0], -1))


def _combine(idx: torch.Tensor, part: torch.Tensor, weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` += Σ_i weights[r, i] z_i in place, for vertices given by ``idx``, ``part`` ``[m, A, K]``."""
    m = idx.shape[0]
    return out.scatter_add_(1, idx.view(m, -1), (weights.unsqueeze(-1) * part).view(m, -1))


def _gather(values: torch.Tensor, idx: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """<values_r, z> over the parts of each vertex: values ``[m, d]``, idx and part ``[m, *, K]`` → ``[m, *]``."""
    m = idx.shape[0]
    return (values.gather(1, idx.reshape(m, -1)).view(idx.shape) * part).sum(-1)


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """``[m, a, b]`` × ``[m, b]`` → ``[m, a]`` as row-wise dot products (several times faster than bmm on CPU)."""
    return torch.linalg.vecdot(matrix, vector.unsqueeze(1))


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def _spread(values: torch.Tensor, rows: torch.Tensor | None, m: int) -> torch.Tensor:
    """Values for the working examples ``rows`` → ``[m, ...]`` (zero elsewhere); ``rows`` None: all of them."""
    return values if rows is None else values.new_zeros(m, *values.shape[1:]).index_put_((rows,), values)


# --------------------------------------------------------------------------------------------------- KKT systems


def _kkt(gram: torch.Tensor, mask: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """K_A = [0 c1ᵀ; c1 G] on the active slots, ``[n, A+1, A+1]`` (the constraint first).

    gram ``[n, A, A]``, mask ``[n, A]``, c ``[n]``. Inactive slots get an identity row: their unknown is decoupled
    and solves to 0.
    """
    n, a = mask.shape
    m = mask.to(gram.dtype)
    kkt = gram.new_zeros(n, a + 1, a + 1)
    kkt[:, 1:, 1:] = gram * m[:, :, None] * m[:, None, :] + torch.diag_embed(1 - m)
    kkt[:, 0, 1:] = kkt[:, 1:, 0] = c[:, None] * m
    return kkt


def _lu_or_pinv(kkt: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve K x = b (``[n, a, a]``, ``[n, a]``) by LU; the examples whose system is singular to working precision —
    an affinely dependent active set, recognised by a failed factorisation or by an amplification ||K||·||x|| / ||b||
    (a lower bound on cond(K)) above _MAX_COND — are re-solved with the pseudo-inverse, which returns the minimum-norm
    least-squares solution instead of one blown up by a tiny pivot."""
    x, info = torch.linalg.solve_ex(kkt, b.unsqueeze(-1))
    x = x.squeeze(-1)
    k_norm = kkt.abs().sum(-1).amax(-1)
    bad = (info != 0) | ~torch.isfinite(x).all(-1) | (k_norm * x.abs().amax(-1) > _MAX_COND * b.abs().amax(-1))
    if bad.any():
        x[bad] = _matvec(torch.linalg.pinv(kkt[bad], rtol=_PINV_RTOL, hermitian=True), b[bad])
    return x


def _solve_kkt(gram: torch.Tensor, mask: torch.Tensor, rhs: torch.Tensor, total: float) -> torch.Tensor:
    """Solve [G 1; 1ᵀ 0] [x; ν] = [rhs; total] on the active slots; returns x ``[n, A]`` (0 on inactive slots).

    The constraint is scaled by the mean active diagonal of G; see :func:`_lu_or_pinv`.
    """
    m = mask.to(gram.dtype)
    c = ((gram.diagonal(dim1=-2, dim2=-1) * m).sum(-1) / m.sum(-1).clamp_min(1)).clamp_min(1.0)
    x = _lu_or_pinv(_kkt(gram, mask, c), torch.cat([(total * c)[:, None], rhs * m], dim=-1))
    return x[:, 1:] * m


# ---------------------------------------------------------------------------------------------------- the solver


class _ActiveSet:
    """The active sets of the examples still working (every tensor indexed by working example first).

    rows ``[m]``: their index in the batch; s ``[m, d]``: their scores; idx, part ``[m, A, K]``: the vertices in A
    slots (part indices, and which of the K entries are parts); mask ``[m, A]``: the slots in use; alpha ``[m, A]``:
    the current (feasible) weights; gram ``[m, A, A]``: <z_i, z_j> (valid on used slots); zs ``[m, A]``: <z_i, s>
    (0 on free slots); c ``[m]``: the KKT scaling; inv ``[m, A+1, A+1]``: P = K_A⁻¹ (the constraint first, zero rows
    and columns on free slots); x ``[m, A+1]`` = P (c, zs): the face solution (ν, α̂); threshold ``[m]``: the gap at
    which an example has converged; stalled ``[m]``; newest ``[m]``: the slot of the vertex added last (-1: none);
    lengths ``[m]`` or None (for MAP).
    """

    fields = "rows s idx part mask alpha gram zs c inv x threshold stalled newest".split()

    def __init__(self, lengths, buffers=None, **values):
        self.lengths = lengths
        for name in self.fields:
            setattr(self, name, values[name])
        m = self.s.shape[0]
        if buffers is None:  # [M, d] each, M ≥ m, kept as examples retire (large tensors: no allocation per step)
            buffers = torch.zeros_like(self.s, dtype=torch.int8), torch.empty_like(self.s)
        self.buffers = buffers
        self.marker = buffers[0][:m]  # all 0 between uses
        self.at = torch.arange(m, device=self.s.device)
        self.room = 0  # a lower bound, kept on the host, on the free slots of every example

    @classmethod
    def start(cls, s, c, threshold, lengths, idx, part, weights) -> _ActiveSet:
        """Every example at the vertices ``idx``, ``part`` ``[m, A0, K]`` with ``weights`` ``[m, A0]`` (> 0 on the
        first; a zero weight skips the slot): the first vertex alone (P = [[0, c], [c, |z|²]]⁻¹), then the others added
        one at a time."""
        m, _, width = idx.shape
        cap = max(_INITIAL_CAPACITY, weights.shape[1] + 1)
        size = part[:, 0].sum(-1).to(s.dtype)
        st = cls(
            lengths,
            rows=torch.arange(m, device=s.device),
            s=s,
            idx=idx.new_zeros(m, cap, width),
            part=part.new_zeros(m, cap, width),
            mask=torch.zeros(m, cap, dtype=torch.bool, device=s.device),
            alpha=s.new_zeros(m, cap),
            gram=s.new_zeros(m, cap, cap),
            zs=s.new_zeros(m, cap),
            c=c,
            inv=s.new_zeros(m, cap + 1, cap + 1),
            x=s.new_zeros(m, cap + 1),
            threshold=threshold,
            stalled=torch.zeros(m, dtype=torch.bool, device=s.device),
            newest=torch.full((m,), -1, dtype=torch.long, device=s.device),
        )
        st.idx[:, 0], st.part[:, 0], st.mask[:, 0] = idx[:, 0], part[:, 0], True
        st.gram[:, 0, 0] = size
        st.zs[:, 0] = _gather(s, idx[:, 0], part[:, 0])
        st.inv[:, 0, 0] = -size / c**2
        st.inv[:, 0, 1] = st.inv[:, 1, 0] = 1.0 / c
        st.x[:, 0], st.x[:, 1] = (st.zs[:, 0] - size) / c, 1.0
        st.alpha[:, 0] = weights[:, 0]
        for i in range(1, weights.shape[1]):
            given = weights[:, i] > 0
            added = given & ~st.add(given, idx[:, i], part[:, i])
            st.alpha[st.at[added], st.newest[added]] = weights[added, i]  # newest: the slot it went to
        st.alpha = st.alpha / st.alpha.sum(-1, keepdim=True)
        return st

    def take(self, keep: torch.Tensor) -> _ActiveSet:
        """The examples ``keep`` (indices ``[k]``) alone."""
        values = {name: getattr(self, name).index_select(0, keep) for name in self.fields}
        return _ActiveSet(None if self.lengths is None else self.lengths[keep], self.buffers, **values)

    def grow(self) -> None:
        """More slots (a quarter more, at least 8): the state is copied, so not one slot at a time."""
        extra = max(8, self.mask.shape[1] // 4)
        pad = torch.nn.functional.pad
        self.idx, self.part = pad(self.idx, (0, 0, 0, extra)), pad(self.part, (0, 0, 0, extra))
        self.mask, self.alpha, self.zs, self.x = [pad(t, (0, extra)) for t in (self.mask, self.alpha, self.zs, self.x)]
        self.gram, self.inv = pad(self.gram, (0, extra, 0, extra)), pad(self.inv, (0, extra, 0, extra))
        self.room += extra

    def widen(self, width: int) -> None:
        """Room for vertices with up to ``width`` parts."""
        self.idx, self.part = _pad_to(self.idx, width), _pad_to(self.part, width)

    def add(self, adding: torch.Tensor, z_idx: torch.Tensor, z_part: torch.Tensor) -> torch.Tensor:
        """Put vertex z (``z_idx``, ``z_part`` ``[m, K]``) in the first free slot of the examples where ``adding``
        ``[m]``, with weight 0; update G, <z, s>, P and the face solution x (docs/structures.md#sparsemap). Returns
        ``[m]`` bool: where z was affinely dependent on the active set, and so was not added.

        The other examples get z's data written into their first free slot too, which stays free: nothing reads a
        free slot's data unmasked (its weight, x and P entries are 0).
        """
        if self.room < 1:  # possibly full: look (a host synchronisation), grow if so
            self.room = self.mask.shape[1] - int(self.mask.sum(-1).max())
            if self.room < 1:
                self.grow()
        self.room -= 1
        at = self.at
        slot = (~self.mask).to(torch.int8).argmax(-1)
        self.marker.scatter_add_(1, z_idx, z_part.to(torch.int8))
        hits = self.marker.gather(1, self.idx.view(self.idx.shape[0], -1)).view(self.idx.shape) != 0
        self.marker.scatter_(1, z_idx, 0)
        inner = (hits & self.part & self.mask.unsqueeze(-1)).sum(-1, dtype=self.s.dtype)  # <z_i, z>, active slots
        size = z_part.sum(-1, dtype=self.s.dtype)
        zs = _gather(self.s, z_idx, z_part)
        border = torch.cat([self.c[:, None], inner], dim=1)  # (c, Z_A z): the new row of K_A
        u = _matvec(self.inv, border)
        sigma = size - (border * u).sum(-1)
        dependent = adding & (sigma <= _DEPENDENT * size.clamp_min(1.0))
        ok = adding & ~dependent
        u[at, slot + 1] = -1.0
        v = u * ok.unsqueeze(-1)
        v_over_sigma = v / torch.where(ok, sigma, 1.0).unsqueeze(-1)
        self.x.addcmul_(v_over_sigma, ((border * self.x).sum(-1) - zs).unsqueeze(-1))
        self.inv.addcmul_(v.unsqueeze(2), v_over_sigma.unsqueeze(1))
        inner[at, slot] = size
        self.gram[at, slot] = inner
        self.gram[at, :, slot] = inner
        self.idx[at, slot] = z_idx
        self.part[at, slot] = z_part
        self.zs[at, slot] = zs
        self.mask[at, slot] = ok
        self.newest = torch.where(ok, slot, self.newest)
        return dependent

    def drop(self, dropping: torch.Tensor, slot: torch.Tensor) -> None:
        """Remove ``slot`` ``[m]`` from the active sets of the examples where ``dropping`` ``[m]`` (module docs)."""
        at = self.at
        j = slot + 1
        col = self.inv[at, :, j]  # a copy
        w = torch.where(dropping, 1.0 / col[at, j], 0.0)
        self.x -= col * (self.x[at, j] * w)[:, None]
        self.inv.addcmul_(col.unsqueeze(2), (col * -w[:, None]).unsqueeze(1))
        rows = dropping.nonzero().squeeze(1)
        j, slot = j[rows], slot[rows]
        self.inv[rows, j, :] = self.inv[rows, :, j] = self.x[rows, j] = 0.0
        self.alpha[rows, slot] = 0.0
        self.mask[rows, slot] = False

    def drop_step(self) -> torch.Tensor:
        """Where the face solution α̂ is infeasible, move α towards it as far as α ≥ 0 allows and drop the blocking
        vertex. Returns ``[m]`` bool: the examples that took a drop step."""
        a_hat = self.x[:, 1:]
        blocking = self.mask & (a_hat < -_NEG_TOL)
        infeasible = blocking.any(-1)
        if not infeasible.any():
            return infeasible
        ratio = torch.where(blocking, self.alpha / torch.where(blocking, self.alpha - a_hat, 1.0), math.inf)
        t, j = ratio.min(-1)
        t = t.clamp(0.0, 1.0)
        # t = 0: the blocking vertex has weight 0, either one whose face weight was clamped to 0 earlier (it just
        # leaves) or the one just added. In exact arithmetic the latter's weight in α̂ is positive (α̂ moves μ along
        # the part of z - μ orthogonal to the face, by <s - μ, z - μ> > 0), so this is round-off: dropping it would
        # re-add it forever.
        self.stalled |= infeasible & (t <= 0) & (j == self.newest)
        moved = self.alpha + t[:, None] * (a_hat - self.alpha)
        moved = moved.scatter(1, j[:, None], 0.0).clamp_min(0.0) * self.mask
        self.alpha = torch.where(infeasible[:, None], moved / moved.sum(-1, keepdim=True), self.alpha)
        self.drop(infeasible, j)
        return infeasible

    def refresh(self) -> None:
        """Recompute P and x from G where the face solution's KKT residual exceeds ``_REFRESH_TOL``."""
        rhs = torch.cat([self.c[:, None], self.zs * self.mask], dim=1)
        nu, a_hat = self.x[:, 0], self.x[:, 1:]
        face = (_matvec(self.gram, a_hat) + self.c[:, None] * nu[:, None]) * self.mask
        residual = torch.cat([(self.c * (a_hat.sum(-1) - 1.0))[:, None], face - rhs[:, 1:]], dim=1)
        bad = ~(residual.abs().amax(-1) <= _REFRESH_TOL * rhs.abs().amax(-1))
        if not bad.any():
            return
        rows = bad.nonzero().squeeze(1)
        kkt = _kkt(self.gram[rows], self.mask[rows], self.c[rows])
        inv, info = torch.linalg.inv_ex(kkt)
        singular = (info != 0) | ~torch.isfinite(inv).flatten(1).all(-1)
        if singular.any():
            inv[singular] = torch.linalg.pinv(kkt[singular], rtol=_PINV_RTOL, hermitian=True)
        used = torch.cat([torch.ones_like(self.mask[rows, :1]), self.mask[rows]], dim=1).to(inv.dtype)
        self.inv[rows] = inv = inv * used[:, :, None] * used[:, None, :]
        self.x[rows] = _matvec(inv, rhs[rows])

    def map_step(self, structure, part_shape, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """For the working examples ``rows`` (None: all), at their face solution: the most violated vertex
        z = MAP(s - μ) and the gap <s - μ, z - μ>; z joins the active set where the gap exceeds the threshold.

        Returns (the gap ``[r]``, done ``[m]``: converged) and marks the examples where z was dependent as stalled.
        """
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
        alpha = pick(self.alpha)
        resid = self.buffers[1][: alpha.shape[0]]
        if rows is None:
            resid.copy_(self.s)
        else:
            torch.index_select(self.s, 0, rows, out=resid)
        _combine(pick(self.idx), pick(self.part), -alpha, resid)
        z_idx, z_part = _oracle(structure, resid, part_shape, None if self.lengths is None else pick(self.lengths))
        # <s - μ, z - μ> = <r, z> - <r, μ> with r = s - μ, and <r, μ> = αᵀ(Z_A s) - αᵀGα (exact G: no pass over d).
        gap = _gather(resid, z_idx, z_part) - (alpha * (pick(self.zs) - _matvec(pick(self.gram), alpha))).sum(-1)
        m = self.mask.shape[0]
        done = _spread(gap <= pick(self.threshold), rows, m)
        self.widen(max(z_idx.shape[1], self.idx.shape[2]))
        width = self.idx.shape[2]
        z_idx, z_part = _spread(_pad_to(z_idx, width), rows, m), _spread(_pad_to(z_part, width), rows, m)
        adding = ~done if rows is None else _spread(torch.ones_like(rows, dtype=torch.bool), rows, m) & ~done
        if adding.any():
            self.stalled |= self.add(adding, z_idx, z_part)
        return gap, done


def sparsemap_active_set(
    structure,
    scores: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_iter: int | None = None,
    tol: float = 1e-6,
    strict: bool = True,
    init: SparseMAPSolution | None = None,
) -> SparseMAPSolution:
    r"""Solve SparseMAP, argmin_{μ ∈ conv(Z)} ½||μ - s||², by the batched active-set method; no gradient.

    Args:
        structure: any object with ``map(scores, lengths)`` = argmax_{z ∈ Z} <scores, z> (batched, 0/1, shaped like
            ``scores``), or better ``map_parts`` (:meth:`latentstruct.structures.Structure.map_parts`).
        scores: ``[batch, *part_shape]`` finite part scores s (float32 or float64, any device).
        lengths: ``[batch]`` or None, passed to MAP unchanged. Parts that no vertex uses (padding) come out 0.
        max_iter: iterations of the loop; one iteration is a drop step or one MAP call for each example still
            working. Default (None): ``100 + 2 d`` for d parts. Each MAP step adds one vertex, and a solution can
            need as many as the polytope's dimension + 1 (Carathéodory), so a fixed cap would fail on large
            structures: projective trees with n = 60 words and N(0, 1) scores use ~160 iterations (~75 vertices in
            the support), and near-zero scores (SST arc scores at initialisation) put ~250 vertices in the support.
            Round-off cycling is caught separately (``stalled``), so a generous cap costs nothing.
        tol: stop an example when its gap <s - μ, z - μ> ≤ tol · scale, scale = max(1, ||s||_∞ ||ẑ||_1) with
            ẑ = MAP(s) (the size of a vertex's score, so the criterion is invariant to rescaling s and to the
            number of parts per vertex). ½||μ - μ*||² ≤ gap.
        strict: raise when an example has not converged; with ``strict=False`` return the last iterate instead (a
            truncated active set: a point of the polytope, the convex combination of its active vertices, whose
            remaining gap is in ``gap``).
        init: a warm start (docs/structures.md#sparsemap): a solution of this solver for scores of the same shape
            and lengths.

    Returns:
        :class:`SparseMAPSolution`.

    Raises:
        SparseMAPConvergenceError: (``strict`` only) if an example has not reached the tolerance after ``max_iter``
            iterations (or stalled: MAP returned a vertex affinely dependent on the active set — e.g. one already
            active — while the gap exceeds the tolerance, which only round-off can cause).
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
            indices=torch.full((batch, 1, 1), -1, dtype=torch.long, device=device),
            weights=scores.new_zeros(batch, 1, dtype=_WORK_DTYPE),
            gram=scores.new_zeros(batch, 1, 1, dtype=_WORK_DTYPE),
            gap=scores.new_zeros(batch, dtype=_WORK_DTYPE),
            iterations=0,
        )
    s = scores.detach().reshape(batch, d).to(_WORK_DTYPE)
    if not torch.isfinite(s).all():
        raise ValueError("sparsemap needs finite scores (padding positions included: any finite value is fine)")
    if lengths is not None:
        lengths = torch.as_tensor(lengths, device=device)

    z_idx, z_part = _oracle(structure, s, part_shape, lengths)
    size = z_part.sum(-1).to(_WORK_DTYPE)
    scale = (s.abs().amax(-1) * size).clamp_min(1.0)
    if init is None:
        idx, part, weights = z_idx[:, None], z_part[:, None], s.new_ones(batch, 1)
    else:
        idx, part, weights = _check_init(init, batch, d)
    st = _ActiveSet.start(s, size.clamp_min(1.0), tol * scale, lengths, idx, part, weights)

    retired: list[tuple[torch.Tensor, ...]] = []
    gap = torch.full((batch,), math.inf, dtype=_WORK_DTYPE, device=device)
    converged = torch.zeros(batch, dtype=torch.bool, device=device)
    iterations = map_calls = 0
    while st.rows.numel() and iterations < max_iter:
        iterations += 1
        if iterations % _CHECK_EVERY == 0:
            st.refresh()
        ready = ~st.drop_step() & ~st.stalled
        face = st.x[:, 1:].clamp_min(0.0) * st.mask
        st.alpha = torch.where(ready[:, None], face / face.sum(-1, keepdim=True), st.alpha)
        leaving = st.stalled
        rows = None if bool(ready.all()) else ready.nonzero().squeeze(1)
        if rows is None or rows.numel():
            map_calls += 1
            g, done = st.map_step(structure, part_shape, rows)
            gap[st.rows if rows is None else st.rows[rows]] = g
            converged[st.rows] = done  # the working examples had not converged
            leaving = done | st.stalled
        if leaving.any():
            gone = leaving.nonzero().squeeze(1)
            retired.append((st.rows[gone], st.idx[gone], st.part[gone], (st.alpha * st.mask)[gone], st.gram[gone]))
            st = st.take((~leaving).nonzero().squeeze(1))
    if st.rows.numel():
        retired.append((st.rows, st.idx, st.part, st.alpha * st.mask, st.gram))

    # The batch, from the retired examples (they left in any order, each with its own numbers of slots and parts).
    slots = max(r[1].shape[1] for r in retired)
    width = max(r[1].shape[2] for r in retired)
    idx = torch.zeros(batch, slots, width, dtype=torch.long, device=device)
    part = torch.zeros(batch, slots, width, dtype=torch.bool, device=device)
    alpha = s.new_zeros(batch, slots)
    gram = s.new_zeros(batch, slots, slots)
    for rows, i, p, a, g in retired:
        idx[rows, : i.shape[1], : i.shape[2]] = i
        part[rows, : p.shape[1], : p.shape[2]] = p
        alpha[rows, : a.shape[1]] = a
        gram[rows, : g.shape[1], : g.shape[2]] = g
    mu = _combine(idx, part, alpha, s.new_zeros(batch, d))

    if not converged.all():
        # Stalled examples, and those stopped by max_iter (their last iteration may have been a drop step or added a
        # vertex): measure the gap of the returned μ.
        rows = (~converged).nonzero().squeeze(1)
        resid = s[rows] - mu[rows]
        z_idx, z_part = _oracle(structure, resid, part_shape, None if lengths is None else lengths[rows])
        gap[rows] = _gather(resid, z_idx, z_part) - torch.linalg.vecdot(resid, mu[rows])
        failed = ~(gap <= tol * scale)
        if strict and failed.any():
            worst = (gap / scale)[failed].max().item()
            raise SparseMAPConvergenceError(
                f"SparseMAP active set did not converge for {int(failed.sum())} of {batch} examples after "
                f"{iterations} iterations (max_iter = {max_iter}); largest remaining gap <s - mu, z - mu> / scale "
                f"= {worst:.3e} > tol = {tol:.1e} (an example stalls when round-off makes MAP return a vertex "
                "affinely dependent on its active set). Raise max_iter or tol."
            )

    # Keep only the support (α > 0), compacted to the left.
    support = alpha > 0
    order = torch.argsort(support.to(torch.int8), dim=-1, descending=True, stable=True)
    keep = max(int(support.sum(-1).max()), 1)
    order = order[:, :keep]
    on = support.gather(1, order)
    pick = order[:, :, None].expand(-1, -1, width)
    gram = gram.gather(1, order[:, :, None].expand(-1, -1, slots)).gather(2, order[:, None, :].expand(-1, keep, -1))
    return SparseMAPSolution(
        mu=mu.to(scores.dtype).reshape(scores.shape),
        indices=torch.where(part.gather(1, pick) & on[:, :, None], idx.gather(1, pick), -1),
        weights=alpha.gather(1, order) * on,
        gram=gram * on[:, :, None] * on[:, None, :],
        gap=gap,
        iterations=iterations,
        map_calls=map_calls,
    )


def _check_init(init: SparseMAPSolution, batch: int, d: int):
    """A warm start's support as (idx, part ``[batch, A0, K]``, weights ``[batch, A0]``), checked."""
    indices, weights = init.indices, init.weights.to(_WORK_DTYPE)
    if indices.shape[0] != batch or int(indices.max()) >= d or weights.shape != indices.shape[:2]:
        raise ValueError(
            f"init must be a SparseMAPSolution for scores with the same batch ({batch}) and number of parts ({d})"
        )
    if not (weights[:, 0] > 0).all():
        raise ValueError("init has an example without support")
    return indices.clamp_min(0), indices >= 0, weights


def _active_face_jvp(indices: torch.Tensor, gram: torch.Tensor, support: torch.Tensor, grad: torch.Tensor):
    """J g for J = Z_Aᵀ (M - M11ᵀM / 1ᵀM1) Z_A, M = (Z_A Z_Aᵀ)⁻¹: the projection of g onto the active face's
    direction space, computed as Z_Aᵀ β with [G 1; 1ᵀ 0] [β; ν] = [Z_A g; 0] (docs/structures.md#sparsemap).

    indices ``[n, A, K]`` (-1: no part), gram ``[n, A, A]``, support ``[n, A]``, grad ``[n, d]`` (float64) → ``[n, d]``.
    """
    part = indices >= 0
    idx = indices.clamp_min(0)
    beta = _solve_kkt(gram, support, _gather(grad, idx, part), 0.0)
    return _combine(idx, part, beta, torch.zeros_like(grad))


class _SparseMAPFunction(torch.autograd.Function):
    """μ = SparseMAP(s) with the sparse active-set backward J g (docs/structures.md#sparsemap)."""

    @staticmethod
    def forward(ctx, scores, structure, lengths, max_iter, tol, strict, init):
        sol = sparsemap_active_set(structure, scores, lengths, max_iter=max_iter, tol=tol, strict=strict, init=init)
        ctx.save_for_backward(sol.indices, sol.gram, sol.weights > 0)
        return sol.mu

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mu):
        indices, gram, support = ctx.saved_tensors
        g = grad_mu.reshape(grad_mu.shape[0], -1).to(_WORK_DTYPE)
        grad_scores = _active_face_jvp(indices, gram, support, g)
        return grad_scores.to(grad_mu.dtype).reshape(grad_mu.shape), None, None, None, None, None, None


def sparsemap(
    structure,
    scores: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    max_iter: int | None = None,
    tol: float = 1e-6,
    strict: bool = True,
    init: SparseMAPSolution | None = None,
) -> torch.Tensor:
    r"""SparseMAP for any structure with a MAP oracle: argmin_{μ ∈ conv(Z)} ½||μ - s||² (Niculae et al., 2018).

    Args:
        structure: provides ``map_parts`` or ``map``; nothing else is called.
        scores: ``[batch, *part_shape]`` part scores s, float32 or float64, CPU or CUDA; must be finite.
        lengths: ``[batch]`` or None, forwarded to MAP.
        max_iter, tol, strict, init: see :func:`sparsemap_active_set`. With ``strict=False`` the backward uses the
            last iterate's active set (the Jacobian of the projection onto that face).

    Returns:
        μ ``[batch, *part_shape]``, same dtype and device as ``scores``, differentiable w.r.t. ``scores``: the
        backward applies J = Z_Aᵀ (M - M11ᵀM / 1ᵀM1) Z_A, M = (Z_A Z_Aᵀ)⁻¹, over the final active set Z_A (a
        symmetric projector, never materialised).

    Raises:
        SparseMAPConvergenceError: (``strict`` only) the tolerance was not met within ``max_iter`` iterations.
    """
    return _SparseMAPFunction.apply(scores, structure, lengths, max_iter, tol, strict, init)

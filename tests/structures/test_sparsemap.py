"""The generic active-set SparseMAP solver (DESIGN.md §4, §9) against independent ground truths.

Toy structures defined here give closed forms or enumerable polytopes: Categorical (the simplex: sparsemax), k-hot
vectors (the capped simplex: a threshold found by bisection), the hypercube (clipping) and an arbitrary list of 0/1
vertices (enumeration, a direct QP solve over the simplex of weights).
"""

import itertools

import pytest
import torch
from entmax import sparsemax

from latentstruct.structures import Categorical, Structure
from latentstruct.structures.parts import dense_to_parts
from latentstruct.structures.sparsemap import (
    SparseMAPConvergenceError,
    _active_face_jvp,
    _solve_kkt,
    sparsemap,
    sparsemap_active_set,
)
from tests.structures.reference import capped_simplex_projection, qp_over_vertices, random_scores

CAT = Categorical()
# The default tol = 1e-6 bounds the duality gap, and ½||μ - μ*||² ≤ gap: comparisons at 1e-9 need a tighter one.
TIGHT = 1e-12


class TopKToy(Structure):
    """Vertices = k-hot vectors of length n (the first ``lengths[b]`` positions only); MAP = the top-k positions."""

    def __init__(self, k):
        self.k = k

    def map(self, scores, lengths=None):
        s = scores.detach()
        if lengths is not None:
            pad = torch.arange(s.shape[-1], device=s.device)[None, :] >= lengths[:, None]
            s = s.masked_fill(pad, -torch.inf)
        return torch.zeros_like(s).scatter_(-1, s.topk(self.k, dim=-1).indices, 1.0)

    def enumerate(self, n):
        subsets = itertools.combinations(range(n), self.k)
        return torch.stack([torch.zeros(n).index_fill_(0, torch.tensor(c), 1.0) for c in subsets])


class Hypercube(Structure):
    """Vertices = {0, 1}^n (the zero vector included, so the Gram matrix of an active set can be singular)."""

    def map(self, scores, lengths=None):
        return (scores.detach() > 0).to(scores.dtype)


class VertexList(Structure):
    """An arbitrary set of 0/1 vertices ``[V, d]``; MAP by enumeration."""

    def __init__(self, vertices):
        self.vertices = vertices

    def map(self, scores, lengths=None):
        v = self.vertices.to(scores)
        return v[(scores.detach() @ v.T).argmax(-1)]

    def enumerate(self, n=None):
        return self.vertices


def _random_vertex_list(d, v, seed):
    g = torch.Generator().manual_seed(seed)
    verts = torch.unique((torch.rand(3 * v, d, generator=g) < 0.5).to(torch.float64), dim=0)
    verts = verts[verts.sum(-1) > 0]
    return verts[torch.randperm(verts.shape[0], generator=g)[:v]]


def _vjp(fn, s, g):
    s = s.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(s), s, g)
    return grad


# --- Categorical: the generic solver must reproduce sparsemax ------------------------------------------------------


@pytest.mark.parametrize("k", [2, 5, 17, 40])
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 10.0, 1000.0])
def test_categorical_matches_sparsemax(k, scale):
    s = random_scores((8, k), scale=scale, seed=k)
    mu = sparsemap(CAT, s)
    torch.testing.assert_close(mu, sparsemax(s, dim=-1), atol=1e-6, rtol=0)
    g = random_scores((8, k), seed=k + 1)
    torch.testing.assert_close(
        _vjp(lambda x: sparsemap(CAT, x), s, g), _vjp(lambda x: sparsemax(x, dim=-1), s, g), atol=1e-9, rtol=0
    )


def test_categorical_vertex_and_interior_cases():
    s = torch.tensor([[100.0, 0.0, -3.0, 1.0], [0.01, 0.02, -0.01, 0.0]], dtype=torch.float64)
    sol = sparsemap_active_set(CAT, s)
    torch.testing.assert_close(sol.mu[0], torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))
    assert (sol.weights[0] > 0).sum() == 1  # a vertex: the active set is the MAP vertex alone
    assert (sol.mu[1] > 0).all() and (sol.weights[1] > 0).sum() == 4  # interior of the simplex
    torch.testing.assert_close(sol.mu, sparsemax(s, dim=-1), atol=1e-12, rtol=0)


def test_categorical_full_jacobian():
    s = torch.tensor([[0.3, 0.1, -0.2, 0.25, -2.0]], dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda x: sparsemap(CAT, x), s)
    ref = torch.autograd.functional.jacobian(lambda x: sparsemax(x, dim=-1), s)
    torch.testing.assert_close(jac, ref, atol=1e-12, rtol=0)


def test_categorical_float32():
    s = random_scores((8, 30), scale=1.0, dtype=torch.float32)
    mu = sparsemap(CAT, s.requires_grad_())
    assert mu.dtype == torch.float32
    torch.testing.assert_close(mu, sparsemax(s.detach(), dim=-1), atol=1e-6, rtol=0)
    (grad,) = torch.autograd.grad(mu, s, torch.ones_like(mu) + torch.arange(30.0))
    assert grad.dtype == torch.float32


def test_categorical_keeps_closed_form():
    assert Categorical.sparsemap is not Structure.sparsemap


# --- TopK: the capped simplex -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(4, 2), (9, 3), (20, 5)])
@pytest.mark.parametrize("scale", [0.05, 1.0, 20.0])
def test_topk_matches_capped_simplex(n, k, scale):
    topk = TopKToy(k)
    s = random_scores((8, n), scale=scale, seed=n * k)
    mu = sparsemap(topk, s, tol=TIGHT)
    torch.testing.assert_close(mu, capped_simplex_projection(s, k), atol=1e-9, rtol=0)
    # J = I - 11ᵀ/|F| on the free coordinates F = {0 < μ < 1}, zero elsewhere.
    for b in range(2):
        jac = torch.autograd.functional.jacobian(lambda x: sparsemap(topk, x[None], tol=TIGHT)[0], s[b])
        free = ((mu[b] > 1e-9) & (mu[b] < 1 - 1e-9)).to(torch.float64)
        ref = torch.diag(free) - free[:, None] * free[None, :] / free.sum().clamp_min(1)
        torch.testing.assert_close(jac, ref, atol=1e-9, rtol=0)


def test_topk_gradcheck():
    s = random_scores((3, 7), scale=1.0, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: sparsemap(TopKToy(3), x), (s,))


def test_topk_padding():
    topk = TopKToy(2)
    s = random_scores((3, 8), scale=1.0, seed=5)
    lengths = torch.tensor([8, 5, 3])
    mu = sparsemap(topk, s.clone().requires_grad_(), lengths, tol=TIGHT)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(mu[b, :n], capped_simplex_projection(s[b : b + 1, :n], 2)[0], atol=1e-9, rtol=0)
        assert (mu[b, n:] == 0).all()
    grad = _vjp(lambda x: sparsemap(topk, x, lengths), s, random_scores((3, 8), seed=6))
    for b, n in enumerate(lengths.tolist()):
        assert (grad[b, n:] == 0).all()


def test_base_class_uses_generic_solver():
    s = random_scores((4, 6), scale=1.0, seed=7)
    torch.testing.assert_close(TopKToy(2).sparsemap(s), capped_simplex_projection(s, 2), atol=1e-6, rtol=0)


# --- Hypercube: a vertex at the origin ------------------------------------------------------------------------------


def test_hypercube_is_clipping():
    s = random_scores((6, 5), scale=1.0, seed=11)
    mu = sparsemap(Hypercube(), s)
    torch.testing.assert_close(mu, s.clamp(0, 1), atol=1e-9, rtol=0)
    g = random_scores((6, 5), seed=12)
    torch.testing.assert_close(
        _vjp(lambda x: sparsemap(Hypercube(), x), s, g), g * ((s > 0) & (s < 1)), atol=1e-9, rtol=0
    )


# --- Arbitrary polytopes: optimality conditions and an independent QP -------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_optimality_and_direct_qp(seed):
    verts = _random_vertex_list(d=6, v=12, seed=seed)
    struct = VertexList(verts)
    s = random_scores((5, 6), scale=[0.3, 1.0, 3.0][seed % 3], seed=seed)
    tol = 1e-9
    sol = sparsemap_active_set(struct, s, tol=tol)
    # μ ∈ conv(Z): a convex combination of returned vertices, each of them a vertex of the structure.
    w = sol.weights
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(torch.einsum("ba,bad->bd", w, sol.vertices), sol.mu, atol=1e-12, rtol=0)
    used = sol.vertices[w > 0]
    assert ((used[:, None, :] == verts[None]).all(-1)).any(-1).all()
    # First-order optimality of the projection: <s - μ, v - μ> ≤ tol for every vertex v.
    gaps = torch.einsum("bd,vbd->bv", s - sol.mu, verts[:, None, :] - sol.mu[None])
    assert gaps.max() <= tol * max(1.0, s.abs().max().item() * verts.sum(-1).max().item())
    for b in range(5):
        torch.testing.assert_close(sol.mu[b], qp_over_vertices(verts, s[b]), atol=1e-5, rtol=0)


def test_gradcheck_vertex_list():
    struct = VertexList(_random_vertex_list(d=5, v=10, seed=21))
    s = random_scores((4, 5), scale=0.7, seed=22).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: sparsemap(struct, x), (s,))


def test_jacobian_is_symmetric_projector():
    struct = VertexList(_random_vertex_list(d=6, v=14, seed=31))
    s = random_scores((1, 6), scale=0.5, seed=32)
    jac = torch.autograd.functional.jacobian(lambda x: sparsemap(struct, x[None])[0], s[0])
    torch.testing.assert_close(jac, jac.T, atol=1e-10, rtol=0)
    torch.testing.assert_close(jac @ jac, jac, atol=1e-10, rtol=0)


def _face_jvp(z, g):
    """The active-face backward on dense vertices ``[1, A, d]`` (every slot in the support)."""
    idx, part = dense_to_parts(z[0])
    indices = torch.where(part, idx, -1)[None]
    return _active_face_jvp(indices, z @ z.mT, torch.ones(z.shape[:2], dtype=torch.bool), g)


def test_backward_with_affinely_dependent_active_set():
    # Four coplanar 0/1 points (the unit square in the first two coordinates): the KKT matrix is singular, the
    # pseudo-inverse still returns the projection of g onto the face's direction space span(e1, e2).
    z = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.float64)[None]
    g = torch.tensor([[0.3, -1.2, 5.0]], dtype=torch.float64)
    out = _face_jvp(z, g)
    torch.testing.assert_close(out, torch.tensor([[0.3, -1.2, 0.0]], dtype=torch.float64), atol=1e-12, rtol=0)
    # A duplicated vertex: the same projection as without the copy.
    z = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 0, 0]], dtype=torch.float64)[None]
    out = _face_jvp(z, g)
    torch.testing.assert_close(out, torch.tensor([[0.75, -0.75, 0.0]], dtype=torch.float64), atol=1e-12, rtol=0)
    # The forward KKT solve on the same degenerate set: weights sum to 1 and give the projection onto the affine hull.
    s = torch.tensor([[0.9, 0.4, 2.0]], dtype=torch.float64)
    alpha = _solve_kkt(z @ z.mT, torch.ones(1, 3, dtype=torch.bool), (z @ s[..., None])[..., 0], 1.0)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(alpha @ z[0], torch.tensor([[0.75, 0.25, 0.0]], dtype=torch.float64), atol=1e-12, rtol=0)


# --- Convergence control and batching -------------------------------------------------------------------------------


def test_non_convergence_raises():
    s = random_scores((3, 10), scale=0.01, seed=41)  # μ interior: needs all 10 vertices, so at least 10 iterations
    with pytest.raises(SparseMAPConvergenceError, match=r"did not converge for 3 of 3 examples"):
        sparsemap(CAT, s, max_iter=1)
    with pytest.raises(RuntimeError, match="largest remaining gap"):
        sparsemap(CAT, s, max_iter=5)
    assert sparsemap_active_set(CAT, s, max_iter=10).iterations == 10


def test_default_iteration_cap_grows_with_the_number_of_parts():
    """A support of ~300 vertices needs ~300 iterations: a fixed cap of 100 would fail; the default scales with d."""
    s = random_scores((2, 300), scale=1e-3, seed=42)
    sol = sparsemap_active_set(CAT, s, tol=TIGHT)
    assert sol.iterations > 100 and (sol.weights > 0).sum(-1).min() > 100
    torch.testing.assert_close(sol.mu, sparsemax(s, dim=-1), atol=1e-9, rtol=0)


def test_batch_equals_one_by_one():
    # Rows converge after 1 (a vertex), a few, and all-K iterations: finished rows must leave the batch untouched.
    k = 12
    s = torch.cat([random_scores((1, k), scale=sc, seed=i) for i, sc in enumerate([100.0, 1.0, 0.01, 0.3, 5.0])])
    g = random_scores(s.shape, seed=50)
    iters = [sparsemap_active_set(CAT, s[b : b + 1]).iterations for b in range(s.shape[0])]
    assert len(set(iters)) >= 3
    mu = sparsemap(CAT, s)
    grad = _vjp(lambda x: sparsemap(CAT, x), s, g)
    for b in range(s.shape[0]):
        torch.testing.assert_close(mu[b : b + 1], sparsemap(CAT, s[b : b + 1]), atol=1e-12, rtol=0)
        torch.testing.assert_close(
            grad[b : b + 1], _vjp(lambda x: sparsemap(CAT, x), s[b : b + 1], g[b : b + 1]), atol=1e-12, rtol=0
        )
    struct = VertexList(_random_vertex_list(d=6, v=14, seed=51))
    s = torch.cat([random_scores((1, 6), scale=sc, seed=60 + i) for i, sc in enumerate([0.1, 1.0, 10.0, 0.5])])
    mu = sparsemap(struct, s)
    for b in range(s.shape[0]):
        torch.testing.assert_close(mu[b : b + 1], sparsemap(struct, s[b : b + 1]), atol=1e-12, rtol=0)


def test_non_finite_scores_rejected():
    with pytest.raises(ValueError, match="finite"):
        sparsemap(CAT, torch.tensor([[0.0, -torch.inf]]))


@pytest.mark.cuda
def test_cuda_matches_cpu():
    s = random_scores((8, 20), scale=0.5, seed=70, dtype=torch.float32)
    g = random_scores((8, 20), seed=71, dtype=torch.float32)
    mu = sparsemap(CAT, s.cuda())
    assert mu.device.type == "cuda"
    torch.testing.assert_close(mu.cpu(), sparsemap(CAT, s), atol=1e-6, rtol=0)
    grad = _vjp(lambda x: sparsemap(CAT, x), s.cuda(), g.cuda())
    torch.testing.assert_close(grad.cpu(), _vjp(lambda x: sparsemap(CAT, x), s, g), atol=1e-5, rtol=0)
    topk = TopKToy(3)
    torch.testing.assert_close(
        sparsemap(topk, s.double().cuda(), torch.full((8,), 15).cuda()).cpu(),
        sparsemap(topk, s.double(), torch.full((8,), 15)),
        atol=1e-9,
        rtol=0,
    )


def test_a_truncated_active_set_returns_a_feasible_iterate_and_its_face_jacobian():
    """sparsemap_max_iter: stop after a few iterations (the seed 001 authors' lp-sparsemap setting) and use the
    iterate: a point of the polytope (every word has head weights summing to 1), whose gap is still open."""
    from latentstruct.structures import ProjectiveDepTree
    from latentstruct.structures.sparsemap import SparseMAPConvergenceError, sparsemap_active_set

    torch.manual_seed(0)
    scores = 0.05 * torch.randn(3, 9, 9, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 8])
    with pytest.raises(SparseMAPConvergenceError):
        sparsemap_active_set(ProjectiveDepTree(), scores, lengths, max_iter=5)
    sol = sparsemap_active_set(ProjectiveDepTree(), scores, lengths, max_iter=5, strict=False)
    assert sol.iterations == 5 and (sol.gap > 1e-6).any()
    torch.testing.assert_close(sol.weights.sum(-1), torch.ones(3, dtype=torch.float64))
    exact = ProjectiveDepTree().sparsemap(scores, lengths)
    tree = ProjectiveDepTree(sparsemap_max_iter=5)
    s = scores.clone().requires_grad_(True)
    mu = tree.sparsemap(s, lengths)
    heads = mu[:, :, 1:].sum(1)  # each real word's head weights sum to 1
    torch.testing.assert_close(heads[0], torch.ones(8, dtype=torch.float64))
    assert not torch.allclose(mu.detach(), exact)
    # the truncated objective is worse than the exact projection's, but it is a feasible point
    dist = lambda m: ((m - scores) ** 2).sum()  # noqa: E731
    assert dist(mu.detach()) >= dist(exact) - 1e-9
    (mu * torch.randn_like(mu)).sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="sparsemap_max_iter"):
        ProjectiveDepTree(sparsemap_max_iter=0)


@pytest.mark.parametrize("name", ["binary_tree", "projective"])
def test_points_near_a_vertex_converge(name):
    """SPIGOT projects ẑ - ηγ with γ zero on many parts: float32 ties leave vertices whose face weight is clamped to 0
    in the active set; when such a vertex blocks a later step (t = 0), it leaves — the solver must not take it for
    round-off on the vertex just added and stall (it did, on the ListOps chart runs)."""
    from latentstruct.structures import BinaryTree, ProjectiveDepTree

    structure = {"binary_tree": BinaryTree(), "projective": ProjectiveDepTree()}[name]
    g = torch.Generator().manual_seed(0)
    s = torch.randn(64, 9, 9, generator=g)
    z = structure.map(s)
    x = z + 1e-3 * torch.randn(64, 9, 9, generator=g) * (torch.rand(64, 9, 9, generator=g) < 0.3)
    sol = sparsemap_active_set(structure, x)  # strict: raises if an example stalls
    assert (sol.gap <= 1e-6 * (x.abs().flatten(1).amax(-1) * z.flatten(1).sum(-1)).clamp_min(1)).all()


def test_warm_start():
    """init = a previous solution: the same projection; from the solution itself, converged after one MAP call; from
    the solution of nearby scores, fewer MAP calls than a cold start."""
    from latentstruct.structures import ProjectiveDepTree

    tree = ProjectiveDepTree()
    g = torch.Generator().manual_seed(3)
    s = torch.randn(6, 9, 9, generator=g, dtype=torch.float64)
    lengths = torch.tensor([8, 8, 5, 3, 8, 1])
    cold = sparsemap_active_set(tree, s, lengths, tol=TIGHT)
    again = sparsemap_active_set(tree, s, lengths, tol=TIGHT, init=cold)
    torch.testing.assert_close(again.mu, cold.mu, atol=1e-9, rtol=0)
    assert again.map_calls == 1 and again.iterations == 1
    near = s + 0.01 * torch.randn(s.shape, generator=g, dtype=torch.float64)
    warm = sparsemap_active_set(tree, near, lengths, tol=TIGHT, init=cold)
    fresh = sparsemap_active_set(tree, near, lengths, tol=TIGHT)
    torch.testing.assert_close(warm.mu, fresh.mu, atol=1e-6, rtol=0)
    assert warm.map_calls < fresh.map_calls
    # the differentiable form accepts it too, and its gradient is the active face's
    x = near.clone().requires_grad_(True)
    (sparsemap(tree, x, lengths, init=cold) * near).sum().backward()
    torch.testing.assert_close(x.grad, _vjp(lambda y: sparsemap(tree, y, lengths), near, near), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="same batch"):
        sparsemap_active_set(tree, s[:3], lengths[:3], init=cold)


def test_refreshing_the_inverse_changes_nothing(monkeypatch):
    """The updated inverse of the KKT matrix agrees with one recomputed from the Gram matrix (forced every check)."""
    import latentstruct.structures.sparsemap as module

    struct = VertexList(_random_vertex_list(d=8, v=40, seed=81))
    s = random_scores((6, 8), scale=0.5, seed=82)
    updated = sparsemap_active_set(struct, s, tol=TIGHT)
    monkeypatch.setattr(module, "_REFRESH_TOL", -1.0)  # every residual counts as too large
    monkeypatch.setattr(module, "_CHECK_EVERY", 1)
    refreshed = sparsemap_active_set(struct, s, tol=TIGHT)
    torch.testing.assert_close(refreshed.mu, updated.mu, atol=1e-9, rtol=0)
    torch.testing.assert_close(refreshed.weights, updated.weights, atol=1e-9, rtol=0)

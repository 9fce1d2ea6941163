"""latentstruct.structures.Categorical against brute-force enumeration (DESIGN.md §4 contract, §9).

Every method is compared with a ground truth built from ``enumerate(K)`` (the K one-hot vertices) or, for SparseMAP,
with an independent solve of the projection QP; sampling is checked statistically with fixed generators.
"""

import functools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.stats import chisquare

from latentstruct.structures import Categorical, Structure, gumbel_like
from tests.structures.reference import enumerated, scores_maker, tol, vertex_scores

CAT = Categorical()
DTYPES = [torch.float32, torch.float64]
SIZES = list(range(1, 7))
EULER_GAMMA = 0.5772156649015329


_tol = functools.partial(tol, double=(1e-12, 1e-10), single=(1e-6, 1e-5))
_scores = scores_maker(lambda k: (k,))


def _project_simplex(v):
    """Euclidean projection of each row onto the simplex by the sort-and-threshold rule (Held et al., 1974)."""
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    ranks = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)
    rho = (u - css / ranks > 0).sum(-1, keepdim=True)  # the condition holds on a prefix of the sorted entries
    tau = css.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - tau).clamp_min(0)


def _slsqp_projection(s):
    """argmin_μ ||μ - s||² s.t. μ >= 0, Σμ = 1, by a generic constrained solver (one example, numpy)."""
    k = s.shape[0]
    res = minimize(
        lambda m: float(((m - s) ** 2).sum()),
        np.full(k, 1.0 / k),
        jac=lambda m: 2 * (m - s),
        bounds=[(0.0, None)] * k,
        constraints=[{"type": "eq", "fun": lambda m: m.sum() - 1.0, "jac": lambda m: np.ones_like(m)}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success, res.message
    return res.x


# --------------------------------------------------------------------------------------------------------- enumerate


@pytest.mark.parametrize("k", SIZES)
def test_enumerate_is_the_one_hot_vertices(k):
    vertices = CAT.enumerate(k)
    assert vertices.shape == (k, k)
    assert torch.equal(vertices, torch.eye(k))


# --------------------------------------------------------------------------------------------------------------- map


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", SIZES)
def test_map_is_the_best_enumerated_vertex(k, dtype):
    scores = _scores(7, k, dtype=dtype, seed=k).requires_grad_(True)
    vertices = enumerated(CAT, k).to(scores)
    vs = vertex_scores(scores.detach(), vertices)
    z = CAT.map(scores)
    assert z.shape == scores.shape and z.dtype == dtype
    assert not z.requires_grad and z.grad_fn is None
    assert torch.equal(z, vertices[vs.argmax(-1)])
    # a vertex: 0/1 with exactly one 1, achieving the best score
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(z.sum(-1), torch.ones(7, dtype=dtype))
    assert torch.equal(CAT.score(z, scores.detach()), vs.max(-1).values)
    # lengths is accepted and ignored
    assert torch.equal(CAT.map(scores, torch.full((7,), k)), z)


@pytest.mark.parametrize("dtype", DTYPES)
def test_map_under_ties_is_still_a_vertex(dtype):
    scores = torch.zeros(3, 5, dtype=dtype)
    scores[1, [1, 3]] = 2.0
    z = CAT.map(scores)
    assert torch.equal(z.sum(-1), torch.ones(3, dtype=dtype))
    assert torch.equal(CAT.score(z, scores), scores.max(-1).values)


# -------------------------------------------------------------------------------------- log_partition and marginals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", SIZES)
def test_log_partition_is_logsumexp_over_vertices(k, dtype):
    scores = _scores(6, k, dtype=dtype, seed=10 + k)
    vs = vertex_scores(scores, enumerated(CAT, k))
    log_z = CAT.log_partition(scores)
    assert log_z.shape == (6,) and log_z.dtype == dtype
    expected = torch.log(torch.exp(vs.double()).sum(-1)).to(dtype)
    torch.testing.assert_close(log_z, expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", SIZES)
def test_marginals_are_the_gibbs_mean_and_the_gradient_of_log_partition(k, dtype):
    scores = _scores(6, k, dtype=dtype, seed=20 + k)
    vertices = enumerated(CAT, k).to(scores)
    vs = vertex_scores(scores, vertices)
    p = torch.exp(vs.double() - torch.logsumexp(vs.double(), -1, keepdim=True))  # p(z) for every vertex
    expected = (p @ vertices.double()).to(dtype)
    mu = CAT.marginals(scores)
    assert mu.shape == scores.shape and mu.dtype == dtype
    torch.testing.assert_close(mu, expected, **_tol(dtype))

    s = scores.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(CAT.log_partition(s).sum(), s)
    torch.testing.assert_close(mu, grad, **_tol(dtype))

    # differentiable when the scores require grad
    assert CAT.marginals(s).requires_grad


@pytest.mark.parametrize("k", SIZES)
def test_marginals_gradcheck(k):
    scores = _scores(3, k, seed=30 + k).requires_grad_(True)
    assert torch.autograd.gradcheck(CAT.marginals, (scores,))
    assert torch.autograd.gradgradcheck(CAT.marginals, (scores,))


def test_marginals_are_stable_for_large_scores():
    scores = torch.tensor([[1000.0, 999.0, -1000.0]])
    mu = CAT.marginals(scores)
    assert torch.isfinite(mu).all()
    torch.testing.assert_close(mu.sum(-1), torch.ones(1))
    assert torch.isfinite(CAT.log_partition(scores)).all()


# ----------------------------------------------------------------------------------------------------------- log_prob


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", SIZES)
def test_log_prob_is_a_distribution_over_vertices(k, dtype):
    scores = _scores(4, k, dtype=dtype, seed=40 + k)
    vertices = enumerated(CAT, k).to(scores)
    vs = vertex_scores(scores, vertices)
    log_p = torch.stack([CAT.log_prob(v.expand_as(scores), scores) for v in vertices], dim=-1)  # [B, V]
    assert log_p.shape == (4, k)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(4, dtype=dtype), **_tol(dtype))
    torch.testing.assert_close(log_p, torch.log_softmax(vs, -1), **_tol(dtype))


# ---------------------------------------------------------------------------------------------------------- sparsemap


def _kink_distance(scores):
    """For one example [1, K]: min_i |s_i - τ| with τ the sparsemax threshold (how far the scores are from a kink)."""
    mu = _project_simplex(scores)
    tau = (scores - mu)[mu > 0][0]
    return (scores - tau).abs().min().item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", SIZES)
def test_sparsemap_is_the_projection_onto_the_simplex(k, dtype):
    scores = _scores(8, k, dtype=dtype, seed=50 + k, scale=0.7)
    mu = CAT.sparsemap(scores)
    assert mu.shape == scores.shape and mu.dtype == dtype
    tol = _tol(dtype)

    # the closed-form (sort-based) projection, computed in float64
    torch.testing.assert_close(mu.double(), _project_simplex(scores.double()), atol=max(tol["atol"], 1e-7), rtol=0)

    # an independent generic QP solve
    for b in range(scores.shape[0]):
        ref = _slsqp_projection(scores[b].double().numpy())
        np.testing.assert_allclose(mu[b].double().numpy(), ref, atol=1e-6)

    # optimality: μ in the simplex and <s - μ, v - μ> <= 0 for every vertex v (variational inequality)
    assert (mu >= 0).all()
    torch.testing.assert_close(mu.sum(-1), torch.ones(8, dtype=dtype), **tol)
    vertices = CAT.enumerate(k).to(dtype)
    residual = scores - mu
    vi = (residual.unsqueeze(1) * (vertices.unsqueeze(0) - mu.unsqueeze(1))).sum(-1)  # [B, V]
    assert vi.max().item() <= (1e-6 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparsemap_is_sparse_and_fixes_points_of_the_simplex(dtype):
    scores = torch.tensor([[3.0, 0.0, -1.0], [0.2, 0.5, 0.3]], dtype=dtype)
    mu = CAT.sparsemap(scores)
    torch.testing.assert_close(mu[0], torch.tensor([1.0, 0.0, 0.0], dtype=dtype))
    torch.testing.assert_close(mu[1], scores[1], **_tol(dtype))  # already in the simplex
    # a vertex is its own projection
    vertices = CAT.enumerate(4).to(dtype)
    assert torch.equal(CAT.sparsemap(vertices), vertices)


@pytest.mark.parametrize("k", SIZES)
def test_sparsemap_gradcheck_away_from_ties(k):
    # pick deterministic scores whose every entry is >= 1e-2 away from the sparsemax threshold (no kink nearby)
    for seed in range(100):
        scores = _scores(1, k, seed=60 + 1000 * k + seed, scale=0.6)
        if k == 1 or _kink_distance(scores) > 1e-2:
            break
    else:  # pragma: no cover
        pytest.fail("no tie-free scores found")
    scores.requires_grad_(True)
    assert torch.autograd.gradcheck(CAT.sparsemap, (scores,))

    # the Jacobian is the known closed form: diag(1_S) - 1_S 1_Sᵀ / |S| (Martins & Astudillo, 2016, Prop. 2)
    jac = torch.autograd.functional.jacobian(lambda x: CAT.sparsemap(x)[0], scores)[:, 0]  # [K, K]
    support = (_project_simplex(scores.detach()) > 0).double()[0]
    expected = torch.diag(support) - torch.outer(support, support) / support.sum()
    torch.testing.assert_close(jac, expected, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", ["sample", "exact_sample"])
def test_sampling_matches_the_gibbs_distribution(method, dtype):
    n = 200_000
    scores = torch.tensor([[0.5, -1.0, 1.3, 0.0]], dtype=dtype)
    gen = torch.Generator().manual_seed(1234)
    z = getattr(CAT, method)(scores.expand(n, -1), generator=gen)
    assert z.shape == (n, 4) and z.dtype == dtype
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(z.sum(-1), torch.ones(n, dtype=dtype))  # every sample is a vertex

    p = torch.softmax(scores.double(), -1)[0]
    freq = z.double().mean(0)
    assert (freq - p).abs().max().item() < 0.01
    counts = z.double().sum(0).numpy()
    assert chisquare(counts, (p * n).numpy()).pvalue > 1e-4


@pytest.mark.parametrize("method", ["sample", "exact_sample"])
def test_sampling_is_reproducible_with_a_generator_and_leaves_the_global_rng_alone(method):
    scores = _scores(50, 5, seed=70)
    state = torch.get_rng_state()
    a = getattr(CAT, method)(scores, generator=torch.Generator().manual_seed(3))
    b = getattr(CAT, method)(scores, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)
    # without a generator: the global RNG, so a global seed reproduces it
    torch.manual_seed(5)
    c = getattr(CAT, method)(scores)
    torch.manual_seed(5)
    assert torch.equal(c, getattr(CAT, method)(scores))


def test_sampling_does_not_track_gradients():
    scores = _scores(3, 4).requires_grad_(True)
    assert not CAT.sample(scores).requires_grad
    assert not CAT.exact_sample(scores).requires_grad


@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_noise_moments(dtype):
    gen = torch.Generator().manual_seed(0)
    like = torch.empty(1000, 1000, dtype=dtype)
    g = gumbel_like(like, gen)
    assert g.shape == like.shape and g.dtype == dtype and g.device == like.device
    assert torch.isfinite(g).all()
    g = g.double()
    assert abs(g.mean().item() - EULER_GAMMA) < 0.01  # s.e. ≈ 0.0013
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03  # s.e. ≈ 0.0045
    # the distribution function exp(-exp(-x)) at a few points
    for x in (-1.0, 0.0, 1.0, 3.0):
        assert abs((g <= x).double().mean().item() - math.exp(-math.exp(-x))) < 0.005


@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_noise_is_finite_at_the_ends_of_the_uniform(dtype, monkeypatch):
    eps = torch.finfo(dtype).eps
    extremes = torch.tensor([0.0, torch.finfo(dtype).tiny, 0.5, 1 - eps, 1 - eps / 2], dtype=dtype)
    monkeypatch.setattr(torch, "rand", lambda shape, **kwargs: extremes.reshape(shape))
    g = gumbel_like(torch.empty(5, dtype=dtype))
    assert torch.isfinite(g).all(), g


def test_gumbel_noise_follows_the_global_rng_without_a_generator():
    like = torch.empty(4, 3, dtype=torch.float64)
    torch.manual_seed(11)
    a = gumbel_like(like)
    torch.manual_seed(11)
    u = torch.rand(like.shape, dtype=like.dtype)
    torch.testing.assert_close(a, -torch.log(-torch.log(u)), atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------- the base class defaults


class _LogSumExpOnly(Structure):
    """A categorical structure that defines only what the base class requires: map, log_partition, enumerate."""

    def map(self, scores, lengths=None):
        return torch.nn.functional.one_hot(scores.detach().argmax(-1), scores.shape[-1]).to(scores.dtype)

    def log_partition(self, scores, lengths=None):
        return torch.logsumexp(scores, dim=-1)

    def enumerate(self, n):
        return torch.eye(n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 5])
def test_default_marginals_are_the_gradient_of_log_partition(k, dtype):
    structure = _LogSumExpOnly()
    scores = _scores(4, k, dtype=dtype, seed=80 + k)
    mu = structure.marginals(scores)
    torch.testing.assert_close(mu, torch.softmax(scores, -1), **_tol(dtype))
    torch.testing.assert_close(mu, CAT.marginals(scores), **_tol(dtype))
    assert not mu.requires_grad  # scores without grad: a constant
    with torch.no_grad():  # and usable under no_grad, as estimators call it
        torch.testing.assert_close(structure.marginals(scores), mu)

    # with grad: differentiable, and its derivative is the softmax Jacobian
    s = scores.clone().requires_grad_(True)
    mu = structure.marginals(s)
    assert mu.requires_grad
    w = _scores(4, k, dtype=dtype, seed=90 + k)
    (g_default,) = torch.autograd.grad((mu * w).sum(), s)
    s2 = scores.clone().requires_grad_(True)
    (g_cat,) = torch.autograd.grad((CAT.marginals(s2) * w).sum(), s2)
    torch.testing.assert_close(g_default, g_cat, **_tol(dtype))


def test_default_marginals_gradcheck():
    structure = _LogSumExpOnly()
    scores = _scores(2, 4, seed=95).requires_grad_(True)
    assert torch.autograd.gradcheck(structure.marginals, (scores,))


def test_default_sample_is_perturb_and_map():
    structure = _LogSumExpOnly()
    scores = _scores(30, 4, seed=96)
    a = structure.sample(scores, generator=torch.Generator().manual_seed(2))
    b = CAT.sample(scores, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b)


def test_base_class_exact_sample_raises_and_sparsemap_is_the_generic_solver():
    structure = _LogSumExpOnly()
    scores = _scores(2, 3)
    with pytest.raises(NotImplementedError, match="exact"):
        structure.exact_sample(scores)
    # Only `map` is defined: the generic active-set SparseMAP must reproduce the closed form.
    torch.testing.assert_close(structure.sparsemap(scores), CAT.sparsemap(scores), atol=1e-6, rtol=0)
    bare = Structure()
    for call in (lambda: bare.map(scores), lambda: bare.log_partition(scores), lambda: bare.enumerate(3)):
        with pytest.raises(NotImplementedError):
            call()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    scores = torch.randn(5, 7, generator=torch.Generator().manual_seed(3), dtype=dtype)
    for method in (CAT.map, CAT.marginals, CAT.sparsemap, CAT.log_partition):
        on_gpu = method(scores.cuda())
        assert on_gpu.is_cuda and on_gpu.dtype == dtype
        torch.testing.assert_close(on_gpu.cpu(), method(scores))
    z = CAT.sample(scores.cuda(), generator=torch.Generator(device="cuda").manual_seed(0))
    assert z.is_cuda and torch.equal(z.sum(-1).cpu(), torch.ones(5, dtype=dtype))

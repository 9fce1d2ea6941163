"""latentstruct.structures.topk.TopK against brute-force enumeration and independent references (DESIGN.md §4, §9).

The ground truth is ``enumerate(n)``, checked against an independent brute force over {0, 1}^n and the counts
C(n, k). MAP, the log-partition, the marginals and the exact sampler are compared with the Gibbs distribution over
the enumerated vertices; the closed-form SparseMAP with the generic active-set solver (which only calls ``map``), a
bisection reference and the analytic Jacobian.
"""

import functools
import itertools
import math

import pytest
import torch

from latentstruct.structures.base import Structure
from latentstruct.structures.sparsemap import sparsemap
from latentstruct.structures.topk import TopK
from tests.structures.reference import (
    brute_log_partition,
    brute_marginals,
    brute_max,
    capped_simplex_projection,
    enumerated,
    gibbs,
    scores_maker,
    tol,
)

DTYPES = [torch.float32, torch.float64]
CASES = [(1, 1), (3, 1), (4, 2), (5, 3), (6, 2), (7, 4), (7, 7)]  # (n, k)
TIGHT = 1e-12  # the generic solver's duality-gap tolerance for comparisons at 1e-9


_tol = functools.partial(tol, double=1e-10)
_scores = scores_maker(lambda n: (n,), scale=1.0)


def _brute_force(n, k):
    """All 0/1 vectors of length n with k ones, as a set of tuples (no code shared with ``enumerate``)."""
    return {bits for bits in itertools.product((0, 1), repeat=n) if sum(bits) == k}


def _jacobian(fn, s):
    """d fn(s[b]) / d s[b] for one example s ``[n]`` → ``[n, n]``."""
    return torch.autograd.functional.jacobian(lambda x: fn(x[None])[0], s)


def _frequencies(z, vertices):
    """Empirical frequency of every vertex among samples z ``[N, n]`` → ``[V]``; every sample must be a vertex."""
    hits = (z[:, None, :] == vertices[None]).all(-1)
    assert torch.all(hits.sum(-1) == 1)
    return hits.to(torch.float64).mean(0)


# ------------------------------------------------------------------------------------------------------- basics


def test_constructor_checks_k():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k >= 1"):
            TopK(bad)
    assert TopK(3).k == 3 and repr(TopK(3)) == "TopK(k=3)"


@pytest.mark.parametrize("n", range(1, 8))
def test_enumerate_matches_brute_force(n):
    for k in range(1, n + 1):
        z = TopK(k).enumerate(n)
        assert z.shape == (math.comb(n, k), n)
        rows = {tuple(int(v) for v in row) for row in z.tolist()}
        assert len(rows) == z.shape[0]  # no duplicates
        assert rows == _brute_force(n, k)


def test_shape_and_length_errors():
    topk = TopK(3)
    with pytest.raises(ValueError, match=r"scores \[batch, n\]"):
        topk.map(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="at least k positions"):
        topk.map(torch.zeros(2, 2))
    s = _scores(2, 5)
    for method in (topk.map, topk.log_partition, topk.marginals, topk.sparsemap, topk.exact_sample):
        with pytest.raises(ValueError, match="lengths >= k"):
            method(s, torch.tensor([5, 2]))
    with pytest.raises(ValueError, match="<= n"):
        topk.map(s, torch.tensor([6, 5]))


# ---------------------------------------------------------------------------------------------------------- MAP


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", CASES)
def test_map_is_a_best_vertex(n, k, dtype):
    topk = TopK(k)
    scores = _scores(16, n, dtype=dtype, seed=n * 10 + k, scale=2.0).requires_grad_(True)
    z = topk.map(scores)
    assert z.dtype == dtype and not z.requires_grad
    assert torch.all((z == 0) | (z == 1)) and torch.all(z.sum(-1) == k)
    best = brute_max(scores.detach(), enumerated(topk, n))
    torch.testing.assert_close(Structure.score(z, scores.detach()), best, **_tol(dtype))


def test_map_with_infinite_candidates():
    # A candidate at -inf still beats padding; +inf candidates are taken first.
    s = torch.tensor([[-torch.inf, 0.5, torch.nan, 7.0], [torch.inf, -torch.inf, 1.0, -torch.inf]])
    z = TopK(2).map(s, torch.tensor([2, 4]))
    assert torch.equal(z, torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]]))


# ------------------------------------------------------------------------------------ log-partition and marginals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", CASES)
def test_log_partition_and_marginals_match_enumeration(n, k, dtype):
    topk = TopK(k)
    scores = _scores(8, n, dtype=dtype, seed=n + 100 * k, scale=2.0)
    vertices = enumerated(topk, n)
    torch.testing.assert_close(topk.log_partition(scores), brute_log_partition(scores, vertices), **_tol(dtype))
    mu = topk.marginals(scores)
    torch.testing.assert_close(mu, brute_marginals(scores, vertices), **_tol(dtype))
    assert mu.dtype == dtype


def test_log_partition_is_stable_for_large_scores():
    topk = TopK(3)
    scores = _scores(4, 9, seed=3, scale=1000.0)
    vertices = enumerated(topk, 9)
    torch.testing.assert_close(topk.log_partition(scores), brute_log_partition(scores, vertices))
    torch.testing.assert_close(topk.marginals(scores), brute_marginals(scores, vertices))
    assert torch.isfinite(topk.log_partition(scores.float())).all()


def test_marginals_gradcheck():
    topk = TopK(2)
    scores = _scores(3, 5, seed=4).requires_grad_(True)
    lengths = torch.tensor([5, 3, 2])
    assert torch.autograd.gradcheck(lambda s: topk.log_partition(s, lengths), (scores,))
    assert torch.autograd.gradcheck(lambda s: topk.marginals(s, lengths), (scores,))


def test_large_batch():
    topk = TopK(10)
    lengths = torch.randint(10, 201, (32,), generator=torch.Generator().manual_seed(0))
    scores = _scores(32, 200, dtype=torch.float32, seed=1).requires_grad_(True)
    mu = topk.marginals(scores, lengths)
    (mu * torch.randn_like(mu)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    torch.testing.assert_close(mu.detach().sum(-1), torch.full((32,), 10.0))
    assert torch.all(
        Structure.score(topk.map(scores, lengths), scores.detach()) <= topk.log_partition(scores, lengths) + 1e-3
    )


# ---------------------------------------------------------------------------------------------------- sampling


def _gibbs_tv(sampler, scores, k, lengths=None, seed=0, samples=20000):
    """Total variation between the empirical distribution of ``samples`` draws and the Gibbs distribution."""
    n = scores.shape[-1]
    length = n if lengths is None else int(lengths)
    batch = scores.expand(samples, n)
    lens = None if lengths is None else torch.full((samples,), length)
    z = sampler(batch, lens, torch.Generator().manual_seed(seed))
    assert torch.all(z[:, length:] == 0)
    vertices = enumerated(TopK(k), length)
    p = gibbs(scores[:, :length].double(), vertices)
    return 0.5 * (_frequencies(z[:, :length].double(), vertices) - p[0]).abs().sum().item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_sample_matches_gibbs(dtype):
    topk = TopK(2)
    scores = torch.tensor([[1.5, 1.0, 0.0, -0.5, -1.0]], dtype=dtype)
    assert _gibbs_tv(topk.exact_sample, scores, 2) < 0.03
    # Power check: Gumbel top-k (perturb-and-MAP: sampling without replacement) is a different distribution, and the
    # same statistic at the same sample size rejects it.
    assert _gibbs_tv(topk.sample, scores, 2) > 0.04


def test_exact_sample_matches_gibbs_with_lengths():
    topk = TopK(3)
    scores = torch.tensor([[0.3, 1.2, -0.7, 0.9, 0.0, -1.1, float("nan"), 5.0]], dtype=torch.float64)
    assert _gibbs_tv(topk.exact_sample, scores, 3, lengths=6, seed=1) < 0.03


def test_exact_sample_is_k_hot_and_reproducible():
    topk = TopK(4)
    lengths = torch.tensor([9, 4, 6, 5])
    scores = _scores(4, 9, seed=8, scale=3.0).requires_grad_(True)
    z1 = topk.exact_sample(scores, lengths, torch.Generator().manual_seed(5))
    z2 = topk.exact_sample(scores, lengths, torch.Generator().manual_seed(5))
    assert torch.equal(z1, z2) and not z1.requires_grad and z1.dtype == scores.dtype
    assert torch.all(z1.sum(-1) == 4) and torch.all((z1 == 0) | (z1 == 1))
    assert torch.all(z1[1, :4] == 1)  # lengths == k: the only vertex
    for b, length in enumerate(lengths.tolist()):
        assert torch.all(z1[b, length:] == 0)


def test_exact_sample_extreme_scores():
    # Probabilities of exactly 0 and 1 (up to exp underflow): the sample is the MAP vertex.
    topk = TopK(2)
    scores = torch.tensor([[0.0, 800.0, -800.0, 900.0, 0.0]], dtype=torch.float32).expand(64, 5)
    z = topk.exact_sample(scores, generator=torch.Generator().manual_seed(0))
    assert torch.equal(z, topk.map(scores))


# --------------------------------------------------------------------------------------------------- SparseMAP


@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0, 20.0, 1000.0])
@pytest.mark.parametrize("n,k", [(4, 2), (7, 3), (9, 1), (12, 5), (6, 6)])
def test_sparsemap_matches_generic_solver_and_bisection(n, k, scale):
    topk = TopK(k)
    s = _scores(8, n, seed=n + k, scale=scale)
    mu = topk.sparsemap(s)
    assert topk.sparsemap is not Structure.sparsemap
    torch.testing.assert_close(mu, sparsemap(topk, s, tol=TIGHT), atol=1e-9, rtol=0)  # the generic active set
    torch.testing.assert_close(mu, capped_simplex_projection(s, k), atol=1e-9, rtol=0)
    assert torch.all(mu >= 0) and torch.all(mu <= 1)
    torch.testing.assert_close(mu.sum(-1), torch.full((8,), float(k), dtype=torch.float64))


def test_sparsemap_base_class_method_is_the_generic_solver():
    topk = TopK(2)
    s = _scores(4, 6, seed=7)
    torch.testing.assert_close(Structure.sparsemap(topk, s), topk.sparsemap(s), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "row",
    [
        [0.0, 0.0, 0.0, 0.0, 0.0],  # all tied: μ = k/n
        [1.0, 1.0, 0.0, 0.0, -1.0],  # integers: τ on a breakpoint, μ a vertex
        [2.0, 1.0, 1.0, 1.0, -3.0],  # ties across the free set
        [0.5, 0.5, 0.5, -0.5, -0.5],  # s_i - 1 of one coordinate equals s_j of another
        [3.0, 2.0, 1.0, 0.0, -1.0],  # breakpoints coincide
        [1e-17, 0.0, -1e-17, 1.0, 1.0 - 1e-16],  # near-ties at the float64 resolution
    ],
)
def test_sparsemap_degenerate_scores(row):
    s = torch.tensor([row], dtype=torch.float64)
    for k in (1, 2, 3):
        mu = TopK(k).sparsemap(s)
        torch.testing.assert_close(mu, capped_simplex_projection(s, k), atol=1e-12, rtol=0)
        torch.testing.assert_close(mu.sum(-1), torch.tensor([float(k)], dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparsemap_dtype(dtype):
    topk = TopK(3)
    s = _scores(16, 10, dtype=dtype, seed=9).requires_grad_(True)
    mu = topk.sparsemap(s)
    assert mu.dtype == dtype and mu.requires_grad
    torch.testing.assert_close(mu.double(), capped_simplex_projection(s.detach().double(), 3), **_tol(dtype))
    (grad,) = torch.autograd.grad(mu, s, torch.randn_like(mu))
    assert grad.dtype == dtype


def test_sparsemap_gradcheck():
    s = _scores(4, 7, seed=3).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: TopK(3).sparsemap(x), (s,))
    lengths = torch.tensor([7, 5, 3, 4])
    assert torch.autograd.gradcheck(lambda x: TopK(3).sparsemap(x, lengths), (s,))


@pytest.mark.parametrize("seed", range(4))
def test_sparsemap_jacobian(seed):
    topk = TopK(3)
    s = _scores(1, 8, seed=seed, scale=[0.3, 1.0, 3.0, 0.1][seed])[0]
    jac = _jacobian(topk.sparsemap, s)
    mu = topk.sparsemap(s[None])[0]
    free = ((mu > 1e-9) & (mu < 1 - 1e-9)).to(torch.float64)
    assert free.sum() >= 1
    analytic = torch.diag(free) - free[:, None] * free[None, :] / free.sum()
    torch.testing.assert_close(jac, analytic, atol=1e-12, rtol=0)
    torch.testing.assert_close(jac, _jacobian(lambda x: sparsemap(topk, x, tol=TIGHT), s), atol=1e-9, rtol=0)


# ------------------------------------------------------------------------------------------------------ lengths


def test_lengths_equal_the_cropped_problems():
    topk = TopK(2)
    lengths = torch.tensor([7, 4, 2, 5])
    clean = _scores(4, 7, seed=11, scale=2.0)
    scores = clean.clone()
    for b, length in enumerate(lengths.tolist()):
        scores[b, length:] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, 0.0])[: 7 - length]
    scores.requires_grad_(True)
    outputs = {
        "map": topk.map(scores, lengths),
        "marginals": topk.marginals(scores, lengths),
        "sparsemap": topk.sparsemap(scores, lengths),
        "sample": topk.sample(scores, lengths, torch.Generator().manual_seed(0)),
        "exact_sample": topk.exact_sample(scores, lengths, torch.Generator().manual_seed(0)),
    }
    log_z = topk.log_partition(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        block = clean[b : b + 1, :length]
        torch.testing.assert_close(log_z[b], topk.log_partition(block)[0])
        torch.testing.assert_close(outputs["map"][b, :length], topk.map(block)[0])
        torch.testing.assert_close(outputs["marginals"][b, :length], topk.marginals(block)[0])
        torch.testing.assert_close(outputs["sparsemap"][b, :length], topk.sparsemap(block)[0])
        for name, out in outputs.items():
            assert torch.all(out[b, length:] == 0), name
            assert torch.isfinite(out[b]).all(), name
        assert outputs["sample"][b].sum() == 2 and outputs["exact_sample"][b].sum() == 2
    # Generic solver with lengths (it needs finite padding) agrees with the closed form.
    torch.testing.assert_close(
        outputs["sparsemap"], sparsemap(topk, clean, lengths, tol=TIGHT).to(clean.dtype), atol=1e-9, rtol=0
    )
    # Gradients stay off the padding and are finite.
    for name in ("marginals", "sparsemap"):
        (grad,) = torch.autograd.grad(outputs[name], scores, torch.randn_like(clean))
        assert torch.isfinite(grad).all(), name
        for b, length in enumerate(lengths.tolist()):
            assert torch.all(grad[b, length:] == 0), name
    (grad,) = torch.autograd.grad(log_z.sum(), scores)
    assert torch.isfinite(grad).all()


def test_lengths_equal_to_k():
    topk = TopK(3)
    s = _scores(2, 5, seed=12)
    lengths = torch.tensor([3, 5])
    only = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    for method in (topk.map, topk.marginals, topk.sparsemap):
        torch.testing.assert_close(method(s, lengths)[0], only)
    torch.testing.assert_close(topk.log_partition(s, lengths)[0], s[0, :3].sum())


# --------------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    topk = TopK(3)
    lengths = torch.tensor([8, 5, 3, 6])
    scores = _scores(4, 8, dtype=dtype, seed=13)
    for method in (topk.map, topk.log_partition, topk.marginals, topk.sparsemap):
        on_gpu = method(scores.cuda(), lengths.cuda())
        assert on_gpu.is_cuda and on_gpu.dtype == dtype
        torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths))
    z = topk.exact_sample(scores.cuda(), lengths.cuda(), torch.Generator(device="cuda").manual_seed(0))
    assert z.is_cuda and torch.all(z.sum(-1) == 3)
    big = scores[:1].cuda().expand(20000, 8)
    z = topk.exact_sample(big, None, torch.Generator(device="cuda").manual_seed(1)).cpu().double()
    vertices = enumerated(topk, 8)
    p = gibbs(scores[:1].double(), vertices)
    assert 0.5 * (_frequencies(z, vertices) - p[0]).abs().sum().item() < 0.05

"""latentstruct.structures.matching.Matching against brute force and independent references (DESIGN.md §4, §9).

The ground truth is ``enumerate(n)`` (all n! permutation matrices), checked against an independent brute force over
{0, 1}^{n×n} and the counts n! (test_contract.py compares MAP with it); the Sinkhorn relaxation with a
probability-space implementation and with its limits (doubly stochastic at convergence, the MAP permutation as
tau → 0); SparseMAP (the generic active-set solver on the Birkhoff polytope) with the first-order optimality
conditions over every vertex and with an independent QP over doubly-stochastic matrices.
"""

import functools
import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from latentstruct.structures.base import Structure, gumbel_like
from latentstruct.structures.matching import Matching, gumbel_sinkhorn, sinkhorn
from latentstruct.structures.sparsemap import sparsemap_active_set
from tests.structures.reference import enumerated, scores_maker, spans, tol

DTYPES = [torch.float32, torch.float64]
MATCHING = Matching()


_tol = functools.partial(tol, double=1e-10)
_scores = scores_maker(spans, scale=1.0)


def _assert_permutation(z, length=None):
    """z ``[n, n]`` is a permutation matrix on its top-left ``length`` block and 0 elsewhere."""
    n = z.shape[-1]
    length = n if length is None else length
    assert torch.all((z == 0) | (z == 1))
    block = z[:length, :length]
    assert torch.all(block.sum(0) == 1) and torch.all(block.sum(1) == 1)
    assert z.sum() == length


def _naive_sinkhorn(scores, tau, n_iter):
    """Sinkhorn in probability space (moderate scores only): P = exp(s / tau), normalise rows, then columns."""
    p = torch.exp(scores / tau)
    for _ in range(n_iter):
        p = p / p.sum(-1, keepdim=True)
        p = p / p.sum(-2, keepdim=True)
    return p


def _qp_birkhoff(s):
    """argmin ||μ - s||² over n×n doubly-stochastic μ by SLSQP (one example, numpy): an independent projection."""
    s = s.numpy()
    n = s.shape[0]
    rows = np.kron(np.eye(n), np.ones((1, n)))  # row sums of the row-major flattening
    cols = np.kron(np.ones((1, n)), np.eye(n))
    a = np.concatenate([rows, cols[:-1]])  # the last column sum is implied: keep the constraints independent
    res = minimize(
        lambda m: 0.5 * float(((m - s.ravel()) ** 2).sum()),
        np.full(n * n, 1.0 / n),
        jac=lambda m: m - s.ravel(),
        bounds=[(0.0, None)] * (n * n),
        constraints=[{"type": "eq", "fun": lambda m: a @ m - 1.0, "jac": lambda m: a}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    assert res.success, res.message
    return torch.from_numpy(res.x.reshape(n, n))


# ------------------------------------------------------------------------------------------------------- basics


@pytest.mark.parametrize("n", range(1, 6))
def test_enumerate_counts(n):
    z = MATCHING.enumerate(n)
    assert z.shape == (math.factorial(n), n, n)
    assert len({tuple(v.flatten().tolist()) for v in z}) == z.shape[0]
    for v in z:
        _assert_permutation(v)


@pytest.mark.parametrize("n", range(1, 4))
def test_enumerate_matches_brute_force(n):
    # Every 0/1 n×n matrix whose rows and columns each sum to one: no code shared with ``enumerate``.
    brute = set()
    for bits in itertools.product((0, 1), repeat=n * n):
        m = np.array(bits).reshape(n, n)
        if (m.sum(0) == 1).all() and (m.sum(1) == 1).all():
            brute.add(bits)
    assert {tuple(int(x) for x in v.flatten().tolist()) for v in MATCHING.enumerate(n)} == brute


def test_shape_and_length_errors():
    with pytest.raises(ValueError, match=r"\[batch, n, n\]"):
        MATCHING.map(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 3\]"):
        MATCHING.map(torch.zeros(2, 3, 3), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="tau"):
        sinkhorn(torch.zeros(1, 2, 2), tau=0.0)


@pytest.mark.parametrize("method", ["marginals", "log_partition"])
def test_exact_inference_is_not_implemented(method):
    with pytest.raises(NotImplementedError, match=r"#P-hard.*sinkhorn"):
        getattr(MATCHING, method)(_scores(2, 3))


# ---------------------------------------------------------------------------------------------------------- MAP


def test_map_of_a_permuted_diagonal():
    perm = torch.tensor([2, 0, 3, 1])
    scores = torch.eye(4)[perm][None] * 5.0 + 0.1 * _scores(1, 4, dtype=torch.float32, seed=1)
    assert torch.equal(MATCHING.map(scores)[0], torch.eye(4)[perm])


def test_perturb_and_map_samples_are_permutations():
    lengths = torch.tensor([5] * 8 + [3] * 8)
    scores = _scores(16, 5, seed=2, scale=0.5)
    z = MATCHING.sample(scores, lengths, generator=torch.Generator().manual_seed(0))
    for zb, length in zip(z, lengths.tolist(), strict=True):
        _assert_permutation(zb, length)
    # Noise makes different samples for equal scores.
    assert len({tuple(zb.flatten().tolist()) for zb in z[:8]}) > 1


# ----------------------------------------------------------------------------------------------------- Sinkhorn


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinkhorn_matches_probability_space_iterations(dtype):
    scores = _scores(4, 5, dtype=dtype, seed=3)
    for tau, n_iter in ((1.0, 0), (1.0, 1), (0.5, 7), (2.0, 20)):
        torch.testing.assert_close(sinkhorn(scores, tau, n_iter), _naive_sinkhorn(scores, tau, n_iter), **_tol(dtype))
    torch.testing.assert_close(MATCHING.sinkhorn(scores, 0.5, 7), sinkhorn(scores, 0.5, 7))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinkhorn_is_doubly_stochastic_at_convergence(dtype):
    p = sinkhorn(_scores(8, 6, dtype=dtype, seed=4), tau=1.0, n_iter=300)
    assert torch.all(p >= 0)
    ones = torch.ones(8, 6, dtype=dtype)
    torch.testing.assert_close(p.sum(1), ones, atol=1e-6, rtol=0)
    torch.testing.assert_close(p.sum(2), ones, atol=1e-6, rtol=0)
    # After any round the columns sum to one.
    torch.testing.assert_close(sinkhorn(_scores(8, 6, dtype=dtype, seed=4), 1.0, 1).sum(1), ones, atol=1e-6, rtol=0)


def test_sinkhorn_small_tau_approaches_map():
    n = 6
    scores = _scores(16, n, seed=5)
    z = MATCHING.map(scores)
    p = sinkhorn(scores, tau=0.01, n_iter=1000)
    assert torch.equal(torch.round(p), z)
    # The fixed point maximises <P, s> + tau H(P) over the Birkhoff polytope, so its score is within tau n log n of
    # the MAP score; the gap shrinks with tau.
    gaps = []
    for tau in (1.0, 0.3, 0.1, 0.01):
        gap = Structure.score(z, scores) - Structure.score(sinkhorn(scores, tau, 1000), scores)
        assert gap.max() <= tau * n * math.log(n) + 1e-2
        gaps.append(gap.mean().item())
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.01
    # With a clear margin between the best and the second-best permutation, the matrix itself converges.
    perm = torch.tensor([3, 0, 4, 1, 2])
    clear = 2.0 * torch.eye(5, dtype=torch.float64)[perm] + 0.3 * _scores(1, 5, seed=6)[0]
    torch.testing.assert_close(
        sinkhorn(clear[None], 0.05, 200)[0], torch.eye(5, dtype=torch.float64)[perm], atol=1e-3, rtol=0
    )


def test_sinkhorn_is_stable_for_large_scores():
    # exp(1e4) overflows in any dtype: a probability-space implementation returns NaN, log space does not.
    scores = _scores(4, 5, dtype=torch.float32, seed=6, scale=1e4).requires_grad_(True)
    assert not torch.isfinite(_naive_sinkhorn(scores.detach(), 1.0, 1)).all()
    p = sinkhorn(scores, tau=1.0, n_iter=50)
    assert torch.isfinite(p).all() and torch.all(p >= 0)
    torch.testing.assert_close(p.detach().sum(1), torch.ones(4, 5), atol=1e-5, rtol=0)
    (grad,) = torch.autograd.grad(p.square().sum(), scores)
    assert torch.isfinite(grad).all()
    # Only scores / tau matters.
    torch.testing.assert_close(p, sinkhorn(scores / 1e4, tau=1e-4, n_iter=50), atol=1e-5, rtol=0)
    base = _scores(4, 5, seed=6)
    torch.testing.assert_close(sinkhorn(1e6 * base, 1e6, 20), sinkhorn(base, 1.0, 20))


def test_sinkhorn_gradcheck():
    scores = _scores(2, 4, seed=7).requires_grad_(True)
    lengths = torch.tensor([4, 3])
    assert torch.autograd.gradcheck(lambda s: sinkhorn(s, 0.7, 10), (scores,))
    assert torch.autograd.gradcheck(lambda s: sinkhorn(s, 1.3, 5, lengths), (scores,))


def test_gumbel_sinkhorn():
    scores = _scores(8, 5, seed=8)
    lengths = torch.tensor([5, 5, 4, 4, 3, 3, 2, 1])
    p1 = gumbel_sinkhorn(scores, 0.5, 30, torch.Generator().manual_seed(3), lengths)
    p2 = MATCHING.gumbel_sinkhorn(scores, 0.5, 30, torch.Generator().manual_seed(3), lengths)
    assert torch.equal(p1, p2)
    noisy = scores + gumbel_like(scores, torch.Generator().manual_seed(3))
    torch.testing.assert_close(p1, sinkhorn(noisy, 0.5, 30, lengths))
    # Small tau: the relaxation of perturb-and-MAP with the same noise.
    p = gumbel_sinkhorn(scores, 0.01, 1000, torch.Generator().manual_seed(4), lengths)
    z = MATCHING.sample(scores, lengths, torch.Generator().manual_seed(4))
    assert torch.equal(torch.round(p), z)


# --------------------------------------------------------------------------------------------------- SparseMAP


@pytest.mark.parametrize("n", range(1, 5))
@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_sparsemap_in_birkhoff_polytope_and_optimal(n, scale):
    scores = _scores(6, n, seed=10 * n, scale=scale)
    mu = MATCHING.sparsemap(scores)
    assert MATCHING.sparsemap is not Structure.sparsemap  # padding sanitiser in front of the generic solver
    assert torch.all(mu >= -1e-12)
    ones = torch.ones(6, n, dtype=torch.float64)
    torch.testing.assert_close(mu.sum(1), ones, atol=1e-10, rtol=0)
    torch.testing.assert_close(mu.sum(2), ones, atol=1e-10, rtol=0)
    # First-order optimality of the projection: <s - μ, v - μ> ≤ tol for every permutation matrix v.
    gaps = torch.einsum("bij,vbij->bv", scores - mu, enumerated(MATCHING, n)[:, None] - mu[None])
    assert gaps.max() <= 1e-6 * max(1.0, scores.abs().max().item() * n)
    sol = sparsemap_active_set(MATCHING, scores, tol=1e-12)
    torch.testing.assert_close(mu, sol.mu, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_sparsemap_matches_direct_qp(n):
    scores = _scores(3, n, seed=20 + n, scale=0.7)
    mu = sparsemap_active_set(MATCHING, scores, tol=1e-12).mu
    for b in range(3):
        torch.testing.assert_close(mu[b], _qp_birkhoff(scores[b]), atol=1e-5, rtol=0)


def test_sparsemap_gradcheck():
    scores = _scores(2, 3, seed=30, scale=0.5).requires_grad_(True)
    lengths = torch.tensor([3, 2])  # a full and a cropped example
    assert torch.autograd.gradcheck(lambda s: MATCHING.sparsemap(s, lengths), (scores,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparsemap_dtype(dtype):
    scores = _scores(4, 5, dtype=dtype, seed=31).requires_grad_(True)
    mu = MATCHING.sparsemap(scores)
    assert mu.dtype == dtype
    (grad,) = torch.autograd.grad(mu, scores, torch.randn_like(mu))
    assert grad.dtype == dtype and torch.isfinite(grad).all()


# ------------------------------------------------------------------------------------------------------ lengths


def test_lengths_equal_the_cropped_problems():
    n, lengths = 5, torch.tensor([5, 3, 1, 4, 2, 0])
    clean = _scores(len(lengths), n, seed=40, scale=1.5)
    scores = clean.clone()
    for b, length in enumerate(lengths.tolist()):  # padding may hold anything
        scores[b, length:, :] = float("-inf")
        scores[b, :, length:] = float("nan")
    scores.requires_grad_(True)
    outputs = {
        "map": MATCHING.map(scores, lengths),
        "sinkhorn": sinkhorn(scores, 0.8, 15, lengths),
        "sparsemap": MATCHING.sparsemap(scores, lengths),
        "sample": MATCHING.sample(scores, lengths, torch.Generator().manual_seed(0)),
        "gumbel_sinkhorn": gumbel_sinkhorn(scores, 0.8, 15, torch.Generator().manual_seed(0), lengths),
    }
    for b, length in enumerate(lengths.tolist()):
        block = clean[b : b + 1, :length, :length]
        if length:
            torch.testing.assert_close(outputs["map"][b, :length, :length], MATCHING.map(block)[0])
            torch.testing.assert_close(outputs["sinkhorn"][b, :length, :length], sinkhorn(block, 0.8, 15)[0])
            torch.testing.assert_close(outputs["sparsemap"][b, :length, :length], MATCHING.sparsemap(block)[0])
        for name, out in outputs.items():
            assert torch.isfinite(out[b]).all(), name
            assert torch.all(out[b, length:, :] == 0) and torch.all(out[b, :, length:] == 0), name
        for name in ("map", "sample"):
            _assert_permutation(outputs[name][b], length)
    for name in ("sinkhorn", "sparsemap", "gumbel_sinkhorn"):
        (grad,) = torch.autograd.grad(outputs[name], scores, torch.randn_like(clean))
        assert torch.isfinite(grad).all(), name
        for b, length in enumerate(lengths.tolist()):
            assert torch.all(grad[b, length:, :] == 0) and torch.all(grad[b, :, length:] == 0), name


# --------------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    lengths = torch.tensor([5, 3, 1])
    scores = _scores(3, 5, dtype=dtype, seed=50)
    methods = (
        MATCHING.map,
        MATCHING.sparsemap,
        lambda s, n: sinkhorn(s, 0.5, 20, n),
    )
    for method in methods:
        on_gpu = method(scores.cuda(), lengths.cuda())
        assert on_gpu.is_cuda and on_gpu.dtype == dtype
        torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths), atol=1e-5, rtol=1e-5)
    z = MATCHING.sample(scores.cuda(), lengths.cuda(), torch.Generator(device="cuda").manual_seed(0))
    assert z.is_cuda
    for zb, length in zip(z.cpu(), lengths.tolist(), strict=True):
        _assert_permutation(zb, length)

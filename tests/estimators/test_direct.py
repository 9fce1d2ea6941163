"""The direct loss minimization estimator (seed 002, seed 003): latentstruct/estimators/direct.py.

The central check: with a loss linear in z, L(z) = <c, z>, the direct gradient averaged over many noise draws must
approach, as |ε| → 0 and for both signs of ε, the gradient of the expected loss F(s, σ) = E_γ[<c, MAP(s + σγ)>]
w.r.t. the scores *and* w.r.t. σ. The draws are batched: one example expanded to a batch of N, whose leaf receives
the sum over the batch of the per-example gradients, i.e. the average direct gradient (the training loss is the batch
mean). The ground truth is computed independently of the estimator:

* TopK (n = 4, k = 2): Gumbel-perturbed top-k is Gumbel-top-k sampling without replacement (Plackett-Luce with
  p = softmax(s / σ)), so F is a closed form over ordered pairs, differentiated by autograd (exact).
* Matching (n = 3): no closed form; the likelihood-ratio identity for the Gumbel density g(u) = exp(-u - e^{-u})
  (integration by parts over the noise, unbiased, independent of the pathwise direct rule):
      ∂F/∂s_p = E[(L - b) (1 - e^{-G_p})] / σ,
      ∂F/∂σ   = E[(L - b) Σ_p ((1 - e^{-G_p})(G_p - c_E) - 1)] / σ,
  with G standard Gumbel, c_E Euler's constant (the estimator's noise is G - c_E) and b = E[L] a baseline. The
  identity is itself checked against the exact TopK closed form.

A wrong sign flips the gradient (errors ~ 2‖∇F‖), a wrong normalisation (1/B, 1/samples, 1/|ε|) scales it: the
tolerances below are far tighter than either.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from latentstruct.estimators.direct import EULER_GAMMA, Direct
from latentstruct.structures import Categorical, Matching, Structure, TopK, gumbel_like
from tests.structures.reference import STRUCTURES

DT = torch.float64
N_DRAWS = 200_000


class _EnumeratedMap(Structure):
    """MAP by enumerating the vertices of a small structure, vectorised over a large batch (the real Matching runs
    the Hungarian algorithm one example at a time, too slow for 10⁵ draws); checked against the real MAP below."""

    def __init__(self, base: Structure, n: int):
        self.vertices = base.enumerate(n).to(DT)

    def map(self, scores, lengths=None):
        flat = self.vertices.flatten(1)
        best = (scores.detach().flatten(1) @ flat.T).argmax(-1)
        return flat[best].view_as(scores).to(scores.dtype)


def _linear(c):
    return lambda mu: (mu * c).flatten(1).sum(-1)


def _direct_average(est, s0, sigma0, c, structure, n=N_DRAWS, seed=0):
    """The direct gradient w.r.t. (s, σ) averaged over n draws: one example expanded to a batch of n."""
    torch.manual_seed(seed)
    est.train()
    s = s0.clone().requires_grad_(True)
    sigma = sigma0.clone().requires_grad_(True)
    z = est(s.expand(n, *s0.shape), structure, None, _linear(c), sigma=sigma.expand(n))
    return torch.autograd.grad(_linear(c)(z).mean(), (s, sigma))


def _plackett_luce_truth(s0, sigma0, c):
    """Exact ∇F for TopK(2): P({i, j}) = Σ over the two orders of p_i p_j / (1 - p_i), p = softmax(s / σ)."""
    s = s0.clone().requires_grad_(True)
    sigma = sigma0.clone().requires_grad_(True)
    p = torch.softmax(s / sigma, -1)
    expected = sum(p[i] * p[j] / (1 - p[i]) * (c[i] + c[j]) for i, j in itertools.permutations(range(len(s0)), 2))
    return torch.autograd.grad(expected, (s, sigma))


def _likelihood_ratio_truth(s0, sigma0, c, structure, n=1_000_000, seed=123):
    """Unbiased ∇F by the likelihood-ratio identity of the module docstring (zero-mean Gumbel noise G - c_E)."""
    g = gumbel_like(s0.expand(n, *s0.shape).contiguous(), torch.Generator().manual_seed(seed))
    z = structure.map(s0 + sigma0 * (g - EULER_GAMMA))
    loss = _linear(c)(z)
    centred = (loss - loss.mean()).view(-1, *[1] * s0.dim())
    score_s = 1 - torch.exp(-g)
    grad_s = (centred * score_s).mean(0) / sigma0
    score_sigma = (score_s * (g - EULER_GAMMA) - 1).flatten(1).sum(-1)
    grad_sigma = (centred.flatten() * score_sigma).mean() / sigma0
    return grad_s, grad_sigma


@functools.cache
def _topk_problem():
    s0 = torch.tensor([0.3, -0.2, 0.5, 0.0], dtype=DT)
    c = torch.tensor([1.0, -0.5, 0.8, -1.2], dtype=DT)
    sigma0 = torch.tensor(0.8, dtype=DT)
    return _EnumeratedMap(TopK(2), 4), s0, c, sigma0, _plackett_luce_truth(s0, sigma0, c)


@functools.cache
def _matching_problem():
    g = torch.Generator().manual_seed(3)
    s0 = torch.randn(3, 3, dtype=DT, generator=g)
    c = torch.randn(3, 3, dtype=DT, generator=g)
    sigma0 = torch.tensor(0.8, dtype=DT)
    structure = _EnumeratedMap(Matching(), 3)
    return structure, s0, c, sigma0, _likelihood_ratio_truth(s0, sigma0, c, structure)


PROBLEMS = {"topk": _topk_problem, "matching": _matching_problem}


def _err(estimate, truth):
    return max((estimate[0] - truth[0]).abs().max().item(), (estimate[1] - truth[1]).abs().item())


# ------------------------------------------------------------------------------- the gradient of the expected loss


def test_enumerated_map_is_the_real_map():
    torch.manual_seed(0)
    x = torch.randn(500, 3, 3, dtype=DT)
    assert torch.equal(_EnumeratedMap(Matching(), 3).map(x), Matching().map(x))
    y = torch.randn(500, 4, dtype=DT)
    assert torch.equal(_EnumeratedMap(TopK(2), 4).map(y), TopK(2).map(y))


def test_likelihood_ratio_ground_truth_matches_the_exact_topk_gradient():
    structure, s0, c, sigma0, exact = _topk_problem()
    grad_s, grad_sigma = _likelihood_ratio_truth(s0, sigma0, c, structure)
    torch.testing.assert_close(grad_s, exact[0], atol=0.01, rtol=0)
    torch.testing.assert_close(grad_sigma, exact[1], atol=0.02, rtol=0)


@pytest.mark.parametrize("name", PROBLEMS)
def test_direct_gradient_tends_to_the_expected_loss_gradient(name):
    """Both signs of ε: close to ∇F (s and σ) at |ε| = 0.1, off at |ε| = 1; the mean of the ±ε estimates cancels
    the O(ε) bias and lands on ∇F."""
    structure, s0, c, sigma0, truth = PROBLEMS[name]()
    scale = max(truth[0].abs().max().item(), abs(truth[1].item()))
    estimates = {}
    for eps in (0.1, -0.1, 1.0, -1.0):
        estimates[eps] = _direct_average(Direct(epsilon=eps, max_retries=0), s0, sigma0, c, structure)
    for sign in (1, -1):
        small, large = _err(estimates[0.1 * sign], truth), _err(estimates[1.0 * sign], truth)
        assert small < 0.2 * scale, (sign, small, scale)
        assert small < large, (sign, small, large)
    central = tuple((a + b) / 2 for a, b in zip(estimates[0.1], estimates[-0.1], strict=True))
    assert _err(central, truth) < 0.06 * scale, (_err(central, truth), scale)


def test_samples_are_averaged():
    """samples = 4 on N/4 examples estimates the same gradient (a missing or doubled 1/samples would not)."""
    structure, s0, c, sigma0, truth = _topk_problem()
    plus = _direct_average(Direct(0.1, samples=4, max_retries=0), s0, sigma0, c, structure, n=N_DRAWS // 4)
    minus = _direct_average(Direct(-0.1, samples=4, max_retries=0), s0, sigma0, c, structure, n=N_DRAWS // 4)
    central = tuple((a + b) / 2 for a, b in zip(plus, minus, strict=True))
    assert _err(central, truth) < 0.03, _err(central, truth)


@pytest.mark.parametrize("name", PROBLEMS)
@pytest.mark.parametrize("eps", [-12.0, 12.0])
def test_large_epsilon_with_retries_is_a_descent_direction(name, eps):
    """The defaults (|ε| = 12, retries on) are biased but the score gradient still points downhill for the expected
    loss (<g, ∇F> > 0; cosines 0.41-0.98 here), for both signs. (The σ gradient is not checked: at |ε| = 12 its bias
    flips its sign on both problems with ε < 0.)"""
    structure, s0, c, sigma0, truth = PROBLEMS[name]()
    grad_s, _ = _direct_average(Direct(epsilon=eps), s0, sigma0, c, structure, n=20_000)
    cosine = torch.nn.functional.cosine_similarity(grad_s.flatten(), truth[0].flatten(), dim=0)
    assert cosine > 0.2, cosine


# ------------------------------------------------------------------------------------------------------ retries


class _Counting(Categorical):
    def __init__(self):
        self.calls = 0

    def map(self, scores, lengths=None):
        self.calls += 1
        return super().map(scores, lengths)


@pytest.mark.parametrize("sign", [-1, 1])
def test_zero_update_with_positive_loss_grows_epsilon_per_example_up_to_the_cap(sign):
    """σ = 0, ε = ±0.1. Example 0 needs |ε| > 2.5 to move (34 growths: 0.1·1.1³⁴ ≈ 2.57, 0.1·1.1³³ ≈ 2.33), example 1
    moves at once, example 2 has a negative loss, and no ε can move example 3 (ẑ already has the extreme loss)."""
    eps = 0.1 * sign
    s = torch.tensor([[0.0, 2.0, 5.0], [0.0, 0.1, -1.0], [0.0, 2.0, 5.0], [0.0, 2.0, 5.0]], dtype=DT)
    c = torch.tensor([[1.0, 2.0, 3.0], [0.0, 2.0, 0.0], [-1.0, -2.0, -3.0], [3.0, 2.0, 1.0]], dtype=DT)
    if sign > 0:  # "away from best": the same geometry with the loss order reversed
        c = torch.tensor([[3.0, 2.0, 1.0], [0.0, -2.0, 0.0], [-3.0, -2.0, -1.0], [1.0, 2.0, 3.0]], dtype=DT)
    batch = s.shape[0]
    e = torch.eye(3, dtype=DT)
    for cap, calls in ((100, 2 + 1 + 34), (34, 2 + 1 + 34), (33, 2 + 1 + 33), (0, 2)):
        structure = _Counting()
        est = Direct(epsilon=eps, sigma=0.0, max_retries=cap).train()
        leaf = s.clone().requires_grad_(True)
        z = est(leaf, structure, None, _linear(c))
        (grad,) = torch.autograd.grad(_linear(c)(z).mean(), leaf)
        assert structure.calls == calls, (cap, structure.calls)
        expected = torch.zeros_like(s)
        if cap >= 34:
            expected[0] = (e[0] - e[2]) / (eps * 1.1**34) / batch
        expected[1] = (e[0] - e[1]) / eps / batch
        torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)


def test_retries_stop_where_the_loss_is_not_positive():
    s = torch.tensor([[0.0, 2.0, 5.0]], dtype=DT, requires_grad=True)
    structure = _Counting()
    z = Direct(epsilon=-0.1, sigma=0.0).train()(s, structure, None, lambda mu: (mu * 0.0).sum(-1))
    (grad,) = torch.autograd.grad(z.sum() * 0, s)
    assert structure.calls == 2 and torch.equal(grad, torch.zeros_like(grad))


# ----------------------------------------------------------------------------------------------------- sigma


def test_sigma_zero_is_deterministic_direct_loss_minimization():
    torch.manual_seed(0)
    s = torch.randn(6, 5, dtype=DT)
    c = torch.randn(6, 5, dtype=DT)
    cat = Categorical()
    results = []
    for samples in (1, 5, 1):
        leaf = s.clone().requires_grad_(True)
        z = Direct(epsilon=-0.7, sigma=0.0, samples=samples, max_retries=0).train()(leaf, cat, None, _linear(c))
        (grad,) = torch.autograd.grad(_linear(c)(z).mean(), leaf)
        results.append((z, grad))
    z_hat, z_eps = cat.map(s), cat.map(s - 0.7 * c)
    for z, grad in results:
        assert torch.equal(z, z_hat)
        torch.testing.assert_close(grad, (z_eps - z_hat) / -0.7 / 6, rtol=0, atol=1e-12)


def test_a_learned_sigma_tensor_gets_its_gradient():
    torch.manual_seed(1)
    s = torch.randn(8, 4, dtype=DT)
    c = torch.randn(8, 4, dtype=DT)
    grads = {}
    for shape in ((8,), (8, 1), (), (1,)):
        sigma = torch.full(shape, 0.9, dtype=DT, requires_grad=True)
        leaf = s.clone().requires_grad_(True)
        torch.manual_seed(2)  # the same noise for every shape
        z = Direct(epsilon=-0.5, max_retries=0).train()(leaf, TopK(2), None, _linear(c), sigma=sigma)
        g_s, g_sigma = torch.autograd.grad(_linear(c)(z).mean(), (leaf, sigma))
        assert g_sigma.shape == sigma.shape and torch.isfinite(g_sigma).all()
        grads[shape] = (g_s, g_sigma)
    assert grads[(8,)][1].abs().sum() > 0
    # One σ per example or one shared σ: the same noise, the same score gradient; the shared one sums.
    for shape in ((8, 1), (), (1,)):
        torch.testing.assert_close(grads[shape][0], grads[(8,)][0])
    torch.testing.assert_close(grads[(8, 1)][1].flatten(), grads[(8,)][1])
    torch.testing.assert_close(grads[()][1], grads[(8,)][1].sum())
    # σ = 0 as a tensor: MAP(s) forward, yet σ still gets the gradient <γ, ẑ_ε - ẑ> / (B ε).
    sigma = torch.zeros(8, dtype=DT, requires_grad=True)
    z = Direct(epsilon=-3.0).train()(s, TopK(2), None, _linear(c), sigma=sigma)
    assert torch.equal(z, TopK(2).map(s))
    (g_sigma,) = torch.autograd.grad(_linear(c)(z).mean(), sigma)
    assert torch.isfinite(g_sigma).all() and g_sigma.abs().sum() > 0


def test_scores_without_grad_and_no_downstream():
    s = torch.randn(3, 4, dtype=DT)
    z = Direct().train()(s, Categorical())  # nothing needs a gradient: no downstream needed
    assert z.shape == s.shape
    with pytest.raises(ValueError, match="downstream"):
        Direct().train()(s.requires_grad_(True), Categorical())


# ------------------------------------------------------------------------------------------------------ evaluation


@pytest.mark.parametrize("eval_latent", ["relaxed", "map"])
def test_evaluation_returns_the_noise_free_map(eval_latent):
    torch.manual_seed(0)
    s = torch.randn(5, 4, 4, dtype=DT, requires_grad=True)
    est = Direct(sigma=3.0, samples=3, eval_latent=eval_latent).eval()
    for sigma in (None, torch.full((5,), 2.0, dtype=DT, requires_grad=True)):
        z = est(s, Matching(), sigma=sigma)
        assert torch.equal(z, Matching().map(s)) and not z.requires_grad


# ------------------------------------------------------------------------------------------- every structure


SHAPES = {  # scores [B, *parts] and lengths, for structures of tests/structures/reference.py
    "categorical": ((4, 6), None),
    "projective_multiroot": ((3, 5, 5), [4, 2, 3]),
    "nonprojective_single_root": ((3, 5, 5), [4, 2, 3]),
    "sequence": ((3, 4, 3, 3), [4, 2, 3]),
    "binary_tree": ((3, 5, 5), [5, 2, 3]),
    "matching": ((3, 4, 4), [4, 2, 3]),
    "topk": ((3, 5), [5, 2, 3]),
}


@pytest.mark.parametrize("name", SHAPES)
def test_runs_on_every_structure(name):
    structure, (shape, lengths) = STRUCTURES[name], SHAPES[name]
    lengths = None if lengths is None else torch.tensor(lengths)
    torch.manual_seed(0)
    s = torch.randn(*shape, dtype=DT, requires_grad=True)
    c = torch.randn(*shape, dtype=DT)
    sigma = torch.full((shape[0],), 0.7, dtype=DT, requires_grad=True)

    def downstream(mu):
        return (mu * c).flatten(1).sum(-1) ** 2

    est = Direct(epsilon=-2.0, samples=3).train()
    z = est(s, structure, lengths, downstream, sigma=sigma)
    assert z.shape == s.shape
    assert torch.equal(structure.map(z, lengths), z)  # a vertex is its own MAP
    g_s, g_sigma = torch.autograd.grad(downstream(z).mean(), (s, sigma))
    assert torch.isfinite(g_s).all() and g_s.abs().sum() > 0 and torch.isfinite(g_sigma).all()
    # Parts that no vertex uses (padding, the root column, the diagonal) get no gradient.
    support = torch.zeros_like(s, dtype=torch.bool)
    for _ in range(30):
        support |= structure.map(torch.randn_like(s) * 3, lengths) > 0
    assert torch.equal(g_s[~support], torch.zeros_like(g_s[~support]))
    assert torch.equal(est.eval()(s, structure, lengths), structure.map(s, lengths))


# ------------------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0},
        {"epsilon": math.inf},
        {"epsilon": True},
        {"sigma": -0.1},
        {"sigma": math.nan},
        {"samples": 0},
        {"samples": 1.5},
        {"grow": 1.0},
        {"grow": 0.9},
        {"max_retries": -1},
        {"max_retries": 2.5},
        {"eval_latent": "sample"},
    ],
)
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        Direct(**kwargs)


def test_bad_sigma_tensors_are_refused():
    s = torch.randn(4, 3, dtype=DT, requires_grad=True)
    est = Direct().train()
    down = _linear(torch.ones(4, 3, dtype=DT))
    with pytest.raises(ValueError, match="one element per example"):
        est(s, Categorical(), None, down, sigma=torch.ones(3, dtype=DT))
    with pytest.raises(ValueError, match=">= 0"):
        est(s, Categorical(), None, down, sigma=-torch.ones(4, dtype=DT))
    with pytest.raises(ValueError, match=">= 0"):
        est(s, Categorical(), None, down, sigma=-1.0)
    with pytest.raises(ValueError, match="one loss per example"):
        est(s, Categorical(), None, lambda mu: mu.sum(), sigma=None)

"""The MAP-oracle estimators (blackbox, imle, perturbed): their formulas on small Categorical cases, computed here by
hand with the same noise (the same seed), the blackbox sign against the paper's minimisation form, descent on a loss
whose minimiser is known, the sum-of-gamma noise's moments, and perturbed's gradient against the exact Jacobian of
the Gaussian-perturbed argmax (K = 2, a closed form)."""

import math

import pytest
import torch
import torch.nn.functional as F

from latentstruct.estimators import Blackbox, Imle, Perturbed, sum_of_gamma_like
from latentstruct.structures import TopK, gumbel_like
from tests.estimators.test_estimators import CASES, CAT, _case, _close, _drive, _linear, _one_hot_argmax

LAMS = [0.5, 2.0, 10.0]


def _one_hot_argmin(x):
    return F.one_hot(x.argmin(-1), x.shape[-1]).to(x.dtype)


def _rows(x, n):
    """[B, K] → [n·B, K], row m·B + b = x[b] (the estimators' draw order), written independently."""
    return torch.cat([x] * n, 0)


# ----------------------------------------------------------------------------------------------------------- blackbox


@pytest.mark.parametrize("b,k,seed", CASES)
def test_blackbox(b, k, seed):
    s, c = _case(b, k, seed)
    gamma = c / b  # the gradient of the batch mean of <z, c>
    for lam in LAMS:
        z, g = _drive(Blackbox(lam), s, _linear(c))
        assert torch.equal(z, _one_hot_argmax(s))
        _close(g, (_one_hot_argmax(s) - _one_hot_argmax(s - lam * gamma)) / lam)


@pytest.mark.parametrize("b,k,seed", CASES)
def test_blackbox_is_the_papers_minimisation_rule_with_cost_minus_scores(b, k, seed):
    """Vlastelica et al.'s rule as they state it, for a solver y(w) = argmin <w, y>: w' = w + λ ∂L/∂y,
    ∂L/∂w = −(y(w) − y(w'))/λ. Our scores are s = −w, so ∂L/∂s = −∂L/∂w."""
    s, c = _case(b, k, seed)
    for lam in LAMS:
        w = -s
        dl_dy = c / b
        w_prime = w + lam * dl_dy
        grad_w = -(_one_hot_argmin(w) - _one_hot_argmin(w_prime)) / lam
        _, g = _drive(Blackbox(lam), s, _linear(c))
        _close(g, -grad_w)


def test_blackbox_step_decreases_a_loss_with_a_known_minimiser():
    """L = <c, z>, minimal at the category of the smallest c (2 here); MAP(s) = category 0, the worst. One gradient
    step on s must move MAP to the minimiser; the opposite sign would leave it at category 0."""
    s = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    c = torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64)
    z, g = _drive(Blackbox(10.0), s, _linear(c))
    assert z.argmax().item() == 0
    assert g[0, 0] > 0 and g[0, 2] < 0  # lower the score of the current vertex, raise the minimiser's
    after = CAT.map(s - 20.0 * g)
    assert after.argmax().item() == 2
    assert _linear(c)(after).item() < _linear(c)(z).item()


def test_blackbox_gradient_is_zero_where_the_perturbation_does_not_change_the_map():
    s = torch.tensor([[5.0, 0.0, 0.0]], dtype=torch.float64)
    c = torch.tensor([[0.1, 0.0, -0.1]], dtype=torch.float64)
    _, g = _drive(Blackbox(1.0), s, _linear(c))
    assert torch.equal(g, torch.zeros_like(g))
    _, g = _drive(Blackbox(100.0), s, _linear(c))  # a larger λ reaches the minimiser
    _close(g, torch.tensor([[0.01, 0.0, -0.01]], dtype=torch.float64))


# --------------------------------------------------------------------------------------------------------------- imle


def _imle_expected(s, c, lam, noise):
    """Forward mean_m onehot(argmax(s + ε_m)); gradient mean_m (MAP(s + ε_m) − MAP(s − λγ + ε_m)) / λ; noise
    [S·B, K] in draw order."""
    b = s.shape[0]
    n = noise.shape[0] // b
    s_rep, gamma_rep = _rows(s, n), _rows(c / b, n)
    z_all = _one_hot_argmax(s_rep + noise)
    target = _one_hot_argmax(s_rep - lam * gamma_rep + noise)
    z = z_all.view(n, b, -1).mean(0)
    g = ((z_all - target) / lam).view(n, b, -1).mean(0)
    return z, g


@pytest.mark.parametrize("samples", [1, 3])
@pytest.mark.parametrize("b,k,seed", CASES)
def test_imle_sum_of_gamma(b, k, seed, samples):
    """On Categorical every vertex has one part: the default k is 1."""
    s, c = _case(b, k, seed)
    for lam, tau in [(0.5, 1.0), (2.0, 0.5), (10.0, 2.0)]:
        torch.manual_seed(300 + seed)
        noise = sum_of_gamma_like(_rows(s, samples), 1.0, terms=10, tau=tau)
        torch.manual_seed(300 + seed)
        z, g = _drive(Imle(lam, noise_temperature=tau, samples=samples), s, _linear(c))
        want_z, want_g = _imle_expected(s, c, lam, noise)
        _close(z, want_z)
        _close(g, want_g)
        if samples == 1:
            assert torch.equal(z, _one_hot_argmax(s + noise))  # the forward value is the perturbed MAP


@pytest.mark.parametrize("b,k,seed", CASES)
def test_imle_gumbel_noise_and_explicit_k(b, k, seed):
    s, c = _case(b, k, seed)
    torch.manual_seed(400 + seed)
    noise = 0.7 * gumbel_like(_rows(s, 2))
    torch.manual_seed(400 + seed)
    z, g = _drive(Imle(3.0, noise="gumbel", noise_temperature=0.7, samples=2), s, _linear(c))
    want_z, want_g = _imle_expected(s, c, 3.0, noise)
    _close(z, want_z)
    _close(g, want_g)
    torch.manual_seed(500 + seed)
    noise = sum_of_gamma_like(s, 4.0, terms=5, tau=1.5)
    torch.manual_seed(500 + seed)
    z, g = _drive(Imle(3.0, noise_k=4, noise_terms=5, noise_temperature=1.5), s, _linear(c))
    _close(z, _one_hot_argmax(s + noise))
    _close(g, _imle_expected(s, c, 3.0, noise)[1])


@pytest.mark.parametrize("b,k,seed", CASES)
def test_imle_without_noise_is_blackbox(b, k, seed):
    s, c = _case(b, k, seed)
    for lam in LAMS:
        z, g = _drive(Imle(lam, noise="none"), s, _linear(c))
        z_bb, g_bb = _drive(Blackbox(lam), s, _linear(c))
        assert torch.equal(z, z_bb)
        _close(g, g_bb)


def test_imle_default_k_is_the_number_of_parts_of_a_vertex():
    """On TopK(3) the default k is 3: the noise is the same as with noise_k=3."""
    structure = TopK(3)
    s = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(6)
    eps_default = Imle().noise_like(s, structure, None)
    torch.manual_seed(6)
    eps_three = Imle(noise_k=3).noise_like(s, structure, None)
    torch.manual_seed(6)
    eps_one = Imle(noise_k=1).noise_like(s, structure, None)
    assert torch.equal(eps_default, eps_three) and not torch.equal(eps_default, eps_one)


def test_imle_step_decreases_a_loss_with_a_known_minimiser():
    s = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64).expand(64, -1).clone()
    c = torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64).expand(64, -1).clone()
    torch.manual_seed(7)
    _, g = _drive(Imle(640.0, noise_temperature=0.3), s, _linear(c))  # λγ = 10 c (γ = c / 64)
    mean = g.mean(0)
    assert mean[0] > 0 and mean[2] < 0  # the expected step lowers the bad category, raises the minimiser


@pytest.mark.parametrize("k,terms,tau", [(1.0, 10, 1.0), (3.0, 10, 0.5), (5.0, 4, 2.0)])
def test_sum_of_gamma_moments(k, terms, tau):
    """Mean (τ/k)(H_κ − log κ), variance (τ²/k) Σ_{i≤κ} 1/i² (Gamma(shape 1/k, scale k/i): mean 1/i, var k/i²)."""
    torch.manual_seed(8)
    n = 200_000
    eps = sum_of_gamma_like(torch.zeros(n, dtype=torch.float64), k, terms, tau)
    harmonic = sum(1.0 / i for i in range(1, terms + 1))
    mean = tau / k * (harmonic - math.log(terms))
    var = tau**2 / k * sum(1.0 / i**2 for i in range(1, terms + 1))
    se_mean = math.sqrt(var / n)
    assert abs(eps.mean().item() - mean) < 5 * se_mean
    assert abs(eps.var().item() / var - 1) < 0.03


def test_sum_of_gamma_k_copies_sum_to_a_gumbel_like_variable():
    """Σ of k draws of SoG(k, 1, κ) has the law of Σ_{i≤κ} E_i/i − log κ, which for large κ is Gumbel(0, 1): mean
    → Euler's γ, variance → π²/6."""
    torch.manual_seed(9)
    k, terms = 4, 200
    eps = sum_of_gamma_like(torch.zeros(10_000, k, dtype=torch.float64), float(k), terms, 1.0).sum(-1)
    assert abs(eps.mean().item() - 0.5772) < 0.05
    assert abs(eps.var().item() - math.pi**2 / 6) < 0.15
    assert abs(eps.median().item() + math.log(math.log(2))) < 0.05  # the Gumbel median


def test_sum_of_gamma_takes_one_k_per_example():
    torch.manual_seed(10)
    k = torch.tensor([1.0, 8.0], dtype=torch.float64)
    eps = sum_of_gamma_like(torch.zeros(2, 50_000, dtype=torch.float64), k, 10, 1.0)
    var = [1.0 / kk * sum(1.0 / i**2 for i in range(1, 11)) for kk in (1.0, 8.0)]
    for row, v in zip(eps, var, strict=True):
        assert abs(row.var().item() / v - 1) < 0.05


# ---------------------------------------------------------------------------------------------------------- perturbed


@pytest.mark.parametrize("b,k,seed", CASES)
def test_perturbed(b, k, seed):
    s, c = _case(b, k, seed)
    gamma = c / b
    for sigma, samples in [(0.5, 1), (1.0, 4), (2.0, 7)]:
        torch.manual_seed(600 + seed)
        z_noise = torch.randn(samples * b, k, dtype=torch.float64)
        torch.manual_seed(600 + seed)
        y, g = _drive(Perturbed(sigma, samples=samples), s, _linear(c))
        y_all = _one_hot_argmax(_rows(s, samples) + sigma * z_noise)
        _close(y, y_all.view(samples, b, k).mean(0))
        inner = (y_all * _rows(gamma, samples)).sum(-1, keepdim=True)  # ⟨y_m, γ⟩
        _close(g, (z_noise * inner).view(samples, b, k).sum(0) / (samples * sigma))


def test_perturbed_gradient_is_the_jacobian_of_the_gaussian_smoothed_argmax():
    """K = 2: y*_σ(s)_0 = P(s0 + σZ0 > s1 + σZ1) = Φ((s0 − s1)/(σ√2)); the gradient of <y*_σ, c> is
    (c0 − c1) φ(d) / (σ√2) · (1, −1). Many draws in one call: the estimate is within a few standard errors."""
    s = torch.tensor([[0.3, -0.2]], dtype=torch.float64)
    c = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    sigma, n = 0.8, 100_000
    d = (s[0, 0] - s[0, 1]) / (sigma * math.sqrt(2))
    density = math.exp(-d.item() ** 2 / 2) / math.sqrt(2 * math.pi)
    exact = (c[0, 0] - c[0, 1]) * density / (sigma * math.sqrt(2)) * torch.tensor([1.0, -1.0], dtype=torch.float64)
    torch.manual_seed(11)
    y, g = _drive(Perturbed(sigma, samples=n), s, _linear(c))
    p0 = 0.5 * (1 + math.erf(d.item() / math.sqrt(2)))
    assert abs(y[0, 0].item() - p0) < 5 * math.sqrt(p0 * (1 - p0) / n)
    # a per-draw term Z_m ⟨y_m, c⟩ / σ has variance ≤ E[Z²] max|c|² / σ² = (2 / σ)²
    se = 2.0 / sigma / math.sqrt(n)
    assert ((g[0] - exact).abs() < 4 * se).all(), (g, exact)


def test_perturbed_is_a_descent_direction_on_average():
    s = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    c = torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64)
    torch.manual_seed(12)
    _, g = _drive(Perturbed(1.0, samples=5000), s, _linear(c))
    assert g[0, 0] > 0 and g[0, 2] < 0


# --------------------------------------------------------------------------------------------------- shared behaviour


MAKERS = [lambda: Blackbox(), lambda: Imle(), lambda: Imle(noise="gumbel", samples=3), lambda: Perturbed()]


@pytest.mark.parametrize("make", MAKERS)
def test_needs_no_downstream_and_evaluates_to_map(make):
    s, c = _case(3, 4, 13)
    est = make().train()
    leaf = s.clone().requires_grad_(True)
    z = est(leaf, CAT, None, None)
    (z * c).sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    est.eval()
    state = torch.get_rng_state()
    assert torch.equal(est(s, CAT), _one_hot_argmax(s))
    assert torch.equal(torch.get_rng_state(), state)  # evaluation is noise-free


@pytest.mark.parametrize("make", MAKERS)
def test_lengths_repeat_with_the_draws(make):
    """A padded TopK batch: every draw sees its example's length (the padding is never selected)."""
    structure = TopK(2)
    s = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 3, 4])
    z = make().train()(s, structure, lengths, None)
    pad = torch.arange(6) >= lengths.view(-1, 1)
    assert (z[pad] == 0).all()
    torch.testing.assert_close(z.sum(-1), torch.full((3,), 2.0, dtype=torch.float64))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Blackbox(0.0), "lam"),
        (lambda: Blackbox(float("nan")), "lam"),
        (lambda: Imle(-1.0), "lam"),
        (lambda: Imle(noise="normal"), "noise"),
        (lambda: Imle(noise_k=0), "noise_k"),
        (lambda: Imle(noise_terms=0), "noise_terms"),
        (lambda: Imle(noise_temperature=0.0), "noise_temperature"),
        (lambda: Imle(samples=0), "samples"),
        (lambda: Imle(samples=1.5), "samples"),
        (lambda: Perturbed(0.0), "sigma"),
        (lambda: Perturbed(samples=0), "samples"),
    ],
)
def test_invalid_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()

"""The estimator formulas of DESIGN.md §5, asserted exactly on small Categorical cases.

With the linear downstream loss L_b(μ) = <μ_b, c_b> and the training loss its batch mean, γ(μ) = c / B at every μ,
so each surrogate gradient has a closed form computed here independently of the package.
"""

import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from latentstruct.estimators import (
    Blackbox,
    Direct,
    GumbelSoftmax,
    Imle,
    Marginals,
    PerturbAndMap,
    Perturbed,
    Ppo,
    Sfe,
    Sparsemap,
    Spigot,
    SpigotCe,
    SpigotEg,
    SteI,
    SteS,
    StGumbel,
    ppo_loss,
)
from latentstruct.structures import Categorical, gumbel_like

CAT = Categorical()
ATOL = 1e-10
CASES = [(1, 2, 0), (3, 4, 1), (5, 6, 2), (8, 3, 3)]  # (B, K, seed)
ETAS = [0.1, 1.0, 7.5]
STEPS = [1, 2, 5]
TAUS = [0.5, 1.0, 3.0]


def _case(b, k, seed):
    g = torch.Generator().manual_seed(seed)
    s = 1.5 * torch.randn(b, k, generator=g, dtype=torch.float64)
    c = torch.randn(b, k, generator=g, dtype=torch.float64)
    return s, c


def _linear(c):
    return lambda mu: (mu * c).sum(-1)


def _drive(est, s, downstream, structure=CAT):
    """As the task does: latent = est(s, structure, None, downstream); loss = mean(downstream(latent))."""
    est.train()
    s = s.clone().requires_grad_(True)
    z = est(s, structure, None, downstream)
    loss = downstream(z).mean()
    (g,) = torch.autograd.grad(loss, s)
    return z.detach(), g


def _one_hot_argmax(x):
    return F.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype)


def _project_simplex(v):
    """Euclidean projection of each row onto the simplex (sort-and-threshold rule), written independently."""
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1
    ranks = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype)
    rho = (u - css / ranks > 0).sum(-1, keepdim=True)
    tau = css.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - tau).clamp_min(0)


def _softmax_jacobian(x):
    """The full Jacobian of softmax, diag(p) - p pᵀ, built explicitly: [B, K, K]."""
    p = torch.softmax(x, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def _jt_gamma(x, gamma):
    return (_softmax_jacobian(x).transpose(-1, -2) @ gamma.unsqueeze(-1)).squeeze(-1)


def _close(a, b, atol=ATOL):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


# ------------------------------------------------------------------------------------------- the pulled-back family


@pytest.mark.parametrize("b,k,seed", CASES)
def test_ste_i(b, k, seed):
    s, c = _case(b, k, seed)
    for eta, steps in itertools.product(ETAS, STEPS):
        z, g = _drive(SteI(eta, steps=steps), s, _linear(c))
        assert torch.equal(z, _one_hot_argmax(s))
        _close(g, steps * eta * c / b)


@pytest.mark.parametrize("b,k,seed", CASES)
def test_spigot(b, k, seed):
    s, c = _case(b, k, seed)
    z_hat, gamma = _one_hot_argmax(s), c / b
    for eta, steps in itertools.product(ETAS, STEPS):
        z, g = _drive(Spigot(eta, steps=steps), s, _linear(c))
        assert torch.equal(z, z_hat)
        mu = z_hat
        for _ in range(steps):
            mu = _project_simplex(mu - eta * gamma)
        _close(g, z_hat - mu)
        if steps == 1:
            _close(g, z_hat - _project_simplex(z_hat - eta * gamma))


@pytest.mark.parametrize("b,k,seed", CASES)
def test_spigot_ce(b, k, seed):
    s, c = _case(b, k, seed)
    gamma = c / b
    for eta, steps in itertools.product(ETAS, STEPS):
        z, g = _drive(SpigotCe(eta, steps=steps), s, _linear(c))
        assert torch.equal(z, _one_hot_argmax(s))
        mu0 = mu = torch.softmax(s, -1)
        for _ in range(steps):
            mu = _project_simplex(mu - eta * gamma)
        _close(g, mu0 - mu)


@pytest.mark.parametrize("b,k,seed", CASES)
def test_spigot_eg(b, k, seed):
    s, c = _case(b, k, seed)
    gamma = c / b
    for eta, steps in itertools.product(ETAS, STEPS):
        z, g = _drive(SpigotEg(eta, steps=steps), s, _linear(c))
        assert torch.equal(z, _one_hot_argmax(s))
        s_t = s
        for _ in range(steps):
            s_t = s_t - eta * gamma
        _close(g, torch.softmax(s, -1) - torch.softmax(s_t, -1))
        _close(g, torch.softmax(s, -1) - torch.softmax(s - steps * eta * gamma, -1))


def test_pulled_back_inner_steps_use_the_loss_gradient_at_the_iterate():
    """With a nonlinear loss γ changes along the path: check the k-step recursions against autograd's γ(μ_t)."""
    s, c = _case(4, 5, 7)
    d = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(8))

    def downstream(mu):
        return (mu * c).sum(-1) ** 2 + (mu * d).sum(-1)

    def gamma(mu):
        mu = mu.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(downstream(mu).mean(), mu)
        return g

    eta, steps = 0.7, 3
    z_hat, p = _one_hot_argmax(s), torch.softmax(s, -1)
    expected = {}
    mu = z_hat
    for _ in range(steps):
        mu = mu - eta * gamma(mu)
    expected[SteI] = z_hat - mu
    mu = z_hat
    for _ in range(steps):
        mu = _project_simplex(mu - eta * gamma(mu))
    expected[Spigot] = z_hat - mu
    mu = p
    for _ in range(steps):
        mu = _project_simplex(mu - eta * gamma(mu))
    expected[SpigotCe] = p - mu
    s_t, mu = s, p
    for _ in range(steps):
        s_t = s_t - eta * gamma(mu)
        mu = torch.softmax(s_t, -1)
    expected[SpigotEg] = p - mu
    for cls, want in expected.items():
        _, g = _drive(cls(eta, steps=steps), s, downstream)
        _close(g, want)


# ------------------------------------------------------------------------------------------------------------- STE-S


@pytest.mark.parametrize("b,k,seed", CASES)
def test_ste_s_is_the_full_softmax_jacobian(b, k, seed):
    s, c = _case(b, k, seed)
    z, g = _drive(SteS(), s, _linear(c))
    assert torch.equal(z, _one_hot_argmax(s))
    _close(g, _jt_gamma(s, c / b))


def test_ste_s_is_not_the_diagonal_only_version():
    s = torch.tensor([[1.0, 0.0, -0.5]], dtype=torch.float64)
    c = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    _, g = _drive(SteS(), s, _linear(c))
    p = torch.softmax(s, -1)
    diagonal_only = p * (1 - p) * c  # the authors' code (seed 001 notes it)
    assert (g - diagonal_only).abs().max() > 1e-2
    _close(g, _jt_gamma(s, c))


# ------------------------------------------------------------------------------------- straight-through Gumbel


@pytest.mark.parametrize("cls", [StGumbel, PerturbAndMap])
@pytest.mark.parametrize("b,k,seed", CASES)
def test_st_gumbel(b, k, seed, cls):
    s, c = _case(b, k, seed)
    for tau in TAUS:
        torch.manual_seed(100 + seed)
        noise = gumbel_like(s)
        torch.manual_seed(100 + seed)
        z, g = _drive(cls(tau), s, _linear(c))
        assert torch.equal(z, _one_hot_argmax(s + noise))
        _close(g, _jt_gamma((s + noise) / tau, c / b) / tau)


# -------------------------------------------------------------------------------------------------------- relaxations


@pytest.mark.parametrize("b,k,seed", CASES)
def test_marginals_estimator(b, k, seed):
    s, c = _case(b, k, seed)
    z, g = _drive(Marginals(), s, _linear(c))
    _close(z, torch.softmax(s, -1))
    _close(g, _jt_gamma(s, c / b))


@pytest.mark.parametrize("b,k,seed", CASES)
def test_sparsemap_estimator(b, k, seed):
    s, c = _case(b, k, seed)
    z, g = _drive(Sparsemap(), s, _linear(c))
    _close(z, _project_simplex(s))
    # the sparsemax Jacobian: on the support S, γ_S - mean(γ_S); zero off it
    support = (z > 0).double()
    gamma = c / b
    mean_on_support = (gamma * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    _close(g, support * (gamma - mean_on_support))


@pytest.mark.parametrize("b,k,seed", CASES)
def test_gumbel_softmax(b, k, seed):
    s, c = _case(b, k, seed)
    for tau in TAUS:
        torch.manual_seed(200 + seed)
        noise = gumbel_like(s)
        torch.manual_seed(200 + seed)
        z, g = _drive(GumbelSoftmax(tau), s, _linear(c))
        _close(z, torch.softmax((s + noise) / tau, -1))
        _close(g, _jt_gamma((s + noise) / tau, c / b) / tau)

        est = GumbelSoftmax(tau).eval()
        state = torch.get_rng_state()
        _close(est(s, CAT), torch.softmax(s / tau, -1))
        assert torch.equal(torch.get_rng_state(), state)  # evaluation is noise-free


# --------------------------------------------------------------------------------------------------------- eval mode

NON_RELAXED = [
    lambda e: SteI(1.0, steps=2, eval_latent=e),
    lambda e: SteS(eval_latent=e),
    lambda e: Spigot(1.0, steps=2, eval_latent=e),
    lambda e: SpigotCe(1.0, steps=2, eval_latent=e),
    lambda e: SpigotEg(1.0, steps=2, eval_latent=e),
    lambda e: StGumbel(0.5, eval_latent=e),
    lambda e: PerturbAndMap(0.5, eval_latent=e),
    lambda e: Sfe("moving_average", eval_latent=e),
    lambda e: Sfe("rloo", samples=3, eval_latent=e),
    lambda e: Blackbox(2.0, eval_latent=e),
    lambda e: Imle(eval_latent=e),
    lambda e: Imle(noise="gumbel", samples=3, eval_latent=e),
    lambda e: Perturbed(samples=4, eval_latent=e),
]
RELAXED = [
    (lambda e: Marginals(eval_latent=e), lambda s: torch.softmax(s, -1)),
    (lambda e: Sparsemap(eval_latent=e), _project_simplex),
    (lambda e: GumbelSoftmax(2.0, eval_latent=e), lambda s: torch.softmax(s / 2.0, -1)),
]


@pytest.mark.parametrize("eval_latent", ["relaxed", "map"])
@pytest.mark.parametrize("make", NON_RELAXED)
def test_eval_non_relaxed_returns_map(make, eval_latent):
    s, _ = _case(5, 4, 9)
    est = make(eval_latent).eval()
    assert not est.relaxed
    z = est(s.clone().requires_grad_(True), CAT)  # no downstream needed at evaluation
    assert torch.equal(z, _one_hot_argmax(s))


@pytest.mark.parametrize("eval_latent", ["relaxed", "map"])
@pytest.mark.parametrize("make,relaxation", RELAXED)
def test_eval_relaxed_returns_relaxation_or_map(make, relaxation, eval_latent):
    s, _ = _case(5, 4, 9)
    est = make(eval_latent).eval()
    assert est.relaxed
    z = est(s, CAT)
    if eval_latent == "relaxed":
        _close(z, relaxation(s))
    else:
        assert torch.equal(z, _one_hot_argmax(s))


# --------------------------------------------------------------------------------------------------------------- SFE


def _sfe_exact_gradient(s0, downstream):
    """∇_s E_{z ~ softmax(s)} L(z) by enumeration of the K vertices and autograd; s0 is [1, K]."""
    s = s0.clone().requires_grad_(True)
    vertices = CAT.enumerate(s.shape[-1]).to(s)
    losses = downstream(vertices)  # [V]
    (g,) = torch.autograd.grad((torch.softmax(s, -1)[0] * losses).sum(), s)
    return g


def _sfe_run(est, s0, downstream, n, seed):
    """One call with n copies of s0: returns the gradient w.r.t. s0, the samples and their losses."""
    est.train()
    s_leaf = s0.clone().requires_grad_(True)
    s = s_leaf.expand(n, -1)
    torch.manual_seed(seed)
    z = est(s, CAT, None, downstream)
    loss = downstream(z).mean()
    (g,) = torch.autograd.grad(loss, s_leaf)
    return g, z.detach(), downstream(z.detach())


def _nonlinear():
    c = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    d = torch.tensor([[0.3, 1.0, -1.5]], dtype=torch.float64)
    return lambda mu: (mu * c).sum(-1) ** 2 + (mu * d).sum(-1)


S0 = torch.tensor([[0.4, -0.3, 1.0]], dtype=torch.float64)
N_SFE = 20_000


def test_sfe_without_baseline_is_unbiased():
    downstream = _nonlinear()
    g, z, losses = _sfe_run(Sfe("none"), S0, downstream, N_SFE, seed=0)
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    per_sample = losses.unsqueeze(-1) * (z - torch.softmax(S0, -1))  # (L_b - 0) ∇ log p(z_b)
    _close(g, per_sample.mean(0, keepdim=True))  # the estimator's own formula, exactly
    se = per_sample.std(0) / math.sqrt(N_SFE)
    exact = _sfe_exact_gradient(S0, downstream)
    assert ((g - exact).abs() <= 4 * se + 1e-12).all(), (g, exact, se)


def test_sfe_with_moving_average_baseline_is_unbiased_after_warm_up():
    downstream = _nonlinear()
    est = Sfe("moving_average", decay=0.9)
    _sfe_run(est, S0, downstream, 100, seed=1)  # warm-up: sets the running loss
    baseline = est.running_loss.clone().double()
    assert torch.isfinite(baseline)
    g, z, losses = _sfe_run(est, S0, downstream, N_SFE, seed=2)
    per_sample = (losses - baseline).unsqueeze(-1) * (z - torch.softmax(S0, -1))
    _close(g, per_sample.mean(0, keepdim=True))
    se = per_sample.std(0) / math.sqrt(N_SFE)
    exact = _sfe_exact_gradient(S0, downstream)
    assert ((g - exact).abs() <= 4 * se + 1e-12).all(), (g, exact, se)
    # updated after use: b <- decay b + (1 - decay) mean(L)
    expected = 0.9 * baseline + 0.1 * losses.mean()
    torch.testing.assert_close(est.running_loss.double(), expected, atol=1e-6, rtol=1e-6)


def test_sfe_moving_average_reduces_variance():
    base = _nonlinear()

    def downstream(mu):
        return base(mu) + 20.0  # a large constant offset: the no-baseline estimator is very noisy

    est = Sfe("moving_average", decay=0.5)
    for seed in range(5):
        _sfe_run(est, S0, downstream, 200, seed=10 + seed)
    baseline = est.running_loss.clone().double()  # the value the next call uses
    _, z, losses = _sfe_run(est, S0, downstream, 2000, seed=20)
    p = torch.softmax(S0, -1)
    _, z0, losses0 = _sfe_run(Sfe("none"), S0, downstream, 2000, seed=20)
    var_ma = ((losses - baseline).unsqueeze(-1) * (z - p)).var(0).sum()
    var_none = (losses0.unsqueeze(-1) * (z0 - p)).var(0).sum()
    assert var_ma < 0.1 * var_none


def test_sfe_gives_the_decoder_its_usual_gradient():
    torch.manual_seed(0)
    decoder = torch.nn.Linear(3, 1).double()

    def downstream(mu):
        return decoder(mu).squeeze(-1) ** 2

    s = S0.expand(7, -1).clone().requires_grad_(True)
    torch.manual_seed(1)
    z = Sfe("none")(s, CAT, None, downstream)
    downstream(z).mean().backward()
    got = decoder.weight.grad.clone()
    decoder.zero_grad()
    downstream(z.detach()).mean().backward()
    _close(got, decoder.weight.grad)


def test_sfe_self_critical_baseline_on_a_structure_is_the_map_loss():
    """baseline=self_critical on a structure: b_b = L_b(MAP(s_b)); the estimator's gradient uses L − b exactly."""
    downstream = _nonlinear()
    s = torch.tensor([[0.4, -0.3, 1.0], [2.0, 0.1, -1.0]], dtype=torch.float64)
    g, z, losses = _sfe_run_batch(Sfe("self_critical"), s, downstream, seed=3)
    greedy = downstream(_one_hot_argmax(s))
    _close(g, (losses - greedy).unsqueeze(-1) * (z - torch.softmax(s, -1)) / 2)


def _sfe_draws(s, m, seed):
    """The M draws the estimator makes after ``torch.manual_seed(seed)``: one exact_sample call on the batch
    repeated M times (row m·B + b = draw m of example b), as [M, B, K]."""
    torch.manual_seed(seed)
    return CAT.exact_sample(torch.cat([s] * m, 0)).view(m, *s.shape)


def test_sfe_with_several_samples_averages_their_estimates_and_feeds_the_first():
    downstream = _nonlinear()
    s = torch.tensor([[0.4, -0.3, 1.0], [2.0, 0.1, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    for baseline in ("none", "self_critical"):
        g, z, _ = _sfe_run_batch(Sfe(baseline, samples=5), s, downstream, seed=4)
        draws = _sfe_draws(s, 5, seed=4)
        assert torch.equal(z, draws[0])
        losses = torch.stack([downstream(d) for d in draws])  # [M, B]
        if baseline == "self_critical":
            losses = losses - downstream(_one_hot_argmax(s))
        per_draw = losses.unsqueeze(-1) * (draws - torch.softmax(s, -1))
        _close(g, per_draw.mean(0) / 3)


def test_sfe_rloo_advantage_is_the_loss_minus_the_mean_of_the_other_draws():
    est = Sfe("rloo", samples=3)
    losses = torch.tensor([[1.0, 4.0], [2.0, 0.0], [6.0, 2.0]])
    want = torch.tensor([[1.0 - 4.0, 4.0 - 1.0], [2.0 - 3.5, 0.0 - 3.0], [6.0 - 1.5, 2.0 - 2.0]])
    torch.testing.assert_close(est.advantage(losses), want)
    torch.testing.assert_close(want, 3 / 2 * (losses - losses.mean(0)))  # the same, as M/(M−1)(L − mean)
    with pytest.raises(ValueError, match="rloo"):
        est.advantage(torch.tensor([1.0, 2.0]))  # one draw per example: no leave-one-out


def test_sfe_rloo_gradient_formula():
    downstream = _nonlinear()
    s = torch.tensor([[0.4, -0.3, 1.0], [2.0, 0.1, -1.0]], dtype=torch.float64)
    g, z, _ = _sfe_run_batch(Sfe("rloo", samples=4), s, downstream, seed=5)
    draws = _sfe_draws(s, 4, seed=5)
    assert torch.equal(z, draws[0])
    losses = torch.stack([downstream(d) for d in draws])  # [M, B]
    others = torch.stack([torch.cat([losses[:m], losses[m + 1:]]).mean(0) for m in range(4)])
    per_draw = (losses - others).unsqueeze(-1) * (draws - torch.softmax(s, -1))
    _close(g, per_draw.mean(0) / 2)


def test_sfe_rloo_is_unbiased_and_beats_no_baseline():
    """Monte Carlo on a 3-category case: the mean over many examples (copies of S0) of the rloo estimate is within
    4 standard errors of the exact ∇_s E[L], and its variance is below the no-baseline estimator's at the same M."""
    def downstream(mu):
        return _nonlinear()(mu) + 5.0  # an offset, which the leave-one-out baseline removes

    n, m = 5000, 4
    s = S0.expand(n, -1).clone()
    p = torch.softmax(S0, -1)
    exact = _sfe_exact_gradient(S0, downstream)
    g, _, _ = _sfe_run(Sfe("rloo", samples=m), S0, downstream, n, seed=6)
    draws = _sfe_draws(s, m, seed=6)
    losses = torch.stack([downstream(d) for d in draws])
    per_example = (m / (m - 1) * (losses - losses.mean(0))).unsqueeze(-1) * (draws - p)
    per_example = per_example.mean(0)  # [n, K]: one estimate per example
    _close(g, per_example.mean(0, keepdim=True))
    se = per_example.std(0) / math.sqrt(n)
    assert ((g - exact).abs() <= 4 * se + 1e-12).all(), (g, exact, se)
    plain = (losses.unsqueeze(-1) * (draws - p)).mean(0)
    assert per_example.var(0).sum() < 0.2 * plain.var(0).sum()


def test_rloo_and_several_samples_are_for_a_structure():
    _, log_probs, _, mask = _policy()
    losses = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    for est in (Sfe("rloo", samples=2), Sfe("none", samples=3)):
        with pytest.raises(ValueError, match="sequential policy"):
            est.policy_loss(log_probs, mask, losses)
    with pytest.raises(ValueError, match="rloo"):
        Ppo("rloo")


def _sfe_run_batch(est, s0, downstream, seed):
    est.train()
    s = s0.clone().requires_grad_(True)
    torch.manual_seed(seed)
    z = est(s, CAT, None, downstream)
    (g,) = torch.autograd.grad(downstream(z).mean(), s)
    return g, z.detach(), downstream(z.detach())


def test_the_control_variates_one_rule():
    """Sfe.advantage, used by sfe on a structure and by the policy estimators alike: A = L − b. The moving average
    returns the first batch's own mean on its first call (no history), then the past only, updated after use."""
    ma = Sfe("moving_average", decay=0.5)
    first = ma.advantage(torch.tensor([1.0, 3.0]))
    assert first.tolist() == [-1.0, 1.0]  # b = 2.0, the first batch's mean
    assert ma.running_loss.item() == 2.0
    assert ma.advantage(torch.tensor([5.0, 5.0])).tolist() == [3.0, 3.0]  # b = 2 (the past), then 3.5
    assert ma.advantage(torch.tensor([0.0])).tolist() == [-3.5]
    assert ma.state_dict()["running_loss"].item() == pytest.approx(1.75)
    assert Sfe("none").advantage(torch.tensor([1.0, 3.0])).tolist() == [1.0, 3.0]
    critic = Sfe("self_critical")
    assert critic.advantage(torch.tensor([1.0, 3.0]), lambda: torch.tensor([2.0, 2.5])).tolist() == [-1.0, 0.5]
    with pytest.raises(ValueError, match="greedy"):
        critic.advantage(torch.tensor([1.0]))
    # normalisation: A / max(1, σ), σ² ← 0.5 σ² + 0.5 var(A) from σ² = 1
    norm = Sfe("none", normalize_advantage=True, norm_decay=0.5)
    a = torch.tensor([0.0, 6.0])  # var 9 → σ² = 5
    torch.testing.assert_close(norm.advantage(a), a / math.sqrt(5.0))
    small = torch.tensor([0.0, 0.2])  # σ² = 2.5 + 0.005 > 1: still divided
    torch.testing.assert_close(norm.advantage(small), small / math.sqrt(0.5 * 5.0 + 0.5 * 0.01))
    assert "advantage_var" in norm.state_dict() and "advantage_var" not in Sfe().state_dict()


def _policy(seed=0):
    """Per-step log-probabilities of a tiny sequential policy (two steps over three choices), and its entropies."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 3, (4, 2), generator=g)
    log_p = logits.log_softmax(-1)
    log_probs = log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    mask = torch.tensor([[True, True], [True, False], [True, True], [False, False]])
    return logits, log_probs, entropy, mask


def test_sfe_policy_loss_is_reinforce_with_the_control_variate():
    logits, log_probs, entropy, mask = _policy()
    losses = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    est = Sfe("moving_average", entropy_weight=0.1)
    est.advantage(torch.tensor([4.0, 2.0], dtype=torch.float64))  # history: b = 3 (then 3·0.9 + 0.1·... )
    b = float(est.running_loss)
    got = est.policy_loss(log_probs, mask, losses, entropy)
    expected = (((losses - b) * log_probs.masked_fill(~mask, 0).sum(-1))
                - 0.1 * entropy.masked_fill(~mask, 0).sum(-1)).mean()
    _close(got, expected)
    with pytest.raises(ValueError, match="ppo"):
        est.policy_loss(log_probs, mask, losses, old_log_probs=log_probs.detach())
    with pytest.raises(ValueError, match="sequential"):
        est.train()(S0.clone().requires_grad_(True), CAT, None, _nonlinear())  # no entropy rule for a structure


def test_ppo_policy_loss_is_the_clipped_surrogate_and_refuses_a_structure():
    logits, log_probs, entropy, mask = _policy(1)
    losses = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    old = (log_probs + 0.3).detach()  # ρ = e^{-0.3 · steps}: clipped for the two-step examples
    ppo = Ppo("self_critical", entropy_weight=0.01, clip=0.2, refresh=4)
    greedy = torch.tensor([1.5, 1.5, 1.5, 1.5], dtype=torch.float64)
    got = ppo.policy_loss(log_probs, mask, losses, entropy, lambda: greedy, old)
    bonus = 0.01 * entropy.masked_fill(~mask, 0).sum(-1).mean()
    expected = ppo_loss(log_probs, old, mask, greedy - losses, 0.2) - bonus
    _close(got, expected)
    # at ρ = 1 the gradient is Sfe's
    fresh = ppo.policy_loss(log_probs, mask, losses, None, lambda: greedy, log_probs.detach())
    ref = Sfe("self_critical").policy_loss(log_probs, mask, losses, None, lambda: greedy)
    (g1,) = torch.autograd.grad(fresh, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(ref, logits)
    _close(g1, g2)
    with pytest.raises(ValueError, match="old_log_probs"):
        ppo.policy_loss(log_probs, mask, losses, None, lambda: greedy)
    with pytest.raises(ValueError, match="sfe"):
        ppo.train()(S0.clone().requires_grad_(True), CAT, None, _nonlinear())
    with pytest.raises(ValueError, match="clip"):
        Ppo(clip=1.5)


def test_st_gumbel_on_masked_choices_is_one_hot_forward_softmax_backward():
    """What the merge parser feeds it at every merge: scores with −inf on the pairs that do not exist."""
    scores = torch.randn(6, 5, dtype=torch.float64).requires_grad_()
    allowed = torch.arange(5) < torch.tensor([5, 3, 1, 4, 2, 5]).view(-1, 1)
    masked = scores.masked_fill(~allowed, float("-inf"))
    w = torch.randn(6, 5, dtype=torch.float64)
    torch.manual_seed(3)
    y = StGumbel(0.5).train()(masked, CAT)
    assert ((y == 0) | (y == 1)).all() and (y.sum(-1) == 1).all() and not (y.bool() & ~allowed).any()
    (grad_st,) = torch.autograd.grad((y * w).sum(), scores, retain_graph=True)
    torch.manual_seed(3)
    noise = gumbel_like(masked)
    assert torch.equal(y, _one_hot_argmax(masked + noise))
    (grad_soft,) = torch.autograd.grad((((masked + noise) / 0.5).softmax(-1) * w).sum(), scores)
    torch.testing.assert_close(grad_st, grad_soft)
    assert grad_st.abs().sum() > 0 and (grad_st[~allowed] == 0).all()


# ------------------------------------------------------------------------------ downstream never touches the decoder


PULLED_BACK = [SteI, Spigot, SpigotCe, SpigotEg]


def _decoder_downstream(calls):
    torch.manual_seed(3)
    decoder = torch.nn.Linear(4, 3).double()
    y = torch.tensor([0, 2, 1, 1, 0])

    def downstream(mu):
        calls.append(1)
        return F.cross_entropy(decoder(mu), y, reduction="none")

    return decoder, downstream


@pytest.mark.parametrize("cls", PULLED_BACK)
def test_pulled_back_calls_leave_no_gradient_on_decoder(cls):
    s, _ = _case(5, 4, 11)

    # full training step: the decoder's gradient is exactly the one a plain MAP forward gives it
    calls = []
    decoder, downstream = _decoder_downstream(calls)
    s_leaf = s.clone().requires_grad_(True)
    z = cls(0.5, steps=3).train()(s_leaf, CAT, None, downstream)
    downstream(z).mean().backward()
    assert len(calls) == 1 + (2 if cls in (SteI, Spigot) else 3)  # the main call plus the pull-back steps
    got = decoder.weight.grad.clone(), decoder.bias.grad.clone()
    decoder.zero_grad()
    downstream(CAT.map(s)).mean().backward()
    _close(got[0], decoder.weight.grad)
    _close(got[1], decoder.bias.grad)

    # a loss that does not involve the decoder: the pull-back steps call it, yet its .grad stays None
    calls = []
    decoder, downstream = _decoder_downstream(calls)
    s_leaf = s.clone().requires_grad_(True)
    z = cls(0.5, steps=3).train()(s_leaf, CAT, None, downstream)
    (z * torch.arange(4.0, dtype=z.dtype)).sum().backward()
    assert len(calls) == (2 if cls in (SteI, Spigot) else 3)
    assert decoder.weight.grad is None and decoder.bias.grad is None
    assert s_leaf.grad is not None


# ------------------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "make",
    [
        lambda: SpigotCe(1.0),
        lambda: SpigotEg(1.0),
        lambda: SteI(1.0, steps=2),
        lambda: Spigot(1.0, steps=2),
        lambda: Sfe(),
        lambda: Sfe("moving_average"),
        lambda: Sfe("rloo", samples=2),
        lambda: Direct(),
    ],
)
def test_estimators_that_need_downstream_say_so(make):
    """... and how to build it, pointing to the page that explains it."""
    s, _ = _case(3, 4, 12)
    assert (Path(__file__).resolve().parents[2] / "docs" / "library.md").is_file()
    with pytest.raises(ValueError, match=r"needs the `downstream` closure .*lambda mu: .*docs/library\.md"):
        # the error may come from the forward or from the backward, where the pull-back steps run
        z = make().train()(s.clone().requires_grad_(True), CAT, None, None)
        z.sum().backward()


@pytest.mark.parametrize("make", [lambda: SteI(1.0), lambda: Spigot(1.0), lambda: SteS(), lambda: StGumbel()])
def test_estimators_that_do_not_need_downstream_work_without_it(make):
    s, _ = _case(3, 4, 13)
    s = s.clone().requires_grad_(True)
    z = make().train()(s, CAT, None, None)
    z.sum().backward()
    assert s.grad is not None and torch.isfinite(s.grad).all()


@pytest.mark.parametrize("cls", PULLED_BACK)
@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_invalid_steps(cls, steps):
    with pytest.raises(ValueError, match="steps"):
        cls(1.0, steps=steps)


@pytest.mark.parametrize("cls", PULLED_BACK)
@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan")])
def test_invalid_eta(cls, eta):
    with pytest.raises(ValueError, match="eta"):
        cls(eta)


@pytest.mark.parametrize("cls", [StGumbel, PerturbAndMap, GumbelSoftmax])
@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan")])
def test_invalid_tau(cls, tau):
    with pytest.raises(ValueError, match="tau"):
        cls(tau)


@pytest.mark.parametrize("kwargs", [{"baseline": "mean"}, {"baseline": None}, {"decay": 1.0}, {"decay": -0.1},
                                    {"norm_decay": 1.0}, {"samples": 0}, {"samples": 2.0},
                                    {"baseline": "rloo"}, {"baseline": "rloo", "samples": 1}])
def test_invalid_sfe_arguments(kwargs):
    with pytest.raises(ValueError, match="baseline|decay|samples"):
        Sfe(**kwargs)


@pytest.mark.parametrize("make", [lambda e: SteS(eval_latent=e), lambda e: Marginals(eval_latent=e)])
def test_invalid_eval_latent(make):
    with pytest.raises(ValueError, match="eval_latent"):
        make("sample")


@pytest.mark.parametrize(
    "est", [SpigotCe(1.0), SpigotEg(1.0), SteI(1.0, steps=2), Spigot(1.0, steps=3)], ids=lambda e: type(e).__name__
)
def test_missing_downstream_fails_in_the_forward_pass(est):
    est.train()
    s = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="downstream"):
        est(s, Categorical(), None, None)

"""Implicit gradients of seed 004 (eq. 3-4): Hessian-vector products against finite differences, the implicit gradient
against the analytic total derivative of a quadratic bi-level problem, the Neumann series' convergence, and the
implicit gradient against autograd through a long unrolled inner optimisation; conjugate gradient (its stopping rule,
its cap, its stop on negative curvature, its damped system) against a dense solve."""

from __future__ import annotations

import pytest
import torch

import latentstruct.models.implicit as implicit_module
from latentstruct.models.implicit import (
    cg_inverse_hvp,
    exact_inverse_hvp,
    grad_or_zeros,
    hvp,
    implicit_gradient,
    minres_inverse_hvp,
    mixed_vp,
    neumann_inverse_hvp,
)

DT = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=DT)


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


# --------------------------------------------------------------------------------------- HVPs vs finite differences


def _smooth_loss(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """A non-quadratic scalar of three tensors with every second derivative non-zero (c enters bilinearly)."""
    m = _randn(3, 4, seed=1)
    return torch.tanh(a @ m @ b).pow(2).sum() + (a.exp() * c).sum() + torch.log1p((b * b).sum()) * (c * c).sum()


def _fd_grad_direction(fn, params: list[torch.Tensor], v: list[torch.Tensor], wrt: list[torch.Tensor], eps=1e-6):
    """(∇_wrt L(params + εv) − ∇_wrt L(params − εv)) / 2ε, the central difference of a gradient along v."""

    def grads(sign: float) -> list[torch.Tensor]:
        with torch.no_grad():
            for p, d in zip(params, v, strict=True):
                p.add_(sign * eps * d)
        g = torch.autograd.grad(fn(), wrt, allow_unused=True)
        with torch.no_grad():
            for p, d in zip(params, v, strict=True):
                p.sub_(sign * eps * d)
        return [torch.zeros_like(w) if x is None else x for x, w in zip(g, wrt, strict=True)]

    plus, minus = grads(1.0), grads(-1.0)
    return [(p - m) / (2 * eps) for p, m in zip(plus, minus, strict=True)]


def test_hvp_matches_finite_differences():
    a = _randn(3, seed=2).requires_grad_()
    b = _randn(4, seed=3).requires_grad_()
    c = _randn(3, seed=4).requires_grad_()
    theta = [a, b]
    v = [_randn(3, seed=5), _randn(4, seed=6)]
    fn = lambda: _smooth_loss(a, b, c)  # noqa: E731
    got = hvp(fn(), theta, v)
    want = _fd_grad_direction(fn, theta, v, theta)
    assert torch.allclose(_flat(got), _flat(want), atol=1e-7, rtol=1e-6)
    # reusing precomputed first gradients gives the same product
    grads = torch.autograd.grad(fn(), theta, create_graph=True)
    assert torch.allclose(_flat(hvp(list(grads), theta, v)), _flat(got), atol=1e-12)


def test_mixed_vp_matches_finite_differences():
    a = _randn(3, seed=7).requires_grad_()
    b = _randn(4, seed=8).requires_grad_()
    c = _randn(3, seed=9).requires_grad_()
    unused = _randn(2, seed=10).requires_grad_()
    v = [_randn(3, seed=11), _randn(4, seed=12)]
    fn = lambda: _smooth_loss(a, b, c)  # noqa: E731
    got = mixed_vp(fn(), [a, b], [c, unused], v)
    # (∂²L/∂φ∂θ) v = d/dε ∇_φ L(θ + εv, φ)
    want = _fd_grad_direction(fn, [a, b], v, [c, unused])
    assert torch.allclose(_flat(got), _flat(want), atol=1e-7, rtol=1e-6)
    assert torch.equal(got[1], torch.zeros(2, dtype=DT))
    assert _flat(got).abs().max() > 0.1  # a non-trivial cross term


def test_grad_or_zeros_handles_unused_and_graphless_outputs():
    x = torch.ones(2, dtype=DT, requires_grad=True)
    y = torch.ones(3, dtype=DT, requires_grad=True)
    g = grad_or_zeros((x * x).sum(), [x, y])
    assert torch.equal(g[0], 2 * x.detach()) and torch.equal(g[1], torch.zeros(3, dtype=DT))
    assert all(torch.equal(t, torch.zeros_like(t)) for t in grad_or_zeros([torch.zeros(2, dtype=DT)], [x], [x]))


# ------------------------------------------------------------------------------------ the quadratic bi-level problem


class Quadratic:
    """θ ∈ R^n (two tensors), φ ∈ R^m (two tensors, plus one that appears in no loss):

        L_aux(θ, φ)  = ½ θᵀAθ − θᵀBφ + ½ ‖φ‖²                       θ*(φ) = A⁻¹Bφ
        L_prim(θ, φ) = ½ ‖Cθ − d‖² + eᵀφ + ½ φᵀDφ

    so that  dL_prim/dφ = (A⁻¹B)ᵀ Cᵀ(Cθ* − d) + e + Dφ  (the implicit part, then the explicit ∂L_prim/∂φ).
    A is SPD with eigenvalues in [1, 10]."""

    n1, n2, m1, m2 = 3, 2, 2, 2

    def __init__(self) -> None:
        n, m = self.n1 + self.n2, self.m1 + self.m2
        q, _ = torch.linalg.qr(_randn(n, n, seed=20))
        self.eigs = torch.linspace(1.0, 10.0, n, dtype=DT)
        self.A = q @ torch.diag(self.eigs) @ q.T
        self.B = _randn(n, m, seed=21)
        self.C = _randn(4, n, seed=22)
        self.d = _randn(4, seed=23)
        self.e = _randn(m, seed=24)
        dd = _randn(m, m, seed=25)
        self.D = dd @ dd.T
        self.phi_value = _randn(m, seed=26)

    def params(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Leaves (θ at its optimum θ*(φ), φ): θ = [θ1, θ2], φ = [φ1, φ2, unused]."""
        theta_star = torch.linalg.solve(self.A, self.B @ self.phi_value)
        theta = [t.clone().requires_grad_() for t in theta_star.split([self.n1, self.n2])]
        phi = [t.clone().requires_grad_() for t in self.phi_value.split([self.m1, self.m2])]
        return theta, phi + [torch.zeros(3, dtype=DT, requires_grad=True)]

    def losses(self, theta: list[torch.Tensor], phi: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        t, f = torch.cat(theta), torch.cat(phi[:2])
        aux = 0.5 * t @ self.A @ t - t @ self.B @ f + 0.5 * f @ f
        r = self.C @ t - self.d
        prim = 0.5 * r @ r + self.e @ f + 0.5 * f @ self.D @ f
        return prim, aux

    def total_derivative(self) -> torch.Tensor:
        f = self.phi_value
        theta_star = torch.linalg.solve(self.A, self.B @ f)
        dtheta_dphi = torch.linalg.solve(self.A, self.B)  # [n, m]
        return dtheta_dphi.T @ self.C.T @ (self.C @ theta_star - self.d) + self.e + self.D @ f

    def explicit(self) -> torch.Tensor:
        return self.e + self.D @ self.phi_value


def _implicit(problem: Quadratic, **kwargs) -> list[torch.Tensor]:
    theta, phi = problem.params()
    prim, aux = problem.losses(theta, phi)
    return implicit_gradient(prim, aux, theta, phi, **kwargs)


def test_implicit_gradient_with_exact_inverse_is_the_total_derivative():
    problem = Quadratic()
    got = _implicit(problem, inverse_hvp=exact_inverse_hvp)
    want = problem.total_derivative()
    assert [g.shape for g in got] == [(2,), (2,), (3,)]
    assert torch.equal(got[2], torch.zeros(3, dtype=DT))  # φ that no loss uses
    assert torch.allclose(_flat(got[:2]), want, atol=1e-10)
    # the test can tell: the explicit part alone, or the implicit term with the wrong sign, is far off
    implicit_part = want - problem.explicit()
    assert implicit_part.norm() > 0.5
    assert not torch.allclose(_flat(got[:2]), problem.explicit() - implicit_part, atol=1e-2)


def test_neumann_series_converges_to_the_total_derivative():
    problem = Quadratic()
    want = problem.total_derivative()
    alpha = 1.0 / problem.eigs.max().item()  # eigenvalues of I − αA in [0, 0.9]
    errors = [(_flat(_implicit(problem, terms=k, alpha=alpha)[:2]) - want).norm().item() for k in (0, 5, 20, 50, 200)]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[0] > 0.1 and errors[-1] < 1e-8 * want.norm().item(), errors


def test_neumann_inverse_hvp_matches_solve_and_diverges_past_two_over_lambda_max():
    problem = Quadratic()
    theta, phi = problem.params()
    _, aux = problem.losses(theta, phi)
    grads = torch.autograd.grad(aux, theta, create_graph=True)
    v = [_randn(3, seed=30), _randn(2, seed=31)]
    want = torch.linalg.solve(problem.A, _flat(v))
    lam_max = problem.eigs.max().item()
    assert torch.allclose(_flat(exact_inverse_hvp(list(grads), theta, v)), want, atol=1e-12)
    good = _flat(neumann_inverse_hvp(list(grads), theta, v, terms=300, alpha=1.5 / lam_max))
    assert torch.allclose(good, want, atol=1e-10)
    # α > 2/λ_max: the top eigen-direction is amplified by |1 − αλ_max| > 1 at every term
    short = _flat(neumann_inverse_hvp(list(grads), theta, v, terms=10, alpha=2.5 / lam_max))
    long = _flat(neumann_inverse_hvp(list(grads), theta, v, terms=40, alpha=2.5 / lam_max))
    assert (long - want).norm() > 100 * (short - want).norm()


def test_implicit_gradient_is_explicit_when_primary_ignores_theta():
    problem = Quadratic()
    theta, phi = problem.params()
    _, aux = problem.losses(theta, phi)
    prim = problem.losses([t.detach() for t in theta], phi)[0]  # ȳ detached: no ∂L_prim/∂θ
    got = implicit_gradient(prim, aux, theta, phi, terms=5, alpha=0.1)
    assert torch.allclose(_flat(got[:2]), problem.explicit(), atol=1e-12)


def test_overlapping_parameter_lists_are_rejected():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="disjoint"):
        implicit_gradient((x * x).sum(), (x * x).sum(), [x], [x])


# -------------------------------------------------------------------- against autograd through an unrolled solver


def _reweighted_logistic(n: int = 12, d: int = 3, seed: int = 40):
    """Inner: per-example weights exp(φ_w) on a logistic regression with an L2 term and a linear tilt by φ_t —
    strongly convex and smooth in θ, non-linear in φ. Outer: a held-out logistic loss plus an explicit term in φ."""
    g = _gen(seed)
    x = torch.randn(n, d, generator=g, dtype=DT)
    t = (torch.rand(n, generator=g, dtype=DT) < 0.5).to(DT)
    xv = torch.randn(n, d, generator=g, dtype=DT)
    tv = (torch.rand(n, generator=g, dtype=DT) < 0.5).to(DT)
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def aux(theta: torch.Tensor, phi_w: torch.Tensor, phi_t: torch.Tensor) -> torch.Tensor:
        per = bce(x @ theta, t, reduction="none")
        return (phi_w.exp() * per).mean() + 0.5 * 0.3 * theta @ theta - theta @ phi_t

    def prim(theta: torch.Tensor, phi_w: torch.Tensor, phi_t: torch.Tensor) -> torch.Tensor:
        return bce(xv @ theta, tv) + 0.1 * (phi_w * phi_w).sum() + 0.2 * phi_t.sum()

    return aux, prim, d, n


@pytest.fixture
def unrolled():
    """The reweighted logistic problem, its φ = (φ_w, φ_t), and θ after 300 unrolled steps θ_{k+1} = θ_k − η ∇_θ
    L_aux(θ_k, φ) (η = 1), a function of φ differentiable end to end: ``(aux, prim, phi_w, phi_t, theta)``."""
    aux, prim, d, n = _reweighted_logistic()
    phi_w = (0.3 * _randn(n, seed=41)).requires_grad_()
    phi_t = (0.5 * _randn(d, seed=42)).requires_grad_()
    theta = torch.zeros(d, dtype=DT, requires_grad=True)
    for _ in range(300):
        (g,) = torch.autograd.grad(aux(theta, phi_w, phi_t), theta, create_graph=True)
        theta = theta - 1.0 * g
    return aux, prim, phi_w, phi_t, theta


def test_implicit_gradient_matches_unrolled_optimisation(unrolled):
    aux, prim, phi_w, phi_t, theta = unrolled
    # unrolled: differentiated end to end w.r.t. φ
    unrolled = torch.autograd.grad(prim(theta, phi_w, phi_t), [phi_w, phi_t])
    # implicit: at the converged θ (a fresh leaf, no history)
    theta_star = theta.detach().requires_grad_()
    (stationarity,) = torch.autograd.grad(aux(theta_star, phi_w, phi_t), theta_star)
    assert stationarity.norm() < 1e-12
    exact = implicit_gradient(
        prim(theta_star, phi_w, phi_t),
        aux(theta_star, phi_w, phi_t),
        [theta_star],
        [phi_w, phi_t],
        inverse_hvp=exact_inverse_hvp,
    )
    neumann = implicit_gradient(
        prim(theta_star, phi_w, phi_t),
        aux(theta_star, phi_w, phi_t),
        [theta_star],
        [phi_w, phi_t],
        terms=300,
        alpha=1.0,
    )
    explicit = torch.autograd.grad(prim(theta_star, phi_w, phi_t), [phi_w, phi_t])
    want = _flat(list(unrolled))
    assert torch.allclose(_flat(exact), want, atol=1e-9, rtol=1e-7)
    assert torch.allclose(_flat(neumann), want, atol=1e-8, rtol=1e-6)
    # and the implicit term matters here
    assert (_flat(list(explicit)) - want).norm() > 0.05 * want.norm()


# ------------------------------------------------------------------------------------------- conjugate gradient


def _system(eigs: torch.Tensor, seed: int = 50):
    """θ = two tensors with L = ½ θᵀAθ, A = Q diag(eigs) Qᵀ: (∇_θ L with a graph, θ, A, v)."""
    n = eigs.numel()
    q, _ = torch.linalg.qr(_randn(n, n, seed=seed))
    a = q @ torch.diag(eigs.to(DT)) @ q.T
    theta = [_randn(3, seed=seed + 1).requires_grad_(), _randn(n - 3, seed=seed + 2).requires_grad_()]
    t = torch.cat(theta)
    grads = torch.autograd.grad(0.5 * t @ a @ t, theta, create_graph=True)
    v = [_randn(3, seed=seed + 3), _randn(n - 3, seed=seed + 4)]
    return list(grads), theta, a, v


def test_cg_solves_a_positive_definite_system_to_its_tolerance_within_its_cap(monkeypatch):
    grads, theta, a, v = _system(torch.logspace(-1, 1, 12))  # κ = 100
    want = torch.linalg.solve(a, _flat(v))
    calls = []
    real_hvp = implicit_module.hvp
    monkeypatch.setattr(implicit_module, "hvp", lambda *args: calls.append(1) or real_hvp(*args))
    history: list[float] = []
    got = _flat(cg_inverse_hvp(grads, theta, v, tol=1e-6, max_iter=100, history=history))
    # it stopped on its rule: the first iterate with residual ≤ tol, one product per iteration
    assert history[-1] <= 1e-6 < min(history[:-1]) and len(calls) == len(history) <= 12 + 2  # n, + rounding
    residual = (_flat(v) - a @ got).norm() / _flat(v).norm()
    assert residual <= 1e-6 and torch.allclose(got, want, rtol=1e-4, atol=1e-8)
    # the cap: 3 products, however far from the tolerance
    calls.clear()
    capped: list[float] = []
    cg_inverse_hvp(grads, theta, v, tol=1e-12, max_iter=3, history=capped)
    assert len(calls) == len(capped) == 3 and capped[-1] > 1e-3
    # a loose tolerance stops early; tol reached at once (v = 0) costs nothing
    loose: list[float] = []
    cg_inverse_hvp(grads, theta, v, tol=0.5, max_iter=100, history=loose)
    assert len(loose) < len(history) and loose[-1] <= 0.5
    assert all(torch.equal(t, torch.zeros_like(t)) for t in cg_inverse_hvp(grads, theta, [0 * t for t in v]))


def test_cg_beats_the_series_with_fewer_products():
    grads, theta, a, v = _system(torch.logspace(-1, 1, 12))
    want = torch.linalg.solve(a, _flat(v))
    series: list[float] = []
    neumann = _flat(neumann_inverse_hvp(grads, theta, v, terms=20, alpha=1.0 / 10))
    # the series' free residual history is its true residual: of 20 terms after the 21st product
    neumann_inverse_hvp(grads, theta, v, terms=21, alpha=1.0 / 10, history=series)
    assert series[-1] == pytest.approx(((_flat(v) - a @ neumann).norm() / _flat(v).norm()).item(), rel=1e-9)
    assert all(a > b for a, b in zip(series, series[1:], strict=False))  # α = 1/λ_max: monotone
    cg = _flat(cg_inverse_hvp(grads, theta, v, tol=series[-1], max_iter=20))
    assert (cg - want).norm() < 0.5 * (neumann - want).norm()


def test_cg_stops_on_negative_curvature_and_damping_makes_the_system_definite():
    eigs = torch.tensor([-0.5, 0.2, 1.0, 2.0, 3.0, 5.0])
    grads, theta, a, v = _system(eigs, seed=60)
    history: list[float] = []
    got = cg_inverse_hvp(grads, theta, v, tol=1e-10, max_iter=50, history=history)
    assert history[-1] == float("inf")  # stopped on pᵀHp ≤ 0, not on the tolerance nor the cap
    assert len(history) < 50 and all(torch.isfinite(t).all() for t in got)
    # with μ = 1 > |λ_min| the system (H + μI) w = v is definite: solved to the tolerance
    damped: list[float] = []
    got = _flat(cg_inverse_hvp(grads, theta, v, tol=1e-10, max_iter=50, damping=1.0, history=damped))
    want = torch.linalg.solve(a + torch.eye(6, dtype=DT), _flat(v))
    assert damped[-1] <= 1e-10 and torch.allclose(got, want, atol=1e-8)


def test_cg_implicit_gradient_matches_the_unrolled_one_closer_than_the_series(unrolled):
    aux, prim, phi_w, phi_t, theta = unrolled
    want = _flat(list(torch.autograd.grad(prim(theta, phi_w, phi_t), [phi_w, phi_t])))
    theta_star = theta.detach().requires_grad_()

    def grad(**kwargs):
        return _flat(implicit_gradient(prim(theta_star, phi_w, phi_t), aux(theta_star, phi_w, phi_t), [theta_star],
                                       [phi_w, phi_t], **kwargs))

    series = grad(terms=5, alpha=1.0)
    cg = grad(inverse_hvp=lambda g, p, v: cg_inverse_hvp(g, p, v, tol=1e-8, max_iter=5))
    assert (cg - want).norm() < 1e-6 * want.norm() < (series - want).norm()
    # a wrong solver (here: the inverse's sign flipped) is caught
    flipped = grad(inverse_hvp=lambda g, p, v: [-t for t in cg_inverse_hvp(g, p, v, tol=1e-8, max_iter=5)])
    assert (flipped - want).norm() > 0.05 * want.norm()


# ------------------------------------------------------------------------------------------------------- MINRES


def test_minres_solves_an_indefinite_system_with_a_monotone_residual():
    eigs = torch.tensor([-2.0, -0.5, 0.3, 1.0, 2.0, 3.0, 5.0, 8.0])
    grads, theta, a, v = _system(eigs, seed=70)
    want = torch.linalg.solve(a, _flat(v))
    history: list[float] = []
    got = _flat(minres_inverse_hvp(grads, theta, v, tol=1e-10, max_iter=50, history=history))
    assert torch.allclose(got, want, atol=1e-8)
    assert history[-1] <= 1e-10 and len(history) <= 8 + 2  # n products, + rounding
    assert all(b <= a + 1e-12 for a, b in zip(history, history[1:], strict=False))
    # its recurrence's residual is the true one, at every cap
    for k in (1, 2, 4):
        capped: list[float] = []
        x = _flat(minres_inverse_hvp(grads, theta, v, tol=0.0, max_iter=k, history=capped))
        true = ((_flat(v) - a @ x).norm() / _flat(v).norm()).item()
        assert len(capped) == k and capped[-1] == pytest.approx(true, rel=1e-8)
    # CG on the same system stops at once on negative curvature or wanders; MINRES's damped system is solved too
    damped = _flat(minres_inverse_hvp(grads, theta, v, tol=1e-10, max_iter=50, damping=0.7))
    assert torch.allclose(damped, torch.linalg.solve(a + 0.7 * torch.eye(8, dtype=DT), _flat(v)), atol=1e-8)


def test_minres_residual_is_never_above_the_series_at_equal_products():
    eigs = torch.tensor([-1.0, 0.05, 0.2, 1.0, 2.0, 4.0, 6.0, 9.0, 12.0, 15.0])
    grads, theta, a, v = _system(eigs, seed=80)
    series: list[float] = []  # [k-1]: the first k terms' residual, made by k products (the k-th is the free one)
    neumann_inverse_hvp(grads, theta, v, terms=30, alpha=0.1, history=series)
    mr: list[float] = []
    minres_inverse_hvp(grads, theta, v, tol=0.0, max_iter=9, history=mr)
    # k products of MINRES against the first k terms (k − 1 products + the free residual)
    assert all(m <= s_ + 1e-12 for m, s_ in zip(mr, series, strict=False))
    assert mr[-1] < 0.5 * series[len(mr) - 1]
    assert series[-1] > series[9]  # the series diverges along λ < 0


def test_minres_implicit_gradient_matches_the_exact_one():
    problem = Quadratic()
    got = _implicit(problem, inverse_hvp=lambda g, p, v: minres_inverse_hvp(g, p, v, tol=1e-12, max_iter=10))
    assert torch.allclose(_flat(got[:2]), problem.total_derivative(), atol=1e-9)


# ---------------------------------------------- the products two ways: double backward and forward-over-reverse


def _tiny_bilevel(seed: int = 11):
    """θ (two tensors) and φ (two tensors) of a small non-quadratic L_aux(θ, φ) (a tanh layer read by φ) and
    L_prim(θ, φ); ``aux(w, b)`` = L_aux with θ's values replaced (φ the tensors of ``phi``), ``aux_full(w, b, u, c)``
    with φ's too."""
    w1, b1 = _randn(4, 3, seed=seed), _randn(4, seed=seed + 1)
    u, c = _randn(4, seed=seed + 2), _randn(3, seed=seed + 3)
    theta = [w1.requires_grad_(), b1.requires_grad_()]
    phi = [u.requires_grad_(), c.requires_grad_()]
    x = _randn(5, 3, seed=seed + 4)

    def aux_full(w, b, u, c):
        h = torch.tanh(x @ w.T + b)  # [5, 4]
        return (h @ u).pow(2).mean() + 0.3 * (h * h).sum() + (w.pow(2).sum(1) * c.sum()).sum() + 0.5 * (w * w).sum()

    def prim(w, b):
        return torch.sin(torch.tanh(x @ w.T + b) @ u).sum() + (c * c).sum() * b.sum()

    return theta, phi, (lambda w, b: aux_full(w, b, *phi)), prim, aux_full


def test_every_hvp_variant_equals_the_dense_hessian_times_v():
    theta, phi, aux, _, aux_full = _tiny_bilevel()
    v = [_randn(4, 3, seed=40), _randn(4, seed=41)]
    sizes, psizes = [p.numel() for p in theta], [p.numel() for p in phi]

    def split(z, like, shapes):
        return [t.view_as(p) for t, p in zip(z.split(shapes), like, strict=True)]

    z, zphi = _flat(theta).detach(), _flat(phi).detach()
    dense_h = torch.autograd.functional.hessian(lambda t: aux_full(*split(t, theta, sizes), *phi), z)
    want = dense_h @ _flat(v)
    # the mixed product (∂²L/∂φ∂θ) v: the dense |φ| × |θ| block of the joint Hessian, times v
    joint = torch.autograd.functional.hessian(lambda t: aux_full(*split(t[:z.numel()], theta, sizes),
                                                                 *split(t[z.numel():], phi, psizes)),
                                              torch.cat([z, zphi]))
    want_mixed = joint[z.numel():, :z.numel()] @ _flat(v)
    loss = aux(*theta)
    grads = grad_or_zeros(loss, theta, create_graph=True)
    op = implicit_module.ForwardOverReverse(lambda vals: aux(*vals), theta, phi)
    got = {"double backward (loss)": hvp(loss, theta, v), "double backward (reused graph)": hvp(grads, theta, v),
           "forward-over-reverse": op(v), "forward-over-reverse via hvp": hvp(op, theta, v)}
    for name, h in got.items():
        torch.testing.assert_close(_flat(h), want, rtol=1e-10, atol=1e-12, msg=name)
    assert want.abs().max() > 1e-2  # not a vacuous check
    mixed = {"double backward": mixed_vp(grads, theta, phi, v), "forward-over-reverse": op.mixed(v),
             "forward-over-reverse via mixed_vp": mixed_vp(op, theta, phi, v)}
    for name, m in mixed.items():
        torch.testing.assert_close(_flat(m), want_mixed, rtol=1e-10, atol=1e-12, msg=name)
    assert want_mixed.abs().max() > 1e-2
    # the product is of v, not of another vector
    assert not torch.allclose(_flat(op([2 * t for t in v])), want)


@pytest.mark.parametrize("solver", ["neumann", "minres", "exact"])
def test_the_implicit_gradient_is_the_same_with_either_product(solver):
    theta, phi, aux, prim, _ = _tiny_bilevel(seed=21)
    inverse = {"neumann": lambda g, p, v: neumann_inverse_hvp(g, p, v, terms=6, alpha=0.05),
               "minres": lambda g, p, v: minres_inverse_hvp(g, p, v, tol=1e-8, max_iter=50),
               "exact": exact_inverse_hvp}[solver]
    clock: dict = {}
    double = implicit_gradient(prim(*theta), aux(*theta), theta, phi, inverse_hvp=inverse)
    forward = implicit_gradient(prim(*theta), None, theta, phi, inverse_hvp=inverse, aux_fn=lambda vals: aux(*vals),
                                clock=clock)
    torch.testing.assert_close(_flat(forward), _flat(double), rtol=1e-10, atol=1e-12)
    explicit = torch.autograd.grad(prim(*theta), phi)
    assert (_flat(double) - _flat(explicit)).norm() > 1e-3 * _flat(double).norm()  # the implicit term is there
    assert clock["implicit"] > 0
    with pytest.raises(ValueError, match="aux_fn"):
        implicit_gradient(prim(*theta), None, theta, phi)


def test_a_model_without_forward_mode_derivatives_is_named():
    class NoForward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    a = _randn(3, seed=50).requires_grad_()
    op = implicit_module.ForwardOverReverse(lambda vals: NoForward.apply(vals[0]).sum(), [a])
    with pytest.raises(NotImplementedError, match="hvp=double_backward"):
        op([_randn(3, seed=51)])


def test_pack_padded_is_pack_padded_sequence_and_the_bilstm_has_forward_over_reverse_products():
    from torch.nn.utils.rnn import pack_padded_sequence

    from latentstruct.models.energy import BiLSTMFeatures
    from latentstruct.models.text import pack_padded

    x = _randn(4, 6, 3, seed=60).requires_grad_()
    lengths = torch.tensor([3, 6, 1, 3])
    ours, theirs = pack_padded(x, lengths), pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    g = _randn(*theirs.data.shape, seed=61)
    assert torch.equal(torch.autograd.grad(ours.data, x, g)[0], torch.autograd.grad(theirs.data, x, g)[0])
    # a BiLSTM over trainable embeddings (the sequence tasks' A_θ): both products agree
    torch.manual_seed(0)
    net = BiLSTMFeatures(vocab_size=9, emb_dim=3, hidden=2, freeze=False).double()
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7], [8, 0, 0, 0]])
    lens = torch.tensor([3, 4, 1])
    names = [n for n, _ in net.named_parameters()]
    theta = list(net.parameters())
    target = _randn(3, 4, 4, seed=62)

    def loss_of(values=None):
        out = net(ids, lens) if values is None else torch.func.functional_call(net, dict(zip(names, values,
                                                                                          strict=True)), (ids, lens))
        return (torch.tanh(out) * target).sum() + out.pow(2).sum()

    v = [_randn(*p.shape, seed=70 + i) for i, p in enumerate(theta)]
    double = hvp(loss_of(), theta, v)
    forward = implicit_module.ForwardOverReverse(loss_of, theta)(v)
    torch.testing.assert_close(_flat(forward), _flat(double), rtol=1e-9, atol=1e-11)
    assert _flat(double).abs().max() > 1e-3

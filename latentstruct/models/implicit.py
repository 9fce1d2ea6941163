"""Implicit gradients of a bi-level problem from Hessian-vector products only (seed 004, eq. 2-4, Appendix A).

For min_φ L_prim(θ*(φ), φ) with θ*(φ) = argmin_θ L_aux(θ, φ), the total derivative at the current (θ, φ) is

    dL_prim/dφ = ∂L_prim/∂φ  −  [∂²L_aux/∂φ∂θ] · H⁻¹ · ∂L_prim/∂θ,     H = ∂²L_aux/∂θ²               (3-4)

(both losses minimised; descend the result). Exact only at a strict local minimiser θ; Algorithm 1 uses it after
T_inner inner steps.

* :func:`hvp` (H v by double backward), :func:`mixed_vp` ((∂²L/∂φ∂θ) v); :class:`ForwardOverReverse`: the same two
  products by forward-over-reverse (re-evaluating L with θ as dual numbers; the ``forward_over_reverse`` option of
  :data:`HVPS`, chosen by an energy task's ``hvp`` setting; slower on CPU, ``results/bench/implicit.md``).
* H⁻¹ v: :func:`neumann_inverse_hvp` (the truncated series of Appendix A, step α), :func:`cg_inverse_hvp`
  ((H + μI)⁻¹ v by conjugate gradient, stops at non-positive curvature), :func:`minres_inverse_hvp` (MINRES, for an
  indefinite H), :func:`exact_inverse_hvp` (forms H: tests and tiny models); :data:`SOLVERS`.
* :func:`implicit_gradient`: the pieces together, one gradient per tensor of φ.

Parameters a loss does not depend on get zero derivatives, so θ and φ may be whole ``model.parameters()`` lists;
they must be disjoint. One outer step of Algorithm 1, with θ = ``list(infnet.parameters())`` and
φ = ``list(energy.parameters())``::

    for _ in range(t_inner):                                  # θ ← θ − η ∇_θ L_aux(θ, φ)
        opt_theta.zero_grad(); aux_loss_fn().backward(inputs=theta); opt_theta.step()
    grads = implicit_gradient(primary_loss_fn(), aux_loss_fn(), theta, phi, terms=k, alpha=a)
    for p, g in zip(phi, grads):
        p.grad = g
    opt_phi.step()                                            # φ ← φ − η dL_prim/dφ

The derivation, each solver's convergence condition and what it computes when truncated: docs/models.md#implicit
(costs: docs/implicit_gradient.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "HVPS",
    "SOLVERS",
    "ForwardOverReverse",
    "cg_inverse_hvp",
    "exact_inverse_hvp",
    "grad_or_zeros",
    "hvp",
    "implicit_gradient",
    "minres_inverse_hvp",
    "mixed_vp",
    "neumann_inverse_hvp",
]

Tensors = Sequence[torch.Tensor]
#: ``(grads_theta, theta, v) -> H⁻¹ v``: the signature of an inverse-HVP solver accepted by :func:`implicit_gradient`
InverseHVP = Callable[[Tensors, Tensors, Tensors], list[torch.Tensor]]
#: the inverse-HVP solvers a task may name (``inverse_solver``): the seed's series, conjugate gradient, MINRES
SOLVERS: tuple[str, ...] = ("neumann", "cg", "minres")
#: how a task's Hessian-vector products are made (``hvp``): double backward through the first backward's graph, or
#: forward-over-reverse (:class:`ForwardOverReverse`)
HVPS: tuple[str, ...] = ("double_backward", "forward_over_reverse")
#: ``v -> H v``: a product operator, accepted by :func:`hvp` and every solver in place of the loss or its gradients
Operator = Callable[[Tensors], list[torch.Tensor]]


# ------------------------------------------------------------------------------------------------------- helpers


def grad_or_zeros(
    outputs: torch.Tensor | Tensors,
    inputs: Tensors,
    grad_outputs: Tensors | None = None,
    create_graph: bool = False,
) -> list[torch.Tensor]:
    """``torch.autograd.grad`` with ``allow_unused`` and zeros (not ``None``) for inputs the outputs do not depend on;
    outputs that carry no graph (e.g. zero gradients of unused parameters) are skipped, all zeros if none has one.
    The graph is always retained, since the callers differentiate the same ``∇_θ L_aux`` many times."""
    outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    gouts = [None] * len(outs) if grad_outputs is None else list(grad_outputs)
    if len(gouts) != len(outs):
        raise ValueError(f"{len(outs)} outputs but {len(gouts)} grad_outputs")
    pairs = [(o, g) for o, g in zip(outs, gouts, strict=True) if o.requires_grad]
    if not pairs:
        return [torch.zeros_like(p) for p in inputs]
    grads = torch.autograd.grad(
        [o for o, _ in pairs],
        list(inputs),
        grad_outputs=None if grad_outputs is None else [g for _, g in pairs],
        retain_graph=True,
        create_graph=create_graph,
        allow_unused=True,
    )
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, inputs, strict=True)]


def _first_grads(loss_or_grads, params: Tensors):
    """∇ L w.r.t. ``params`` with a graph (``create_graph``), or the given gradient tensors (or product operator)
    unchanged."""
    if callable(loss_or_grads):
        return loss_or_grads
    if isinstance(loss_or_grads, torch.Tensor):
        if loss_or_grads.ndim != 0:
            raise ValueError(f"a loss must be a scalar, got shape {tuple(loss_or_grads.shape)}")
        return grad_or_zeros(loss_or_grads, params, create_graph=True)
    grads = list(loss_or_grads)
    if len(grads) != len(params):
        raise ValueError(f"{len(grads)} gradient tensors for {len(params)} parameters")
    return grads


def _check_vectors(v: Tensors, params: Tensors, name: str = "v") -> list[torch.Tensor]:
    v = list(v)
    if len(v) != len(params) or any(a.shape != p.shape for a, p in zip(v, params, strict=False)):
        raise ValueError(f"{name} must hold one tensor of each parameter's shape")
    return v


# ---------------------------------------------------------------------------------------------- vector products


def hvp(loss_or_grads: torch.Tensor | Tensors | Operator, params: Tensors, v: Tensors) -> list[torch.Tensor]:
    """Hessian-vector product H v, H = ∂²L/∂θ², by double backward.

    ``loss_or_grads``: the scalar loss L, or the list ∇_θ L already computed with ``create_graph=True`` (pass it to
    reuse one first backward across many products: each product is then one backward through that graph, no new
    forward), or a product operator ``v -> H v`` (e.g. :class:`ForwardOverReverse`), which is applied. ``params`` θ:
    a list of tensors; ``v``: one tensor per parameter, of its shape. Returns H v as one tensor per parameter (zeros
    where L does not depend on it). The result is detached from the graph (no third derivatives).
    """
    params = list(params)
    grads = _first_grads(loss_or_grads, params)
    v = _check_vectors(v, params)
    if callable(grads):
        return [h.detach() for h in grads(v)]
    return [h.detach() for h in grad_or_zeros(grads, params, grad_outputs=[t.detach() for t in v])]


class ForwardOverReverse:
    """Hessian-vector and mixed products of L(θ, φ) by forward-over-reverse: ``op(v)`` = H v, H = ∂²L/∂θ², and
    ``op.mixed(v)`` = (∂²L/∂φ∂θ) v = ∇_φ ⟨∇_θ L, v⟩, for v in θ-space.

    ``loss_fn(values)``: L evaluated with θ's tensors replaced by ``values`` (one tensor per parameter of ``params``,
    in order; e.g. ``torch.func.functional_call`` of the network), φ = ``outer`` the module's own parameters; it must
    compute the same L as the caller's graph (the same batch, the same random draws: replay the RNG if L draws).
    Each product evaluates ``loss_fn`` once at θ + ε v as dual numbers (``torch.autograd.forward_ad``) and
    differentiates it once by reverse mode: the tangent of ∇L is the product. A module without forward-mode
    derivatives raises ``NotImplementedError`` from PyTorch, re-raised naming this option. Results are detached.
    """

    def __init__(self, loss_fn: Callable[[list[torch.Tensor]], torch.Tensor], params: Tensors,
                 outer: Tensors = ()) -> None:
        self.loss_fn, self.params, self.outer = loss_fn, list(params), list(outer)

    def _products(self, v: Tensors, wrt_outer: bool) -> list[torch.Tensor]:
        import torch.autograd.forward_ad as fwad

        v = _check_vectors(v, self.params)
        primals = [p.detach().requires_grad_() for p in self.params]
        inputs = self.outer if wrt_outer else primals
        try:
            with torch.enable_grad(), fwad.dual_level():
                duals = [fwad.make_dual(p, t.detach().to(p.dtype)) for p, t in zip(primals, v, strict=True)]
                loss = self.loss_fn(duals)
                if loss.ndim != 0:
                    raise ValueError(f"a loss must be a scalar, got shape {tuple(loss.shape)}")
                grads = torch.autograd.grad(loss, inputs, allow_unused=True) if loss.requires_grad else \
                    [None] * len(inputs)
                tangents = [None if g is None else fwad.unpack_dual(g).tangent for g in grads]
        except NotImplementedError as err:  # PyTorch's "Trying to use forward AD with <op> that does not support it"
            raise NotImplementedError(f"hvp=forward_over_reverse: this model has an operation without a forward-mode "
                                      f"derivative ({err}); use hvp=double_backward") from err
        return [torch.zeros_like(p) if t is None else t.detach() for t, p in zip(tangents, inputs, strict=True)]

    def __call__(self, v: Tensors) -> list[torch.Tensor]:
        """H v."""
        return self._products(v, wrt_outer=False)

    def mixed(self, v: Tensors) -> list[torch.Tensor]:
        """(∂²L/∂φ∂θ) v, one tensor per outer parameter."""
        return self._products(v, wrt_outer=True)


def mixed_vp(loss_or_grads: torch.Tensor | Tensors, inner: Tensors, outer: Tensors, v: Tensors) -> list[torch.Tensor]:
    """Cross product (∂²L/∂φ∂θ) v = ∇_φ ⟨∇_θ L, v⟩ for ``v`` in θ-space; returns one tensor per outer parameter φ.

    ``loss_or_grads``: the scalar L, or ∇_θ L (w.r.t. ``inner``) computed with ``create_graph=True``, or a
    :class:`ForwardOverReverse` (its ``outer`` must be ``outer``). Parameters of φ that ∇_θ L does not depend on get
    zeros. Detached result.
    """
    inner, outer = list(inner), list(outer)
    if isinstance(loss_or_grads, ForwardOverReverse):
        return loss_or_grads.mixed(_check_vectors(v, inner))
    grads = _first_grads(loss_or_grads, inner)
    v = _check_vectors(v, inner)
    return [h.detach() for h in grad_or_zeros(grads, outer, grad_outputs=[t.detach() for t in v])]


# ------------------------------------------------------------------------------------------ inverse HVP solvers


def neumann_inverse_hvp(
    loss_or_grads: torch.Tensor | Tensors,
    params: Tensors,
    v: Tensors,
    terms: int = 20,
    alpha: float = 0.01,
    history: list[float] | None = None,
) -> list[torch.Tensor]:
    """H⁻¹ v ≈ α Σ_{i=0}^{terms} (I − αH)^i v, the truncated von Neumann series (seed Appendix A; Lorraine et al.
    2020, Algorithm 3).

    ``loss_or_grads``/``params``: as in :func:`hvp` (pass ∇_θ L with a graph to reuse it); ``v``: one tensor per
    parameter. ``terms`` = K ≥ 0 HVPs are made (K = 0 returns α v). Converges to H⁻¹ v as K → ∞ iff every
    eigenvalue λ of H satisfies 0 < αλ < 2, i.e. H positive definite and 0 < α < 2/λ_max; the error after K terms
    is (I − αH)^{K+1} H⁻¹ v. See docs/models.md#implicit.

    ``history``: a list that receives, after the k-th product (k = 1..K), the relative residual ‖v − H x‖ / ‖v‖ of
    the partial sum of the first k terms x = α Σ_{i<k} (I − αH)^i v — free, since that residual is (I − αH)^k v, the
    term the k-th product makes. The returned sum (K + 1 terms) has its residual one product further (run K + 1
    terms to see it).
    """
    if terms < 0:
        raise ValueError(f"terms={terms} must be >= 0")
    if alpha <= 0:
        raise ValueError(f"alpha={alpha} must be positive")
    params = list(params)
    grads = _first_grads(loss_or_grads, params)
    u = [t.detach().clone() for t in _check_vectors(v, params)]
    p = [t.clone() for t in u]
    v_norm = _norm(u) if history is not None else 0.0
    for _ in range(terms):
        hu = hvp(grads, params, u)
        u = [a - alpha * b for a, b in zip(u, hu, strict=True)]
        p = [a + b for a, b in zip(p, u, strict=True)]
        if history is not None:
            history.append(_norm(u) / v_norm if v_norm else 0.0)
    return [alpha * a for a in p]


def cg_inverse_hvp(
    loss_or_grads: torch.Tensor | Tensors,
    params: Tensors,
    v: Tensors,
    tol: float = 1e-2,
    max_iter: int = 20,
    damping: float = 0.0,
    history: list[float] | None = None,
) -> list[torch.Tensor]:
    """(H + μI)⁻¹ v by conjugate gradient (Hestenes & Stiefel 1952), μ = ``damping`` ≥ 0, one HVP per iteration.

    Starts from x₀ = 0 and stops at the first iterate whose residual r = v − (H + μI) x satisfies
    ‖r‖ ≤ ``tol`` · ‖v‖, or after ``max_iter`` iterations (the cap; ``max_iter`` = 0 returns 0), whichever comes
    first; the residual is CG's recurrence (exact in exact arithmetic). With μ = 0 the system is the seed's H w = v.

    **What it solves.** On a symmetric positive definite H + μI, CG minimises the H-norm error over the Krylov space
    of its iterates, and reaches the solution in at most |θ| steps; the relative residual after k steps shrinks at
    least like 2 ((√κ − 1)/(√κ + 1))^k, κ = λ_max/λ_min of H + μI — versus (1 − αλ_min)^k for the series. **An H
    that is not positive definite** (L_aux is not convex in θ, and θ is only T_inner steps from a minimiser): CG's
    step needs the curvature pᵀ(H + μI)p of its search direction p to be positive. When it is not (a direction of
    negative or zero curvature), the method stops and returns the last iterate — the solution of the system
    restricted to the Krylov space where H + μI was positive definite (the truncated-Newton rule of Steihaug 1983);
    at the first iteration that is x = 0, i.e. no implicit term. Its ``history`` then ends with ``inf``. A damping
    μ > |λ_min| makes H + μI positive definite (and shrinks the directions of small curvature, as the truncated
    series does: see docs/models.md#implicit).

    ``history``: a list that receives ‖r_k‖ / ‖v‖ after each iteration (``inf`` at a negative-curvature stop).
    """
    params, grads, r, x, v_norm = _krylov_start(loss_or_grads, params, v, tol, max_iter, damping)
    if v_norm == 0:
        return x
    p = [t.clone() for t in r]
    rr = _dot(r, r)
    for _ in range(max_iter):
        if rr ** 0.5 <= tol * v_norm:
            break
        hp = _damped_hvp(grads, params, p, damping)
        curvature = _dot(p, hp)
        if not curvature > 0:  # also NaN
            if history is not None:
                history.append(float("inf"))
            break
        step = rr / curvature
        x = [a + step * b for a, b in zip(x, p, strict=True)]
        r = [a - step * b for a, b in zip(r, hp, strict=True)]
        rr_new = _dot(r, r)
        if history is not None:
            history.append(rr_new ** 0.5 / v_norm)
        p = [a + (rr_new / rr) * b for a, b in zip(r, p, strict=True)]
        rr = rr_new
    return x


def minres_inverse_hvp(
    loss_or_grads: torch.Tensor | Tensors,
    params: Tensors,
    v: Tensors,
    tol: float = 1e-1,
    max_iter: int = 20,
    damping: float = 0.0,
    history: list[float] | None = None,
) -> list[torch.Tensor]:
    """(H + μI)⁻¹ v by MINRES (Paige & Saunders 1975), μ = ``damping`` ≥ 0, one HVP per iteration; H symmetric,
    positive definite or not (non-singular for the limit to exist).

    From x₀ = 0, iteration k returns the x in the Krylov space K_k = span{v, Hv, …, H^{k−1}v} with the least residual
    ‖v − (H + μI) x‖ (the Lanczos basis of K_k and a QR factorisation of its tridiagonal matrix by Givens rotations,
    updated with a short recurrence: a few vectors of θ's size are kept). The residual norm is known without a
    product (the rotations' running product), never increases, and the method stops at the first iterate with
    ‖r‖ ≤ ``tol`` · ‖v‖, or after ``max_iter`` products (the cap), or when the Krylov space stops growing (then the
    iterate solves the system). The series' first k terms lie in K_k, so k MINRES products never leave a larger
    residual than the series' first k terms.

    ``history``: a list that receives ‖r_k‖ / ‖v‖ after each iteration.
    """
    params, grads, b, x, beta1 = _krylov_start(loss_or_grads, params, v, tol, max_iter, damping)
    if beta1 == 0:
        return x
    # Lanczos: q_prev, q the last two basis vectors (q_prev = 0 at first), beta_prev the entry that links them
    q_prev, q = [torch.zeros_like(t) for t in b], [t / beta1 for t in b]
    beta_prev = 0.0
    # the previous Givens rotation (c, s), the entries it leaves for the next column, the residual's norm
    c, s, delta_bar, eps_next, phi_bar = -1.0, 0.0, 0.0, 0.0, beta1
    d_prev2, d_prev = [torch.zeros_like(t) for t in b], [torch.zeros_like(t) for t in b]  # search directions
    for _ in range(max_iter):
        if phi_bar <= tol * beta1:
            break
        hq = _damped_hvp(grads, params, q, damping)
        alpha = _dot(q, hq)
        nxt = [a - alpha * t - beta_prev * u for a, t, u in zip(hq, q, q_prev, strict=True)]
        beta_next = _norm(nxt)
        # the new column of the tridiagonal (beta_prev·, alpha, beta_next) through the previous rotation
        eps = eps_next
        delta = c * delta_bar + s * alpha
        gamma_bar = s * delta_bar - c * alpha
        eps_next = s * beta_next
        delta_bar = -c * beta_next
        # the new rotation, zeroing beta_next
        gamma = max((gamma_bar**2 + beta_next**2) ** 0.5, torch.finfo(b[0].dtype).tiny)
        c, s = gamma_bar / gamma, beta_next / gamma
        phi = c * phi_bar
        phi_bar = s * phi_bar
        d = [(t - eps * p2 - delta * p1) / gamma for t, p2, p1 in zip(q, d_prev2, d_prev, strict=True)]
        x = [a + phi * t for a, t in zip(x, d, strict=True)]
        d_prev2, d_prev = d_prev, d
        if history is not None:
            history.append(abs(phi_bar) / beta1)
        if beta_next == 0:  # K_k is invariant under H: x solves the system
            break
        q_prev, q = q, [t / beta_next for t in nxt]
        beta_prev = beta_next
    return x


def _dot(a: Tensors, b: Tensors) -> float:
    return float(sum((x * y).sum() for x, y in zip(a, b, strict=True)))


def _krylov_start(loss_or_grads, params, v, tol: float, max_iter: int, damping: float):
    """What CG and MINRES start from: the settings checked, the parameters as a list, the first gradients, the
    right-hand side v (a detached copy), the zero solution and ‖v‖."""
    if max_iter < 0:
        raise ValueError(f"max_iter={max_iter} must be >= 0")
    if tol < 0 or damping < 0:
        raise ValueError(f"tol={tol} and damping={damping} must be >= 0")
    params = list(params)
    grads = _first_grads(loss_or_grads, params)
    rhs = [t.detach().clone() for t in _check_vectors(v, params)]
    return params, grads, rhs, [torch.zeros_like(t) for t in rhs], _norm(rhs)


def _damped_hvp(grads, params, vector, damping: float) -> list[torch.Tensor]:
    """(H + μI) ``vector``, μ = ``damping``: one Hessian-vector product."""
    product = hvp(grads, params, vector)
    return [a + damping * b for a, b in zip(product, vector, strict=True)] if damping else product


def _norm(a: Tensors) -> float:
    return _dot(a, a) ** 0.5


def exact_inverse_hvp(loss_or_grads: torch.Tensor | Tensors, params: Tensors, v: Tensors) -> list[torch.Tensor]:
    """H⁻¹ v exactly: H is assembled from |θ| HVPs (one per coordinate) and the linear system solved densely.

    Only for tests and tiny models (|θ| up to a few thousand). Raises if H is singular.
    """
    params = list(params)
    grads = _first_grads(loss_or_grads, params)
    v = _check_vectors(v, params)
    sizes = [p.numel() for p in params]
    n = sum(sizes)
    ref = params[0]
    columns = []
    for j in range(n):
        e = torch.zeros(n, dtype=ref.dtype, device=ref.device)
        e[j] = 1.0
        columns.append(torch.cat([h.reshape(-1) for h in hvp(grads, params, _unflatten(e, params))]))
    hessian = torch.stack(columns, dim=1)
    x = torch.linalg.solve(hessian, torch.cat([t.detach().reshape(-1) for t in v]))
    return _unflatten(x, params)


def _unflatten(flat: torch.Tensor, like: Tensors) -> list[torch.Tensor]:
    out, i = [], 0
    for p in like:
        out.append(flat[i : i + p.numel()].view_as(p))
        i += p.numel()
    return out


# ------------------------------------------------------------------------------------------- implicit gradient


def implicit_gradient(
    primary_loss: torch.Tensor,
    aux_loss: torch.Tensor | None,
    inner_params: Tensors,
    outer_params: Tensors,
    terms: int = 20,
    alpha: float = 0.01,
    inverse_hvp: InverseHVP | None = None,
    aux_fn: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
    clock: dict[str, float] | None = None,
) -> list[torch.Tensor]:
    """dL_prim/dφ of the bi-level problem (2) at the current (θ, φ), by eq. 3-4 (= eq. 13) of seed 004:

        dL_prim/dφ = ∂L_prim/∂φ − (∂²L_aux/∂φ∂θ) · H⁻¹ · ∂L_prim/∂θ,    H = ∂²L_aux/∂θ².

    ``primary_loss``, ``aux_loss``: scalars computed from θ = ``inner_params`` and φ = ``outer_params`` (two
    disjoint lists of tensors that require grad). H⁻¹ is applied by :func:`neumann_inverse_hvp` with ``terms`` and
    ``alpha`` unless ``inverse_hvp`` (``(grads_theta, theta, v) -> H⁻¹ v``, e.g. :func:`exact_inverse_hvp`; its
    first argument may also be a product operator) is given. The products are double backward through one
    ``create_graph`` backward of ``aux_loss``; with ``aux_fn`` (L_aux evaluated with θ's tensors replaced by its
    argument, φ the module's own: :class:`ForwardOverReverse`) they are forward-over-reverse, and ``aux_loss`` is
    not differentiated (it may be None). ``clock``: a dict whose ``"implicit"`` entry is increased by the seconds
    spent on the implicit term (everything after L_prim's backward: ∇_θ L_aux, the solver, the mixed product; the
    device synchronised at both ends when θ is on CUDA). Returns one detached tensor per outer parameter (zeros for
    parameters neither loss depends on); nothing is written to ``.grad`` — assign the result there (or pass it to
    an optimiser) to take the step of Algorithm 1. Both losses' graphs are consumed for θ and φ only; other leaves
    are untouched.
    """
    inner, outer = list(inner_params), list(outer_params)
    if {id(p) for p in inner} & {id(p) for p in outer}:
        raise ValueError("inner_params and outer_params must be disjoint")
    if aux_loss is None and aux_fn is None:
        raise ValueError("need aux_loss (double backward) or aux_fn (forward-over-reverse)")
    g_prim = grad_or_zeros(primary_loss, inner + outer)
    d_theta = [g.detach() for g in g_prim[: len(inner)]]
    explicit = [g.detach() for g in g_prim[len(inner) :]]
    if not any(bool(g.any()) for g in d_theta):
        return explicit  # L_prim does not depend on θ (e.g. ȳ detached): the implicit term vanishes
    cuda = clock is not None and inner[0].is_cuda
    if cuda:
        torch.cuda.synchronize(inner[0].device)
    start = time.perf_counter()
    if aux_fn is not None:
        products: torch.Tensor | Tensors | Operator = ForwardOverReverse(aux_fn, inner, outer)
    else:
        products = grad_or_zeros(aux_loss, inner, create_graph=True)
    if inverse_hvp is None:
        w = neumann_inverse_hvp(products, inner, d_theta, terms=terms, alpha=alpha)
    else:
        w = inverse_hvp(products, inner, d_theta)
    cross = mixed_vp(products, inner, outer, w)
    if clock is not None:
        if cuda:
            torch.cuda.synchronize(inner[0].device)
        clock["implicit"] = clock.get("implicit", 0.0) + time.perf_counter() - start
    return [e - c for e, c in zip(explicit, cross, strict=True)]

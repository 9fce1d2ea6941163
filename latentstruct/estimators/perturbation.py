r"""MAP-oracle estimators: the structure's ``map`` is a black box, called on perturbed scores (issue #21).

They call nothing but ``map``, so they run on every structure (Matching included) and need no ``downstream``: the
incoming gradient γ = ∂L/∂z (the gradient of the batch-mean loss at the forward value) is all they use.

=============  ======================================  ================================================================
``blackbox``   ẑ = MAP(s)                              (ẑ − MAP(s − λγ)) / λ                    (Vlastelica et al. 2020)
``imle``       z̄ = (1/S) Σ_m MAP(s + ε_m)              (1/S) Σ_m (MAP(s + ε_m) − MAP(s − λγ + ε_m)) / λ
                                                       ε_m sum-of-gamma noise              (Niepert et al. 2021)
``perturbed``  ȳ = (1/M) Σ_m MAP(s + σZ_m)             (1/(Mσ)) Σ_m Z_m ⟨MAP(s + σZ_m), γ⟩, Z_m ~ N(0, I)
                                                                                           (Berthet et al. 2020)
=============  ======================================  ================================================================

The S (or M) draws per example are one ``map`` call on the batch repeated S times along its first dimension
(sample-major: row m·B + b is draw m of example b), reshaped to ``[S, B, ...]``.

References: M. Vlastelica, A. Paulus, V. Musil, G. Martius, M. Rolínek (2020), "Differentiation of blackbox
combinatorial solvers", ICLR. M. Niepert, P. Minervini, L. Franceschi (2021), "Implicit MLE: backpropagating through
discrete exponential family distributions", NeurIPS. Q. Berthet, M. Blondel, O. Teboul, M. Cuturi, J.-P. Vert,
F. Bach (2020), "Learning with differentiable perturbed optimizers", NeurIPS.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch

from latentstruct.estimators.base import Estimator, surrogate
from latentstruct.ranges import AtLeast, Positive
from latentstruct.structures.base import gumbel_like

__all__ = ["Blackbox", "Imle", "Perturbed", "sum_of_gamma_like", "repeat_batch"]


def repeat_batch(x: torch.Tensor | None, times: int) -> torch.Tensor | None:
    """``x`` ``[B, ...]`` repeated ``times`` along the batch: ``[times·B, ...]``, row m·B + b = ``x[b]`` (None stays
    None). ``.view(times, B, ...)`` of a result splits the draws again."""
    if x is None or times == 1:
        return x
    return x.repeat(times, *[1] * (x.dim() - 1))


def _per_example(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B]`` shaped to broadcast over the part dimensions of ``like`` ``[B, ...]``."""
    return x.reshape(-1, *[1] * (like.dim() - 1))


def sum_of_gamma_like(
    scores: torch.Tensor, k: float | torch.Tensor, terms: int = 10, tau: float = 1.0
) -> torch.Tensor:
    """Sum-of-gamma noise SoG(k, τ, κ) shaped like ``scores`` (Niepert et al. 2021, Sec. 3.2):

        ε = (τ/k) (Σ_{i=1}^{κ} G_i − log κ),     G_i ~ Gamma(shape 1/k, scale k/i), independent,

    κ = ``terms``. Its mean is (τ/k)(H_κ − log κ) (H the harmonic number) and its variance (τ²/k) Σ_{i≤κ} 1/i². The sum
    of k independent draws is τ (Σ_{i≤κ} E_i/i − log κ), E_i ~ Exp(1), which tends to τ·Gumbel(0, 1) as κ → ∞: a
    vertex with k parts receives Gumbel noise on its score <s + ε, z>, as a top-k wants. ``k`` is a number or a tensor
    ``[B]`` (one k per example).
    """
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    k = torch.as_tensor(k, dtype=scores.dtype, device=scores.device)
    if k.dim():
        k = _per_example(k, scores)
    i = torch.arange(1, terms + 1, dtype=scores.dtype, device=scores.device).view(terms, *[1] * scores.dim())
    shape = (terms, *scores.shape)
    concentration = (1.0 / k).expand(shape)
    rate = (i / k).expand(shape)  # scale k/i
    draws = torch.distributions.Gamma(concentration, rate, validate_args=False).sample()
    return tau / k * (draws.sum(0) - math.log(terms))


class Blackbox(Estimator):
    r"""Blackbox differentiation of a combinatorial solver (Vlastelica et al., ICLR 2020): forward ẑ = MAP(s); backward

        ∇_s ≈ (ẑ − MAP(s − λγ)) / λ,      γ = ∂L/∂z at ẑ (the incoming gradient),

    the exact gradient of a piecewise-linear interpolation of s ↦ L(MAP(s)) (their Sec. 3).

    **The sign for a maximising oracle.** The paper's solver *minimises* a cost: y(w) = argmin_y <w, y>; it perturbs
    w' = w + λ ∂L/∂y and returns ∂L/∂w = −(y(w) − y(w'))/λ. Our ``map`` maximises a score, z(s) = argmax_z <s, z> =
    y(−s): the cost is w = −s. Then w' = −s + λγ = −(s − λγ), so y(w') = z(s − λγ), and by the chain rule
    ∂L/∂s = −∂L/∂w = (y(w) − y(w'))/λ = (z(s) − z(s − λγ))/λ. Check on a case: with γ = c, L = <c, z> on Categorical,
    z(s − λc) tends (λ → ∞) to the lowest-loss vertex z⁺, and a descent step s ← s − η(ẑ − z⁺)/λ lowers the score of
    ẑ and raises that of z⁺.

    Calls only ``map``; needs no ``downstream``.

    Args:
        lam: interpolation strength λ > 0: the size of the step along −γ that the perturbed problem takes (larger:
            a coarser interpolation, a gradient that is nonzero more often). Default 10; a hyper-parameter to tune
            per task, as the paper does (λγ must be large enough to change the MAP).
    """

    def __init__(self, lam: Annotated[float, Positive] = 10.0, eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        self.lam = _positive("lam", lam)

    def train_forward(self, scores, structure, lengths, downstream):
        z = structure.map(scores, lengths)
        s = scores.detach()

        def backward_fn(gamma):
            with torch.no_grad():
                return (z - structure.map(s - self.lam * gamma, lengths)) / self.lam

        return surrogate(scores, z, backward_fn)


class Imle(Estimator):
    r"""Implicit maximum-likelihood estimation with perturb-and-MAP (Niepert, Minervini & Franceschi, NeurIPS 2021):
    with ε_1..ε_S independent noise draws, forward

        z̄ = (1/S) Σ_m MAP(s + ε_m)

    (one perturbed MAP state per draw; with S = 1 a vertex, with S > 1 their mean, a point of conv(Z)), backward

        ∇_s ≈ (1/S) Σ_m (MAP(s + ε_m) − MAP(s' + ε_m)) / λ,      s' = s − λγ,

    the *same* ε_m in both MAP calls, γ = ∂L/∂z̄ the incoming gradient. s' is the paper's target distribution
    θ' = θ − λ∇_z L (perturbation-based implicit differentiation); the gradient is the paper's μ̂(θ) − μ̂(θ'), the two
    means each estimated by perturb-and-MAP with shared noise, divided by λ: a finite difference along −γ, whose scale
    does not grow with λ (the paper's algorithm returns the plain difference; the 1/λ is then in the learning rate).
    With ``noise=none`` the estimator *is* :class:`Blackbox`; with S draws the gradient is the mean of the S
    per-draw estimates, each using γ, the gradient with respect to the mean z̄.

    Noise (``noise``):

    * ``sum_of_gamma`` (the paper's SoG(k, τ, κ), :func:`sum_of_gamma_like`): ε = (τ/k)(Σ_{i=1}^{κ} Gamma(1/k, k/i)
      − log κ) i.i.d. on every part, so that a vertex of k parts has approximately τ·Gumbel noise on its score;
      k = ``noise_k``, or by default the number of parts of the example's vertices (every vertex of an example has
      as many parts: 1 on Categorical, k on a top-k, n arcs on a dependency tree of n words, the 2n − 1 spans of a
      binary tree over n leaves), read off the unperturbed MAP (one extra ``map`` call per training step);
    * ``gumbel``: ε = τ·G, G standard Gumbel on every part;
    * ``none``: ε = 0.

    Calls only ``map``; needs no ``downstream``.

    Args:
        lam: λ > 0 of the target distribution s − λγ. Default 10; a hyper-parameter to tune per task, as the
            paper does (λγ must be large enough to change the perturbed MAP).
        noise: perturbation ε: sum_of_gamma (the paper's), gumbel or none (then this is blackbox).
        noise_k: k of the sum-of-gamma noise; null (the default): the number of parts of the example's vertices.
        noise_terms: κ, the number of gamma terms of the sum-of-gamma noise (the paper's default 10).
        noise_temperature: τ, the scale of the noise (sum_of_gamma and gumbel).
        samples: S noise draws per example; the forward value is the mean of their MAP states, the gradient the mean
            of their estimates.
    """

    NOISES = ("sum_of_gamma", "gumbel", "none")

    def __init__(
        self,
        lam: Annotated[float, Positive] = 10.0,
        noise: Literal["sum_of_gamma", "gumbel", "none"] = "sum_of_gamma",
        noise_k: Annotated[int | None, AtLeast(1)] = None,
        noise_terms: Annotated[int, AtLeast(1)] = 10,
        noise_temperature: Annotated[float, Positive] = 1.0,
        samples: Annotated[int, AtLeast(1)] = 1,
        eval_latent: Literal["map", "relaxed"] = "relaxed",
    ):
        super().__init__(eval_latent)
        self.lam = _positive("lam", lam)
        if noise not in self.NOISES:
            raise ValueError(f"noise must be one of {self.NOISES}, got {noise!r}")
        self.noise = noise
        self.noise_k = None if noise_k is None else _count("noise_k", noise_k)
        self.noise_terms = _count("noise_terms", noise_terms)
        self.noise_temperature = _positive("noise_temperature", noise_temperature)
        self.samples = _count("samples", samples)

    def noise_like(self, scores: torch.Tensor, structure, lengths) -> torch.Tensor:
        """One draw of ε shaped like ``scores`` (the class docstring's ``noise``)."""
        if self.noise == "none":
            return torch.zeros_like(scores)
        if self.noise == "gumbel":
            return self.noise_temperature * gumbel_like(scores)
        k = self.noise_k
        if k is None:
            k = structure.map(scores, lengths).flatten(1).sum(-1).clamp_min(1)
        return sum_of_gamma_like(scores, k, self.noise_terms, self.noise_temperature)

    def train_forward(self, scores, structure, lengths, downstream):
        s, n = scores.detach(), self.samples
        s_rep, lengths_rep = repeat_batch(s, n), repeat_batch(lengths, n)
        eps = self.noise_like(s_rep, structure, lengths_rep)
        z_all = structure.map(s_rep + eps, lengths_rep)
        z = z_all.reshape(n, *s.shape).mean(0)

        def backward_fn(gamma):
            with torch.no_grad():
                target = structure.map(s_rep - self.lam * repeat_batch(gamma, n) + eps, lengths_rep)
                return (z_all - target).reshape(n, *s.shape).mean(0) / self.lam

        return surrogate(scores, z, backward_fn)


class Perturbed(Estimator):
    r"""Perturbed optimizers (Berthet et al., NeurIPS 2020) with Gaussian noise: forward

        ȳ = (1/M) Σ_m MAP(s + σZ_m),      Z_m ~ N(0, I) i.i.d.,

    a Monte-Carlo estimate of the perturbed maximiser y*_σ(s) = E[MAP(s + σZ)]; backward the Monte-Carlo estimate of
    J_s y*_σ(s)ᵀ γ, with the Jacobian of their Prop. 3.1 (maximisation; ν(z) = ||z||²/2, so ∇ν(Z) = Z):

        J_s y*_σ(s) = (1/σ) E[MAP(s + σZ) Zᵀ],     ∇_s ≈ (1/(Mσ)) Σ_m Z_m ⟨MAP(s + σZ_m), γ⟩,

    the same Z_m as the forward pass, γ = ∂L/∂ȳ the incoming gradient, ⟨·,·⟩ over all the parts of an example. The
    estimate is unbiased for the gradient of L∘y*_σ where L is linear, and is the paper's estimator otherwise.

    With ``lengths``, the parts outside an example's length get the zero-mean term Z⟨MAP, γ⟩/σ too (the interface
    does not say which parts are padding); its expectation, the true Jacobian there, is 0.

    Calls only ``map``; needs no ``downstream``.

    Args:
        sigma: noise scale σ > 0 (the smoothing: larger, a smoother y*_σ and a more biased one).
        samples: M perturbations per example (one map call on the batch repeated M times); the estimates'
            variance falls as 1/M.
    """

    def __init__(self, sigma: Annotated[float, Positive] = 1.0, samples: Annotated[int, AtLeast(1)] = 10,
                 eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        self.sigma = _positive("sigma", sigma)
        self.samples = _count("samples", samples)

    def train_forward(self, scores, structure, lengths, downstream):
        s, n = scores.detach(), self.samples
        s_rep, lengths_rep = repeat_batch(s, n), repeat_batch(lengths, n)
        noise = torch.randn(s_rep.shape, dtype=s.dtype, device=s.device)
        y_all = structure.map(s_rep + self.sigma * noise, lengths_rep)
        y = y_all.reshape(n, *s.shape).mean(0)

        def backward_fn(gamma):
            with torch.no_grad():
                inner = (y_all * repeat_batch(gamma, n)).flatten(1).sum(-1)  # ⟨y_m, γ⟩ per (draw, example)
                return (noise * _per_example(inner, noise)).reshape(n, *s.shape).mean(0) / self.sigma

        return surrogate(scores, y, backward_fn)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)

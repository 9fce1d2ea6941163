"""Direct loss minimization through a randomly perturbed MAP (seed 002, §3-5 and Appendix C; seed 003).

With s the part scores, γ i.i.d. zero-mean Gumbel noise on the parts (G − 0.5772...), σ ≥ 0 the noise scale and
ℓ_b = ∇_{z_b} L_b at ẑ_b (example b's own loss, linearised by one ``downstream`` call per noise sample), the
estimator forwards ẑ and back-propagates, for the training loss (1/B) Σ_b L_b,

    ẑ   = MAP(s + σγ),                 ẑ_ε = MAP(s + σγ + ε ℓ)                    (seed 002, Eq. 2 and Eq. 14)
    ∂/∂s_b = (ẑ_ε,b − ẑ_b) / (B ε),    ∂/∂σ_b = <γ_b, ẑ_ε,b − ẑ_b> / (B ε)          (Eq. 3; Corollary 2, Eq. 16-17)

averaged over ``samples`` noise draws per example; the incoming gradient is ignored (as ``Sfe`` does). Both signs of
ε give a descent direction; ε < 0 ("towards best") is the default.

* Zero updates (Appendix C): where ẑ_ε = ẑ while the loss is positive, ε grows by ``grow`` up to ``max_retries``
  times, unless one MAP call on sign(ε) ℓ shows no ε can move ẑ; ``max_retries=0`` is the plain estimator.
* ``sigma``: a float (0: Hazan et al. 2010, no noise drawn; 1: Lorberbom et al. 2018) or a learned tensor passed at
  call time, ``estimator(scores, structure, lengths, downstream, sigma=sigma)``, ``[B]``, ``[B, 1, ...]`` or one
  element; it receives ∂/∂σ through autograd.
* ``target=vertices``: ẑ_ε = the known best vertex (the perceptron step towards it, scaled by 1/|ε|; ε < 0 required,
  ``downstream`` not called).

Forward: the first noise sample's ẑ in training, MAP(s) without noise at evaluation.

Derivation (the sign and normalisation of the rule, the loss vector, the retries, why the noise is zero-mean, known
targets) and references: docs/structures.md#direct.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch

from latentstruct.estimators.base import Downstream, Estimator, missing_downstream
from latentstruct.ranges import Above, AtLeast, NonNegative, NonZero
from latentstruct.structures.base import Structure, gumbel_like

__all__ = ["Direct", "EULER_GAMMA"]

EULER_GAMMA = 0.5772156649015329  # the mean of the standard Gumbel distribution


class _DirectGrad(torch.autograd.Function):
    """Identity on the forward value ``z``; the backward returns the precomputed direct gradients for the scores and
    for σ (ignoring the incoming gradient, see the module docstring)."""

    @staticmethod
    def forward(ctx, scores, sigma, z, grad_scores, grad_sigma):
        ctx.grads = (grad_scores, grad_sigma)
        return z.clone()

    @staticmethod
    def backward(ctx, grad_z):
        grad_scores, grad_sigma = ctx.grads
        return (
            grad_scores if ctx.needs_input_grad[0] else None,
            grad_sigma if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
        )


class Direct(Estimator):
    """Direct loss minimization with a randomly perturbed MAP (module docstring: the rule, its sign and scale).

    Args:
        epsilon: the loss-perturbation step ε ≠ 0. Negative = "towards best" (recommended by seed 002 §5). Default
            −12, the value of seed 002 App. C.1 (bipartite matching; the k-NN experiment grid-searches it). Large
            |ε| makes ẑ_ε the vertex that best trades score for (linearised) loss, a robust, rarely-zero update;
            small |ε| approaches the exact gradient of the expected loss, with more variance.
        sigma: the noise scale σ ≥ 0 used when no ``sigma`` tensor is passed at call time (0 = "Direct σ = 0",
            Hazan et al. 2010; 1 = "Direct σ = 1", Lorberbom et al. 2018, the default).
        samples: noise draws per example (≥ 1; seed 002 App. C uses 5 for matching); the gradients are averaged and
            forward returns the first draw's ẑ. Ignored (one draw) when σ is the float 0.
        grow: factor (> 1) by which ε grows on a zero update with a positive loss (Appendix C: 10%, 1.1).
        max_retries: cap (≥ 0) on those growth steps per (sample, example); 0 disables them. Default 100, i.e. |ε|
            may grow up to 1.1¹⁰⁰ ≈ 1.4·10⁴ times; retries that provably cannot succeed are skipped.
        eval_latent: see :class:`~latentstruct.estimators.base.Estimator` (this estimator is not relaxed: MAP).

    Call: ``latent = estimator(scores, structure, lengths=None, downstream=None, sigma=None, target=None)``;
    ``downstream`` is required while training (whenever a gradient is needed) unless ``target`` is given; ``sigma``
    is a float or a tensor, ``target`` the known best vertices ``[B, ...]`` (see module docstring).
    """

    takes_sigma = True
    takes_target = True
    wants_loss_vector = True

    @property
    def temperature(self) -> float:
        """−ε: the step's size towards the best vertex (positive when ε < 0, "towards best")."""
        return -self.epsilon

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.epsilon = -value

    def __init__(
        self,
        epsilon: Annotated[float, NonZero()] = -12.0,
        sigma: Annotated[float, NonNegative] = 1.0,
        samples: Annotated[int, AtLeast(1)] = 1,
        grow: Annotated[float, Above(1)] = 1.1,
        max_retries: Annotated[int, NonNegative] = 100,
        eval_latent: Literal["map", "relaxed"] = "relaxed",
    ):
        super().__init__(eval_latent)
        if not _is_real(epsilon) or not math.isfinite(epsilon) or epsilon == 0:
            raise ValueError(f"epsilon must be a finite nonzero number (negative = towards best), got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.sigma = _check_sigma_float(sigma)
        if not _is_int(samples) or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
        self.samples = int(samples)
        if not _is_real(grow) or not math.isfinite(grow) or not grow > 1:
            raise ValueError(f"grow must be a finite number > 1 (the factor by which ε grows), got {grow!r}")
        self.grow = float(grow)
        if not _is_int(max_retries) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.max_retries = int(max_retries)

    def forward(
        self,
        scores: torch.Tensor,
        structure: Structure,
        lengths: torch.Tensor | None = None,
        downstream: Downstream | None = None,
        sigma: float | torch.Tensor | None = None,
        target: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.training:
            return self.train_forward(scores, structure, lengths, downstream, sigma, target)
        return super().forward(scores, structure, lengths, downstream)

    def train_forward(self, scores, structure, lengths, downstream, sigma=None, target=None):
        s = scores.detach()
        batch = s.shape[0]
        sigma_t, sigma_f = self._resolve_sigma(sigma, s)
        needs_grad = scores.requires_grad or (sigma_t is not None and sigma_t.requires_grad)
        noisy = sigma_t is not None or sigma_f > 0
        n_samples = self.samples if noisy else 1
        reps = (n_samples,) + (1,) * (s.dim() - 1)  # sample-major: row k·B + b is draw k of example b

        s_rep = s.repeat(reps)
        lengths_rep = None
        if lengths is not None:
            lengths_rep = torch.as_tensor(lengths, device=s.device).reshape(-1).repeat(n_samples)
        noise = None
        perturbed = s_rep
        if noisy:
            noise = gumbel_like(s_rep) - EULER_GAMMA
            if sigma_t is not None:
                scale = sigma_t.detach().to(s.dtype).reshape(-1).expand(batch).repeat(n_samples)
                perturbed = s_rep + _per_row(scale, s_rep) * noise
            else:
                perturbed = s_rep + sigma_f * noise
        z = structure.map(perturbed, lengths_rep)
        first = z[:batch]
        if not needs_grad:
            return first
        eps = torch.full((n_samples * batch,), self.epsilon, dtype=s.dtype, device=s.device)
        if target is not None:
            z_eps = self._check_target(target, s).repeat(reps)
        else:
            if downstream is None:
                raise missing_downstream("Direct", "to build the loss-perturbed prediction")
            # One downstream call per noise sample: the closure holds the batch's targets, so B rows at a time.
            pieces = [_loss_and_slope(downstream, z[k * batch : (k + 1) * batch]) for k in range(n_samples)]
            losses = torch.cat([loss for loss, _ in pieces])
            slope = torch.cat([grad for _, grad in pieces]).to(s.dtype)
            z_eps = structure.map(perturbed + self.epsilon * slope, lengths_rep)
            if self.max_retries > 0:
                self._retry(structure, perturbed, slope, lengths_rep, losses, z, z_eps, eps)

        delta = (z_eps - z) / _per_row(eps, z)  # one direct gradient per (sample, example), before the 1/B
        norm = n_samples * batch
        grad_scores = delta.view(n_samples, *s.shape).sum(0) / norm
        grad_sigma = None
        if sigma_t is not None and sigma_t.requires_grad:
            per_example = (noise * delta).flatten(1).sum(-1).view(n_samples, batch).sum(0) / norm
            if sigma_t.numel() == batch and sigma_t.dim() > 0 and sigma_t.shape[0] == batch:
                grad_sigma = per_example.reshape(sigma_t.shape)
            else:  # one σ shared by the batch
                grad_sigma = per_example.sum().reshape(sigma_t.shape)
            grad_sigma = grad_sigma.to(sigma_t.dtype)
        return _DirectGrad.apply(scores, sigma_t, first, grad_scores.to(scores.dtype), grad_sigma)

    # --------------------------------------------------------------------------------------------------- helpers

    def _retry(self, structure, perturbed, slope, lengths, losses, z, z_eps, eps):
        """Appendix C: grow ε (in place, with ``z_eps``) of each row whose update is zero while its loss is positive.

        A row is left alone when ẑ already maximises <sign(ε) ℓ, z>: then no ε of that sign can change ẑ_ε.
        """
        stuck = (z_eps == z).flatten(1).all(1) & (losses > 0)
        rows = stuck.nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        direction = math.copysign(1.0, self.epsilon) * slope[rows]
        sub_lengths = None if lengths is None else lengths[rows]
        best = structure.map(direction, sub_lengths)
        here, there = _dot(z[rows], direction), _dot(best, direction)
        tol = 64 * torch.finfo(direction.dtype).eps * (here.abs() + there.abs()) + torch.finfo(direction.dtype).tiny
        stuck[rows[there - here <= tol]] = False
        for _ in range(self.max_retries):
            rows = stuck.nonzero().squeeze(1)
            if rows.numel() == 0:
                break
            eps[rows] *= self.grow
            sub_lengths = None if lengths is None else lengths[rows]
            z_eps[rows] = structure.map(perturbed[rows] + _per_row(eps[rows], slope) * slope[rows], sub_lengths)
            moved = (z_eps[rows] != z[rows]).flatten(1).any(1)
            stuck[rows[moved]] = False

    def _check_target(self, target, scores):
        """The known best vertices as ẑ_ε (module docstring, "Known targets"): shaped like the scores, ε < 0."""
        if self.epsilon >= 0:
            raise ValueError(f"a target is the towards-best limit: epsilon must be negative, got {self.epsilon}")
        if target.shape != scores.shape:
            raise ValueError(f"target must be shaped like the scores {tuple(scores.shape)}, got {tuple(target.shape)}")
        return target.detach().to(device=scores.device, dtype=scores.dtype)

    def _resolve_sigma(self, sigma, scores):
        """(tensor or None, float): the call-time σ tensor, or the float σ (the constructor's if ``sigma`` is None)."""
        if sigma is None:
            return None, self.sigma
        if not isinstance(sigma, torch.Tensor):
            return None, _check_sigma_float(sigma)
        batch = scores.shape[0]
        if not sigma.is_floating_point():
            raise TypeError(f"a sigma tensor must be floating-point, got {sigma.dtype}")
        shared = sigma.numel() == 1
        per_example = sigma.dim() > 0 and sigma.shape[0] == batch and sigma.numel() == batch
        if not (shared or per_example):
            raise ValueError(
                f"a sigma tensor must have one element per example ([{batch}] or [{batch}, 1, ...]) or a single "
                f"element, got shape {tuple(sigma.shape)}"
            )
        if sigma.device != scores.device:
            raise ValueError(f"sigma is on {sigma.device} but the scores are on {scores.device}")
        detached = sigma.detach()
        if not bool(torch.isfinite(detached).all()) or bool((detached < 0).any()):
            raise ValueError("sigma must be finite and >= 0 (e.g. the softplus output of a noise network)")
        return sigma, 0.0


def _loss_and_slope(downstream: Downstream, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example losses L_b(ẑ_b) ``[B]`` and ℓ_b = ∇_{z_b} L_b ``[B, ...]``: the gradient of the *sum* of the losses,
    i.e. B times ``loss_gradient`` (the gradient of their mean), in one ``downstream`` call; parameters' ``.grad``
    are never touched."""
    with torch.enable_grad():
        mu = z.detach().requires_grad_(True)
        losses = downstream(mu)
        if losses.shape != (z.shape[0],):
            raise ValueError(
                f"downstream must return one loss per example, shape [{z.shape[0]}], got {tuple(losses.shape)}"
            )
        (slope,) = torch.autograd.grad(losses.sum(), mu, allow_unused=True)
    if slope is None:  # the loss does not depend on the latent
        slope = torch.zeros_like(mu)
    return losses.detach(), slope.detach()


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[R]`` → ``[R, 1, ..., 1]``, broadcastable against ``like`` ``[R, ...]``."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def _dot(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """<x, z> per row, reading x only where z is nonzero (padding may hold anything)."""
    return torch.where(z != 0, x * z, torch.zeros_like(x)).flatten(1).sum(-1)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return _is_real(x) and float(x).is_integer()


def _check_sigma_float(sigma) -> float:
    if not _is_real(sigma) or not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"sigma must be a finite number >= 0 (0 = Direct σ = 0, 1 = Direct σ = 1), got {sigma!r}")
    return float(sigma)

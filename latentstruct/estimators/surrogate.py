"""Surrogate gradients: a MAP forward pass with a pulled-back backward pass (seed 001, §5-6, Algorithm 1).

With ẑ = MAP(s), γ(μ) the loss gradient at μ, η = ``eta`` and k = ``steps``:

=============  ===============================================================================
``ste_i``      μ0 = ẑ,        μt = μ(t-1) - ηγ(μ(t-1));               grad = μ0 - μk  (Eq. 15)
``ste_s``      J_Marg(s)ᵀ γ(ẑ) (the full Jacobian of the marginals / softmax)
``spigot``     μ0 = ẑ,        μt = Π_M(μ(t-1) - ηγ(μ(t-1)));          grad = μ0 - μk  (Eq. 9, 14)
``spigot_ce``  μ0 = Marg(s),  μt = Π_M(μ(t-1) - ηγ(μ(t-1)));          grad = μ0 - μk  (Eq. 17)
``spigot_eg``  s0 = s, μ0 = Marg(s), st = s(t-1) - ηγ(μ(t-1)), μt = Marg(st); grad = μ0 - μk  (Eq. 21-22)
=============  ===============================================================================

The first inner step of ``ste_i`` and ``spigot`` reuses the incoming gradient γ(ẑ); every further step, and every
step of ``spigot_ce`` / ``spigot_eg``, calls ``downstream`` once.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from latentstruct.estimators.base import Estimator, loss_gradient, missing_downstream, surrogate
from latentstruct.ranges import AtLeast, Positive

__all__ = ["SteI", "SteS", "Spigot", "SpigotCe", "SpigotEg", "PulledBack", "straight_through"]


class PulledBack(Estimator):
    """Common base of the pulled-back estimators: ``eta`` (step size η) and ``steps`` (k inner steps).

    The default ``pull_back`` is Algorithm 1's loop μt = project(μ(t-1) - ηγ(μ(t-1))), returning μ0 - μk; a
    subclass picks μ0 (ẑ, whose γ is the incoming gradient, or Marg(s)) and the projection.

    Args:
        eta: pull-back step size η.
        steps: k inner pull-back steps (each extra step calls the decoder).
    """

    starts_at_map = True  # μ0 = ẑ (else Marg(s))

    def __init__(self, eta: Annotated[float, Positive] = 1.0, steps: Annotated[int, AtLeast(1)] = 1,
                 eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        if not eta > 0:
            raise ValueError(f"eta must be > 0, got {eta}")
        if steps != int(steps) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps}")
        self.eta, self.steps = float(eta), int(steps)

    @property
    def needs_downstream(self) -> bool:
        """Whether the pull-back evaluates the loss anywhere but at ẑ (whose gradient comes for free)."""
        return self.steps > 1 or not self.starts_at_map

    def train_forward(self, scores, structure, lengths, downstream):
        if downstream is None and self.needs_downstream and scores.requires_grad:
            who = f"{type(self).__name__} (steps={self.steps})"
            raise missing_downstream(who, "to evaluate the loss at a pulled-back μ")
        z = structure.map(scores, lengths)
        s = scores.detach()

        def backward_fn(gamma_z):
            with torch.no_grad():
                return self.pull_back(s, z, gamma_z, structure, lengths, downstream)

        return surrogate(scores, z, backward_fn)

    def project(self, x, structure, lengths):
        return x

    def pull_back(self, s, z, gamma_z, structure, lengths, downstream) -> torch.Tensor:
        """The surrogate gradient w.r.t. the scores, given γ(ẑ) = ``gamma_z``."""
        mu0 = mu = z if self.starts_at_map else structure.marginals(s, lengths)
        for t in range(self.steps):
            gamma = gamma_z if t == 0 and self.starts_at_map else self._gamma(downstream, mu)
            mu = self.project(mu - self.eta * gamma, structure, lengths)
        return mu0 - mu

    def _gamma(self, downstream, mu):
        return loss_gradient(downstream, mu, type(self).__name__)


class SteI(PulledBack):
    """Straight-through with identity (STE-I): plain gradient steps on μ from ẑ (seed 001, Eq. 15)."""


class Spigot(PulledBack):
    """SPIGOT (Peng et al., 2018): projected gradient steps from ẑ onto M = conv(Z) (seed 001, Eq. 9-14)."""

    def project(self, x, structure, lengths):
        return structure.sparsemap(x, lengths)


class SpigotCe(Spigot):
    """SPIGOT-CE: projected gradient from μ0 = Marg(s), with the cross-entropy (CRF) loss (seed 001, Eq. 16-17)."""

    calls = frozenset({"map", "marginals"})

    starts_at_map = False


class SpigotEg(PulledBack):
    """SPIGOT-EG: exponentiated-gradient / mirror-descent steps on the scores (seed 001, Eq. 18-22)."""

    calls = frozenset({"map", "marginals"})

    starts_at_map = False

    def pull_back(self, s, z, gamma_z, structure, lengths, downstream):
        mu0 = mu = structure.marginals(s, lengths)
        for _ in range(self.steps):
            s = s - self.eta * self._gamma(downstream, mu)
            mu = structure.marginals(s, lengths)
        return mu0 - mu


class SteS(Estimator):
    """Straight-through softmax / marginals (STE-S): MAP forward, backward J_Marg(s)ᵀ γ(ẑ) with the full Jacobian.

    (The authors' code used only the Jacobian's diagonal; this is the estimator as the paper defines it.)
    """

    calls = frozenset({"map", "marginals"})

    def train_forward(self, scores, structure, lengths, downstream):
        return straight_through(scores, structure.map(scores, lengths), structure, lengths)


def straight_through(scores, z, structure, lengths, noise=None, tau: float = 1.0):
    """Forward ``z`` exactly; backward ∂/∂s <Marg((s + noise) / τ), γ> = J_Marg((s + noise)/τ)ᵀ γ / τ."""
    s = scores.detach()

    def backward_fn(gamma):
        with torch.enable_grad():
            x = s.clone().requires_grad_(True)
            mu = structure.marginals((x if noise is None else x + noise) / tau, lengths)
            (grad,) = torch.autograd.grad(mu, x, gamma)
        return grad

    return surrogate(scores, z, backward_fn)

"""Stochastic estimators: the forward pass samples a vertex (seed 000; seed 001 §4 "Introducing stochasticity")."""

from __future__ import annotations

from typing import Literal

import torch

from latentstruct.estimators.base import Estimator, Tempered, surrogate
from latentstruct.estimators.surrogate import straight_through
from latentstruct.structures.base import gumbel_like

__all__ = ["StGumbel", "PerturbAndMap", "Sfe"]


class StGumbel(Tempered):
    """Straight-through Gumbel / perturb-and-MAP: forward MAP(s + G), backward J_Marg((s + G)/τ)ᵀ γ / τ.

    The backward is the exact gradient of the Gumbel-softmax relaxation at the same noise; with τ = 1 (the default)
    the chain-rule factor 1/τ is 1.
    """

    def train_forward(self, scores, structure, lengths, downstream):
        noise = gumbel_like(scores)
        z = structure.map(scores.detach() + noise, lengths)
        return straight_through(scores, z, structure, lengths, noise=noise, tau=self.tau)


class PerturbAndMap(StGumbel):
    """The structured name of :class:`StGumbel` (Papandreou & Yuille, 2011; seed 001 Table 3)."""


class Sfe(Estimator):
    """Score-function estimator (REINFORCE): forward z ~ p(z | s); the gradient w.r.t. s is

        (1/B) Σ_b (L_b - b) ∇_s log p(z_b | s_b) = (1/B) Σ_b (L_b - b) (z_b - Marg(s_b)),

    with L_b = downstream(z)_b the example's own loss (not the batch mean), and b = 0 (``baseline="none"``) or a
    moving average of past batch-mean losses (``baseline="moving_average"``, decay ``decay``), updated after use.
    The decoder's own parameters get their usual gradient through the sampled z.

    Args:
        baseline: control variate: none or moving_average.
        decay: decay of the moving-average baseline.
    """

    BASELINES = ("none", "moving_average")

    def __init__(self, baseline: Literal["none", "moving_average"] = "none", decay: float = 0.9,
                 eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        if baseline not in self.BASELINES:
            raise ValueError(f"baseline must be one of {self.BASELINES}, got {baseline!r}")
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.baseline, self.decay = baseline, float(decay)
        # Part of the state dict so that a resumed run continues with the same control variate.
        self.register_buffer("running_loss", torch.tensor(float("nan")))

    def train_forward(self, scores, structure, lengths, downstream):
        if downstream is None:
            raise ValueError("Sfe needs the `downstream` closure to evaluate each sample's loss")
        z = structure.exact_sample(scores.detach(), lengths)
        with torch.no_grad():
            losses = downstream(z).detach()
        advantage = losses - self._baseline_value(losses)
        s = scores.detach()

        def backward_fn(_gamma):
            with torch.no_grad():
                grad_log_p = z - structure.marginals(s, lengths)
                return advantage.view(-1, *[1] * (s.dim() - 1)) * grad_log_p / s.shape[0]

        return surrogate(scores, z, backward_fn)

    def _baseline_value(self, losses: torch.Tensor) -> torch.Tensor:
        if self.baseline == "none":
            return torch.zeros((), dtype=losses.dtype, device=losses.device)
        mean = losses.mean().to(self.running_loss)
        if torch.isnan(self.running_loss):
            self.running_loss.copy_(mean)
        value = self.running_loss.to(losses.dtype).clone()
        self.running_loss.mul_(self.decay).add_((1 - self.decay) * mean)
        return value

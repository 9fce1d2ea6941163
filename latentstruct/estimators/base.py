"""The estimator interface (DESIGN.md §5, a contract) and the machinery shared by the surrogate-gradient families.

``latent = estimator(scores, structure, lengths=None, downstream=None)``

``downstream(mu)`` returns the per-example loss ``[batch]`` of the decoder fed a candidate μ, with everything
upstream of the scores detached. The training loss is its batch mean, so γ(μ) = ∇_μ mean(downstream(μ)) is the
gradient the optimizer would see at μ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import torch
from torch import nn

from latentstruct.ranges import Positive
from latentstruct.structures.base import Structure

__all__ = ["Estimator", "Tempered", "Downstream", "loss_gradient", "surrogate", "missing_downstream"]

Downstream = Callable[[torch.Tensor], torch.Tensor]
EVAL_LATENTS = ("map", "relaxed")


def missing_downstream(who: str, why: str) -> ValueError:
    """The error of an estimator called without the ``downstream`` closure it needs, saying how to build one."""
    return ValueError(
        f"{who} needs the `downstream` closure {why}: pass downstream=lambda mu: the per-example loss [batch] of "
        "your decoder fed mu in place of the latent, with everything upstream of the scores detached "
        "(see docs/library.md)"
    )


def loss_gradient(downstream: Downstream | None, mu: torch.Tensor, who: str = "this estimator") -> torch.Tensor:
    """γ(μ) = ∇_μ mean(downstream(μ)), computed without touching any parameter's ``.grad``."""
    if downstream is None:
        raise missing_downstream(who, "to evaluate the loss at a pulled-back μ")
    with torch.enable_grad():
        mu = mu.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(downstream(mu).mean(), mu)
    return grad


class _Surrogate(torch.autograd.Function):
    """Identity on the forward value ``z``; the backward replaces ∂z/∂s by ``backward_fn(γ)``."""

    @staticmethod
    def forward(ctx, scores, z, backward_fn):
        ctx.backward_fn = backward_fn
        return z.clone()

    @staticmethod
    def backward(ctx, grad_z):
        return ctx.backward_fn(grad_z), None, None


def surrogate(scores: torch.Tensor, z: torch.Tensor, backward_fn: Callable[[torch.Tensor], torch.Tensor]):
    """Return ``z`` in the forward pass, and ``backward_fn(γ(z))`` as the gradient w.r.t. ``scores``.

    ``γ(z)`` is the incoming gradient: since the loss is the batch mean of ``downstream``, it equals
    ∇_z mean(downstream(z)) — the "free" first inner step of Algorithm 1 (seed 001).
    """
    if not scores.requires_grad:
        return z
    return _Surrogate.apply(scores, z.detach(), backward_fn)


class Estimator(nn.Module):
    """Base class. ``relaxed`` estimators feed the decoder a continuous relaxation while training; at evaluation
    ``eval_latent`` decides what the decoder sees: ``"relaxed"`` (the estimator's deterministic relaxation; MAP for
    the non-relaxed ones) or ``"map"`` (always MAP).

    Args:
        eval_latent: decoder input at evaluation: relaxed (the relaxation, if any) or map.
    """

    #: what this estimator calls of a structure (:mod:`latentstruct.capabilities`: refused at composition when the
    #: structure lacks one)
    calls: frozenset[str] = frozenset({"map"})

    relaxed: bool = False

    # What a task may ask of an estimator, instead of asking which class it is (each has a default here and is
    # overridden by the estimators it concerns; docs/architecture.md, "Estimators (contract)"):

    #: the call takes ``sigma=``, a noise-scale tensor per example (a σ-network's output: a learned σ)
    takes_sigma: bool = False
    #: the call takes ``target=``, the known best vertices of a batch (labelled examples), in place of ``downstream``
    takes_target: bool = False
    #: reads ``downstream`` only through its loss vector ℓ = ∇_z downstream at the forward vertex: a task whose loss
    #: is not linear in z serves it better with a linear ``downstream`` whose slope holds each part's exact loss
    wants_loss_vector: bool = False
    #: the loss can be its exact expectation over every vertex: a task that computes each vertex's loss with its
    #: graph uses :func:`latentstruct.estimators.exact.expected_loss` instead of calling the estimator
    enumerates: bool = False
    #: trains a sequential policy from its sampled actions' log-probabilities (``policy_loss``) rather than acting
    #: at each step; a task with a sampled policy (the ListOps merge parser) samples, then adds ``policy_loss``
    policy_gradient: bool = False
    #: training steps between refreshes of a frozen behaviour policy that samples in its place; None: the current
    #: policy samples (the task keeps the copy and refreshes it)
    behaviour_refresh: int | None = None

    @property
    def temperature(self) -> float | None:
        """The positive value a schedule anneals, set before each step as a learning rate is (None: nothing to
        anneal): a relaxation's τ, direct's |ε| towards the best vertex."""
        return None

    @temperature.setter
    def temperature(self, value: float) -> None:
        raise ValueError(f"{type(self).__name__} has no temperature to set")

    def __init__(self, eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__()
        if eval_latent not in EVAL_LATENTS:
            raise ValueError(f"eval_latent must be one of {EVAL_LATENTS}, got {eval_latent!r}")
        self.eval_latent = eval_latent

    def forward(
        self,
        scores: torch.Tensor,
        structure: Structure,
        lengths: torch.Tensor | None = None,
        downstream: Downstream | None = None,
    ) -> torch.Tensor:
        if self.training:
            return self.train_forward(scores, structure, lengths, downstream)
        if self.relaxed and self.eval_latent == "relaxed":
            return self.relax(scores, structure, lengths)
        return structure.map(scores, lengths)

    def train_forward(self, scores, structure, lengths, downstream):
        raise NotImplementedError

    def relax(self, scores, structure, lengths):
        """The deterministic relaxation fed to the decoder at evaluation (relaxed estimators only)."""
        return structure.map(scores, lengths)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "training")


class Tempered(Estimator):
    """An estimator with a temperature τ > 0 (the Gumbel family).

    Args:
        tau: temperature τ of the relaxation.
    """

    def __init__(self, tau: Annotated[float, Positive] = 1.0, eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.tau = float(tau)

    @property
    def temperature(self) -> float:
        """τ."""
        return self.tau

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.tau = value

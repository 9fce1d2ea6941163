"""Stochastic estimators: the forward pass samples a vertex (seed 000; seed 001 §4 "Introducing stochasticity"),
or, for the score-function family, a sequence of choices of a policy (the merge parser of ListOps).

The score-function family (:class:`Sfe`, :class:`Ppo`) has one control variate rule (:meth:`Sfe.advantage`) for both
kinds of latent: a structure through the §5 interface, and a sequential policy whose per-step log-probabilities the
caller hands to :meth:`Sfe.policy_loss`. The functional tier (:func:`reinforce_loss`, :func:`ppo_loss`,
:func:`ppo_update`) works on such per-step log-probabilities directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import torch
from torch import nn

from latentstruct.estimators.base import Estimator, Tempered, missing_downstream, surrogate
from latentstruct.estimators.perturbation import repeat_batch
from latentstruct.estimators.surrogate import straight_through
from latentstruct.ranges import AtLeast, Between
from latentstruct.structures.base import gumbel_like

__all__ = ["StGumbel", "PerturbAndMap", "Sfe", "Ppo", "reinforce_loss", "ppo_loss", "ppo_update"]


class StGumbel(Tempered):
    """Straight-through Gumbel / perturb-and-MAP: forward MAP(s + G), backward J_Marg((s + G)/τ)ᵀ γ / τ.

    The backward is the exact gradient of the Gumbel-softmax relaxation at the same noise; with τ = 1 (the default)
    the chain-rule factor 1/τ is 1.
    """

    calls = frozenset({"map", "marginals"})

    def train_forward(self, scores, structure, lengths, downstream):
        noise = gumbel_like(scores)
        z = structure.map(scores.detach() + noise, lengths)
        return straight_through(scores, z, structure, lengths, noise=noise, tau=self.tau)


class PerturbAndMap(StGumbel):
    """The structured name of :class:`StGumbel` (Papandreou & Yuille, 2011; seed 001 Table 3)."""


class Sfe(Estimator):
    """Score-function estimator (REINFORCE; Williams, 1992), over a structure or over a sequential policy.

    *Structure* (the §5 interface): M = ``samples`` draws z_{m,b} ~ p(z | s_b) per example (``exact_sample`` on the
    batch repeated M times along its first dimension, row m·B + b = draw m of example b); the gradient w.r.t. s is

        (1/B) Σ_b (1/M) Σ_m A_{m,b} ∇_s log p(z_{m,b} | s_b) = (1/B) Σ_b (1/M) Σ_m A_{m,b} (z_{m,b} - Marg(s_b)),

    A_{m,b} = L_{m,b} - b_{m,b}, with L_{m,b} = downstream(z_m)_b the example's own loss on draw m (not the batch
    mean; one ``downstream`` call per draw). The forward value is the first draw z_1 (the decoder gets one vertex per
    example), so the decoder's own parameters get their usual gradient through z_1 alone; the other draws only
    improve the scores' gradient. With M = 1 this is the plain one-sample estimator.

    *Sequential policy* (:meth:`policy_loss`): the caller samples actions a_t ~ π(· | state_t) (e.g. the merges of
    :class:`~latentstruct.models.tree_parsers.MergeParser`), evaluates the example's loss L_b on them, and adds the
    surrogate mean_b A_b Σ_t log π(a_{b,t}) − β mean_b Σ_t H_t (:func:`reinforce_loss`; β = ``entropy_weight``), whose
    gradient is an unbiased estimate of ∇ E[L] − β ∇ E[Σ_t H_t] (Yogatama et al., 2017).

    The control variate b (:meth:`advantage`, the same rule for both) never depends on the sampled z, so the
    estimator stays unbiased:

    * ``none``: b = 0;
    * ``moving_average``: a moving average of past batch-mean losses, decay ``decay``, updated after use. Its first
      call, with no history, returns the first batch's own mean (the batch stands in for the missing history: on
      that one step b depends on the sample through its 1/B share of the mean; every later value is the past's
      only). The state is a buffer, so a resumed run continues with the same control variate;
    * ``self_critical``: b_b = the loss of the MAP structure (the greedy policy) for the same example, without
      gradient (Rennie et al., 2017): A_b < 0 exactly when the sample beats the greedy choice;
    * ``rloo``: the leave-one-out mean of the example's other draws, b_{m,b} = (1/(M-1)) Σ_{j≠m} L_{j,b} (Kool et al.,
      2019, "Buy 4 REINFORCE samples, get a baseline for free!"): A_{m,b} = M/(M-1) (L_{m,b} - mean_j L_{j,b}).
      Independent of draw m, so unbiased; it needs ``samples`` ≥ 2, and a structure (a sequential policy's caller
      draws one sample per example).

    ``normalize_advantage`` divides A by max(1, σ), σ² a running mean (decay ``norm_decay``, from 1) of the batch
    variance of A: Havrylov et al. (2019)'s "gradient normalisation".

    Args:
        baseline: control variate: none, moving_average, self_critical or rloo (leave-one-out, samples ≥ 2).
        decay: decay of the moving-average baseline.
        entropy_weight: sequential policies: weight β of the entropy bonus (sum of the per-step entropies).
        normalize_advantage: divide the advantage by max(1, its running std).
        norm_decay: decay of the advantage's running variance.
        samples: M, draws per example on a structure (exact_sample on the batch repeated M times); the scores'
            gradient averages over them, the decoder is fed the first.
    """

    calls = frozenset({"map", "marginals", "exact_samples"})
    policy_gradient = True

    BASELINES = ("none", "moving_average", "self_critical", "rloo")

    def __init__(self, baseline: Literal["none", "moving_average", "self_critical", "rloo"] = "none",
                 decay: Annotated[float, Between(0, 1, hi_open=True)] = 0.9, entropy_weight: float = 0.0,
                 normalize_advantage: bool = False, norm_decay: Annotated[float, Between(0, 1, hi_open=True)] = 0.9,
                 samples: Annotated[int, AtLeast(1)] = 1, eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        if baseline not in self.BASELINES:
            raise ValueError(f"baseline must be one of {self.BASELINES}, got {baseline!r}")
        if not 0 <= decay < 1 or not 0 <= norm_decay < 1:
            raise ValueError(f"decay and norm_decay must be in [0, 1), got {decay}, {norm_decay}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
        if baseline == "rloo" and samples < 2:
            raise ValueError(f"baseline=rloo (leave-one-out) needs samples >= 2 draws per example, got {samples}")
        self.samples = int(samples)
        self.baseline, self.decay = baseline, float(decay)
        self.entropy_weight, self.normalize_advantage = float(entropy_weight), bool(normalize_advantage)
        self.norm_decay = float(norm_decay)
        # Part of the state dict so that a resumed run continues with the same control variate.
        self.register_buffer("running_loss", torch.tensor(float("nan")))
        if self.normalize_advantage:
            self.register_buffer("advantage_var", torch.tensor(1.0))

    def train_forward(self, scores, structure, lengths, downstream):
        if downstream is None:
            raise missing_downstream(type(self).__name__, "to evaluate each sample's loss")
        if self.entropy_weight:
            raise ValueError("entropy_weight is for sequential policies (policy_loss), not for a structure")
        s, n = scores.detach(), self.samples
        z_all = structure.exact_sample(repeat_batch(s, n), repeat_batch(lengths, n)).reshape(n, *s.shape)
        with torch.no_grad():
            losses = torch.stack([downstream(z_m).detach() for z_m in z_all])  # [M, B]
        advantage = self.advantage(losses, lambda: downstream(structure.map(s, lengths)))

        def backward_fn(_gamma):
            with torch.no_grad():
                grad_log_p = z_all - structure.marginals(s, lengths)  # [M, B, ...]
                weighted = advantage.view(*advantage.shape, *[1] * (s.dim() - 1)) * grad_log_p
                return weighted.mean(0) / s.shape[0]

        return surrogate(scores, z_all[0], backward_fn)

    def policy_loss(self, log_probs: torch.Tensor, mask: torch.Tensor, losses: torch.Tensor,
                    entropy: torch.Tensor | None = None, greedy: Callable[[], torch.Tensor] | None = None,
                    old_log_probs: torch.Tensor | None = None) -> torch.Tensor:
        """The surrogate (a scalar) to add to the task's loss for actions sampled from the current policy.

        ``log_probs`` (differentiable), ``mask``, ``entropy`` ``[B, T]`` per step (masked steps ignored);
        ``losses`` ``[B]`` the examples' losses on the sampled actions (detached here); ``greedy()`` → ``[B]`` the
        losses of the greedy actions (needed by ``self_critical`` only). ``old_log_probs`` is PPO's (:class:`Ppo`).
        """
        if old_log_probs is not None:
            raise ValueError("old_log_probs (a behaviour policy) is PPO's: use estimator=ppo")
        self._one_draw_policy()
        return reinforce_loss(log_probs, mask, -self.advantage(losses, greedy), None, entropy, self.entropy_weight)

    def _one_draw_policy(self):
        if self.samples > 1 or self.baseline == "rloo":
            raise ValueError("samples > 1 and baseline=rloo are for a structure's scores: a sequential policy's "
                             "caller draws one sample per example (use samples=1 and another baseline)")

    @torch.no_grad()
    def advantage(self, losses: torch.Tensor, greedy: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """A = L − b, shaped like ``losses``: ``[B]``, or ``[M, B]`` for M draws per example (detached; the class
        docstring gives b; ``greedy()`` is ``[B]``), divided by max(1, running std) when ``normalize_advantage``.
        Updates the running statistics: call it once per training step."""
        losses = losses.detach()
        if self.baseline == "rloo":
            m = losses.shape[0] if losses.dim() == 2 else 1
            if m < 2:
                raise ValueError(f"baseline=rloo needs losses [M, B] of M >= 2 draws per example, got shape "
                                 f"{tuple(losses.shape)}")
            advantage = losses - (losses.sum(0, keepdim=True) - losses) / (m - 1)
        elif self.baseline == "self_critical":
            if greedy is None:
                raise ValueError("the self_critical baseline needs the loss of the greedy choice (`greedy`)")
            advantage = losses - greedy().detach()
        else:
            advantage = losses - self._baseline_value(losses)
        if self.normalize_advantage:
            var = advantage.var(unbiased=False).to(self.advantage_var)
            self.advantage_var.mul_(self.norm_decay).add_((1 - self.norm_decay) * var)
            advantage = advantage / self.advantage_var.sqrt().clamp_min(1.0).to(advantage)
        return advantage

    def _baseline_value(self, losses: torch.Tensor) -> torch.Tensor:
        if self.baseline == "none":
            return torch.zeros((), dtype=losses.dtype, device=losses.device)
        mean = losses.mean().to(self.running_loss)
        if torch.isnan(self.running_loss):
            self.running_loss.copy_(mean)
        value = self.running_loss.to(losses.dtype).clone()
        self.running_loss.mul_(self.decay).add_((1 - self.decay) * mean)
        return value


class Ppo(Sfe):
    """Proximal policy optimisation (Schulman et al., 2017) for a sequential policy, with :class:`Sfe`'s control
    variates: actions a_b sampled from a *behaviour* policy π_old (a frozen copy of the policy that the caller
    refreshes every ``refresh`` training steps), and the surrogate (:func:`ppo_loss`)

        −mean_b min(ρ_b A_b, clip(ρ_b, 1 − ε, 1 + ε) A_b) − β mean_b Σ_t H_t,   ρ_b = π_θ(a_b | x_b) / π_old(a_b | x_b),

    with A = −(L − b) the advantage of :meth:`Sfe.advantage` as a reward. With ``refresh=1``, ρ = 1 and the gradient
    is :class:`Sfe`'s. PPO has no rule for a structure's scores (no behaviour policy): use ``sfe`` there.

    Args:
        baseline: control variate: none, moving_average or self_critical (one sequence per example: no rloo).
        clip: ε of the clipped probability ratio (Havrylov et al. 2019: 0.2).
        refresh: training steps between refreshes of the behaviour policy (the PPO updates per sample; Havrylov et
            al. 2019: 15 per batch).
    """

    calls = frozenset({"sequential_policy"})

    def __init__(self, baseline: Literal["none", "moving_average", "self_critical"] = "none",
                 decay: Annotated[float, Between(0, 1, hi_open=True)] = 0.9, entropy_weight: float = 0.0,
                 normalize_advantage: bool = False, norm_decay: Annotated[float, Between(0, 1, hi_open=True)] = 0.9,
                 clip: Annotated[float, Between(0, 1, lo_open=True, hi_open=True)] = 0.2,
                 refresh: Annotated[int, AtLeast(1)] = 15, eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(baseline, decay, entropy_weight, normalize_advantage, norm_decay, eval_latent=eval_latent)
        if baseline == "rloo":
            raise ValueError("ppo draws one sequence per example: baseline=rloo is sfe's, on a structure")
        if not 0 < clip < 1 or refresh < 1:
            raise ValueError(f"need 0 < clip < 1 and refresh >= 1, got {clip}, {refresh}")
        self.clip, self.refresh = float(clip), int(refresh)

    @property
    def behaviour_refresh(self) -> int:
        """``refresh``: the behaviour policy is the caller's frozen copy, refreshed every ``refresh`` steps."""
        return self.refresh

    def train_forward(self, scores, structure, lengths, downstream):
        raise ValueError("ppo trains a sequential policy (policy_loss); for a structure's scores use estimator=sfe")

    def policy_loss(self, log_probs, mask, losses, entropy=None, greedy=None, old_log_probs=None):
        """:meth:`Sfe.policy_loss` with the behaviour policy's ``old_log_probs`` ``[B, T]`` (required)."""
        if old_log_probs is None:
            raise ValueError("ppo needs the behaviour policy's log-probabilities (old_log_probs)")
        surrogate = ppo_loss(log_probs, old_log_probs, mask, -self.advantage(losses, greedy), self.clip)
        if self.entropy_weight and entropy is not None:
            surrogate = surrogate - self.entropy_weight * entropy.masked_fill(~mask, 0).sum(-1).mean()
        return surrogate


# ------------------------------------------------------------------------------- functional: per-step policies


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def reinforce_loss(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    reward: torch.Tensor,
    baseline: torch.Tensor | float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_weight: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Score-function (REINFORCE) surrogate to minimise: −(1/B) Σ_b (R_b − b_b) Σ_t mask · log π_t, minus
    ``entropy_weight`` · (1/B) Σ_b Σ_t mask · H_t when ``entropy`` is given.

    ``log_probs``, ``mask``, ``entropy`` ``[B, T]`` (masked entries are ignored whatever they hold); ``reward``
    ``[B]`` is to be *maximised* (accuracy, or −loss) and ``baseline`` (``[B]``, a scalar or None for 0) must not
    depend on the sampled actions; both are detached. The gradient is then an unbiased estimate of −∇ E_π[R]
    (Σ_a b ∇π(a | x) = b ∇1 = 0). When R itself depends on parameters (a differentiable composition), add its own
    pathwise term: minimise ``task_loss + reinforce_loss(..., reward=-task_loss)``. ``reduction="none"`` returns the
    per-example terms ``[B]``.
    """
    advantage = reward.detach()
    if baseline is not None:
        advantage = advantage - torch.as_tensor(baseline, dtype=advantage.dtype, device=advantage.device).detach()
    total = log_probs.masked_fill(~mask, 0.0).sum(-1)
    loss = -advantage * total
    if entropy is not None and entropy_weight:
        loss = loss - entropy_weight * entropy.masked_fill(~mask, 0.0).sum(-1)
    return _reduce(loss, reduction)


def ppo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantage: torch.Tensor,
    clip: float = 0.2,
    reduction: str = "mean",
) -> torch.Tensor:
    """Clipped PPO surrogate to minimise (Schulman et al., 2017) on whole action sequences (Havrylov et al., 2019):
    −(1/B) Σ_b min(ρ_b A_b, clip(ρ_b, 1 − ε, 1 + ε) A_b), ρ_b = exp Σ_t mask · (new − old).

    ``new_log_probs`` (differentiable), ``old_log_probs`` (detached), ``mask`` ``[B, T]``; ``advantage`` ``[B]``
    (R − b, detached); ``clip`` = ε. The ratio is the whole sequence's (per trajectory, not per step). At ρ = 1 the
    gradient equals :func:`reinforce_loss`'s with R − b = A; once ρ leaves [1 − ε, 1 + ε] on the side that A
    favours, the example's gradient is 0.
    """
    if not 0 < clip < 1:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    diff = (new_log_probs - old_log_probs.detach()).masked_fill(~mask, 0.0).sum(-1)
    ratio = diff.exp()
    advantage = advantage.detach()
    objective = torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    return _reduce(-objective, reduction)


def ppo_update(
    rescore: Callable[[torch.Tensor], torch.Tensor],
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantage: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    epochs: int = 4,
    clip: float = 0.2,
    max_grad_norm: float | None = None,
) -> list[float]:
    """K = ``epochs`` PPO steps on one stored batch of trajectories (the original algorithm); returns the loss
    before each step.

    ``rescore(actions [B, T]) → new log_probs [B, T]`` re-scores the stored actions under the current parameters,
    e.g. ``lambda a: parser(x, lengths, mode="given", actions=a).log_probs``. Each epoch: zero the gradients,
    :func:`ppo_loss` against the stored ``old_log_probs`` and ``advantage``, backward, clip the gradient norm of the
    optimizer's parameters to ``max_grad_norm`` (if given), step.
    """
    old_log_probs, advantage = old_log_probs.detach(), advantage.detach()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses = []
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = ppo_loss(rescore(actions), old_log_probs, mask, advantage, clip)
        loss.backward()
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses

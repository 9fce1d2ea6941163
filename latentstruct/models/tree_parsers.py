"""Incremental latent-tree parsers: a binary tree over n leaves built by n − 1 merges of adjacent nodes, composed by
a binary Tree-LSTM, and the policy-gradient losses that train them (seed 000, Parts II and III).

Parser (easy-first, bottom-up adjacent merge; Choi et al., 2018)
----------------------------------------------------------------
The leaves are r⁰ = (leaf(x_0), …, leaf(x_{L-1})) (:meth:`BinaryTreeLSTMCell.leaf`). At step t = 0 … L − 2 the
current list r^t = (r_0, …, r_{L-1-t}) of (h, c) nodes is shortened by one merge: every adjacent pair is composed
into a candidate parent and scored with a learned query vector q,

    p_i = cell(r_i, r_{i+1}),     s_i = qᵀ h(p_i),     π(a_t = i | r^t) = softmax(s)_i     (i = 0 … L − 2 − t),

a pair a_t is chosen, and r^{t+1} = (r_0, …, r_{a−1}, p_a, r_{a+2}, …). After L − 1 steps one node is left, the
root. The actions a = (a_0, …, a_{L-2}) determine the tree (the merged span at step t is a constituent), but not
conversely: a tree with two disjoint constituents can be built in several orders. The policy is over action
sequences, π(a | x) = Π_t π(a_t | r^t); every log-probability, ratio and entropy below is over action sequences, and
expectations over them equal expectations over trees (the tree is a function of a).

Choice rules (``mode``):

* ``gumbel`` — Gumbel Tree-LSTM (Choi et al., 2018), straight-through Gumbel-softmax at every step: y = softmax((s + g)
  / τ) with g ~ Gumbel(0, 1); forward the exact one-hot of argmax(s + g), backward the gradient of y. The new node
  list is the convex combination r^{t+1}_i = (1 − C_i) r_i + y_i p_i + (C_i − y_i) r_{i+1} with C_i = Σ_{k≤i} y_k
  (in the forward pass exactly the list above), so the downstream gradient reaches the scores, hence q.
* ``sample`` — a_t ~ π(· | r^t) (Gumbel-max), no gradient through the choice; for REINFORCE / PPO.
* ``argmax`` — greedy a_t = argmax s. ``gumbel`` and ``sample`` fall back to it in eval mode (``module.eval()``).
* ``given`` — follow given actions (or a given tree, through :func:`tree_actions`): teacher forcing, to compose along a
  known tree (gold, left/right-branching) or to re-score old actions (PPO).

Every mode returns the log-probabilities log π(a_t | r^t) of the actions taken under the current scores (with their
gradient), the per-step entropies H(π(· | r^t)) and the tree in the layout of
:class:`~latentstruct.structures.BinaryTree` (``z[b, i, j]`` = 1 iff leaves i..j form a constituent, i < j; diagonal,
lower triangle and padding 0), so that ``tree_f1`` and ``tree_depth`` of :mod:`latentstruct.data.listops` apply.

Score-function estimator (Williams, 1992; Yogatama et al., 2017)
----------------------------------------------------------------
For a reward R(a) to *maximise* (accuracy, or −loss) and any baseline b(x) that does not depend on a,

    ∇ E_{a~π}[R(a)] = E_{a~π}[(R(a) − b(x)) ∇ log π(a | x)],

because Σ_a b ∇π(a | x) = b ∇1 = 0. :func:`reinforce_loss` returns the surrogate to *minimise*,
−(1/B) Σ_b (R_b − b_b) Σ_t log π(a_{b,t}), whose gradient is an unbiased estimate of −∇ E[R]; the reward and the
baseline are detached. When R depends on parameters through the root (the composition is differentiable), its own
pathwise gradient −∇R(a) must be added, i.e. minimise ``task_loss + reinforce_loss(..., reward=-task_loss)``.
Control variates: :class:`MovingAverageBaseline` (a moving average of past batch-mean rewards; seed 000, "Control
variates"), :func:`self_critical_baseline` (the reward of the greedy parse of the same example; Rennie et al., 2017),
and any input-dependent b(x) the caller learns (Havrylov et al., 2019). An optional entropy bonus subtracts
β · (1/B) Σ_b Σ_t H_t.

PPO (Schulman et al., 2017; Havrylov et al., 2019)
-------------------------------------------------
With stored actions a, their old log-probabilities and advantages A_b = R_b − b_b, :func:`ppo_loss` is

    −(1/B) Σ_b min(ρ_b A_b, clip(ρ_b, 1 − ε, 1 + ε) A_b),     ρ_b = π_θ(a_b | x_b) / π_old(a_b | x_b),

with ρ the ratio of the whole parse's probabilities (per trajectory, not per step). The seed only names PPO as
Havrylov et al.'s remedy for co-adaptation; we read their objective as clipping the ratio of the parse's
probability π(z | x), a product over the merge decisions, and use that. At ρ = 1 its gradient is the REINFORCE
surrogate's, −A ∇ log π(a). :func:`ppo_update` runs K epochs of it over one stored batch, re-scoring the old actions
with ``mode="given"``.

Cost. Every step composes all m − 1 adjacent pairs: Σ_t (L − 1 − t) ≈ L²/2 cell applications per example, so
O(B n² dim²) time and O(B n² dim) autograd memory, with a Python loop over the n − 1 steps only.

References: R. J. Williams (1992), "Simple statistical gradient-following algorithms for connectionist reinforcement
learning", Machine Learning. D. Yogatama, P. Blunsom, C. Dyer, E. Grefenstette, W. Ling (2017), "Learning to compose
words into sentences with reinforcement learning", ICLR. J. Choi, K. M. Yoo, S. Lee (2018), "Learning to compose
task-specific tree structures", AAAI. S. J. Rennie, E. Marcheret, Y. Mroueh, J. Ross, V. Goel (2017), "Self-critical
sequence training for image captioning", CVPR. J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov (2017),
"Proximal policy optimization algorithms", arXiv:1707.06347. S. Havrylov, G. Kruszewski, A. Joulin (2019),
"Cooperative learning of disjoint syntax and semantics", NAACL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.models.composition import BinaryTreeLSTMCell
from latentstruct.models.masks import check_lengths, length_mask
from latentstruct.structures.base import gumbel_like

__all__ = [
    "MODES",
    "MergeParser",
    "MovingAverageBaseline",
    "Parse",
    "ppo_loss",
    "ppo_update",
    "reinforce_loss",
    "self_critical_baseline",
    "tree_actions",
]

#: the choice rules of :class:`MergeParser`
MODES: tuple[str, ...] = ("gumbel", "sample", "argmax", "given")


def _st_gumbel(
    scores: torch.Tensor, tau: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Straight-through Gumbel-softmax over the last dim of ``scores`` ``[B, K]`` (−inf = not allowed; at least one
    finite per row): ``(y, a)`` with ``y`` exactly the one-hot of a = argmax(s + g) in the forward pass and the
    gradient of softmax((s + g)/τ) in the backward pass."""
    soft = ((scores + gumbel_like(scores, generator)) / tau).softmax(-1)
    index = soft.argmax(-1)
    hard = F.one_hot(index, scores.shape[-1]).to(soft.dtype)
    # hard + (soft − soft) rather than hard − soft + soft: the forward value is then exactly 0/1.
    return hard + (soft - soft.detach()), index


# ------------------------------------------------------------------------------------------------------- parser


@dataclass
class Parse:
    """The output of :class:`MergeParser` for a batch ``[B, n]`` (T = n − 1 steps; step t of example b is real iff
    ``mask[b, t]``, i.e. t < lengths[b] − 1).

    * ``h``, ``c`` ``[B, dim]`` — the root state (a single leaf's state when the length is 1).
    * ``actions`` ``[B, T]`` long — a_t, the index of the left node of the merged pair in the step-t list (0 where
      masked).
    * ``log_probs`` ``[B, T]`` — log π(a_t | r^t) under the current scores, differentiable (0 where masked).
    * ``entropy`` ``[B, T]`` — H(π(· | r^t)), differentiable (0 where masked).
    * ``mask`` ``[B, T]`` bool.
    * ``z`` ``[B, n, n]`` — the tree, 0/1 in x's dtype, BinaryTree layout (n − 1 ones per full-length example).
    """

    h: torch.Tensor
    c: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor
    z: torch.Tensor

    @property
    def log_prob(self) -> torch.Tensor:
        """log π(a | x) = Σ_t log π(a_t | r^t), ``[B]``."""
        return self.log_probs.masked_fill(~self.mask, 0.0).sum(-1)


class MergeParser(nn.Module):
    """Easy-first merge parser with a binary Tree-LSTM composition (module docstring; Choi et al., 2018).

    ``forward(x [B, n, input_dim], lengths [B] | None, mode=None, actions=None, tree=None, generator=None)`` →
    :class:`Parse`. ``mode`` (default: the constructor's) is one of :data:`MODES`; in eval mode ``gumbel`` and
    ``sample`` become ``argmax``. ``given`` needs exactly one of ``actions`` ``[B, n-1]`` (entries at masked steps
    are ignored) or ``tree`` ``[B, n, n]`` (a binary bracketing per example, replayed via :func:`tree_actions`; a
    ValueError if the replay does not reproduce it). ``generator`` seeds the Gumbel noise.

    ``cell`` — pass a :class:`BinaryTreeLSTMCell` to share it (e.g. one parser and one composer with disjoint
    parameters as in Havrylov et al. (2019): ``composer(x, lengths, mode="given", actions=parse.actions)``); by
    default a fresh ``BinaryTreeLSTMCell(dim, input_dim)``, used both to build the candidates and to compose, as in
    Choi et al. (2018). The query q ``[dim]`` starts small (N(0, 0.01²)) so that the first policy is nearly uniform.
    Padded words of ``x`` are replaced by 0 and never reach a real node, so in the deterministic modes (``argmax``,
    ``given``) an example's output does not depend on the padding or on the rest of the batch.
    """

    def __init__(
        self, input_dim: int, dim: int, mode: str = "gumbel", tau: float = 1.0, cell: BinaryTreeLSTMCell | None = None
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        self.cell = BinaryTreeLSTMCell(dim, input_dim) if cell is None else cell
        if self.cell.dim != dim or self.cell.dim_in != input_dim:
            raise ValueError(f"cell is ({self.cell.dim_in} → {self.cell.dim}), expected ({input_dim} → {dim})")
        self.input_dim, self.dim, self.mode, self.tau = input_dim, dim, mode, float(tau)
        self.query = nn.Parameter(0.01 * torch.randn(dim))

    def score(self, parent_h: torch.Tensor) -> torch.Tensor:
        """Pair scores s_i = qᵀ h(p_i): ``[B, m-1, dim]`` → ``[B, m-1]``."""
        return parent_h @ self.query

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor | None = None,
        mode: str | None = None,
        actions: torch.Tensor | None = None,
        tree: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Parse:
        mode = self.mode if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not self.training and mode in ("gumbel", "sample"):
            mode = "argmax"
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must be [B, n, {self.input_dim}], got {tuple(x.shape)}")
        batch, n, _ = x.shape
        device = x.device
        lengths = check_lengths(lengths, batch, n, device)
        steps = torch.arange(n - 1, device=device)
        step_mask = steps.view(1, -1) < (lengths - 1).view(-1, 1)  # [B, T]
        if mode == "given":
            if (actions is None) == (tree is None):
                raise ValueError("mode='given' needs exactly one of `actions` or `tree`")
            if tree is not None:
                actions = tree_actions(tree, lengths)
            actions = torch.as_tensor(actions, device=device).long()
            if actions.shape != (batch, n - 1):
                raise ValueError(f"actions must be [{batch}, {n - 1}], got {tuple(actions.shape)}")
            actions = actions.masked_fill(~step_mask, 0)
            highest = (lengths - 2).view(-1, 1) - steps.view(1, -1)  # a_t ≤ L − 2 − t
            if bool(((actions < 0) | (actions > highest))[step_mask].any()):
                raise ValueError("given actions out of range: a_t must lie in 0..lengths-2-t at every real step")
        elif actions is not None or tree is not None:
            raise ValueError(f"`actions` / `tree` are only read with mode='given', not {mode!r}")

        x = x.masked_fill(~length_mask(lengths, n, device).unsqueeze(-1), 0.0)
        h, c = self.cell.leaf(x)  # [B, m, dim], m = n − t nodes at step t (the real ones first)
        start = torch.arange(n, device=device).expand(batch, n)  # leaves spanned by each node
        end = start
        z = torch.zeros(batch, n, n, dtype=x.dtype, device=device)
        rows = torch.arange(batch, device=device)
        taken, log_probs, entropies = [], [], []
        for t in range(n - 1):
            m = n - t
            active = t < lengths - 1  # [B]: examples with at least two nodes left
            parent_h, parent_c = self.cell(h[:, :-1], c[:, :-1], h[:, 1:], c[:, 1:])  # [B, m-1, dim]
            pairs = torch.arange(m - 1, device=device)
            # Finished examples keep pair 0 allowed: an all −inf row would put NaN into the softmax's backward.
            valid = pairs.view(1, -1) < (lengths - 1 - t).clamp_min(1).view(-1, 1)  # [B, m-1]
            scores = self.score(parent_h).masked_fill(~valid, float("-inf"))
            log_p = scores.log_softmax(-1)
            entropies.append(-(log_p.exp() * log_p.masked_fill(~valid, 0.0)).sum(-1))
            if mode == "gumbel":
                select, a = _st_gumbel(scores, self.tau, generator)
            else:
                if mode == "sample":
                    a = (scores.detach() + gumbel_like(scores, generator)).argmax(-1)
                elif mode == "argmax":
                    a = scores.detach().argmax(-1)
                else:
                    a = actions[:, t]
                select = F.one_hot(a, m - 1).to(x.dtype)
            a = a.masked_fill(~active, 0)
            taken.append(a)
            log_probs.append(log_p.gather(1, a.view(-1, 1)).squeeze(1))

            # r_i ← (1 − C_i) r_i + y_i p_i + (C_i − y_i) r_{i+1}: exactly the merged list for a one-hot y.
            cum = select.cumsum(-1)
            w_left, w_parent, w_right = (1 - cum).unsqueeze(-1), select.unsqueeze(-1), (cum - select).unsqueeze(-1)
            new_h = w_left * h[:, :-1] + w_parent * parent_h + w_right * h[:, 1:]
            new_c = w_left * c[:, :-1] + w_parent * parent_c + w_right * c[:, 1:]
            done = ~active.view(-1, 1, 1)
            h, c = torch.where(done, h[:, :-1], new_h), torch.where(done, c[:, :-1], new_c)

            # the merged span, and the leaves spanned by the new list (node i ← i for i ≤ a, else i + 1)
            i, j = start.gather(1, a.view(-1, 1)).squeeze(1), end.gather(1, (a + 1).view(-1, 1)).squeeze(1)
            z[rows[active], i[active], j[active]] = 1
            shift = (pairs.view(1, -1) > a.view(-1, 1)).long()
            start_new = start.gather(1, pairs.view(1, -1) + shift)
            end_new = end.gather(1, pairs.view(1, -1) + (pairs.view(1, -1) >= a.view(-1, 1)).long())
            keep = ~active.view(-1, 1)
            start = torch.where(keep, start[:, :-1], start_new)
            end = torch.where(keep, end[:, :-1], end_new)

        def stacked(values: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
            if not values:
                return torch.zeros(batch, 0, dtype=dtype, device=device)
            return torch.stack(values, dim=1)

        out = Parse(
            h=h[:, 0],
            c=c[:, 0],
            actions=stacked(taken, torch.long).masked_fill(~step_mask, 0),
            log_probs=stacked(log_probs, x.dtype).masked_fill(~step_mask, 0.0),
            entropy=stacked(entropies, x.dtype).masked_fill(~step_mask, 0.0),
            mask=step_mask,
            z=z,
        )
        if tree is not None:
            inside = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1) & length_mask(
                lengths, n, device
            ).unsqueeze(1)
            if not torch.equal((torch.as_tensor(tree, device=device) != 0) & inside, z.bool()):
                raise ValueError("`tree` is not a binary bracketing of each example's leaves (the replay differs)")
        return out


def tree_actions(z: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Merge actions that build the binary bracketing ``z`` ``[B, n, n]`` (BinaryTree layout) → long ``[B, n-1]``
    (0 at steps ≥ lengths[b] − 1), for :class:`MergeParser` with ``mode="given"``.

    The order is shift-reduce's (SPINN's): constituents by right end, then by width, so a constituent comes after
    the ones it contains. The constituent (i, j) is then merged when every constituent ending before i already is,
    and only those, so its left child is node i − #{(i', j') ∈ z : j' < i} of the list. Only the strict upper
    triangle inside the length is read; an example without exactly lengths − 1 constituents raises ValueError.
    Crossing brackets are not detected here (``MergeParser(..., tree=z)`` checks its replay against z).
    """
    if z.dim() != 3 or z.shape[1] != z.shape[2]:
        raise ValueError(f"z must be [B, n, n], got {tuple(z.shape)}")
    batch, n, _ = z.shape
    device = z.device
    lengths = check_lengths(lengths, batch, n, device)
    pos = torch.arange(n, device=device)
    inside = length_mask(lengths, n, device)
    part = (z != 0) & (pos.view(-1, 1) < pos.view(1, -1)) & inside.unsqueeze(1)
    counts = part.flatten(1).sum(-1)
    if bool((counts != lengths - 1).any()):
        raise ValueError(f"each tree needs lengths - 1 constituents; got {counts.tolist()} for {lengths.tolist()}")
    i, j = pos.view(-1, 1).expand(n, n), pos.view(1, -1).expand(n, n)
    key = torch.where(part, j * n + (j - i), torch.full_like(j, n * n))  # by end, then width; non-parts last
    order = key.flatten(1).argsort(dim=1, stable=True)[:, : n - 1]  # [B, T]
    first, last = order // n, order % n
    real = torch.arange(n - 1, device=device).view(1, -1) < (lengths - 1).view(-1, 1)
    before = (last.unsqueeze(1) < first.unsqueeze(2)) & real.unsqueeze(1)  # [b, t, t']: span t' ends before t starts
    return (first - before.sum(-1)).masked_fill(~real, 0)


# ------------------------------------------------------------------------------------------------ REINFORCE


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

    ``log_probs``, ``mask``, ``entropy`` ``[B, T]`` (as in :class:`Parse`; masked entries are ignored whatever they
    hold); ``reward`` ``[B]`` is to be *maximised* (accuracy, or −loss) and ``baseline`` (``[B]``, a scalar or None
    for 0) must not depend on the sampled actions; both are detached. The gradient is then an unbiased estimate of
    −∇ E_π[R] (module docstring). ``reduction="none"`` returns the per-example terms ``[B]``.
    """
    advantage = reward.detach()
    if baseline is not None:
        advantage = advantage - torch.as_tensor(baseline, dtype=advantage.dtype, device=advantage.device).detach()
    total = log_probs.masked_fill(~mask, 0.0).sum(-1)
    loss = -advantage * total
    if entropy is not None and entropy_weight:
        loss = loss - entropy_weight * entropy.masked_fill(~mask, 0.0).sum(-1)
    return _reduce(loss, reduction)


class MovingAverageBaseline(nn.Module):
    """b = a moving average of past batch-mean rewards (seed 000, "Control variates").

    ``forward(reward [B])`` returns the current b ``[B]`` (broadcast), *then* updates b ← decay · b + (1 − decay) ·
    mean(reward). The value returned never depends on the rewards passed with it, so the estimator stays unbiased;
    the first call returns 0 (no history yet). The state is a buffer, so it is saved and resumed with the model.
    """

    def __init__(self, decay: float = 0.9):
        super().__init__()
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.register_buffer("value", torch.tensor(float("nan")))

    def forward(self, reward: torch.Tensor) -> torch.Tensor:
        reward = reward.detach()
        started = not bool(torch.isnan(self.value))
        current = self.value.to(reward.dtype) if started else torch.zeros((), dtype=reward.dtype)
        out = current.to(reward.device).expand(reward.shape).clone()
        mean = reward.mean().to(self.value)
        self.value.copy_(self.decay * self.value + (1 - self.decay) * mean if started else mean)
        return out


@torch.no_grad()
def self_critical_baseline(
    parser: MergeParser,
    x: torch.Tensor,
    lengths: torch.Tensor | None,
    reward_fn: Callable[[Parse], torch.Tensor],
) -> torch.Tensor:
    """Self-critical baseline (Rennie et al., 2017): b_b = the reward ``reward_fn(parse)`` ``[B]`` of the greedy
    (argmax) parse of the same example, computed without gradient. It does not depend on the sampled actions, so it
    keeps the estimator unbiased; R − b > 0 exactly when the sample beats the greedy parse."""
    return reward_fn(parser(x, lengths, mode="argmax")).detach()


# ------------------------------------------------------------------------------------------------------------ PPO


def ppo_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantage: torch.Tensor,
    clip: float = 0.2,
    reduction: str = "mean",
) -> torch.Tensor:
    """Clipped PPO surrogate to minimise (Schulman et al., 2017) on whole parses (Havrylov et al., 2019):
    −(1/B) Σ_b min(ρ_b A_b, clip(ρ_b, 1 − ε, 1 + ε) A_b), ρ_b = exp Σ_t mask · (new − old).

    ``new_log_probs`` (differentiable), ``old_log_probs`` (detached), ``mask`` ``[B, T]``; ``advantage`` ``[B]``
    (R − b, detached); ``clip`` = ε. At ρ = 1 the gradient equals :func:`reinforce_loss`'s with R − b = A; once ρ
    leaves [1 − ε, 1 + ε] on the side that A favours, the example's gradient is 0.
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
    """K = ``epochs`` PPO steps on one stored batch of trajectories; returns the loss before each step.

    ``rescore(actions [B, T]) → new log_probs [B, T]`` re-scores the stored actions under the current parameters,
    typically ``lambda a: parser(x, lengths, mode="given", actions=a).log_probs``. Each epoch: zero the gradients,
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

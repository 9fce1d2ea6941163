"""Latent-tree parsers for ListOps (seed 000, Parts II and III): an incremental merge parser, a binary tree over n
leaves built by n − 1 merges of adjacent nodes and composed by a binary Tree-LSTM, and the chart parser's span scorer.

* :class:`MergeParser` (easy-first adjacent merges, Choi et al. 2018): at every step each adjacent pair is composed
  by the Tree-LSTM cell and scored by a learned query, and one pair is merged; ``mode`` (:data:`MODES`) chooses it:
  ``estimate`` (a :class:`~latentstruct.structures.Categorical` choice by an estimator: ``st_gumbel`` is the Gumbel
  Tree-LSTM), ``sample`` (for the score-function estimators), ``argmax`` (also eval mode of the first two),
  ``given`` (follow given actions or a tree: teacher forcing). It returns a :class:`Parse`: the root state, the
  actions with their log-probabilities and entropies, and the tree ``[B, n, n]`` in the layout of
  :class:`~latentstruct.structures.BinaryTree`. O(B n² dim²) time per batch; ``given`` with ``scores=False``
  composes only the given merges, O(B n dim²), for a composer that replays a tree and reads only its root.
* :func:`tree_actions`: the merge actions that build a given tree.
* :class:`SpanScorer`: span scores ``[B, n, n]`` for :class:`~latentstruct.structures.BinaryTree` from the
  LSTM-minus features of a BiLSTM, s[i, j] = vᵀ tanh(W [f_j − f_{i−1}; b_i − b_{j+1}] + c).

The policy over action sequences, the soft merge of the relaxed estimators, the span features:
docs/models.md#tree_parsers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.models.composition import BinaryTreeLSTMCell
from latentstruct.models.masks import check_lengths, length_mask
from latentstruct.models.text import BiLSTMEncoder
from latentstruct.structures import Categorical
from latentstruct.structures.base import gumbel_like

__all__ = ["MODES", "MergeParser", "Parse", "SpanScorer", "tree_actions"]

#: the choice rules of :class:`MergeParser`
MODES: tuple[str, ...] = ("estimate", "sample", "argmax", "given")
#: each merge of ``mode="estimate"``: one choice among the adjacent pairs
_PAIRS = Categorical()


# ------------------------------------------------------------------------------------------------------- parser


@dataclass
class Parse:
    """The output of :class:`MergeParser` for a batch ``[B, n]`` (T = n − 1 steps; step t of example b is real iff
    ``mask[b, t]``, i.e. t < lengths[b] − 1).

    * ``h``, ``c`` ``[B, dim]`` — the root state (a single leaf's state when the length is 1).
    * ``actions`` ``[B, T]`` long — a_t, the index of the left node of the merged pair in the step-t list (0 where
      masked).
    * ``log_probs`` ``[B, T]`` — log π(a_t | r^t) under the current scores, differentiable (0 where masked); None
      from a replay that scored nothing (``scores=False``).
    * ``entropy`` ``[B, T]`` — H(π(· | r^t)), differentiable (0 where masked); None where ``log_probs`` is.
    * ``mask`` ``[B, T]`` bool.
    * ``z`` ``[B, n, n]`` — the tree, 0/1 in x's dtype, BinaryTree layout (n − 1 ones per full-length example).
    """

    h: torch.Tensor
    c: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor | None
    entropy: torch.Tensor | None
    mask: torch.Tensor
    z: torch.Tensor

    @property
    def log_prob(self) -> torch.Tensor:
        """log π(a | x) = Σ_t log π(a_t | r^t), ``[B]``."""
        return self.log_probs.masked_fill(~self.mask, 0.0).sum(-1)


class MergeParser(nn.Module):
    """Easy-first merge parser with a binary Tree-LSTM composition (docs/models.md#tree_parsers; Choi et al., 2018).

    ``forward(x [B, n, input_dim], lengths [B] | None, mode="argmax", actions=None, tree=None, generator=None,
    estimator=None)`` → :class:`Parse`. ``mode`` is one of :data:`MODES`; in eval mode ``estimate`` and ``sample``
    become ``argmax``. ``estimate`` needs the §5 ``estimator`` that makes each merge. ``given`` needs exactly one of
    ``actions`` ``[B, n-1]`` (entries at masked steps are ignored) or ``tree`` ``[B, n, n]`` (a binary bracketing per
    example, replayed via :func:`tree_actions`; a ValueError if the replay does not reproduce it). ``generator``
    seeds the noise of ``sample``. ``scores=False`` (``given`` only) skips the pairs that are not merged: one cell per
    example and step instead of one per adjacent pair, the same root (up to the float rounding of a smaller matrix
    product), and ``log_probs`` and ``entropy`` None (nothing was scored).

    One :class:`BinaryTreeLSTMCell` (``dim_in = input_dim``) builds the candidates and composes, as in Choi et al.
    (2018); a second parser replaying the first one's merges (``mode="given"``) composes with parameters of its own,
    as in Havrylov et al. (2019). The query q ``[dim]`` starts small (N(0, 0.01²)) so that the first policy is nearly
    uniform. Padded words of ``x`` are replaced by 0 and never reach a real node, so in the deterministic modes
    (``argmax``, ``given``) an example's output does not depend on the padding or on the rest of the batch.
    """

    FROM_DATA = ("input_dim", "dim")  # the word and state sizes, given by the task

    def __init__(self, input_dim: int, dim: int):
        super().__init__()
        self.cell = BinaryTreeLSTMCell(dim, input_dim)
        self.input_dim, self.dim = input_dim, dim
        self.query = nn.Parameter(0.01 * torch.randn(dim))

    def score(self, parent_h: torch.Tensor) -> torch.Tensor:
        """Pair scores s_i = qᵀ h(p_i): ``[B, m-1, dim]`` → ``[B, m-1]``."""
        return parent_h @ self.query

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor | None = None,
        mode: str = "argmax",
        actions: torch.Tensor | None = None,
        tree: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        estimator: nn.Module | None = None,
        scores: bool = True,
    ) -> Parse:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not scores and mode != "given":
            raise ValueError(f"scores=False composes given merges only (mode='given'), not {mode!r}")
        if not self.training and mode in ("estimate", "sample"):
            mode = "argmax"
        if mode == "estimate" and estimator is None:
            raise ValueError("mode='estimate' needs the `estimator` that makes each merge")
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
            pairs = torch.arange(m - 1, device=device)
            if not scores:  # the merged pair alone: [B, 1, dim], which the update below broadcasts to its place
                a = actions[:, t]
                at = a.view(-1, 1, 1).expand(-1, 1, self.dim)
                left, right = (h.gather(1, at), c.gather(1, at)), (h.gather(1, at + 1), c.gather(1, at + 1))
                parent_h, parent_c = self.cell(*left, *right)
                select = F.one_hot(a, m - 1).to(x.dtype)
            else:
                parent_h, parent_c = self.cell(h[:, :-1], c[:, :-1], h[:, 1:], c[:, 1:])  # [B, m-1, dim]
                # Finished examples keep pair 0 allowed: an all −inf row would put NaN into the softmax's backward.
                valid = pairs.view(1, -1) < (lengths - 1 - t).clamp_min(1).view(-1, 1)  # [B, m-1]
                pair_scores = self.score(parent_h).masked_fill(~valid, float("-inf"))
                log_p = pair_scores.log_softmax(-1)
                entropies.append(-(log_p.exp() * log_p.masked_fill(~valid, 0.0)).sum(-1))
                if mode == "estimate":
                    select = estimator(pair_scores, _PAIRS)
                    a = select.detach().argmax(-1)
                else:
                    if mode == "sample":
                        a = (pair_scores.detach() + gumbel_like(pair_scores, generator)).argmax(-1)
                    elif mode == "argmax":
                        a = pair_scores.detach().argmax(-1)
                    else:
                        a = actions[:, t]
                    select = F.one_hot(a, m - 1).to(x.dtype)
            a = a.masked_fill(~active, 0)
            taken.append(a)
            if scores:
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
            log_probs=stacked(log_probs, x.dtype).masked_fill(~step_mask, 0.0) if scores else None,
            entropy=stacked(entropies, x.dtype).masked_fill(~step_mask, 0.0) if scores else None,
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




# --------------------------------------------------------------------------------------------------- span scorer


class SpanScorer(nn.Module):
    """The chart parser's span scores (docs/models.md#tree_parsers): word vectors ``x`` ``[B, n, input_dim]`` and
    ``lengths`` ``[B]`` → ``[B, n, n]`` with ``s[b, i, j] = vᵀ tanh(W [f_j − f_{i−1}; b_i − b_{j+1}] + c)`` for
    i < j < L and 0 elsewhere, [f; b] the states of a BiLSTM (``lstm_dim`` units, both directions together; exactly 0
    at padding) and ``hidden`` the size of the tanh layer (memory ``[B, n, n, hidden]``)."""

    FROM_DATA = ("input_dim", "lstm_dim", "hidden")  # the word size and the scorer's sizes, given by the task

    def __init__(self, input_dim: int, lstm_dim: int, hidden: int):
        super().__init__()
        if lstm_dim % 2:
            raise ValueError(f"lstm_dim is [forward; backward] and must be even, got {lstm_dim}")
        self.encoder = BiLSTMEncoder(input_dim, lstm_dim)
        self.half = lstm_dim // 2
        self.proj = nn.Linear(lstm_dim, hidden)  # W on [Δf; Δb], and c
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x, lengths)
        batch, n, _ = h.shape
        f, b = h[..., : self.half], h[..., self.half :]
        zero = h.new_zeros(batch, 1, self.half)
        f_before = torch.cat([zero, f[:, :-1]], dim=1)  # f_{i−1}
        b_after = torch.cat([b[:, 1:], zero], dim=1)  # b_{j+1} (0 past the length: padding is 0)
        w_f, w_b = self.proj.weight[:, : self.half], self.proj.weight[:, self.half :]
        start = b @ w_b.t() - f_before @ w_f.t() + self.proj.bias  # [B, n, k]: the terms of i
        end = f @ w_f.t() - b_after @ w_b.t()  # [B, n, k]: the terms of j
        scores = self.v(torch.tanh(start.unsqueeze(2) + end.unsqueeze(1))).squeeze(-1)
        pos = torch.arange(n, device=h.device)
        ends = lengths.to(h.device).long().view(-1, 1, 1)
        parts = (pos.view(1, -1, 1) < pos.view(1, 1, -1)) & (pos.view(1, 1, -1) < ends)
        return scores.masked_fill(~parts, 0.0)

"""Tag sequences (linear-chain CRF parts): Viterbi, the forward algorithm, forward-filtering backward-sampling.

``scores[b, i, s, t]`` (``[batch, n, T, T]``) is the score of tag ``s`` at ``i-1`` followed by tag ``t`` at ``i``
(emission of ``t`` plus transition ``s → t``; ``SequenceTagging.parts`` builds it from emissions and transitions).
Position 0 uses row 0 only (``scores[b, 0, 0, t]``: start with ``t``); its other rows are never parts. A vertex is
the indicator of a tag sequence y_0 … y_{n-1}: ``z[0, 0, y_0] = 1`` and ``z[i, y_{i-1}, y_i] = 1``; T^n vertices.
Positions past ``lengths[b]`` are padding (ignored, 0 in every output, no gradient); a part of -inf is a forbidden
transition (probability 0, zero rather than NaN gradients while some sequence stays allowed).

* ``log_partition``: the forward algorithm in log space; ``marginals`` its gradient (forward-backward), twice
  differentiable.
* ``map``: Viterbi with back-pointers and one batched backtrack.
* ``exact_sample``: forward filtering, backward sampling (the draws taken by Gumbel-max during the forward pass).

Example::

    >>> tagger = SequenceTagging(num_tags=3)
    >>> z = tagger.map(torch.randn(2, 4, 3, 3))            # [2, 4, 3, 3]
    >>> z.sum((1, 2, 3)).tolist()                          # one part per position
    [4.0, 4.0]

Derivation and references: docs/structures.md#sequence.
"""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

from latentstruct.ranges import AtLeast
from latentstruct.structures.base import Structure, gumbel_like

__all__ = ["SequenceTagging"]


class SequenceTagging(Structure):
    """Sequences of ``num_tags`` tags over ``n`` positions (linear-chain CRF parts; see the module docstring).

    Scores ``[batch, n, T, T]``, ``scores[b, i, s, t]`` = score of tag s at i-1 followed by tag t at i; at i = 0 only
    ``scores[b, 0, 0, t]`` (the start) is a part. ``lengths`` ``[batch]`` (integer, each in 1..n; default n) is the
    number of positions; padding may hold any value and is 0 in every output.

    Args:
        num_tags: number of tags T (scores [batch, n, T, T]).
    """

    has = frozenset({"map", "marginals", "exact_samples", "enumerate"})  # latentstruct.capabilities

    def __init__(self, num_tags: Annotated[int, AtLeast(1)]):
        if int(num_tags) < 1:
            raise ValueError(f"SequenceTagging needs num_tags >= 1, got {num_tags}")
        self.num_tags = int(num_tags)

    # ------------------------------------------------------------------------------------------------- interface

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The Viterbi tag sequence: 0/1 tensor ``[batch, n, T, T]`` in the scores' dtype, no gradient."""
        tags, lengths = self._viterbi(scores, lengths)
        return _vertex(tags, lengths, self.num_tags, scores.dtype)

    def map_parts(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The Viterbi tag sequence as its parts (``Structure.map_parts``): position i's part is the flat index
        i T² + y_{i-1} T + y_i (y_{-1} = 0), ``[batch, n]``, on the positions i < lengths[b]."""
        tags, lengths = self._viterbi(scores, lengths)
        positions = torch.arange(tags.shape[1], device=tags.device)
        parts = positions * self.num_tags**2 + _transitions(tags, self.num_tags)
        return parts, positions < lengths.view(-1, 1)

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_y exp <s, z(y)> by the forward algorithm, shape ``[batch]``; differentiable (twice)."""
        s, lengths = self._prepare(scores, lengths)
        alpha, _ = _forward(s, lengths, semiring="logsumexp")
        return torch.logsumexp(alpha, -1)

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """y ~ p(y | s) ∝ exp <s, z(y)> exactly (forward filtering, backward sampling); 0/1 like ``map``.

        ``num_samples`` M: ``[M, batch, ...]`` (the batch repeated M times, ``Structure.repeat_samples``).
        """
        if num_samples is not None:
            return self.repeat_samples(self.exact_sample, scores, lengths, generator, num_samples)
        with torch.no_grad():
            s, lengths = self._prepare(scores.detach(), lengths)
            alpha, pointers = _forward(s, lengths, semiring="sample", generator=generator)
            last = (alpha + gumbel_like(alpha, generator)).argmax(-1)
            return _vertex(_backtrack(last, pointers), lengths, self.num_tags, scores.dtype)

    def enumerate(self, n: int) -> torch.Tensor:
        """Every tag sequence of length ``n``, ``[T^n, n, T, T]``, in lexicographic order of (y_0, …, y_{n-1})."""
        if n < 1:
            raise ValueError(f"SequenceTagging.enumerate needs n >= 1, got {n}")
        num = self.num_tags
        index = torch.arange(num**n)
        # Tag of position i in sequence v: the i-th base-T digit of v, most significant first.
        place = num ** torch.arange(n - 1, -1, -1)
        tags = (index.view(-1, 1) // place) % num  # [V, n]
        return _vertex(tags, torch.full((num**n,), n), num, torch.float32)

    # ------------------------------------------------------------------------------------------------- helpers

    @staticmethod
    def parts(
        emissions: torch.Tensor,
        transitions: torch.Tensor,
        start: torch.Tensor | None = None,
        end: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """CRF potentials → part scores ``[batch, n, T, T]`` in this module's layout (differentiable).

        ``emissions[b, i, t]`` ``[batch, n, T]``; ``transitions[s, t]`` = score of s → t, ``[T, T]`` or per example
        ``[batch, T, T]``; ``start[t]`` (optional, ``[T]`` or ``[batch, T]``) is added at position 0 and ``end[t]``
        (optional, same shapes) at each example's last position ``lengths[b] - 1`` (default n - 1). Then
        ``scores[b, 0, 0, t] = emissions[b, 0, t] + start[t]`` (rows 1.. of position 0 are 0) and
        ``scores[b, i, s, t] = emissions[b, i, t] + transitions[s, t]`` for i ≥ 1.
        """
        if emissions.dim() != 3:
            raise ValueError(f"SequenceTagging.parts expects emissions [batch, n, T], got {tuple(emissions.shape)}")
        batch, n, num = emissions.shape
        if end is not None:
            if lengths is None:
                lengths = torch.full((batch,), n, dtype=torch.long, device=emissions.device)
            last = torch.as_tensor(lengths, device=emissions.device).long() - 1
            at_last = F.one_hot(last, n).to(emissions.dtype)  # [B, n]
            emissions = emissions + at_last.unsqueeze(-1) * end.unsqueeze(-2)
        first = emissions[:, 0] if start is None else emissions[:, 0] + start  # [B, T]
        first = torch.cat([first.unsqueeze(1), first.new_zeros(batch, num - 1, num)], dim=1)  # [B, T, T]
        rest = emissions[:, 1:].unsqueeze(-2) + transitions.unsqueeze(-3)  # [B, n-1, T, T]
        return torch.cat([first.unsqueeze(1), rest], dim=1)

    @staticmethod
    def tags(z: torch.Tensor) -> torch.Tensor:
        """Tag indices ``[batch, n]`` (long) of vertices ``z`` ``[batch, n, T, T]``; -1 on padding positions.

        Position i's tag is the column holding z[b, i]'s one; a position whose block is all 0 (padding) gets -1.
        """
        column = z.sum(-2)  # [B, n, T]
        return torch.where(column.sum(-1) > 0, column.argmax(-1), torch.full_like(column[..., 0], -1).long())

    # ------------------------------------------------------------------------------------------------ internals

    def _viterbi(self, scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The Viterbi tags ``[batch, n]`` (long; padding positions hold a copy of the last tag) and the lengths."""
        with torch.no_grad():
            s, lengths = self._prepare(scores.detach(), lengths)
            alpha, pointers = _forward(s, lengths, semiring="max")
            return _backtrack(alpha.argmax(-1), pointers), lengths

    def _prepare(self, scores: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Check shapes; replace every non-part (rows 1.. of position 0, padding positions) by 0; floor −inf.

        Zeroing rather than leaving them means junk there (NaN, ±inf) reaches neither the value nor the gradient.
        −inf on a part (a forbidden transition) is raised to ``_floor``, so that a tag unreachable at some position
        gets marginal 0 instead of a NaN gradient (the backward of a log-sum-exp over an all −inf slice is NaN).
        """
        num = self.num_tags
        if scores.dim() != 4 or scores.shape[2:] != (num, num):
            raise ValueError(
                f"SequenceTagging({num}) expects scores [batch, n, {num}, {num}], got {tuple(scores.shape)}"
            )
        batch, n = scores.shape[:2]
        if n < 1:
            raise ValueError("SequenceTagging needs at least one position (scores [batch, n, T, T] with n >= 1)")
        device = scores.device
        if lengths is None:
            lengths = torch.full((batch,), n, dtype=torch.long, device=device)
        else:
            lengths = torch.as_tensor(lengths, device=device).long()
        pos = torch.arange(n, device=device)
        live = pos.view(1, -1) < lengths.view(-1, 1)  # [B, n]
        row_ok = (pos.view(-1, 1) > 0) | (torch.arange(num, device=device).view(1, -1) == 0)  # [n, T]
        part = live.view(batch, n, 1, 1) & row_ok.view(1, n, num, 1)
        return _floor(scores.masked_fill(~part, 0.0), n), lengths


# ------------------------------------------------------------------------------------------------------- helpers


def _floor(s: torch.Tensor, n: int) -> torch.Tensor:
    """Raise −inf (and anything below) to finfo.min / (4 n): a sum of n such scores is still finite, and any path
    through one has probability exp(−huge) = 0 next to a path without (its gradient is 0 as well)."""
    return s.clamp_min(torch.finfo(s.dtype).min / (4 * n))


def _forward(
    s: torch.Tensor, lengths: torch.Tensor, semiring: str, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward variables α_{L-1} ``[B, T]`` in the given semiring over prepared scores ``[B, n, T, T]``.

    ``max``: also the Viterbi back-pointers ``[B, n, T]`` (``bp[b, i, t]`` = best previous tag for tag t at i;
    row 0 unused). ``sample``: log-space forward variables, and back-pointers drawn from p(y_{i-1} | y_i = t, y_{<i}
    marginalised) by Gumbel-max. ``logsumexp``: no back-pointers. Past an example's length α is carried unchanged
    and the back-pointers are the identity.
    """
    batch, n, num, _ = s.shape
    identity = torch.arange(num, device=s.device).expand(batch, num)
    steps = s.unbind(1)  # one backward node for all positions (indexing s[:, i] would zero-fill [B, n, T, T] per step)
    alpha = steps[0][:, 0]  # [B, T]
    pointers = [identity]
    for i in range(1, n):
        x = alpha.unsqueeze(-1) + steps[i]  # [B, T(prev), T(next)]
        if semiring == "max":
            new, bp = x.max(-2)
        else:
            new = torch.logsumexp(x, -2)
            bp = (x + gumbel_like(x, generator)).argmax(-2) if semiring == "sample" else None
        live = (lengths > i).view(batch, 1)
        alpha = torch.where(live, new, alpha)
        if bp is not None:
            pointers.append(torch.where(live, bp, identity))
    return alpha, (torch.stack(pointers, 1) if semiring != "logsumexp" else None)


def _backtrack(last: torch.Tensor, pointers: torch.Tensor) -> torch.Tensor:
    """Follow back-pointers ``[B, n, T]`` from the last tag ``last`` ``[B]`` (whole batch at once) → tags ``[B, n]``."""
    n = pointers.shape[1]
    tags = [last]
    for i in range(n - 1, 0, -1):
        tags.append(pointers[:, i].gather(1, tags[-1].view(-1, 1)).squeeze(1))
    return torch.stack(tags[::-1], 1)


def _transitions(tags: torch.Tensor, num: int) -> torch.Tensor:
    """The part of each position within its ``[T, T]`` block, y_{i-1} T + y_i (row 0 at position 0), ``[B, n]``."""
    prev = torch.cat([torch.zeros_like(tags[:, :1]), tags[:, :-1]], dim=1)
    return prev * num + tags


def _vertex(tags: torch.Tensor, lengths: torch.Tensor, num: int, dtype: torch.dtype) -> torch.Tensor:
    """Indicator ``[B, n, T, T]`` of tag sequences ``[B, n]``, 0 at positions ≥ ``lengths``."""
    batch, n = tags.shape
    z = F.one_hot(_transitions(tags, num), num * num).view(batch, n, num, num)
    live = torch.arange(n, device=tags.device).view(1, -1) < lengths.view(-1, 1)
    return (z * live.view(batch, n, 1, 1)).to(dtype)

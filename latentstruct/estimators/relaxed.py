"""Relaxations: the decoder is fed a point of M = conv(Z) and autograd does the rest (seed 000; seed 001 §4)."""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from latentstruct.estimators.base import Estimator, Tempered
from latentstruct.ranges import AtLeast, Positive
from latentstruct.structures.base import gumbel_like
from latentstruct.structures.neuralsort import relaxed_topk
from latentstruct.structures.topk import TopK

__all__ = ["Marginals", "Sparsemap", "GumbelSoftmax", "NeuralSort"]


class Marginals(Estimator):
    """Structured attention: Marg(s) = E_p[z] (softmax on Categorical), exact autograd."""

    calls = frozenset({"marginals"})

    relaxed = True

    def train_forward(self, scores, structure, lengths, downstream):
        return structure.marginals(scores, lengths)

    def relax(self, scores, structure, lengths):
        return structure.marginals(scores, lengths)


class Sparsemap(Estimator):
    """SparseMAP (Niculae et al., 2018): Π_M(s) (sparsemax on Categorical), exact backward."""

    relaxed = True

    def train_forward(self, scores, structure, lengths, downstream):
        return structure.sparsemap(scores, lengths)

    def relax(self, scores, structure, lengths):
        return structure.sparsemap(scores, lengths)


class GumbelSoftmax(Tempered):
    """Gumbel-softmax / concrete (Jang et al., 2017; Maddison et al., 2017): Marg((s + G) / τ).

    At evaluation the relaxation drops the noise: Marg(s / τ).
    """

    calls = frozenset({"marginals"})

    relaxed = True

    def train_forward(self, scores, structure, lengths, downstream):
        return structure.marginals((scores + gumbel_like(scores)) / self.tau, lengths)

    def relax(self, scores, structure, lengths):
        return structure.marginals(scores / self.tau, lengths)


class NeuralSort(Tempered):
    """NeuralSort (Grover et al., 2019) on a :class:`~latentstruct.structures.TopK`: the relaxed top-k, the sum of the
    first k rows of the NeuralSort relaxation of the sorting permutation at temperature τ
    (:func:`~latentstruct.structures.neuralsort.relaxed_topk`); ``stochastic``: the mean over ``samples`` relaxed
    Plackett-Luce samples (the scores perturbed by Gumbel noise). At evaluation the relaxation drops the noise.

    Args:
        stochastic: relax Plackett-Luce samples of the scores (stochastic NeuralSort) instead of their sort.
        samples: stochastic: samples per example, whose relaxed top-k are averaged.
    """

    calls = frozenset({"k"})

    relaxed = True

    def __init__(
        self,
        tau: Annotated[float, Positive] = 1.0,
        stochastic: bool = False,
        samples: Annotated[int, AtLeast(1)] = 1,
        eval_latent: Literal["map", "relaxed"] = "relaxed",
    ):
        super().__init__(tau, eval_latent)
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.stochastic, self.samples = stochastic, samples

    def train_forward(self, scores, structure, lengths, downstream):
        k = _topk(structure, lengths)
        draws = self.samples if self.stochastic else 1
        return torch.stack([relaxed_topk(scores, k, self.tau, self.stochastic) for _ in range(draws)]).mean(0)

    def relax(self, scores, structure, lengths):
        return relaxed_topk(scores, _topk(structure, lengths), self.tau)


def _topk(structure, lengths) -> int:
    """The k of a :class:`TopK` without padding: what NeuralSort relaxes."""
    if not isinstance(structure, TopK):
        raise ValueError(f"NeuralSort relaxes a top-k: it needs structure=topk, got {type(structure).__name__}")
    if lengths is not None:
        raise ValueError("NeuralSort takes no lengths (every position is a candidate)")
    return structure.k

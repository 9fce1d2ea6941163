"""Relaxations: the decoder is fed a point of M = conv(Z) and autograd does the rest (seed 000; seed 001 §4)."""

from __future__ import annotations

from latentstruct.estimators.base import Estimator, Tempered
from latentstruct.structures.base import gumbel_like

__all__ = ["Marginals", "Sparsemap", "GumbelSoftmax"]


class Marginals(Estimator):
    """Structured attention: Marg(s) = E_p[z] (softmax on Categorical), exact autograd."""

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

    relaxed = True

    def train_forward(self, scores, structure, lengths, downstream):
        return structure.marginals((scores + gumbel_like(scores)) / self.tau, lengths)

    def relax(self, scores, structure, lengths):
        return structure.marginals(scores / self.tau, lengths)

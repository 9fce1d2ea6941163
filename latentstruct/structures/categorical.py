"""One of K choices: vertices are the one-hot vectors, M = conv(Z) is the probability simplex."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from entmax import sparsemax

from latentstruct.structures.base import Structure

__all__ = ["Categorical"]


class Categorical(Structure):
    """Scores ``[batch, K]``. marginals = softmax, sparsemap = sparsemax (Martins & Astudillo, 2016).

    ``lengths`` is accepted for interface uniformity and ignored: every example has all K choices.
    """

    has = frozenset({"map", "marginals", "exact_samples", "enumerate"})  # latentstruct.capabilities

    def map(self, scores, lengths=None):
        return F.one_hot(scores.detach().argmax(-1), scores.shape[-1]).to(scores.dtype)

    def log_partition(self, scores, lengths=None):
        return torch.logsumexp(scores, dim=-1)

    def marginals(self, scores, lengths=None):
        return torch.softmax(scores, dim=-1)

    def sparsemap(self, scores, lengths=None):
        return sparsemax(scores, dim=-1)

    def exact_sample(self, scores, lengths=None, generator=None, num_samples=None):
        if num_samples is not None:
            return self.repeat_samples(self.exact_sample, scores, lengths, generator, num_samples)
        # Gumbel-max: with one part per vertex perturb-and-MAP samples the Gibbs distribution exactly.
        return self.sample(scores, lengths, generator)

    def enumerate(self, n):
        return torch.eye(n)

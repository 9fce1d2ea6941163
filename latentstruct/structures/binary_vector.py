"""n independent binary variables z = (z_1, ..., z_n) ∈ {0, 1}^n, each written as a one-hot over its two states.

``scores[b, i, v]`` (``[batch, n, 2]``) = φ_i(x_b, z_i = v), the unstructured encoder of seed 003. A vertex is
``[n, 2]`` with row i = onehot(z_i); the bit itself is ``vertex[..., 1]`` (:func:`bits`). 2^n vertices; M is the
product of n two-point simplices. Two parts per bit so that part-level Gumbel noise perturbs both states and the
part-perturbing estimators (``direct``, ``gumbel_softmax``, ``st_gumbel``) sample the Gibbs distribution exactly.

* ``map``: per bit the higher-scoring state (ties to state 0);
* ``log_partition`` = Σ_i logsumexp_v φ_i(v); ``marginals``: per-bit softmax; ``sparsemap``: per-bit sparsemax;
* ``exact_sample`` = ``sample`` (Gumbel-max per bit); ``enumerate(n)``: the 2^n vertices, bit 0 slowest.

``lengths`` ``[batch]``: the first ``lengths[b]`` bits are the example's; the rest is padding (0, no gradient).

Example::

    >>> bits(BinaryVector().map(torch.tensor([[[0.0, 1.0], [2.0, -1.0]]])))
    tensor([[1., 0.]])

Why two parts per bit, in full: docs/structures.md#binary_vector.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from entmax import sparsemax

from latentstruct.structures.base import Structure

__all__ = ["BinaryVector", "bits"]


def bits(z: torch.Tensor) -> torch.Tensor:
    """The bits ``[..., n]`` of vertices or points of M ``[..., n, 2]``: the weight of state 1 of each variable."""
    return z[..., 1]


def _keep(scores: torch.Tensor, lengths) -> torch.Tensor:
    """``[batch, n, 1]`` bool: True on the example's bits, False on the padding."""
    if lengths is None:
        return torch.ones(*scores.shape[:2], 1, dtype=torch.bool, device=scores.device)
    positions = torch.arange(scores.shape[1], device=scores.device)
    return (positions < torch.as_tensor(lengths, device=scores.device).reshape(-1, 1)).unsqueeze(-1)


class BinaryVector(Structure):
    """Independent binary variables, scores ``[batch, n, 2]`` (module docstring: the part layout and why)."""

    has = frozenset({"map", "marginals", "exact_samples", "enumerate"})  # latentstruct.capabilities

    def map(self, scores, lengths=None):
        s = scores.detach()
        z = F.one_hot(s.argmax(-1), 2).to(s.dtype)
        return z * _keep(s, lengths)

    def log_partition(self, scores, lengths=None):
        keep = _keep(scores, lengths)
        per_bit = torch.logsumexp(torch.where(keep, scores, 0.0), -1)  # padding: never read, no gradient
        return torch.where(keep.squeeze(-1), per_bit, 0.0).sum(-1)

    def marginals(self, scores, lengths=None):
        keep = _keep(scores, lengths)
        return torch.where(keep, torch.softmax(torch.where(keep, scores, 0.0), -1), 0.0)

    def sparsemap(self, scores, lengths=None):
        keep = _keep(scores, lengths)
        return torch.where(keep, sparsemax(torch.where(keep, scores, 0.0), dim=-1), 0.0)

    def exact_sample(self, scores, lengths=None, generator=None, num_samples=None):
        if num_samples is not None:
            return self.repeat_samples(self.exact_sample, scores, lengths, generator, num_samples)
        # Gumbel-max on each bit's two states: part-level perturb-and-MAP is exact here (module docstring)
        return self.sample(torch.where(_keep(scores, lengths), scores.detach(), 0.0), lengths, generator)

    def enumerate(self, n):
        rows = torch.tensor(list(itertools.product((0, 1), repeat=n)), dtype=torch.long).reshape(-1, n)
        return F.one_hot(rows, 2).to(torch.get_default_dtype())

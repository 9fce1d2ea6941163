r"""The exact gradient of an expected loss, by enumerating every vertex (the "unbiased gradient" of seed 003's slides).

For p(z | s) ∝ exp <s, z> over the vertices Z of a structure and a loss L(z),

    E(s) = Σ_{v ∈ Z} p(v | s) L(v),      ∇_s E = Σ_v p(v | s) (L(v) − E) (v − μ),   μ = Σ_v p(v | s) v = Marg(s)

(the score-function identity ∇_s log p(v | s) = v − μ, summed exactly instead of sampled: no variance, no bias). It
costs one loss evaluation per vertex, so it serves small vertex sets: a categorical latent's K one-hots (seed 003's
K = 10 and 50), a few bits.

Two tiers:

* :func:`expected_loss` ``(scores [B, *parts], vertices [V, *parts], losses [B, V])`` → E ``[B]``, differentiable
  in the scores *and* in the losses: a task that computes every vertex's loss with its graph (the discrete VAE's
  decoder log-likelihood of each category) trains its decoder on the exact expectation too.
* :class:`Exact`, the §5 estimator: ``estimator(scores, structure, lengths, downstream, vertices=None)`` calls
  ``downstream`` once per vertex (without gradient), gives the scores the exact ∇_s of mean_b E_b, and forwards one
  exact Gibbs sample per example (the decoder's own parameters get that one sample's gradient, as with ``sfe``). The
  vertices default to ``structure.enumerate(n)`` for the n whose parts' shape is the scores'.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch

from latentstruct.estimators.base import Estimator, missing_downstream, surrogate
from latentstruct.ranges import AtLeast

__all__ = ["Exact", "expected_loss", "vertex_log_probs"]


def vertex_log_probs(scores: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
    """log p(v | s) ``[B, V]`` for the vertices ``[V, *parts]`` and the scores ``[B, *parts]``: a log-softmax of the
    vertex scores <s, v> over the listed vertices (exact when they are all of Z)."""
    v = vertices.to(scores.dtype).flatten(1)
    return torch.log_softmax(scores.flatten(1) @ v.T, dim=-1)


def expected_loss(scores: torch.Tensor, vertices: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """E_b = Σ_v p(v | s_b) L_b(v) ``[B]`` from the scores ``[B, *parts]``, every vertex ``[V, *parts]`` and each
    example's loss at each vertex ``losses [B, V]``; autograd gives the exact gradient (module docstring) in both."""
    if losses.shape != (scores.shape[0], vertices.shape[0]):
        raise ValueError(f"losses must be [batch, vertices] = [{scores.shape[0]}, {vertices.shape[0]}], got "
                         f"{tuple(losses.shape)}")
    return (vertex_log_probs(scores, vertices).exp() * losses).sum(-1)


class Exact(Estimator):
    """The exact gradient of the expected loss by enumeration (module docstring); not relaxed: MAP at evaluation.

    Args:
        max_vertices: refuse structures with more vertices than this (the cost is one loss per vertex).
    """

    calls = frozenset({"exact_samples", "enumerate"})
    enumerates = True

    def __init__(self, max_vertices: Annotated[int, AtLeast(1)] = 4096,
                 eval_latent: Literal["map", "relaxed"] = "relaxed"):
        super().__init__(eval_latent)
        if isinstance(max_vertices, bool) or not isinstance(max_vertices, int) or max_vertices < 1:
            raise ValueError(f"max_vertices must be an integer >= 1, got {max_vertices!r}")
        self.max_vertices = max_vertices

    def forward(self, scores, structure, lengths=None, downstream=None, vertices=None):
        if self.training:
            return self.train_forward(scores, structure, lengths, downstream, vertices)
        return super().forward(scores, structure, lengths, downstream)

    def train_forward(self, scores, structure, lengths, downstream, vertices=None):
        if lengths is not None:
            raise ValueError("exact enumerates one vertex set for the whole batch: it takes no lengths")
        if downstream is None:
            raise missing_downstream("Exact", "to evaluate the loss at every vertex")
        s = scores.detach()
        vertices = self.vertices(structure, s) if vertices is None else vertices.to(s)
        z = structure.exact_sample(s)
        if not scores.requires_grad:
            return z
        with torch.no_grad():
            losses = torch.stack([downstream(v.expand_as(s).contiguous()) for v in vertices], -1)  # [B, V]
        with torch.enable_grad():
            leaf = s.requires_grad_(True)
            (grad,) = torch.autograd.grad(expected_loss(leaf, vertices, losses).mean(), leaf)
        return surrogate(scores, z, lambda _gamma: grad)

    def vertices(self, structure, scores: torch.Tensor) -> torch.Tensor:
        """``structure.enumerate(n)`` for the size n whose vertices are shaped like one example's scores."""
        shape = tuple(scores.shape[1:])
        for n in sorted({d - off for d in shape for off in (0, 1) if d - off >= 1}):
            found = structure.enumerate(n)
            if tuple(found.shape[1:]) == shape:
                if found.shape[0] > self.max_vertices:
                    raise ValueError(f"exact: {type(structure).__name__} of size {n} has {found.shape[0]} vertices, "
                                     f"more than max_vertices={self.max_vertices}")
                return found.to(scores)
        raise ValueError(f"exact: no size of {type(structure).__name__} has vertices shaped {shape}")

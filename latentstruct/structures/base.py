"""The structure interface (DESIGN.md §4, a contract).

A structure is a set of vertices Z ⊂ {0, 1}^parts. Given part scores s it answers the questions every estimator asks:
the best vertex (``map``), the mean of the Gibbs distribution p(z) ∝ exp <s, z> (``marginals``), the Euclidean
projection onto M = conv(Z) (``sparsemap``), perturb-and-MAP samples and the log-partition function.
All methods are batched over the first dimension of ``scores``.
"""

from __future__ import annotations

import numbers

import torch

from latentstruct.structures.parts import dense_to_parts

__all__ = ["Structure", "check_num_samples", "gumbel_like"]


def gumbel_like(scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise -log(-log U) shaped like ``scores`` (same dtype and device)."""
    u = torch.rand(scores.shape, generator=generator, dtype=scores.dtype, device=scores.device)
    tiny = torch.finfo(scores.dtype).tiny
    neg_log_u = -torch.log(u.clamp_min(tiny))
    return -torch.log(neg_log_u.clamp_min(tiny))


def check_num_samples(num_samples: int) -> int:
    """``num_samples`` as a positive int (``exact_sample``'s M), or a ValueError."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or num_samples < 1:
        raise ValueError(f"num_samples must be None or an int >= 1, got {num_samples!r}")
    return int(num_samples)


class Structure:
    """Base class of every latent structure. Subclasses implement ``map``, ``log_partition`` and ``enumerate``;
    ``marginals`` defaults to the gradient of the log-partition, ``sample`` to perturb-and-MAP.

    Structures are stateless: they hold only their combinatorial hyper-parameters (e.g. ``multiroot``) and, for the
    generic SparseMAP solver, ``sparsemap_max_iter``: None (the default) solves to the duality-gap tolerance and raises
    if it cannot; an integer stops the active set after that many iterations and uses its iterate (a truncated,
    inexact projection: what the authors of seed 001 ran, lp-sparsemap with ``max_inner_iter=50``).
    """

    #: what this structure can do, for the estimators' ``calls`` (:mod:`latentstruct.capabilities`); SparseMAP
    #: comes with MAP (the generic active-set solver calls only ``map``)
    has: frozenset[str] = frozenset({"map"})

    sparsemap_max_iter: int | None = None

    def map(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """argmax_{z in Z} <s, z>: a 0/1 tensor shaped like ``scores``, without gradient."""
        raise NotImplementedError

    def log_partition(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log Σ_z exp <s, z>, shape ``[batch]``, differentiable."""
        raise NotImplementedError

    def map_parts(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``map`` as lists of parts: (parts ``[batch, K]`` int64, flat indices into the part dimensions; on
        ``[batch, K]`` bool, False on padding), K the most parts of a vertex in the batch
        (:mod:`latentstruct.structures.parts`).

        The generic SparseMAP solver calls this once per iteration. The default converts ``map``'s dense output;
        structures whose MAP algorithm yields the parts directly (heads, tags, a permutation) override it.
        """
        z = self.map(scores, lengths)
        return dense_to_parts(z.reshape(z.shape[0], -1))

    def enumerate(self, n: int) -> torch.Tensor:
        """Every vertex for size ``n``, shape ``[V, *part_shape]`` (small n only: the ground truth for tests)."""
        raise NotImplementedError

    def marginals(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """E_p[z] for p(z) ∝ exp <s, z>, shaped like ``scores``; the gradient of ``log_partition``.

        Differentiable (twice-differentiable log-partition) when ``scores`` requires grad.
        """
        with torch.enable_grad():
            s = scores if scores.requires_grad else scores.detach().requires_grad_(True)
            log_z = self.log_partition(s, lengths).sum()
            (mu,) = torch.autograd.grad(log_z, s, create_graph=scores.requires_grad)
        return mu

    def sparsemap(self, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """argmin_{μ in conv(Z)} ||μ - s||²: the Euclidean projection onto the marginal polytope.

        The generic active-set solver (``latentstruct.structures.sparsemap``), which calls only ``map``; structures
        with a closed form override this.
        """
        from latentstruct.structures.sparsemap import sparsemap  # the solver module imports nothing from here

        budget = self.sparsemap_max_iter
        return sparsemap(self, scores, lengths, max_iter=budget, strict=budget is None)

    def sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Perturb-and-MAP: MAP(s + G) with i.i.d. standard Gumbel noise G on every part."""
        return self.map(scores + gumbel_like(scores, generator), lengths)

    def exact_sample(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> torch.Tensor:
        """z ~ p(z | s) ∝ exp <s, z> exactly (what the score-function estimator needs).

        ``num_samples``: None draws one sample per example, shaped like ``scores``; an integer M draws M independent
        samples per example, ``[M, batch, *part_shape]`` (:meth:`repeat_samples` for a structure without a faster way).

        Part-level perturb-and-MAP is exact only when every vertex has one part (Categorical); structures with an
        exact sampler override this.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no exact Gibbs sampler; perturb-and-MAP with part-level noise "
            "(`sample`) is not one"
        )

    @staticmethod
    def repeat_samples(draw, scores, lengths, generator, num_samples: int) -> torch.Tensor:
        """M = ``num_samples`` draws per example in one call of ``draw(scores, lengths, generator)`` on the batch
        repeated M times (sample m of example b at row m · batch + b), reshaped to ``[M, batch, *part_shape]``."""
        m = check_num_samples(num_samples)
        batch = scores.shape[0]
        many = scores.unsqueeze(0).expand(m, *scores.shape).reshape(m * batch, *scores.shape[1:])
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=scores.device).reshape(-1).repeat(m)
        return draw(many, lengths, generator).view(m, batch, *scores.shape[1:])

    @staticmethod
    def score(z: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """<s, z> per example, shape ``[batch]``."""
        return (z * scores).flatten(1).sum(-1)

    def log_prob(self, z: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """log p(z | s) = <s, z> - log Z(s), shape ``[batch]``."""
        return self.score(z, scores) - self.log_partition(scores, lengths)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"

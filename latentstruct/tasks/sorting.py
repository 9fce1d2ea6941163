r"""Sorting numbers as a latent bipartite matching (Mena et al. 2018; seed 002 §5.1 and App. C.1).

A batch ``x`` ``[B, d]`` of numbers in [0, 1] is matched with the sorted positions: z*[i, j] = 1 iff x_i is the j-th
smallest. ``task.scorer`` (:class:`~latentstruct.models.sorting.RankScorer`) scores each number on its own, rows of
``[B, d, d]``; ``task.estimator`` over a :class:`~latentstruct.structures.Matching` gives z; with ``task.sigma_net``
(``direct`` only) σ ``[B, 1]`` is learned from the sequence.

Loss: L(z) = ‖z − z*‖²_F / 2 = d − <z, z*> (the number of misplaced elements), the batch mean;
``baseline=gumbel_sinkhorn`` trains Mena et al.'s Gumbel-Sinkhorn in place of the estimator. Metrics: ``acc``
(all-correct sequences ×100), ``prop_wrong`` (misplaced elements ×100), ``kendall_tau`` (:func:`kendall_tau`),
``loss`` and, with a σ-network, ``sigma``.

    python -m latentstruct.train +experiment=sorting_direct_learned

The loss's scaling, the loss-perturbed MAP it gives ``direct`` and where our protocol differs: docs/tasks.md#sorting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Estimator
from latentstruct.ranges import AtLeast, Part, Positive
from latentstruct.structures.matching import Matching, gumbel_sinkhorn
from latentstruct.tasks.base import Task

__all__ = ["Sorting", "SortingOutput", "sorting_loss", "kendall_tau", "BASELINES"]

BASELINES = ("none", "gumbel_sinkhorn")


@dataclass
class SortingOutput:
    loss: torch.Tensor  # scalar, batch mean
    z: torch.Tensor | None  # [batch, d, d] the matching the loss was computed on; None for the Gumbel-Sinkhorn loss


def sorting_loss(z: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """L(z) = d − <z, z*> ``[batch]`` for z, z* ``[batch, d, d]``: ||z − z*||²_F / 2 (the number of misplaced
    elements) when z is a permutation matrix; its linear extension to any other z."""
    return target.shape[-1] - (z * target).flatten(1).sum(-1)


def kendall_tau(pred: torch.Tensor, gold: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Kendall's τ ``[batch]`` between two rankings without ties, ``[batch, d]`` each: (concordant − discordant)
    pairs / (d(d−1)/2), in [−1, 1]; 1 for d = 1. Computed in chunks of sequences to bound the ``[chunk, d, d]``
    memory."""
    d = pred.shape[-1]
    if d < 2:
        return torch.ones(pred.shape[0], device=pred.device)
    out = []
    for a, b in zip(pred.split(chunk), gold.split(chunk), strict=True):
        sa = torch.sign(a.unsqueeze(2) - a.unsqueeze(1)).to(torch.float32)
        sb = torch.sign(b.unsqueeze(2) - b.unsqueeze(1)).to(torch.float32)
        out.append((sa * sb).sum((1, 2)) / (d * (d - 1)))  # each unordered pair counted twice
    return torch.cat(out)


class Sorting(Task):
    """Learn to sort d numbers through a latent matching (docs/tasks.md#sorting: model, loss, baseline, metrics).

    Built from ``scorer`` (the μ-network, :class:`~latentstruct.models.sorting.RankScorer`), ``structure`` (a
    :class:`Matching`), ``estimator`` (how gradients cross the Hungarian argmax: ``direct`` in seed 002, or any
    estimator that needs only ``map`` / ``sparsemap`` of a matching; null with ``baseline=gumbel_sinkhorn``) and
    ``sigma_net`` (a σ-network for a learned σ, with ``direct``; null for the estimator's own σ). Batches hold ``x``
    ``[batch, d]`` and the ranks ``y`` ``[batch, d]`` (z* = one_hot(y)).
    """

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict,
        scorer: Annotated[Any, Part()],
        structure: Annotated[Any, Part(Matching)],
        estimator: Annotated[Any, Part(Estimator)],
        sigma_net: Annotated[Any, Part()],
        baseline: Literal["none", "gumbel_sinkhorn"] = "none",
        tau: Annotated[float, Positive] = 1.0,
        sinkhorn_iters: Annotated[int, AtLeast(1)] = 10,
        samples: Annotated[int, AtLeast(1)] = 5,
    ) -> Sorting:
        """The μ- and σ-networks sized by d, the length of the sequences (``dataset=sorting``).

        Args:
            baseline: none: train through the configured estimator; gumbel_sinkhorn: Mena et al. (2018) instead
            tau: gumbel_sinkhorn: Sinkhorn temperature τ
            sinkhorn_iters: gumbel_sinkhorn: Sinkhorn normalisation rounds
            samples: gumbel_sinkhorn: Gumbel noise samples per sequence
        """
        if "num_items" not in dims:
            raise ValueError("task=sorting needs a dataset of sequences to sort (dataset=sorting)")
        d = dims["num_items"]
        mu = scorer(num_items=d)
        sigma = None if sigma_net is None else sigma_net(in_features=d)
        return cls(structure, estimator, mu, sigma, baseline, tau, sinkhorn_iters, samples)

    def __init__(
        self,
        structure: Matching,
        estimator: nn.Module | None,
        mu: nn.Module,
        sigma: nn.Module | None = None,
        baseline: str = "none",
        tau: float = 1.0,
        sinkhorn_iters: int = 10,
        samples: int = 5,
    ):
        super().__init__()
        if not isinstance(structure, Matching):
            raise ValueError(f"the sorting task needs structure=matching, got {type(structure).__name__}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        if (estimator is None) != (baseline == "gumbel_sinkhorn"):
            raise ValueError("task.baseline=gumbel_sinkhorn trains without an estimator (estimator=null); every "
                             f"other method through one (got baseline={baseline!r}, estimator={estimator})")
        if sigma is not None and not getattr(estimator, "takes_sigma", False):
            raise ValueError(f"a learned σ: sigma_net needs estimator=direct (an estimator that takes a noise scale) "
                             f"and task.baseline=none, got {type(estimator).__name__}")
        if not tau > 0 or sinkhorn_iters < 1 or samples < 1:
            raise ValueError(f"need tau > 0, sinkhorn_iters >= 1, samples >= 1; got {tau}, {sinkhorn_iters}, {samples}")
        self.structure, self.estimator, self.mu, self.sigma = structure, estimator, mu, sigma
        self.baseline, self.tau, self.sinkhorn_iters, self.samples = baseline, float(tau), sinkhorn_iters, samples

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``default``: the μ-network; ``sigma``: the σ-network (if any; App. C.1 trains it by SGD)."""
        groups = {"default": list(self.mu.parameters())}
        if self.sigma is not None:
            groups["sigma"] = list(self.sigma.parameters())
        return groups

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, d]`` → ``[batch, d, d]``: row i is f(x_i), one number at a time."""
        return self.mu(x)

    def forward(self, batch: dict[str, torch.Tensor]) -> SortingOutput:
        x = batch["x"]
        target = F.one_hot(batch["y"], x.shape[-1]).to(x.dtype)
        scores = self.scores(x)
        if not self.training:
            z = self.structure.map(scores)
            return SortingOutput(sorting_loss(z, target).mean(), z)
        if self.baseline == "gumbel_sinkhorn":
            return SortingOutput(self._reconstruction_loss(scores, x), None)

        def downstream(mu):
            return sorting_loss(mu, target)

        sigma = {} if self.sigma is None else {"sigma": self.sigma(x)}  # [batch, 1], one σ per sequence
        z = self.estimator(scores, self.structure, None, downstream, **sigma)
        return SortingOutput(downstream(z).mean(), z)

    def _reconstruction_loss(self, scores: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Mena et al.'s loss: mean squared error of P̃ᵀx against sort(x) over ``samples`` Gumbel-Sinkhorn draws."""
        reps = (self.samples, 1, 1)  # sample-major: row k·B + b is draw k of sequence b
        soft = gumbel_sinkhorn(scores.repeat(reps), self.tau, self.sinkhorn_iters)
        rebuilt = torch.einsum("bij,bi->bj", soft, x.repeat(self.samples, 1))
        return (rebuilt - x.sort(-1).values.repeat(self.samples, 1)).pow(2).mean()

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """``acc``, ``prop_wrong`` (×100), ``kendall_tau``, ``loss`` and, with a σ-network, ``sigma``: means over
        the split's sequences of the hard, noise-free matching (docs/tasks.md#sorting)."""
        was_training = self.training
        self.eval()
        perfect, wrong, tau, losses, sigmas = [], [], [], [], []
        for batch in iterate_batches(data, batch_size):
            out = self(batch)
            position = out.z.argmax(-1)  # [B, d]: where each element was put
            correct = position == batch["y"]
            perfect.append(correct.all(-1))
            wrong.append((~correct).float().mean(-1))
            tau.append(kendall_tau(position, batch["y"]))
            losses.append(out.loss * len(position))
            if self.sigma is not None:
                sigmas.append(self.sigma(batch["x"]).reshape(-1))
        self.train(was_training)
        n = sum(len(p) for p in perfect)
        metrics = {
            "loss": float(torch.stack(losses).sum() / n),
            "acc": 100 * float(torch.cat(perfect).float().mean()),
            "prop_wrong": 100 * float(torch.cat(wrong).mean()),
            "kendall_tau": float(torch.cat(tau).mean()),
        }
        if sigmas:
            metrics["sigma"] = float(torch.cat(sigmas).mean())
        return metrics

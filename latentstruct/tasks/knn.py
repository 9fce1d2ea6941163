r"""k-nearest-neighbour image classification through a latent top-k set (Grover et al. 2019's dKNN protocol, with the
direct loss minimization of seed 002 §5.2 and App. C.2).

**A training step.** A batch of images is split into ``num_queries`` queries (the first ones) and candidates (the
rest): 100 queries and 800 candidates for MNIST / Fashion-MNIST, 100 and 600 for CIFAR-10, so
``trainer.batch_size`` = queries + candidates. An embedding network f (the ``encoder``) maps every image to a vector
and the part scores of query q are the negative squared distances to the candidates, s[q, c] = −||f(x_q) − f(x_c)||².
The latent structure is :class:`~latentstruct.structures.TopK` over the candidates, with the task's k (built by the
task, not a config group): its MAP is the k nearest ones.

**Loss**: the fraction of the k chosen candidates whose label differs from the query's,

    L(z) = 1 − <z, c> / k,          c[j] = 1 iff y_j = y_q,

linear in the k-hot z with slope −c / k, so the ``direct`` estimator's loss-perturbed MAP is exact: with ε < 0 it
adds |ε| / k to the scores of the candidates of the query's class (seed 002 §5.2: the label is the k-subset of
candidates with the query's label). The training loss is its mean over the queries, with z from the configured
estimator. With a σ-network (``sigma_net``) each query image gets its own noise scale (seed 002 App. C.2), trained by
its own optimizer (``optim_groups.sigma``).

**NeuralSort baselines** (Grover et al. 2019): the estimators ``estimator=neuralsort`` / ``neuralsort_stochastic``
(``latentstruct/estimators/relaxed.py``), the same loss of the relaxed top-k at temperature ``task.estimator.tau``
(stochastic: of relaxed Plackett-Luce samples, averaged over ``task.estimator.samples`` draws).

**Evaluation** (every method): the classic kNN classifier in the learned embedding space. The whole training split
(what ``train.py`` hands over with :meth:`use_training_data`) is embedded and every image of the evaluated split gets
the majority label of its k nearest training embeddings; a tied vote goes to the tied label whose nearest member is
closest. ``acc`` = 100 × the fraction classified correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import nn

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Estimator
from latentstruct.ranges import AtLeast, Part
from latentstruct.structures.topk import TopK
from latentstruct.tasks.base import Task

__all__ = ["KNN", "KNNOutput", "knn_loss", "knn_predict"]


@dataclass
class KNNOutput:
    loss: torch.Tensor  # scalar: mean over the queries
    z: torch.Tensor  # [queries, candidates]: the (relaxed) top-k the loss was computed on


def knn_loss(z: torch.Tensor, same: torch.Tensor, k: int) -> torch.Tensor:
    """1 − <z, c> / k ``[queries]``: the fraction of the k chosen candidates with another label than the query
    (``same`` = c, 1 where the candidate has the query's label); linear in z."""
    return 1 - (z * same).sum(-1) / k


def knn_predict(queries: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor, k: int,
                num_classes: int, chunk: int = 1024) -> torch.Tensor:
    """Majority vote of the k nearest ``reference`` embeddings (squared Euclidean distance) for each query
    ``[N, D]`` → labels ``[N]``; ties go to the tied label whose nearest member is closest."""
    out = []
    ref_sq = reference.pow(2).sum(-1)
    for q in queries.split(chunk):
        dist = q.pow(2).sum(-1, keepdim=True) - 2 * q @ reference.T + ref_sq  # [chunk, R]
        nearest = dist.topk(k, dim=-1, largest=False).indices  # sorted by distance
        votes = torch.nn.functional.one_hot(labels[nearest], num_classes)  # [chunk, k, C]
        closeness = torch.arange(k, 0, -1, device=q.device)  # k for the nearest neighbour, 1 for the k-th
        nearest_member = (votes * closeness[:, None]).amax(1)  # [chunk, C]: 0 for labels without a vote
        out.append((votes.sum(1) * (k + 1) + nearest_member).argmax(-1))  # the count first, then the tie-break
    return torch.cat(out)


def _image_network(part, dims: dict[str, int]) -> nn.Module:
    """A partial image network (``encoder``, ``sigma_net``) called with the sizes it takes from the data, those its
    ``FROM_DATA`` lists: ``in_channels``, ``image_size`` (the side of the square images)."""
    sizes = {"in_channels": dims["channels"], "image_size": dims["height"]}
    return part(**{name: sizes[name] for name in part.func.FROM_DATA})


class KNN(Task):
    """Learn an embedding for k-nearest-neighbour classification (module docstring: step, loss, baselines,
    evaluation).

    Built from ``encoder`` (the embedding network, images → ``[B, D]``), ``estimator`` (how gradients cross the top-k
    MAP: ``direct`` in seed 002, or the NeuralSort relaxations) and ``sigma_net`` (the σ-network, images → ``[B, 1]``
    > 0, for a learned σ with ``direct``; null for the estimator's own σ). Batches hold ``x`` ``[B, C, H, W]`` and
    ``y`` ``[B]``.
    """

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict, encoder: Annotated[Any, Part()],
              estimator: Annotated[Any, Part(Estimator)], sigma_net: Annotated[Any, Part()],
              k: Annotated[int, AtLeast(1)], num_queries: Annotated[int, AtLeast(1)] = 100) -> KNN:
        """The networks sized by the images (channels, side) of an image dataset.

        Args:
            k: neighbours (seed 002 Table 3: 1, 3, 5, 9)
            num_queries: queries per batch; the rest of trainer.batch_size are the candidates
        """
        if "channels" not in dims:
            raise ValueError("task=knn needs an image dataset (dataset=mnist, fashion_mnist or cifar10)")
        embedding = _image_network(encoder, dims)
        sigma = None if sigma_net is None else _image_network(sigma_net, dims)
        return cls(embedding, estimator, k, dims["num_classes"], num_queries, sigma)

    def __init__(
        self,
        embedding: nn.Module,
        estimator: nn.Module,
        k: int,
        num_classes: int,
        num_queries: int = 100,
        sigma: nn.Module | None = None,
    ):
        super().__init__()
        if sigma is not None and not getattr(estimator, "takes_sigma", False):
            raise ValueError(f"a learned σ: sigma_net needs estimator=direct (an estimator that takes a noise scale), "
                             f"got {type(estimator).__name__}")
        if k < 1 or num_queries < 1:
            raise ValueError(f"need k >= 1, num_queries >= 1; got {k}, {num_queries}")
        self.embedding, self.estimator, self.sigma = embedding, estimator, sigma
        self.structure = TopK(k)
        self.k, self.num_classes, self.num_queries = k, num_classes, num_queries
        self._reference: dict[str, torch.Tensor] | None = None
        self._cache: tuple[int, torch.Tensor] | None = None  # (updates, reference embeddings)
        self._updates = 0

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``default``: the embedding network; ``sigma``: the σ-network (if any; App. C.2 trains it by SGD)."""
        groups = {"default": list(self.embedding.parameters())}
        if self.sigma is not None:
            groups["sigma"] = list(self.sigma.parameters())
        return groups

    def use_training_data(self, train: dict[str, torch.Tensor]) -> None:
        """The kNN classifier's neighbours at evaluation: the training split."""
        self._reference, self._cache = train, None

    def forward(self, batch: dict[str, torch.Tensor]) -> KNNOutput:
        x, y = batch["x"], batch["y"]
        queries = self.num_queries
        if len(x) < queries + self.k:
            raise ValueError(f"a batch of {len(x)} images cannot hold {queries} queries and at least k = {self.k} "
                             f"candidates; make trainer.batch_size larger than task.num_queries + k (and keep "
                             f"trainer.drop_last=true, which skips each epoch's smaller last batch)")
        if self.training:
            self._updates += 1
        emb = self.embedding(x)
        eq, ec = emb[:queries], emb[queries:]
        # −||e_q − e_c||² expanded: no [Q, C, D] intermediate.
        scores = 2 * eq @ ec.T - eq.pow(2).sum(-1, keepdim=True) - ec.pow(2).sum(-1)  # [Q, C]
        same = (y[:queries].unsqueeze(1) == y[queries:].unsqueeze(0)).to(scores.dtype)

        def downstream(mu):
            return knn_loss(mu, same, self.k)

        sigma = {} if self.sigma is None else {"sigma": self.sigma(x[:queries])}  # [Q, 1], one σ per query
        z = self.estimator(scores, self.structure, None, downstream if self.training else None, **sigma)
        return KNNOutput(downstream(z).mean(), z)

    def _embed(self, data: dict[str, torch.Tensor], batch_size: int | None) -> torch.Tensor:
        return torch.cat([self.embedding(b["x"]) for b in iterate_batches(data, batch_size or 1000)])

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """``acc`` (×100) of the kNN classifier over the training embeddings; ``sigma`` = the mean learned σ."""
        if self._reference is None:
            raise RuntimeError("KNN.evaluate needs the training split first: call use_training_data(train)")
        was_training = self.training
        self.eval()
        if self._cache is None or self._cache[0] != self._updates:  # valid and test share one embedding pass
            self._cache = (self._updates, self._embed(self._reference, batch_size))
        pred = knn_predict(self._embed(data, batch_size), self._cache[1], self._reference["y"], self.k,
                           self.num_classes)
        metrics = {"acc": 100 * float((pred == data["y"]).float().mean())}
        if self.sigma is not None:
            metrics["sigma"] = float(torch.cat([self.sigma(b["x"]) for b in
                                                iterate_batches(data, batch_size or 1000)]).mean())
        self.train(was_training)
        return metrics

"""Classification through a latent structure: x → features → scores → [estimator ∘ structure] → z → decoder → ŷ.

The scorer's ``latent_dim`` outputs are reshaped to the structure's parts (the data's ``part_shape``, default
``(latent_dim,)``: categorical) and the decoder is fed vec(z). The true latent ``z`` of the data is either a class
index ``[N]`` (the synthetic clusters; ``latent=gold`` one-hots it) or a vertex ``[N, *part_shape]`` (the planted
structures, ``latentstruct/data/planted.py``; ``latent=gold`` feeds it as it is).

The loss is the batch-mean cross-entropy; ``downstream(μ)`` is the per-example cross-entropy of the decoder fed μ
with the features detached, so that estimators can take pulled-back steps (DESIGN.md §5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Estimator
from latentstruct.ranges import Part
from latentstruct.structures.base import Structure
from latentstruct.tasks.base import Task

__all__ = ["LatentClassifier", "Output"]

LATENT_SOURCES = ("predicted", "gold", "none")


@dataclass
class Output:
    logits: torch.Tensor  # [batch, num_classes]
    loss: torch.Tensor  # scalar, batch mean
    clusters: torch.Tensor | None  # [batch] MAP latent (categorical) for recovery metrics; None while training
    vertex: torch.Tensor | None = None  # [batch, *part_shape] MAP (or gold) vertex of a structured latent; eval only


class LatentClassifier(Task):
    """``latent`` = ``predicted`` (the estimator's z), ``gold`` (the oracle: the true z, one-hot) or ``none``
    (a decoder that ignores z, e.g. the linear baseline)."""

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict, encoder: Annotated[Any, Part()],
              scorer: Annotated[Any, Part()], structure: Annotated[Any, Part(Structure)],
              estimator: Annotated[Any, Part(Estimator)], decoder: Annotated[Any, Part()],
              latent: Literal["predicted", "gold", "none"] = "predicted") -> LatentClassifier:
        """encoder → scorer → structure, estimator → decoder, sized by the data (``input_dim``, ``latent_dim``,
        ``num_classes``; a decoder that lists an extra of the data in its ``FROM_DATA``, such as the planted
        structures' fixed ``readout``, gets it too); ``latent`` is the top-level config key."""
        encoder = encoder(input_dim=dims["input_dim"])
        shape = tuple(dims.get("part_shape", (dims["latent_dim"],)))
        if math.prod(shape) != dims["latent_dim"]:
            raise ValueError(f"part_shape {shape} does not hold latent_dim={dims['latent_dim']} parts")
        given = {k: extras[k] for k in getattr(getattr(decoder, "func", decoder), "FROM_DATA", ()) if k in extras}
        return cls(
            encoder=encoder,
            scorer=scorer(in_features=encoder.output_dim, num_parts=dims["latent_dim"]),
            structure=structure,
            estimator=estimator,
            decoder=decoder(
                in_features=encoder.output_dim, latent_dim=dims["latent_dim"], num_classes=dims["num_classes"],
                **given,
            ),
            latent=latent,
            part_shape=shape,
        )

    def __init__(self, encoder, scorer, structure, estimator, decoder, latent: str = "predicted",
                 part_shape: tuple[int, ...] | None = None):
        super().__init__()
        if latent not in LATENT_SOURCES:
            raise ValueError(f"latent must be one of {LATENT_SOURCES}, got {latent!r}")
        if (latent == "none") == decoder.uses_latent:
            raise ValueError(
                f"latent={latent!r} does not fit decoder {type(decoder).__name__} "
                f"(uses_latent={decoder.uses_latent}): use latent=none exactly with a decoder that ignores z"
            )
        self.encoder, self.scorer, self.estimator, self.decoder = encoder, scorer, estimator, decoder
        self.structure, self.latent = structure, latent
        self.part_shape = None if part_shape is None else tuple(part_shape)

    def forward(self, batch: dict[str, torch.Tensor]) -> Output:
        features, y = self.encoder(batch["x"]), batch["y"]
        lengths = batch.get("lengths")
        if self.latent == "none":
            return Output(*self._logits_loss(features, None, y), clusters=None)
        scores = self.scorer(features)
        structured = (self.part_shape is not None and len(self.part_shape) > 1) or batch.get("z", y).dim() > 1
        if structured:  # the parts' shape; the categorical path below is the synthetic clusters' one, untouched
            return self._structured(features, scores.view(-1, *self.part_shape), batch, lengths)
        if self.latent == "gold":
            z = F.one_hot(batch["z"], scores.shape[-1]).to(features.dtype)
            clusters = batch["z"]
        else:
            detached = features.detach()

            def downstream(mu):
                return F.cross_entropy(self.decoder(detached, mu), y, reduction="none")

            z = self.estimator(scores, self.structure, lengths, downstream)
            # Recovery metrics always use MAP; only evaluation needs them.
            clusters = None if self.training else self.structure.map(scores.detach(), lengths).argmax(-1)
        return Output(*self._logits_loss(features, z, y), clusters=clusters)

    def _structured(self, features, scores, batch, lengths) -> Output:
        """A latent with part scores ``[batch, *part_shape]``: the decoder is fed vec(z); at evaluation the output
        holds the MAP vertex (the gold one for ``latent=gold``) for the recovery metrics."""
        y = batch["y"]
        if self.latent == "gold":
            z = batch["z"].to(features.dtype)
            vertex = batch["z"]
        else:
            detached = features.detach()

            def downstream(mu):
                return F.cross_entropy(self.decoder(detached, mu.flatten(1)), y, reduction="none")

            z = self.estimator(scores, self.structure, lengths, downstream)
            vertex = None if self.training else self.structure.map(scores.detach(), lengths)
        return Output(*self._logits_loss(features, z.flatten(1), y), clusters=None, vertex=vertex)

    def _logits_loss(self, features, z, y):
        logits = self.decoder(features, z)
        return logits, F.cross_entropy(logits, y)

    def report_record(self, test: dict[str, torch.Tensor], extras: dict) -> dict | None:
        """A vertex ``z`` (the planted structures): the recovery a latent unrelated to z* gets on ``test``
        (``report.matrix``'s chance line, :func:`_chance`: the setting's, whatever the model); None otherwise."""
        if self.structure is None or "z" not in test or test["z"].dim() < 2:
            return None
        return {"chance": _chance(self.structure, test["z"].cpu())}

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """Accuracy and, when the true latent ``z`` is known, how well the MAP latent recovers it; all ×100.

        A class-index ``z`` (the synthetic clusters): ``v_measure`` of the MAP cluster (exactly as for Table 2; a
        model without a latent predicts one constant cluster, whose V-measure is 0 by definition).
        A vertex ``z`` ``[N, *part_shape]`` (the planted structures), with a latent (predicted or gold):
        ``recovery``, the part F1 of the MAP vertex against z* (micro over the examples; for trees the attachment or
        span score, as every vertex has the same number of parts), and ``exact``, the rate of MAP = z*; for a
        categorical z (one part shape dimension, one-hot) ``recovery`` and ``v_measure`` are the V-measure of the
        argmax (clusters are identified up to a permutation), and for sequence tags ``v_measure`` is that of the
        tag at each position.
        A model without a latent (``latent=none``) reports no recovery.
        """
        was_training = self.training
        self.eval()
        preds, gold, clusters, true_z, losses, vertices = [], [], [], [], [], []
        for batch in iterate_batches(data, batch_size):
            out = self(batch)
            preds.append(out.logits.argmax(-1))
            gold.append(batch["y"])
            losses.append(out.loss * len(batch["y"]))
            if "z" in batch:
                true_z.append(batch["z"])
                if batch["z"].dim() > 1:
                    vertices.append(out.vertex)
                else:
                    clusters.append(out.clusters if out.clusters is not None else torch.zeros_like(batch["z"]))
        self.train(was_training)
        preds, gold = torch.cat(preds), torch.cat(gold)
        metrics = {
            "loss": float(torch.stack(losses).sum() / len(gold)),
            "acc": 100 * float((preds == gold).float().mean()),
        }
        if true_z and true_z[0].dim() == 1:
            metrics["v_measure"] = v_measure(torch.cat(true_z), torch.cat(clusters))
        elif true_z and all(v is not None for v in vertices):
            metrics.update(recovery_metrics(torch.cat(vertices), torch.cat(true_z)))
        return metrics


def v_measure(true: torch.Tensor, pred: torch.Tensor) -> float:
    """The V-measure ×100 of the clustering ``pred`` against the classes ``true`` (1-d integer tensors): the harmonic
    mean of homogeneity h = 1 − H(C|K)/H(C) and completeness c = 1 − H(K|C)/H(K) (Rosenberg & Hirschberg, 2007),
    each 1 where its denominator entropy is 0, and 100 for no examples. Computed here from the contingency table
    (scikit-learn's ``v_measure_score`` is the cross-check in the tests; importing it cost every run's process 2 s of
    CPU, one core busy)."""
    true, pred = true.detach().cpu().long().flatten(), pred.detach().cpu().long().flatten()
    if true.numel() == 0:
        return 100.0
    classes, clusters = torch.unique(true, return_inverse=True)[1], torch.unique(pred, return_inverse=True)[1]
    n_c, n_k = int(classes.max()) + 1, int(clusters.max()) + 1
    joint = torch.bincount(classes * n_k + clusters, minlength=n_c * n_k).view(n_c, n_k).double() / true.numel()
    p_c, p_k = joint.sum(1), joint.sum(0)

    def entropy(p: torch.Tensor) -> float:
        p = p[p > 0]
        return float(-(p * p.log()).sum())

    nz = joint > 0
    outer = torch.outer(p_c, p_k)
    mutual = float((joint[nz] * (joint[nz] / outer[nz]).log()).sum())  # I(C; K) = H(C) − H(C|K) = H(K) − H(K|C)
    h_c, h_k = entropy(p_c), entropy(p_k)
    h = 1.0 if h_c == 0 else mutual / h_c
    c = 1.0 if h_k == 0 else mutual / h_k
    return 0.0 if h + c == 0 else 100 * 2 * h * c / (h + c)


def _chance(structure, true: torch.Tensor) -> dict[str, float]:
    """:func:`recovery_metrics` of the MAP of random scores (N(0, 1) per part, ``torch.Generator`` seed 0) against
    the true vertices ``true``: what a latent that carries no information about z* scores."""
    gen = torch.Generator().manual_seed(0)
    guess = structure.map(torch.randn(true.shape, generator=gen, dtype=torch.float64)).to(true.dtype)
    return recovery_metrics(guess, true)


def recovery_metrics(pred: torch.Tensor, true: torch.Tensor) -> dict[str, float]:
    """How well vertices ``pred`` ``[N, *part_shape]`` recover ``true`` (0/1), ×100: ``recovery`` (part F1, micro;
    for a categorical latent, shape ``[N, n]``, the V-measure of the argmax, also as ``v_measure``), ``exact`` (the
    rate of pred = true) and, for sequence tags ``[N, n, T, T]``, ``v_measure`` of the tag at each position."""
    pred, true = pred.detach().cpu() > 0.5, true.detach().cpu() > 0.5
    flat_pred, flat_true = pred.flatten(1), true.flatten(1)
    metrics = {"exact": 100 * float((flat_pred == flat_true).all(1).float().mean())}
    if true.dim() == 2 and bool((true.sum(1) == 1).all()):  # categorical: a cluster per example
        metrics["recovery"] = v_measure(true.int().argmax(1), pred.int().argmax(1))
        metrics["v_measure"] = metrics["recovery"]
        return metrics
    overlap, sizes = float((flat_pred & flat_true).sum()), float(flat_pred.sum() + flat_true.sum())
    metrics["recovery"] = 100 * 2 * overlap / sizes if sizes else 100.0
    if true.dim() == 4:  # sequence tags [n, T(previous), T(current)]: the tag at each position
        def tags(v):
            return v.sum(2).int().argmax(-1).flatten()

        metrics["v_measure"] = v_measure(tags(true), tags(pred))
    return metrics

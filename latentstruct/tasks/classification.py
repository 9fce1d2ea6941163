"""Classification through a latent structure: x → features → scores → [estimator ∘ structure] → z → decoder → ŷ.

The loss is the batch-mean cross-entropy; ``downstream(μ)`` is the per-example cross-entropy of the decoder fed μ
with the features detached, so that estimators can take pulled-back steps (DESIGN.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from sklearn.metrics import v_measure_score

from latentstruct.data.base import iterate_batches
from latentstruct.tasks.base import Task

__all__ = ["LatentClassifier", "Output"]

LATENT_SOURCES = ("predicted", "gold", "none")


@dataclass
class Output:
    logits: torch.Tensor  # [batch, num_classes]
    loss: torch.Tensor  # scalar, batch mean
    clusters: torch.Tensor | None  # [batch] MAP latent (categorical) for recovery metrics; None while training


class LatentClassifier(Task):
    """``latent`` = ``predicted`` (the estimator's z), ``gold`` (the oracle: the true z, one-hot) or ``none``
    (a decoder that ignores z, e.g. the linear baseline)."""

    PARTS = ("encoder", "scorer", "structure", "estimator", "decoder")

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict, encoder, scorer, structure, estimator, decoder,
              latent: Literal["predicted", "gold", "none"] = "predicted") -> LatentClassifier:
        """encoder → scorer → structure, estimator → decoder, sized by the data (``input_dim``, ``latent_dim``,
        ``num_classes``); ``latent`` is the top-level config key."""
        encoder = encoder(input_dim=dims["input_dim"])
        return cls(
            encoder=encoder,
            scorer=scorer(in_features=encoder.output_dim, num_parts=dims["latent_dim"]),
            structure=structure,
            estimator=estimator,
            decoder=decoder(
                in_features=encoder.output_dim, latent_dim=dims["latent_dim"], num_classes=dims["num_classes"]
            ),
            latent=latent,
        )

    def __init__(self, encoder, scorer, structure, estimator, decoder, latent: str = "predicted"):
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

    def forward(self, batch: dict[str, torch.Tensor]) -> Output:
        features, y = self.encoder(batch["x"]), batch["y"]
        lengths = batch.get("lengths")
        if self.latent == "none":
            return Output(*self._logits_loss(features, None, y), clusters=None)
        scores = self.scorer(features)
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

    def _logits_loss(self, features, z, y):
        logits = self.decoder(features, z)
        return logits, F.cross_entropy(logits, y)

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """Accuracy and, when the true latent ``z`` is known, the V-measure of the MAP latent; both ×100.

        A model without a latent predicts one constant cluster, whose V-measure is 0 by definition.
        """
        was_training = self.training
        self.eval()
        preds, gold, clusters, true_z, losses = [], [], [], [], []
        for batch in iterate_batches(data, batch_size):
            out = self(batch)
            preds.append(out.logits.argmax(-1))
            gold.append(batch["y"])
            losses.append(out.loss * len(batch["y"]))
            if "z" in batch:
                true_z.append(batch["z"])
                clusters.append(out.clusters if out.clusters is not None else torch.zeros_like(batch["z"]))
        self.train(was_training)
        preds, gold = torch.cat(preds), torch.cat(gold)
        metrics = {
            "loss": float(torch.stack(losses).sum() / len(gold)),
            "acc": 100 * float((preds == gold).float().mean()),
        }
        if true_z:
            metrics["v_measure"] = 100 * float(
                v_measure_score(torch.cat(true_z).cpu().numpy(), torch.cat(clusters).cpu().numpy())
            )
        return metrics

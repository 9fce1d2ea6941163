"""Text classification through latent dependency trees (seed 001 §7.2): SST sentiment and SNLI inference.

* :class:`LatentTreeSST` — word ids ``x`` ``[B, n]`` with ``lengths`` ``[B]`` → embedder → ``task.encoder`` (a
  BiLSTM) → h ``[B, n, hidden]``; with ``latent=predicted``, ``task.scorer`` (arc scores ``[B, n+1, n+1]``) →
  ``task.estimator`` ∘ ``task.structure`` (a projective tree) → z; ``task.decoder`` reads [h_i; head_i] → 2 logits.
  ``latent=none`` is the BiLSTM baseline (no scorer, structure or estimator).
* :class:`LatentTreeNLI` — premise and hypothesis ids, each sentence's tree from one ``task.scorer`` on the word
  vectors (non-projective by default), every word concatenated with its head → decomposable attention → 3 logits.

Metrics: ``acc`` (×100), ``loss``, and for tree models the MAP trees' depth. ``report_record`` writes every distinct
test sentence's words and MAP heads (``report.json``, Figure 6).

    python -m latentstruct.train +experiment=sst_spigot

The wiring, the readings of §7.2 and where our protocol differs: docs/tasks.md#text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Estimator
from latentstruct.models.text import (
    ArcScorer,
    BaselineSST,
    BiLSTMEncoder,
    DecomposableAttention,
    Embedder,
    SSTDecoder,
    head_vectors,
)
from latentstruct.ranges import Part
from latentstruct.structures import NonProjectiveDepTree, ProjectiveDepTree
from latentstruct.tasks.base import Task

__all__ = ["LatentTreeSST", "LatentTreeNLI", "TextOutput", "tree_depths"]


@dataclass
class TextOutput:
    logits: torch.Tensor  # [batch, num_classes]
    loss: torch.Tensor  # scalar, batch mean
    trees: list[tuple[torch.Tensor, torch.Tensor]]  # (MAP arcs [B, n+1, n+1], lengths) per sentence; [] unless eval


def tree_depths(z: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Depth (arcs on the longest root-to-word path) of every 0/1 tree ``z`` ``[B, n+1, n+1]`` over ``lengths``
    words, by pointer jumping on the head arrays: ``[B]`` float (what :func:`latentstruct.trees.depth` gives)."""
    batch, n = z.shape[0], z.shape[-1] - 1
    heads = torch.cat([z.new_zeros(batch, 1, dtype=torch.long), z[:, :, 1:].argmax(1)], dim=1)  # [B, n+1], 0 → 0
    real = torch.arange(1, n + 1, device=z.device).view(1, -1) <= lengths.view(-1, 1)
    node, level = heads[:, 1:], real.long()  # each word's distance to the root reached so far
    for _ in range(n):
        alive = (node != 0) & real
        if not bool(alive.any()):
            break
        level = level + alive.long()
        node = torch.gather(heads, 1, node)
    return level.max(1).values.float()


def _embedder(embedding: dict[str, Any], dims: dict[str, int], extras: dict) -> Embedder:
    """The word vectors: the dataset's pretrained matrix (``extras["embeddings"]``) or ``embedding.dim`` random ones."""
    pretrained = extras.get("embeddings")
    dim = pretrained.shape[1] if pretrained is not None else embedding["dim"]
    return Embedder(dims["vocab_size"], dim, pretrained=pretrained, freeze=embedding["freeze"])


_TREES = (ProjectiveDepTree, NonProjectiveDepTree)


def _has_tree(task: str, dataset: str, latent: str, scorer, structure, estimator) -> bool:
    """Whether the model goes through a tree: ``latent=predicted`` with a scorer, a structure and an estimator, or
    ``latent=none`` (the baseline) with none of them; text has no gold trees."""
    if latent == "gold":
        raise ValueError(f"{dataset} has no gold latent trees: use latent=predicted or latent=none (the baseline)")
    tree = {"scorer": scorer, "structure": structure, "estimator": estimator}
    if latent == "none" and any(part is not None for part in tree.values()):
        given = {name: _name(part) for name, part in tree.items() if part is not None}
        raise ValueError(f"{task} with latent=none (the baseline) has no tree, but "
                         f"{', '.join(f'{k}={v}' for k, v in given.items())} {'is' if len(given) == 1 else 'are'} "
                         f"set; the baseline is +experiment={dataset.lower()}_baseline, without them")
    if latent != "none" and any(part is None for part in tree.values()):
        missing = ", ".join(name for name, part in tree.items() if part is None)
        raise ValueError(f"{task} with latent={latent} goes through a tree and needs a {missing}; latent=none is the "
                         "baseline")
    return latent != "none"


def _class(part) -> type:
    """The class a part is (or a partial of)."""
    return getattr(part, "func", type(part))


def _name(part) -> str:
    """The class a part is (or a partial of), as ``module.Class``; settings without a ``_target_`` as their keys."""
    if isinstance(part, Mapping):
        return f"{{{', '.join(map(str, part))}}} (no _target_)"
    cls = getattr(part, "func", type(part))
    return f"{cls.__module__}.{cls.__qualname__}"


def _trim(ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return ids[:, : int(lengths.max())].long()


class _TreeTask(Task):
    """What the two text tasks share: the latent source, the evaluation loop, parsing a sentence."""

    def arc_scores(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Arc scores ``[B, n+1, n+1]`` of word ids ``[B, n]`` (what the structure sees)."""
        raise NotImplementedError

    @torch.no_grad()
    def parse(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The MAP trees ``[B, n+1, n+1]`` of word ids ``[B, n]``, in evaluation mode (dropout off)."""
        if self.scorer is None:
            raise ValueError("this model has no latent tree (latent=none, the baseline)")
        was_training = self.training
        self.eval()
        try:
            return self.structure.map(self.arc_scores(_trim(ids, lengths), lengths), lengths)
        finally:
            self.train(was_training)

    def report_record(self, test: dict[str, torch.Tensor], extras: dict) -> dict | None:
        """The MAP tree of every distinct sentence of ``test`` (``report.trees`` draws them): its words (the
        vocabulary's, ``<unk>`` for the unknown ones) and heads (0: the root), in the split's order."""
        if self.scorer is None:
            return None
        itos, seen, sentences = extras["vocab"].itos, set(), []
        for key in ("x", "premise", "hypothesis"):
            if key not in test:
                continue
            lengths = test["lengths" if key == "x" else f"{key}_lengths"]
            for batch in iterate_batches({"ids": test[key], "lengths": lengths}, 256):
                z = self.parse(batch["ids"], batch["lengths"]).cpu()
                for ids, tree, n in zip(batch["ids"].tolist(), z, batch["lengths"].tolist(), strict=True):
                    words = [itos[i] for i in ids[:n]]
                    if tuple(words) not in seen:
                        seen.add(tuple(words))
                        sentences.append({"words": words, "heads": tree[: n + 1, 1 : n + 1].argmax(0).tolist()})
        return {"trees": "dependency", "split": "test", "sentences": sentences}

    def _latent(self, scores, lengths, downstream):
        """The estimator's tree, and the MAP tree for the statistics (evaluation only)."""
        z = self.estimator(scores, self.structure, lengths, downstream)
        tree = None
        if not self.training:
            map_out = not self.estimator.relaxed or self.estimator.eval_latent == "map"  # z is the MAP tree
            tree = z if map_out else self.structure.map(scores.detach(), lengths)
        return z, tree

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        was_training = self.training
        self.eval()
        correct, loss, count, depth_sum, trees = 0.0, 0.0, 0, 0.0, 0
        for batch in iterate_batches(data, batch_size):
            out = self(batch)
            y = batch["y"]
            correct += float((out.logits.argmax(-1) == y).sum())
            loss += float(out.loss) * len(y)
            count += len(y)
            for z, lengths in out.trees:
                depth_sum += float(tree_depths(z, lengths).sum())
                trees += len(lengths)
        self.train(was_training)
        metrics = {"loss": loss / count, "acc": 100 * correct / count}
        if trees:
            metrics["depth"] = depth_sum / trees
        return metrics


class LatentTreeSST(_TreeTask):
    """Sentiment classification through a latent tree, or the BiLSTM baseline (``latent=none``)."""

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict, encoder: Annotated[Any, Part(BiLSTMEncoder)],
              scorer: Annotated[Any, Part(ArcScorer)], structure: Annotated[Any, Part(*_TREES)],
              estimator: Annotated[Any, Part(Estimator)], decoder: Annotated[Any, Part(SSTDecoder, BaselineSST)],
              embedding: dict[str, Any], latent: str = "predicted") -> LatentTreeSST:
        """Embedder (``embedding``, the dataset's vectors) → encoder → scorer, structure, estimator → decoder, sized
        by the data (``vocab_size``, ``num_classes``): BiLSTMEncoder, ArcScorer and SSTDecoder with
        ``latent=predicted``; BiLSTMEncoder and BaselineSST without a tree part with ``latent=none``."""
        name = cls.__name__
        tree = _has_tree(name, "SST", latent, scorer, structure, estimator)
        wanted = SSTDecoder if tree else BaselineSST
        if not issubclass(_class(decoder), wanted):
            raise ValueError(f"{name} with latent={latent} takes as decoder {wanted.__name__}, not {_name(decoder)}: "
                             f"{'decoder=sst' if tree else 'decoder=baseline_sst'}")
        embedder = _embedder(embedding, dims, extras)  # the order of the parts' initialisations is the runs'
        encoder = encoder(input_dim=embedder.out_dim)
        decoder = decoder(dim=encoder.out_dim, num_classes=dims["num_classes"])
        if not tree:
            return cls(embedder, encoder, decoder)
        return cls(embedder, encoder, decoder, scorer=scorer(dim=encoder.out_dim), structure=structure,
                   estimator=estimator)

    def __init__(self, embedder, encoder, decoder, scorer=None, structure=None, estimator=None):
        super().__init__()
        if (scorer is None) != isinstance(decoder, BaselineSST):
            raise ValueError("the baseline decoder goes without a scorer, the tree decoder with one")
        self.embedder, self.encoder, self.decoder = embedder, encoder, decoder
        self.scorer, self.structure, self.estimator = scorer, structure, estimator

    def arc_scores(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.encoder(self.embedder(ids), lengths), lengths)

    def forward(self, batch: dict[str, torch.Tensor]) -> TextOutput:
        lengths, y = batch["lengths"], batch["y"]
        h = self.encoder(self.embedder(_trim(batch["x"], lengths)), lengths)
        if self.scorer is None:
            logits = self.decoder(h, lengths)
            return TextOutput(logits, F.cross_entropy(logits, y), [])
        root = self.scorer.root
        scores = self.scorer(h, lengths)
        hd, rootd = h.detach(), root.detach()

        def downstream(mu):
            return F.cross_entropy(self.decoder(hd, head_vectors(mu, hd, rootd), lengths), y, reduction="none")

        z, tree = self._latent(scores, lengths, downstream)
        logits = self.decoder(h, head_vectors(z, h, root), lengths)
        return TextOutput(logits, F.cross_entropy(logits, y), [] if tree is None else [(tree, lengths)])


class LatentTreeNLI(_TreeTask):
    """Natural language inference: decomposable attention over words concatenated with their latent heads, or
    decomposable attention alone (``latent=none``)."""

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict, scorer: Annotated[Any, Part(ArcScorer)],
              structure: Annotated[Any, Part(*_TREES)], estimator: Annotated[Any, Part(Estimator)],
              decoder: Annotated[Any, Part(DecomposableAttention)], embedding: dict[str, Any],
              latent: str = "predicted") -> LatentTreeNLI:
        """Embedder (``embedding``, the dataset's vectors) → scorer, structure, estimator → decoder (decomposable
        attention over [word; head], or over the words with ``latent=none``), sized by the data (``vocab_size``,
        ``num_classes``)."""
        name = cls.__name__
        tree = _has_tree(name, "SNLI", latent, scorer, structure, estimator)
        embedder = _embedder(embedding, dims, extras)  # the order of the parts' initialisations is the runs'
        d = embedder.out_dim
        decoder = decoder(input_dim=2 * d if tree else d, num_classes=dims["num_classes"])
        if not tree:
            return cls(embedder, decoder)
        return cls(embedder, decoder, scorer=scorer(dim=d), structure=structure, estimator=estimator)

    def __init__(self, embedder, decoder, scorer=None, structure=None, estimator=None):
        super().__init__()
        self.embedder, self.decoder = embedder, decoder
        self.scorer, self.structure, self.estimator = scorer, structure, estimator

    def arc_scores(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.embedder(ids), lengths)

    def forward(self, batch: dict[str, torch.Tensor]) -> TextOutput:
        la, lb, y = batch["premise_lengths"], batch["hypothesis_lengths"], batch["y"]
        a = self.embedder(_trim(batch["premise"], la))
        b = self.embedder(_trim(batch["hypothesis"], lb))
        if self.scorer is None:
            logits = self.decoder(a, b, la, lb)
            return TextOutput(logits, F.cross_entropy(logits, y), [])
        root = self.scorer.root
        sa, sb = self.scorer(a, la), self.scorer(b, lb)
        ad, bd, rootd = a.detach(), b.detach(), root.detach()
        held: dict[str, torch.Tensor] = {}  # the other sentence's MAP head vectors, computed when first needed

        def map_heads(name, scores, lengths, x):
            if name not in held:
                with torch.no_grad():
                    held[name] = head_vectors(self.structure.map(scores.detach(), lengths), x, rootd)
            return held[name]

        def loss_with(heads_a, heads_b):
            logits = self.decoder(torch.cat([ad, heads_a], -1), torch.cat([bd, heads_b], -1), la, lb)
            return F.cross_entropy(logits, y, reduction="none")

        za, tree_a = self._latent(sa, la, lambda mu: loss_with(head_vectors(mu, ad, rootd), map_heads("b", sb, lb, bd)))
        zb, tree_b = self._latent(sb, lb, lambda mu: loss_with(map_heads("a", sa, la, ad), head_vectors(mu, bd, rootd)))
        logits = self.decoder(torch.cat([a, head_vectors(za, a, root)], -1),
                                torch.cat([b, head_vectors(zb, b, root)], -1), la, lb)
        trees = [] if tree_a is None else [(tree_a, la), (tree_b, lb)]
        return TextOutput(logits, F.cross_entropy(logits, y), trees)

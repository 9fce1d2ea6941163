r"""Sequence labelling with an energy network and an inference network (seed 004: CoNLL-2003 NER, Table 3;
Twitter POS, Table 9), plus an exact BiLSTM-CRF reference point.

:class:`SequenceLabelEnergy` fills the hooks of :class:`~latentstruct.tasks.energy.BilevelEnergyTask` for tag
sequences; the training procedures are the base class's (``task.method``, :data:`SEQUENCE_METHODS`: those of
:mod:`latentstruct.tasks.energy` and ``crf``). The batch: word ids ``x`` ``[B, n]``, ``lengths`` ``[B]``, tag ids
``y`` ``[B, n]`` and, for NER+ (:data:`EXTRA_FEATURES`), ``pos`` and ``chunk`` ids ``[B, n]``; each batch is cut to
its longest sentence, and padding never influences an example. Parts: ``task.energy`` (eq. 7 on its own BiLSTM
features), ``task.infnet`` / ``task.cost_net`` (a BiLSTM with a softmax per token), and ``task.encoder``, the
feature network each of them gets its own copy of.

Metrics: ``acc`` = ``task.metric`` (:data:`METRICS`): ``span_f1``, the conlleval F1 (×100, NER; also ``precision``,
``recall``), or ``token_acc`` (POS), of the per-token argmax of A_θ (the Viterbi path for ``crf``); ``infer_seconds``.

    python -m latentstruct.train +experiment=ner_cd

The pieces for sequences (E, A, Δ, the negatives, SPEN's relaxed set) and the evaluation: docs/tasks.md#energy_ner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.conll import span_f1, tag_names
from latentstruct.models.energy import (
    SequenceEnergyNet,
    categorical_samples,
    hamming_loss,
    sequence_nll,
)
from latentstruct.models.masks import length_mask
from latentstruct.ranges import AtLeast, NonNegative, Part, Positive
from latentstruct.structures import Categorical, SequenceTagging
from latentstruct.tasks.energy import (
    HVP,
    METHODS,
    BilevelEnergyTask,
    EnergyOutput,
    InnerOptimizer,
    InverseSolver,
    Method,
    Primary,
)

__all__ = ["EXTRA_FEATURES", "METRICS", "SEQUENCE_METHODS", "SequenceEnergyNet", "SequenceLabelEnergy"]

#: the base class's methods, plus the exact BiLSTM-CRF
SequenceMethod = Literal[Method, "crf"]
SEQUENCE_METHODS: tuple[str, ...] = (*METHODS, "crf")
#: what ``acc`` may be: conlleval's span F1 (NER) or the token accuracy (POS tagging); the dataset says which
METRICS: tuple[str, ...] = ("span_f1", "token_acc")
#: the per-token feature columns a batch may carry (the seed's NER+: POS and chunk tags), in this order
EXTRA_FEATURES: tuple[str, ...] = ("pos", "chunk")


class SequenceLabelEnergy(BilevelEnergyTask):
    """Sequence labelling with an energy (module docstring). The networks: :class:`BilevelEnergyTask`; ``num_tags``
    from the data; ``extra_keys``: the per-token feature columns every network reads (NER+: ``pos``, ``chunk``, of
    :data:`EXTRA_FEATURES`); ``tags``: the tag names, index = tag id (default: CoNLL's BIOES inventory when
    ``num_tags`` = 17); ``metric``: what ``acc`` (the selection metric) is, ``span_f1`` (NER, conlleval) or
    ``token_acc`` (POS tagging: accuracy over tokens; the span metrics are then not computed).

    Args:
        method: mbce (the BiLSTM baseline: A alone, token cross-entropy), implicit (seed 004 Algorithm 1), explicit
            (φ with ∂L_prim/∂φ only), infnet (Tu & Gimpel 2018, eq. 5; + infnet_ce: InfNet+), spen (SSVM,
            projected gradient on the simplices), crf (the BiLSTM-CRF, exact: NLL by the forward algorithm,
            Viterbi).
        num_samples: cd: K sequences drawn per sentence from A(x); our choice (as for MLC).
        infnet_ce: infnet: weight of the inference networks' token cross-entropy in their ascent (InfNet+).
        normalize_cost: Δ = token Hamming loss divided by the length (false: the number of wrong tags, on the scale
            of the energy, a sum over tokens).
    """

    METHODS = SEQUENCE_METHODS
    NETWORKS = {**BilevelEnergyTask.NETWORKS, "crf": (True, False, False)}

    def __init__(
        self,
        energy_net: nn.Module | None,
        infnet: nn.Module | None,
        cost_net: nn.Module | None,
        num_tags: int,
        extra_keys: Sequence[str] = (),
        normalize_cost: bool = False,
        tags: Sequence[str] | None = None,
        metric: str = "span_f1",
        **settings: Any,
    ):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose among {METRICS}")
        unknown = set(extra_keys) - set(EXTRA_FEATURES)
        if unknown:
            raise ValueError(f"unknown extra features {sorted(unknown)}; choose among {EXTRA_FEATURES}")
        super().__init__(energy_net, infnet, cost_net, **settings)
        self.num_tags = int(num_tags)
        self.extra_keys = tuple(extra_keys)
        self.normalize_cost = bool(normalize_cost)
        if tags is None:
            tags = tag_names("bioes") if num_tags == 17 else [f"T{i}" for i in range(num_tags)]
        if len(tags) != num_tags:
            raise ValueError(f"{len(tags)} tag names for {num_tags} tags")
        self.tags = list(tags)
        self.metric = metric
        self.structure = SequenceTagging(num_tags)
        self._simplex = Categorical()

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict[str, Any],
        energy: Annotated[Any, Part()],
        infnet: Annotated[Any, Part()],
        cost_net: Annotated[Any, Part()],
        encoder: Annotated[Any, Part()],
        embedding: dict[str, Any],
        method: SequenceMethod = "implicit",
        primary: Primary = "cd",
        lam: Annotated[float, NonNegative] = 1.0,
        inner_steps: Annotated[int, NonNegative] = 1,
        inner_optimizer: InnerOptimizer = "adam",
        inner_lr: Annotated[float, Positive] = 1e-3,
        neumann_terms: Annotated[int, NonNegative] = 20,
        neumann_alpha: Annotated[float, Positive] = 5e-3,
        num_samples: Annotated[int, AtLeast(1)] = 10,
        straight_through: bool = True,
        infnet_ce: Annotated[float, NonNegative] = 0.0,
        spen_steps: Annotated[int, NonNegative] = 10,
        spen_lr: Annotated[float, Positive] = 0.1,
        phases: int = 0,
        normalize_cost: bool = False,
        inverse_solver: InverseSolver = "minres",
        solver_tol: Annotated[float, NonNegative] = 0.2,
        solver_max_iter: Annotated[int, NonNegative] = 20,
        solver_damping: Annotated[float, NonNegative] = 0.0,
        hvp: HVP = "double_backward",
    ) -> SequenceLabelEnergy:
        """E, A, F in this order (the order of their initial draws), each on its own feature network from
        ``encoder``: word vectors of ``embedding.dim`` (the GloVe file's size when ``embedding.pretrained`` names one;
        its vectors come in ``extras["embeddings"]``, frozen when ``embedding.freeze``), + the POS and chunk
        vocabularies when the data has them (``dataset.features=true``). Sizes, the tag names and the metric come
        from the data (``dataset=conll2003|twpos``)."""
        if "vocab_size" not in dims or "num_tags" not in dims:
            raise ValueError("task=ner_energy needs a tagging dataset (dataset=conll2003 or dataset=twpos)")
        if encoder is None:
            raise ValueError("task=ner_energy builds its networks' features from encoder (encoder=bilstm_features)")
        pretrained = extras.get("embeddings")
        extra = {k: dims[f"{k}_vocab_size"] for k in EXTRA_FEATURES if dims.get(f"{k}_vocab_size", 0)}

        def features():
            return encoder(vocab_size=dims["vocab_size"],
                           emb_dim=pretrained.shape[1] if pretrained is not None else embedding["dim"],
                           extra_vocab_sizes=list(extra.values()), pretrained=pretrained, freeze=embedding["freeze"])

        nets = [None if part is None else part(features=features(), num_tags=dims["num_tags"])
                for part in (energy, infnet, cost_net)]
        return cls(
            *nets, num_tags=dims["num_tags"], extra_keys=tuple(extra), normalize_cost=normalize_cost,
            tags=extras.get("tag_names"), metric=extras.get("metric", "span_f1"), method=method, primary=primary,
            lam=lam, inner_steps=inner_steps, inner_optimizer=inner_optimizer, inner_lr=inner_lr,
            neumann_terms=neumann_terms, neumann_alpha=neumann_alpha, num_samples=num_samples,
            straight_through=straight_through, infnet_ce=infnet_ce, spen_steps=spen_steps, spen_lr=spen_lr,
            pretrain=cls.pretrains(phases), inverse_solver=inverse_solver, solver_tol=solver_tol,
            solver_max_iter=solver_max_iter, solver_damping=solver_damping, hvp=hvp,
        )

    # -------------------------------------------------------------------------------------------- helpers
    def energy_parameters(self) -> list[nn.Parameter]:
        """φ (trainable ones: frozen pretrained vectors are not differentiated)."""
        return [p for p in super().energy_parameters() if p.requires_grad]

    def inference_parameters(self) -> list[nn.Parameter]:
        """θ (trainable ones)."""
        return [p for p in super().inference_parameters() if p.requires_grad]

    @staticmethod
    def trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch cut to its longest sentence (the splits are padded to their own longest)."""
        n = int(batch["lengths"].max())
        return {k: v[:, :n] if v.dim() >= 2 else v for k, v in batch.items()}

    def _extra(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        missing = [k for k in self.extra_keys if k not in batch]
        if missing:
            raise ValueError(f"the model reads per-token features {missing} that the batch lacks "
                             "(dataset.features=true)")
        return tuple(batch[k] for k in self.extra_keys)

    def _mask(self, batch: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """``[B, n, 1]``: 1 at real tokens."""
        x = batch["x"]
        return length_mask(batch["lengths"], x.shape[1], x.device).unsqueeze(-1).to(dtype)

    def energy_features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """b(x, t) of the energy ``[B, n, 2·hidden]`` (the batch may carry them precomputed, ``_energy_features``)."""
        cached = batch.get("_energy_features")
        if cached is not None:
            return cached
        return self.energy_net.token_features(batch["x"], batch["lengths"], self._extra(batch))

    def with_energy_features(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` with b(x, t) of the energy (``_energy_features``), one BiLSTM pass for the step's energies."""
        return {**batch, "_energy_features": self.energy_features(batch)}

    def double_backward_context(self, batch: dict[str, torch.Tensor]):
        if self.method == "implicit" and batch["x"].is_cuda:
            return torch.backends.cudnn.flags(enabled=False)  # cuDNN's LSTM backward has no derivative
        return contextlib.nullcontext()

    # ------------------------------------------------------------------------------------------------ hooks
    def energy(self, batch, y):
        return self.energy_net(self.energy_features(batch), y, batch["lengths"])

    def inference(self, net, batch):
        logits = net.logits(batch["x"], batch["lengths"], self._extra(batch))
        probs = torch.softmax(logits, -1) * self._mask(batch, logits.dtype)
        return probs, sequence_nll(logits, self.gold(batch).to(logits.dtype), batch["lengths"])

    def cost(self, y_bar, batch):
        return hamming_loss(y_bar, self.gold(batch).to(y_bar.dtype), batch["lengths"], normalize=self.normalize_cost)

    def value_target(self, y_bar, batch):
        accuracy = 1 - hamming_loss(y_bar, self.gold(batch).to(y_bar.dtype), batch["lengths"], normalize=True)
        return accuracy.clamp(0, 1)

    def negatives(self, probs, batch):
        return categorical_samples(probs, self.num_samples, straight_through=self.straight_through)

    def gold(self, batch):
        """One-hot gold tags ``[B, n, T]`` (float), rows at padding 0."""
        one_hot = F.one_hot(batch["y"].clamp(0, self.num_tags - 1), self.num_tags).to(torch.get_default_dtype())
        return one_hot * self._mask(batch, one_hot.dtype)

    def energy_pretrain_loss(self, batch):
        logits = self.energy_net.energy.unary_scores(self.energy_features(batch))
        return sequence_nll(logits, self.gold(batch).to(logits.dtype), batch["lengths"])

    def spen_start(self, batch):
        logits = self.energy_net.energy.unary_scores(self.energy_features(batch))
        return (torch.softmax(logits, -1) * self._mask(batch, logits.dtype)).detach()

    def project(self, y):
        """Euclidean projection of every token's row onto the probability simplex (sparsemax)."""
        return self._simplex.sparsemap(y.reshape(-1, y.shape[-1])).view(y.shape)

    def spen_inference(self, batch, augmented=False):
        with torch.no_grad():  # b(x, t) does not depend on ȳ: one feature pass for all the steps
            features = self.energy_net.token_features(batch["x"], batch["lengths"], self._extra(batch))
        return super().spen_inference({**batch, "_energy_features": features}, augmented)

    # -------------------------------------------------------------------------------------------------- CRF
    def crf_nll(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """−log p(y | x) ``[B]`` with p ∝ exp(−E_φ(x, ·)) over tag sequences: log Z(x) + E_φ(x, y)."""
        features = self.energy_features(batch)
        parts = self.energy_net.crf_parts(features, batch["lengths"])
        gold = self.gold(batch).to(parts.dtype)
        return self.structure.log_partition(parts, batch["lengths"]) + self.energy_net(features, gold,
                                                                                       batch["lengths"])

    def viterbi(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """argmin_y E_φ(x, y) over tag sequences, one-hot ``[B, n, T]`` (rows at padding 0)."""
        parts = self.energy_net.crf_parts(self.energy_features(batch), batch["lengths"])
        tags = SequenceTagging.tags(self.structure.map(parts, batch["lengths"]))  # -1 at padding
        return F.one_hot(tags.clamp_min(0), self.num_tags).to(parts.dtype) * self._mask(batch, parts.dtype)

    # ------------------------------------------------------------------------------------- train / predict
    def forward(self, batch: dict[str, torch.Tensor]) -> EnergyOutput:
        batch = self.trim(batch)
        if self.method == "crf" and not self._pretraining:
            return EnergyOutput(self.crf_nll(batch).mean())
        with self.double_backward_context(batch):
            return super().forward(batch)

    def predict(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[B, n, T]`` (n the batch's width): Viterbi one-hot (``crf``), SPEN's inference, else A(x)."""
        width = batch["x"].shape[1]
        batch = self.trim(batch)
        out = self.viterbi(batch) if self.method == "crf" else super().predict(batch)
        return F.pad(out, (0, 0, 0, width - out.shape[1]))

    def predict_tags(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> tuple[torch.Tensor, float]:
        """(per-token argmax of :meth:`predict` ``[N, n]`` long, the seconds the prediction pass took)."""
        preds, seconds = self.predict_split(data, batch_size)
        return preds.argmax(-1), seconds

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """Span F1 (conlleval) and the rest of the module docstring's metrics of one split; with
        ``metric="token_acc"`` only ``acc`` = ``token_acc`` and ``infer_seconds``."""
        pred, seconds = self.predict_tags(data, batch_size)
        gold, lengths = data["y"], data["lengths"]
        mask = length_mask(lengths, gold.shape[1], gold.device)
        token_acc = 100 * float(((pred == gold) & mask).sum()) / max(int(mask.sum()), 1)
        if self.metric == "token_acc":
            return {"acc": token_acc, "token_acc": token_acc, "infer_seconds": seconds}
        names = self.tags
        pred_seqs = [[names[t] for t in row[:n]] for row, n in zip(pred.tolist(), lengths.tolist(), strict=True)]
        gold_seqs = [[names[t] for t in row[:n]] for row, n in zip(gold.tolist(), lengths.tolist(), strict=True)]
        precision, recall, f1 = span_f1(pred_seqs, gold_seqs)
        return {"acc": f1, "f1": f1, "precision": precision, "recall": recall, "token_acc": token_acc,
                "infer_seconds": seconds}

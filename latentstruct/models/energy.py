"""Energy networks, inference networks and primary losses for energy-based structured prediction (seed 004).

Seed 004 trains an energy network E_φ(x, y) and an inference network A_θ(x) as a bi-level problem: θ minimises the
auxiliary loss (eq. 6), φ a primary loss through the implicit gradient (:mod:`latentstruct.models.implicit`). This
module holds the networks and the losses; the training loop lives in :mod:`latentstruct.tasks.energy`.

**E is an energy — lower is better — everywhere in this module**; y is the relaxed output, in [0, 1]^L or one simplex
row per token, and the unary weights are logits (high = the label or tag is on).

* Energies: :class:`MLCEnergy` (SPEN, x ``[B, D]``, y ``[*, B, L]``; ``local_logits`` for the logistic
  pretraining), :class:`SequenceEnergy` (eq. 7, token features ``[B, n, H]``, y ``[*, B, n, T]``, ``lengths``
  ``[B]``), :class:`SequenceEnergyNet` (it on its own features; also read as a CRF, ``crf_parts``). Energies ``[*, B]``.
* Features and inference networks: :class:`BiLSTMFeatures` (``[B, n, 2·hidden]``, 0 at padding),
  :class:`MLCInferenceNet` (``[B, L]`` in [0, 1]), :class:`SequenceInferenceNet` (``[B, n, T]`` per-token softmax).
* Task losses Δ (Δ(y, y) = 0): :func:`f1_loss`, :func:`soft_f1_loss`, :func:`hamming_loss`; negatives
  :func:`bernoulli_samples`, :func:`categorical_samples`.
* Primary losses on energy values: :func:`ssvm_loss` [Δ − E(ȳ) + E(y)]₊, :func:`cd_loss`
  E(y) + logsumexp_k(−E(ȳ_k) + Δ(ȳ_k, y)), :func:`dvn_loss`; :func:`auxiliary_loss` (eq. 6: NLL + λ E(x, A_θ(x)))
  with :func:`multilabel_nll` or :func:`sequence_nll`. The losses detach nothing but the DVN target: pass ȳ attached
  for the implicit gradient, ``ȳ.detach()`` for alternating training.

Example::

    >>> energy = MLCEnergy(input_dim=5, num_labels=3)
    >>> x, y = torch.randn(4, 5), torch.rand(4, 3)
    >>> e_bar, e_gold = energy(x, y), energy(x, (y > 0.5).float())     # [4], [4]
    >>> ssvm_loss(e_bar, e_gold, soft_f1_loss(y, (y > 0.5).float())).shape
    torch.Size([])

The sign convention and why, every equation, what is detached, and where the seed is ambiguous (our reading):
docs/models.md#energy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.models.masks import check_lengths, length_mask
from latentstruct.models.text import BiLSTMEncoder, Embedder
from latentstruct.ranges import AtLeast, Probability
from latentstruct.structures import SequenceTagging

__all__ = [
    "BiLSTMFeatures",
    "MLCEnergy",
    "MLCInferenceNet",
    "SequenceEnergy",
    "SequenceEnergyNet",
    "SequenceInferenceNet",
    "auxiliary_loss",
    "bernoulli_samples",
    "categorical_samples",
    "cd_loss",
    "dvn_loss",
    "f1_loss",
    "hamming_loss",
    "multilabel_nll",
    "sequence_nll",
    "soft_f1_loss",
    "ssvm_loss",
]


# ------------------------------------------------------------------------------------------------------- helpers


def _relu_mlp(input_dim: int, hidden: Sequence[int]) -> nn.Sequential:
    """(Linear → ReLU) for each width in ``hidden``; the identity when ``hidden`` is empty."""
    sizes = [input_dim, *hidden]
    layers: list[nn.Module] = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(d_in, d_out), nn.ReLU()]
    return nn.Sequential(*layers)


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return values.mean()
    if reduction == "sum":
        return values.sum()
    if reduction == "none":
        return values
    raise ValueError(f"unknown reduction {reduction!r}; choose mean, sum or none")


# ---------------------------------------------------------------------------------------------- energy networks


class MLCEnergy(nn.Module):
    """SPEN energy for multi-label classification (E-MLC of docs/models.md#energy); lower is better.

    ``forward(x [B, input_dim], y [*, B, L]) → E [*, B]`` for relaxed y ∈ [0, 1]^L; leading sample dimensions of y
    (e.g. K negative samples ``[K, B, L]``) share one feature pass.

    Args:
        feature_hidden: the energy's feature MLP F (seed 004 / SPEN: 150-150; 250-250 for delicious).
        global_hidden: units of the global energy term vᵀ softplus(Cy + c) (16; 10 for delicious).
    """

    FROM_DATA = ("input_dim", "num_labels")  # given by the task, from the data

    def __init__(
        self, input_dim: int, num_labels: int, feature_hidden: Annotated[Sequence[int], AtLeast(1)] = (150, 150),
        global_hidden: Annotated[int, AtLeast(1)] = 16,
    ) -> None:
        super().__init__()
        if not feature_hidden:
            raise ValueError("feature_hidden needs at least one layer")
        self.num_labels = num_labels
        self.features = _relu_mlp(input_dim, feature_hidden)  # F
        self.local = nn.Linear(feature_hidden[-1], num_labels)  # b_i (rows) and β_i
        self.label_proj = nn.Linear(num_labels, global_hidden)  # C, c
        self.label_weight = nn.Linear(global_hidden, 1, bias=False)  # v

    def feature_parameters(self) -> list[nn.Parameter]:
        """Parameters of F and of the local head: what the independent-logistic pretraining of SPEN trains."""
        return [*self.features.parameters(), *self.local.parameters()]

    def local_logits(self, x: torch.Tensor) -> torch.Tensor:
        """ℓ(x) = b_iᵀF(x) + β_i ``[B, L]``: per-label logits (pretrain with :func:`multilabel_nll`)."""
        return self.local(self.features(x))

    def global_score(self, y: torch.Tensor) -> torch.Tensor:
        """vᵀ softplus(C y + c) ``[*, B]`` for y ``[*, B, L]`` (enters E with a minus)."""
        return self.label_weight(F.softplus(self.label_proj(y))).squeeze(-1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -((y * self.local_logits(x)).sum(-1) + self.global_score(y))


class SequenceEnergy(nn.Module):
    """Eq. 7 of the seed (linear-chain energy on relaxed tags); lower is better.

    ``forward(features [B, n, H], y [*, B, n, T], lengths [B]) → E [*, B]``; ``features`` are b(x, t) (e.g. from
    :class:`BiLSTMFeatures`); positions ``≥ lengths[b]`` contribute nothing. Parameters: ``unary`` (U, no bias, as in
    eq. 7), ``transition`` W [T, T] (W[i, j]: tag i followed by tag j), ``start`` and ``end`` [T]; the last three
    start at zero (no transition preference).
    """

    def __init__(self, feature_dim: int, num_tags: int) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.unary = nn.Linear(feature_dim, num_tags, bias=False)
        self.transition = nn.Parameter(torch.zeros(num_tags, num_tags))
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))

    def unary_scores(self, features: torch.Tensor) -> torch.Tensor:
        """U_jᵀ b(x, t) ``[B, n, T]``: per-token tag logits (enter E with a minus)."""
        return self.unary(features)

    def pairwise_score(self, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Σ_{t=1}^{N+1} y_{t−1}ᵀ W̃ y_t with the start/end symbols, ``[*, B]`` for y ``[*, B, n, T]`` (y masked)."""
        b, n = y.shape[-3], y.shape[-2]
        lengths = check_lengths(lengths, b, n, y.device)
        ym = y * length_mask(lengths, n, y.device).unsqueeze(-1).to(y.dtype)
        inner = torch.einsum("...ti,ij,...tj->...", ym[..., :-1, :], self.transition, ym[..., 1:, :])
        last = F.one_hot(lengths - 1, n).to(y.dtype).unsqueeze(-1)  # [B, n, 1]: the position meeting ⟨/s⟩
        return inner + ym[..., 0, :] @ self.start + (ym * last).sum(-2) @ self.end

    def forward(self, features: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, n = y.shape[-3], y.shape[-2]
        if features.shape[:2] != (b, n):
            raise ValueError(f"features {tuple(features.shape)} and y {tuple(y.shape)} disagree on [B, n]")
        lengths = check_lengths(lengths, b, n, y.device)
        mask = length_mask(lengths, n, y.device).unsqueeze(-1).to(y.dtype)
        unary = (y * mask * self.unary_scores(features)).sum((-1, -2))
        return -(unary + self.pairwise_score(y, lengths))


# ----------------------------------------------------------------------------------- features, inference nets


class BiLSTMFeatures(nn.Module):
    """Token features b(x, t): embeddings of the words (+ of ``extra_vocab_sizes`` per-token feature ids, each
    ``extra_dim`` wide) → one BiLSTM layer of ``hidden`` units per direction → ``[B, n, 2·hidden]``, 0 at padding.

    ``forward(ids [B, n], lengths [B], extra=(ids_1 [B, n], ...))``. ``pretrained`` word vectors are copied in (and
    frozen when ``freeze``), as in :class:`~latentstruct.models.text.Embedder`; id 0 is padding everywhere.

    Args:
        hidden: BiLSTM units per direction (the issue / Tu & Gimpel 2018: 100).
        extra_dim: NER+ (dataset.features=true): size of the POS and of the chunk embeddings; our choice.
        dropout: dropout on the BiLSTM outputs; our choice.
    """

    #: given by the task: the sizes and word vectors from the data, ``emb_dim`` and ``freeze`` from ``embedding``
    FROM_DATA = ("vocab_size", "emb_dim", "extra_vocab_sizes", "pretrained", "freeze")

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int = 100,
        hidden: Annotated[int, AtLeast(1)] = 100,
        extra_vocab_sizes: Sequence[int] = (),
        extra_dim: Annotated[int, AtLeast(1)] = 20,
        pretrained: torch.Tensor | None = None,
        freeze: bool = True,
        dropout: Annotated[float, Probability] = 0.0,
    ) -> None:
        super().__init__()
        self.words = Embedder(vocab_size, emb_dim, pretrained=pretrained, freeze=freeze)
        self.extras = nn.ModuleList(Embedder(v, extra_dim) for v in extra_vocab_sizes)
        self.encoder = BiLSTMEncoder(emb_dim + extra_dim * len(extra_vocab_sizes), 2 * hidden, dropout=dropout)
        self.out_dim = 2 * hidden

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, extra: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        if len(extra) != len(self.extras):
            raise ValueError(f"expected {len(self.extras)} extra feature id tensors, got {len(extra)}")
        x = torch.cat([self.words(ids), *(emb(e) for emb, e in zip(self.extras, extra, strict=True))], -1)
        return self.encoder(x, lengths)


class MLCInferenceNet(nn.Module):
    """A_θ(x) = sigmoid(Linear(ReLU-MLP(x))) ``[B, L]`` (the MLP shaped like the energy's F).

    Args:
        hidden: the MLP's hidden layers (seed 004: the shape of the energy's F, 150-150; 250-250 for delicious).
    """

    FROM_DATA = ("input_dim", "num_labels")  # given by the task, from the data

    def __init__(
        self, input_dim: int, num_labels: int, hidden: Annotated[Sequence[int], AtLeast(1)] = (150, 150)
    ) -> None:
        super().__init__()
        self.body = _relu_mlp(input_dim, hidden)
        self.head = nn.Linear(hidden[-1] if hidden else input_dim, num_labels)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` logits; the MLE term of eq. 6 is :func:`multilabel_nll` of these."""
        return self.head(self.body(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(x))


class SequenceEnergyNet(nn.Module):
    """E_φ of eq. 7 with its own feature network: ``features`` (b(x, t), a :class:`BiLSTMFeatures`) and ``energy``
    (:class:`SequenceEnergy` on them). ``token_features(ids, lengths, extra)`` → ``[B, n, 2·hidden]``;
    ``forward(features, y [*, B, n, T], lengths)`` → E ``[*, B]``."""

    FROM_DATA = ("features", "num_tags")  # given by the task: its own feature network, the tags of the data

    def __init__(self, features: BiLSTMFeatures, num_tags: int) -> None:
        super().__init__()
        self.features = features
        self.energy = SequenceEnergy(features.out_dim, num_tags)

    def token_features(
        self, ids: torch.Tensor, lengths: torch.Tensor, extra: Sequence[torch.Tensor] = ()
    ) -> torch.Tensor:
        return self.features(ids, lengths, extra)

    def forward(self, features: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.energy(features, y, lengths)

    def crf_parts(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Part scores ``[B, n, T, T]`` (:class:`~latentstruct.structures.SequenceTagging`'s layout) whose sum along a
        tag sequence is −E_φ(x, y) of that sequence, one-hot."""
        e = self.energy
        return SequenceTagging.parts(e.unary_scores(features), e.transition, e.start, e.end, lengths)


class SequenceInferenceNet(nn.Module):
    """A_θ(x)_t = softmax(Linear(b_θ(x, t))) ``[B, n, T]``, with b_θ a feature module (:class:`BiLSTMFeatures`,
    having ``out_dim``) owned by this network; rows at padded positions are 0."""

    FROM_DATA = ("features", "num_tags")  # given by the task: its own feature network, the tags of the data

    def __init__(self, features: nn.Module, num_tags: int) -> None:
        super().__init__()
        self.features = features
        self.head = nn.Linear(features.out_dim, num_tags)

    def logits(self, ids: torch.Tensor, lengths: torch.Tensor, extra: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """``[B, n, T]`` per-token logits; the MLE term of eq. 6 is :func:`sequence_nll` of these."""
        return self.head(self.features(ids, lengths, extra))

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, extra: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        probs = torch.softmax(self.logits(ids, lengths, extra), -1)
        return probs * length_mask(lengths, ids.shape[1], ids.device).unsqueeze(-1).to(probs.dtype)


# ---------------------------------------------------------------------------------------------------- task losses


def soft_f1_loss(y_bar: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """1 − 2⟨ȳ, y⟩/(Σȳ + Σy) over the last dimension, ``[*, B]``; differentiable in ȳ; 0 when both are empty."""
    inter = (y_bar * y).sum(-1)
    denom = y_bar.sum(-1) + y.sum(-1)
    f1 = torch.where(denom > 0, 2 * inter / denom.clamp_min(torch.finfo(denom.dtype).tiny), torch.ones_like(denom))
    return 1 - f1


def f1_loss(y_bar: torch.Tensor, y: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Δ = 1 − F1 of the discrete vectors, ȳ rounded at ``threshold`` (y binary), ``[*, B]``; no gradient."""
    with torch.no_grad():
        return soft_f1_loss((y_bar >= threshold).to(y.dtype), y)


def hamming_loss(y_bar: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """Σ_{t < N} (1 − ⟨ȳ_t, y_t⟩) for ȳ, y ``[*, B, n, T]``, ``[*, B]``; divided by N when ``normalize``."""
    b, n = y_bar.shape[-3], y_bar.shape[-2]
    lengths = check_lengths(lengths, b, n, y_bar.device)
    mask = length_mask(lengths, n, y_bar.device).to(y_bar.dtype)
    wrong = ((1 - (y_bar * y).sum(-1)) * mask).sum(-1)
    return wrong / lengths.to(wrong.dtype) if normalize else wrong


# ------------------------------------------------------------------------------------------- negative sampling


def bernoulli_samples(
    probs: torch.Tensor, num_samples: int, generator: torch.Generator | None = None, straight_through: bool = False
) -> torch.Tensor:
    """K draws of independent Bernoulli(probs) ``[K, *probs.shape]`` (values 0/1, probs' dtype). No gradient, unless
    ``straight_through``: then the value is the hard draw and the gradient that of ``probs`` (identity)."""
    shape = (num_samples, *probs.shape)
    u = torch.rand(shape, generator=generator, dtype=probs.dtype, device=probs.device)
    hard = (u < probs.detach()).to(probs.dtype)
    return hard + (probs - probs.detach()) if straight_through else hard  # exact 0/1 values forward


def categorical_samples(
    probs: torch.Tensor, num_samples: int, generator: torch.Generator | None = None, straight_through: bool = False
) -> torch.Tensor:
    """K one-hot draws per row of ``probs`` ``[..., T]`` (categorical over the last dimension, rows need not be
    normalised; an all-zero row — padding — gives tag 0), ``[K, ..., T]``. Gradient as in :func:`bernoulli_samples`.
    """
    p = probs.detach()
    cdf = p.cumsum(-1)
    u = torch.rand((num_samples, *p.shape[:-1], 1), generator=generator, dtype=p.dtype, device=p.device)
    index = (cdf <= u * cdf[..., -1:]).sum(-1).clamp_max(p.shape[-1] - 1)  # inverse CDF
    hard = F.one_hot(index, p.shape[-1]).to(probs.dtype)
    return hard + (probs - probs.detach()) if straight_through else hard  # exact 0/1 values forward


# ------------------------------------------------------------------------------------------------- primary losses


def ssvm_loss(
    energy_bar: torch.Tensor, energy_gold: torch.Tensor, delta: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """(P1) margin-rescaled hinge [Δ(ȳ, y) − E(x, ȳ) + E(x, y)]₊ from ``[B]`` values; zero once the gold energy is
    lower than E(x, ȳ) by at least Δ."""
    return _reduce(F.relu(delta - energy_bar + energy_gold), reduction)


def cd_loss(
    energy_gold: torch.Tensor, energy_neg: torch.Tensor, delta_neg: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """(P2) E(x, y) + logsumexp over k = 0..K of (−E(x, ȳ_k) + Δ(ȳ_k, y)), ȳ_0 = y with Δ(y, y) = 0.

    ``energy_gold`` ``[B]``; ``energy_neg``, ``delta_neg`` ``[K, B]`` for the K negatives. The negative log of the
    seed's L_CD ratio: to be minimised; K = 1 gives softplus(Δ + E(y) − E(ȳ_1)) (Appendix D)."""
    if energy_neg.ndim != energy_gold.ndim + 1 or energy_neg.shape != delta_neg.shape:
        raise ValueError(
            f"energy_neg and delta_neg must be [K, *energy_gold.shape]; got {tuple(energy_neg.shape)}, "
            f"{tuple(delta_neg.shape)} and {tuple(energy_gold.shape)}"
        )
    logits = torch.cat([-energy_gold.unsqueeze(0), -energy_neg + delta_neg], 0)
    return _reduce(energy_gold + torch.logsumexp(logits, 0), reduction)


def dvn_loss(energy_bar: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """(P3) cross-entropy between the value sigmoid(−E(x, ȳ)) and the task score ``target`` = 1 − Δ(ȳ, y) ∈ [0, 1]
    (Gygli et al. 2017), from ``[B]`` values; ``target`` is detached."""
    target = target.detach()
    if bool(((target < 0) | (target > 1)).any()):
        raise ValueError("the DVN target (a task score) must lie in [0, 1]")
    return _reduce(F.binary_cross_entropy_with_logits(-energy_bar, target, reduction="none"), reduction)


# ---------------------------------------------------------------------------------------- auxiliary loss (eq. 6)


def multilabel_nll(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed's MBCE: Σ_j −y_j log a_j − (1 − y_j) log(1 − a_j), a = sigmoid(logits); ``[B, L]`` → ``[B]``."""
    return F.binary_cross_entropy_with_logits(logits, y, reduction="none").sum(-1)


def sequence_nll(logits: torch.Tensor, y: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Token cross-entropy −Σ_{t < N} Σ_j y_{t,j} log softmax(logits_t)_j for one-hot (or soft) gold y
    ``[B, n, T]``, summed over the real tokens, ``[B]``."""
    b, n = y.shape[0], y.shape[1]
    lengths = check_lengths(lengths, b, n, y.device)
    mask = length_mask(lengths, n, y.device).to(logits.dtype)
    return (-(y * torch.log_softmax(logits, -1)).sum(-1) * mask).sum(-1)


def auxiliary_loss(nll: torch.Tensor, energy_bar: torch.Tensor, lam: float, reduction: str = "mean") -> torch.Tensor:
    """Eq. 6: L_aux = L_MLE(y, A_θ(x)) + λ E_φ(x, A_θ(x)), from ``[B]`` values (``nll`` of A_θ's logits, the energy
    of its output)."""
    return _reduce(nll + lam * energy_bar, reduction)

"""Neural components for text classification through a latent dependency tree (seed 001 §7.2, Table 4).

The pipeline of §7.2.1 (SST) is

    ids ──Embedder──▶ x ──BiLSTMEncoder──▶ h ──ArcScorer──▶ s ──[estimator ∘ ProjectiveDepTree]──▶ z
    (h, head_vectors(z, h, root)) ──SSTDecoder──▶ logits

and §7.2.2 (SNLI) feeds ``[x_i; head_i]`` of the premise and of the hypothesis to :class:`DecomposableAttention`.
Everything is batched and right-padded: a batch of word vectors is ``[B, n, d]`` with ``lengths`` ``[B]`` (each ≥ 1)
the number of real words; positions ``≥ lengths[b]`` are padding and never influence the outputs of example b.

Components
----------
* :class:`Embedder` — an ``nn.Embedding``. With ``pretrained`` (GloVe 300d in the paper, Appendix A) the matrix is
  copied in and frozen when ``freeze`` (the default, as in the papers); otherwise N(0, 1) init with the padding row
  zero. The matrix is copied as given: rows the data side left at zero (specials, words without a GloVe vector)
  stay zero, and stay frozen with ``freeze=True``.

* :class:`BiLSTMEncoder` — one bidirectional LSTM layer over **time** (``batch_first=True``) with ``hidden // 2``
  units per direction, so that the concatenated output is ``hidden`` wide (100 for SST, Table 4). The batch is
  packed with ``lengths`` (``pack_padded_sequence``), so the backward direction of a short sentence starts at its own
  last word and padding never enters a state; padded outputs are exactly 0. (The original code ran the LSTM across
  the batch axis; that bug is not reproduced.) ``dropout`` is applied to the outputs.

* :class:`ArcScorer` — eq. 23, s_{i→j} = vᵀ tanh(Wᵀ [h_i; h_j] + b), with i the **head** and j the **modifier**
  (the paper's own reading of "the arc i → j"). Splitting Wᵀ = [W_h, W_m] by the two halves of the concatenation,

      s(h → m) = vᵀ tanh(W_h x_h + W_m x_m + b),

  so each word is projected once per role, ``[B, n+1, k]`` twice, and only the broadcast sum ``[B, n+1, n+1, k]``
  (k the scorer's hidden size) is formed, never the ``[B, n+1, n+1, 2d]`` concatenations. ``v`` has no bias: a
  constant added to every arc shifts every tree's score by the same n · c and changes nothing. The position-0 root
  symbol is a learned vector ``root`` ``[d]`` prepended to the words, x = [root; h_1..h_n], so the output has the
  layout of :class:`~latentstruct.structures.ProjectiveDepTree` / ``NonProjectiveDepTree``: ``scores[b, h, m]`` =
  s(h → m) over positions 0..n. Entries that are not parts are set to exactly 0: the diagonal (self-loops),
  column 0 (arcs into the root) and every arc touching a padded position (h or m > length). The structures ignore
  these entries anyway; zeros (rather than −inf) keep every downstream sum and gradient finite.

* :func:`head_vectors` — for each word m = 1..n, Σ_h z[b, h, m] · H[b, h] with H = [root; h_1..h_n]. For a 0/1 tree
  (MAP, perturb-and-MAP) this is the vector of m's head (``root`` for words attached to the root); for a relaxation
  whose columns sum to 1 (marginals μ, SparseMAP) it is the decoder input of §7.2.1, Σ_j μ(j → m) h_j — the paper
  writes μ_{i→j} there with i the modifier; here z is always indexed ``[head, modifier]``. The ``root`` passed in
  belongs to whatever space ``h`` lives in (``ArcScorer.root`` when the decoder reads the same vectors as the
  scorer, as in the SST model, or a parameter of the caller's own).

* :class:`SSTDecoder` — Peng et al. (2018) as described in §7.2.1: u_i = ReLU(A [h_i; head_i] + a), attention
  weights α = softmax_i(wᵀ u_i + c) over the true length (:func:`masked_softmax`; a learned query, a real attention
  whose weights sum to 1 — not the plain sum of the original code), pooled p = Σ_i α_i u_i, logits = O p + o.

* :class:`BaselineSST` — the §7.2.1 baseline: Σ_i h_i over the true length, then a two-layer ReLU MLP,
  logits = O ReLU(A Σ_i h_i + a) + o. "Two-layer" counts the output layer: with the BiLSTM (300 → 100) this gives
  151K trainable parameters, Table 4's "150K" (a third layer would give 161K). For the same reason the SST latent
  model is meant to share one BiLSTM between the scorer and the decoder: BiLSTM 140.8K + ``ArcScorer(100, 100)``
  20.3K + ``SSTDecoder(100, 100)`` 20.4K = 181.5K, Table 4's "180K" (a second BiLSTM would add 140.8K).

* :class:`DecomposableAttention` — Parikh et al. (2016) without intra-attention (the §7.2.2 baseline), hidden 200,
  dropout 0.2 (Table 4). With a = (a_1..a_la) the premise and b = (b_1..b_lb) the hypothesis:

      project:    ā_i = P a_i,   b̄_j = P b_j                         (linear, no bias, input_dim → hidden)
      attend:     e_ij = F(ā_i) · F(b̄_j)
                  β_i = Σ_j softmax_j(e_ij) b̄_j,   α_j = Σ_i softmax_i(e_ij) ā_i   (masked to the true lengths)
      compare:    v1_i = G([ā_i; β_i]),   v2_j = G([b̄_j; α_j])
      aggregate:  v1 = Σ_i v1_i,  v2 = Σ_j v2_j  (true lengths only),   ŷ = H([v1; v2])

  F and G are two-layer ReLU MLPs with dropout before each linear layer (on the input side of both layers).
  H is ``aggregate_layers`` such ReLU layers followed by a linear layer to the classes. The default 1 gives Table
  4's baseline count "340K" (341.8K; H = ReLU layer + linear output, the usual reading of Parikh et al., where H's
  second layer emits the class scores) and is what the SNLI runs use; 2, a literal reading of the brief ("two-layer
  ReLU MLP, then a linear layer"), gives 382K. The latent-tree variant (§7.2.2) concatenates each word with its
  (weighted) head before the model, so only ``input_dim`` changes (see the class docstring).

The masks (:func:`~latentstruct.models.masks.length_mask`, :func:`~latentstruct.models.masks.masked_softmax`,
:func:`~latentstruct.models.masks.masked_sum`) live in :mod:`latentstruct.models.masks`, shared with the other
sequence models.

**As config options.** Each module is an option of the group of its role (``configs/encoder/bilstm.yaml``,
``scorer/arc.yaml``, ``decoder/sst.yaml``, ``decoder/baseline_sst.yaml``, ``decoder/decomposable_attention.yaml``);
the sizes that come from the data or from the part before (``FROM_DATA``) are given by the task
(:mod:`latentstruct.tasks.text`). The embedder is built by the task from the top-level ``embedding`` settings and the
dataset's vectors.

References: A. Parikh, O. Täckström, D. Das, J. Uszkoreit (2016), "A decomposable attention model for natural
language inference", EMNLP. H. Peng, S. Thomson, N. A. Smith (2018), "Backpropagating through structured argmax
using a SPIGOT", ACL.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.forward_ad import unpack_dual
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from latentstruct.models.masks import check_lengths, length_mask, masked_softmax, masked_sum
from latentstruct.ranges import AtLeast, Probability

__all__ = [
    "Embedder",
    "BiLSTMEncoder",
    "pack_padded",
    "ArcScorer",
    "head_vectors",
    "SSTDecoder",
    "BaselineSST",
    "DecomposableAttention",
]


# ------------------------------------------------------------------------------------------------------- helpers


def _mlp(sizes: list[int], dropout: float) -> nn.Sequential:
    """(Dropout → Linear → ReLU) for each consecutive pair of ``sizes``."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Dropout(dropout), nn.Linear(d_in, d_out), nn.ReLU()]
    return nn.Sequential(*layers)


def pack_padded(x: torch.Tensor, lengths: torch.Tensor) -> PackedSequence:
    """``pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)`` written as one gather
    (``index_select``): the same :class:`PackedSequence`, value for value, and the same gradient, but differentiable
    in forward mode too (``aten::_pack_padded_sequence`` has no forward-mode derivative, which the forward-over-reverse
    Hessian-vector products of ``latentstruct.models.implicit`` need). :class:`BiLSTMEncoder` uses it only for an
    input that carries a forward-mode tangent: on CUDA its backward (``index_add_``) is not the one
    pack_padded_sequence's determinism guarantees were checked with. ``x`` ``[B, n, d]``; ``lengths`` ``[B]`` on the
    CPU, each in 1..n."""
    lengths = lengths.to(torch.int64)
    sorted_lengths, order = torch.sort(lengths, descending=True)  # as pack_padded_sequence sorts
    steps = torch.arange(int(sorted_lengths[0]))
    batch_sizes = (sorted_lengths.unsqueeze(0) > steps.unsqueeze(1)).sum(1)  # [T]: sequences still running at t
    t_index, rank = (torch.arange(len(lengths)).unsqueeze(0) < batch_sizes.unsqueeze(1)).nonzero(as_tuple=True)
    rows = (order[rank] * x.shape[1] + t_index).to(x.device)  # time-major, longest sequence first at each t
    data = x.reshape(-1, x.shape[-1]).index_select(0, rows)
    return PackedSequence(data, batch_sizes, order.to(x.device))


# ----------------------------------------------------------------------------------------------------- embedding


class Embedder(nn.Module):
    """Word ids ``[B, n]`` → vectors ``[B, n, dim]``.

    ``pretrained`` ``[vocab_size, dim]`` is copied in, and frozen when ``freeze``; without it the weights are
    trainable, N(0, 1), with the ``padding_idx`` row zero (``None``: no padding row). Not a config option: the text
    tasks build it from the top-level ``embedding`` settings and the dataset's vocabulary and vectors.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        pretrained: torch.Tensor | None = None,
        freeze: bool = True,
        padding_idx: int | None = 0,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        self.out_dim = dim
        if pretrained is not None:
            if tuple(pretrained.shape) != (vocab_size, dim):
                raise ValueError(f"pretrained must be [{vocab_size}, {dim}], got {tuple(pretrained.shape)}")
            with torch.no_grad():
                self.embedding.weight.copy_(pretrained)
            self.embedding.weight.requires_grad_(not freeze)
            # frozen vectors are the data's: checkpoints leave them out (latentstruct.records.model_weights)
            self.embedding.weight.rebuilt_from_data = freeze
        else:
            with torch.no_grad():
                nn.init.normal_(self.embedding.weight, 0.0, 1.0)
                if padding_idx is not None:
                    self.embedding.weight[padding_idx].zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)


# ------------------------------------------------------------------------------------------------------- encoder


class BiLSTMEncoder(nn.Module):
    """One bidirectional LSTM layer over time, ``hidden // 2`` units per direction: ``[B, n, input_dim]`` and
    ``lengths`` ``[B]`` (each in 1..n) → ``[B, n, hidden]``, exactly 0 at padded positions.

    Args:
        hidden: BiLSTM size, both directions together (seed 001 Table 4: 100).
        dropout: dropout on the BiLSTM outputs (Table 4: 0).
    """

    FROM_DATA = ("input_dim",)  # the word vectors' size, given by the task

    def __init__(
        self, input_dim: int, hidden: Annotated[int, AtLeast(2)] = 100, dropout: Annotated[float, Probability] = 0.0
    ):
        super().__init__()
        if hidden % 2:
            raise ValueError(f"hidden is the total size of both directions and must be even, got {hidden}")
        self.lstm = nn.LSTM(input_dim, hidden // 2, num_layers=1, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.out_dim = hidden

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        cpu_lengths = check_lengths(torch.as_tensor(lengths).detach().cpu(), *x.shape[:2], torch.device("cpu"))
        if unpack_dual(x).tangent is None:
            packed = pack_padded_sequence(x, cpu_lengths, batch_first=True, enforce_sorted=False)
        else:  # x carries a forward-mode tangent (hvp=forward_over_reverse): the same packing, as a gather
            packed = pack_padded(x, cpu_lengths)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # padding → 0
        return self.dropout(out)  # dropout keeps the zeros zero


# ---------------------------------------------------------------------------------------------------- arc scores


class ArcScorer(nn.Module):
    """Eq. 23: ``[B, n, dim]`` word vectors (+ ``lengths``) → arc scores ``[B, n+1, n+1]``, ``[b, h, m]`` = s(h → m)
    = vᵀ tanh(W_h x_h + W_m x_m + b) with x = [root; words]; 0 on the diagonal, column 0 and padding.

    Args:
        hidden: hidden size of the arc scorer's tanh layer (eq. 23).
    """

    FROM_DATA = ("dim",)  # the size of the vectors it scores, given by the task

    def __init__(self, dim: int, hidden: Annotated[int, AtLeast(1)] = 100):
        super().__init__()
        self.head = nn.Linear(dim, hidden)  # W_h and the bias b
        self.modifier = nn.Linear(dim, hidden, bias=False)  # W_m
        self.v = nn.Linear(hidden, 1, bias=False)
        self.root = nn.Parameter(torch.empty(dim))
        bound = 1.0 / math.sqrt(dim)
        nn.init.uniform_(self.root, -bound, bound)

    def forward(self, h: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        batch, n, _ = h.shape
        x = torch.cat([self.root.to(h.dtype).expand(batch, 1, -1), h], dim=1)  # [B, n+1, d]
        pre = self.head(x).unsqueeze(2) + self.modifier(x).unsqueeze(1)  # [B, h, m, k]
        scores = self.v(torch.tanh(pre)).squeeze(-1)  # [B, n+1, n+1]
        if lengths is None:
            lengths = torch.full((batch,), n, dtype=torch.long, device=h.device)
        inside = length_mask(torch.as_tensor(lengths, device=h.device) + 1, n + 1, h.device)  # positions 0..L
        pos = torch.arange(n + 1, device=h.device)
        part = inside.unsqueeze(2) & inside.unsqueeze(1) & (pos.view(-1, 1) != pos.view(1, -1)) & (pos.view(1, -1) > 0)
        return scores.masked_fill(~part, 0.0)


def head_vectors(z: torch.Tensor, h: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """Weighted head vector of every word: ``out[b, m-1] = Σ_h z[b, h, m] · H[b, h]``, H = [root; h].

    ``z`` ``[B, n+1, n+1]`` (a tree or a relaxation, ``[head, modifier]``), ``h`` ``[B, n, d]``, ``root`` ``[d]``
    (or ``[B, d]``) → ``[B, n, d]``. Padded columns of z are 0, so padded words get 0.
    """
    batch, n, d = h.shape
    if z.shape != (batch, n + 1, n + 1):
        raise ValueError(f"z must be [{batch}, {n + 1}, {n + 1}] for h {tuple(h.shape)}, got {tuple(z.shape)}")
    stacked = torch.cat([root.to(h.dtype).expand(batch, d).unsqueeze(1), h], dim=1)  # [B, n+1, d]
    return torch.bmm(z[:, :, 1:].to(h.dtype).transpose(1, 2), stacked)  # [B, n, n+1] @ [B, n+1, d]


# ------------------------------------------------------------------------------------------------------ decoders


class SSTDecoder(nn.Module):
    """Peng et al. (2018), §7.2.1: [h_i; head_i] → Linear → ReLU → attention pooling → Linear → logits.

    Args:
        hidden: the decoder's affine layer.
        dropout: dropout before the output layer (seed 001 Table 4: 0).
    """

    uses_latent = True  # reads the head vectors of the tree
    FROM_DATA = ("dim", "num_classes")  # given by the task: the encoder's size, the dataset's classes

    def __init__(self, dim: int, hidden: Annotated[int, AtLeast(1)] = 100, num_classes: int = 2,
                 dropout: Annotated[float, Probability] = 0.0):
        super().__init__()
        self.hidden = nn.Linear(2 * dim, hidden)
        self.attention = nn.Linear(hidden, 1)  # the learned query w (and c, which cancels in the softmax)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_classes)

    def pool(self, h: torch.Tensor, heads: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled vector ``[B, hidden]`` and the attention weights ``[B, n]`` (0 on padding, sum 1)."""
        u = F.relu(self.hidden(torch.cat([h, heads], dim=-1)))  # [B, n, hidden]
        mask = length_mask(lengths, h.shape[1], h.device)
        weights = masked_softmax(self.attention(u).squeeze(-1), mask, dim=-1)
        return torch.einsum("bn,bnk->bk", weights, u), weights

    def forward(self, h: torch.Tensor, heads: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        pooled, _ = self.pool(h, heads, lengths)
        return self.out(self.dropout(pooled))


class BaselineSST(nn.Module):
    """The §7.2.1 baseline: Σ of the BiLSTM states over the true length → Linear → ReLU → Linear → logits.

    Args:
        hidden: its MLP's hidden layer.
        dropout: dropout before the output layer (seed 001 Table 4: 0).
    """

    uses_latent = False  # no tree: the baseline
    FROM_DATA = ("dim", "num_classes")  # given by the task: the encoder's size, the dataset's classes

    def __init__(self, dim: int, hidden: Annotated[int, AtLeast(1)] = 100, num_classes: int = 2,
                 dropout: Annotated[float, Probability] = 0.0):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.mlp(masked_sum(h, lengths))


class DecomposableAttention(nn.Module):
    """Parikh et al. (2016) without intra-attention: premise ``a`` ``[B, la, input_dim]``, hypothesis ``b``
    ``[B, lb, input_dim]``, true lengths ``len_a``, ``len_b`` ``[B]`` → logits ``[B, num_classes]``.

    Latent-tree variant (§7.2.2): concatenate each word with its (weighted) head, separately for the two sentences,
    and build the model with ``input_dim = 2 · d``::

        scorer, tree = ArcScorer(300, hidden), ProjectiveDepTree()
        da = DecomposableAttention(input_dim=600)
        x_a, x_b = embed(ids_a), embed(ids_b)                                   # [B, la, 300], [B, lb, 300]
        z_a = estimator(scorer(x_a, len_a), tree, len_a, downstream_a)          # [B, la+1, la+1]
        z_b = estimator(scorer(x_b, len_b), tree, len_b, downstream_b)
        a = torch.cat([x_a, head_vectors(z_a, x_a, scorer.root)], dim=-1)      # [B, la, 600]
        b = torch.cat([x_b, head_vectors(z_b, x_b, scorer.root)], dim=-1)
        logits = da(a, b, len_a, len_b)

    Args:
        hidden: decomposable attention's hidden size (seed 001 Table 4: 200).
        dropout: dropout before every layer of F, G and H (Table 4: 0.2).
        aggregate_layers: ReLU layers of the aggregation MLP H before its output layer (1 gives the baseline Table
            4's 340K parameters with 300d vectors).
    """

    FROM_DATA = ("input_dim", "num_classes")  # given by the task: [word; head] or word size, the dataset's classes

    def __init__(
        self,
        input_dim: int,
        hidden: Annotated[int, AtLeast(1)] = 200,
        num_classes: int = 3,
        dropout: Annotated[float, Probability] = 0.2,
        aggregate_layers: Annotated[int, AtLeast(1)] = 1,
    ):
        super().__init__()
        if aggregate_layers < 1:
            raise ValueError(f"aggregate_layers must be >= 1, got {aggregate_layers}")
        self.project = nn.Linear(input_dim, hidden, bias=False)
        self.attend = _mlp([hidden, hidden, hidden], dropout)  # F
        self.compare = _mlp([2 * hidden, hidden, hidden], dropout)  # G
        self.aggregate = _mlp([2 * hidden] + [hidden] * aggregate_layers, dropout)  # H's ReLU layers
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, a: torch.Tensor, b: torch.Tensor, len_a: torch.Tensor, len_b: torch.Tensor) -> torch.Tensor:
        a, b = self.project(a), self.project(b)  # [B, la, k], [B, lb, k]
        mask_a = length_mask(len_a, a.shape[1], a.device)  # [B, la]
        mask_b = length_mask(len_b, b.shape[1], b.device)  # [B, lb]
        e = torch.bmm(self.attend(a), self.attend(b).transpose(1, 2))  # [B, la, lb]
        beta = torch.bmm(masked_softmax(e, mask_b.unsqueeze(1), dim=2), b)  # [B, la, k]: b aligned to each a_i
        alpha = torch.bmm(masked_softmax(e, mask_a.unsqueeze(2), dim=1).transpose(1, 2), a)  # [B, lb, k]
        v1 = masked_sum(self.compare(torch.cat([a, beta], dim=-1)), len_a)  # [B, k]
        v2 = masked_sum(self.compare(torch.cat([b, alpha], dim=-1)), len_b)
        return self.out(self.aggregate(torch.cat([v1, v2], dim=-1)))

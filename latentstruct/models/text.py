"""Neural components for text classification through a latent dependency tree (seed 001 §7.2, Table 4).

The SST pipeline (§7.2.1)::

    ids ──Embedder──▶ x ──BiLSTMEncoder──▶ h ──ArcScorer──▶ s ──[estimator ∘ ProjectiveDepTree]──▶ z
    (h, head_vectors(z, h, root)) ──SSTDecoder──▶ logits

and §7.2.2 (SNLI) feeds ``[x_i; head_i]`` of the premise and of the hypothesis to :class:`DecomposableAttention`.
Batches are right-padded: word vectors ``[B, n, d]`` with ``lengths`` ``[B]`` (each ≥ 1); padding never influences
an example's outputs.

* :class:`Embedder` (GloVe copied in, frozen by default), :class:`BiLSTMEncoder` (packed, ``hidden`` wide, 0 at
  padding).
* :class:`ArcScorer`: eq. 23, ``scores[b, h, m]`` = vᵀ tanh(W_h x_h + W_m x_m + b) ``[B, n+1, n+1]`` over positions
  0..n (0 a learned root vector), in the layout of :class:`~latentstruct.structures.ProjectiveDepTree`; non-parts 0.
* :func:`head_vectors`: Σ_h z[b, h, m] · [root; h][b, h] ``[B, n, d]``, the head of each word (or its expectation).
* :class:`SSTDecoder` (attention pooling over [h_i; head_i]), :class:`BaselineSST` (sum, two-layer MLP),
  :class:`DecomposableAttention` (Parikh et al. 2016, without intra-attention).

Each module is an option of the config group of its role (``encoder=bilstm``, ``scorer=arc``, ``decoder=sst``, ...);
the sizes that come from the data (``FROM_DATA``) are given by the task.

Example::

    >>> h = BiLSTMEncoder(input_dim=8, hidden=6)(torch.randn(2, 5, 8), torch.tensor([5, 3]))   # [2, 5, 6]
    >>> ArcScorer(dim=6, hidden=4)(h, torch.tensor([5, 3])).shape
    torch.Size([2, 6, 6])

Each component's equations, the parameter counts against Table 4, the readings of the paper: docs/models.md#text.
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

r"""ListOps (Nangia & Bowman, 2018): the answer (0-9) of a nested list expression, learned through a latent binary
tree over its tokens, with the learned trees scored against the true ones (seed 000, Parts II-III; issue #7).

The input is the sequence of leaves of :func:`latentstruct.data.listops.leaves` (operators, digits and ``]``), each
batch trimmed to its longest example. ``task.method`` picks the model; every size is in config (``task.*``; the
ListOps experiments use 128 for words and states, as Havrylov et al. 2019).

Methods
-------
* ``lstm`` — the sequence baseline, :class:`~latentstruct.models.composition.LSTMClassifier` (embedding → LSTM →
  its last state → MLP). No tree: ``evaluate`` reports ``acc`` and ``loss`` only.

* ``chart`` — the framework's own route, the structure × estimator split (DESIGN.md §2):

      ids ──emb──> BiLSTM ──> span scores s[i, j] ──[estimator ∘ BinaryTree]──> z or μ [B, n, n]
      ids ──emb──> ChartTreeLSTM(words, z) ──> root h ──> MLP ──> 10 logits

  *Span scorer* (:class:`SpanScorer`). The chart parsers' LSTM-minus span features (Wang & Chang, 2016; Cross &
  Huang, 2016; Stern et al., 2017): with f_t, b_t the forward and backward BiLSTM states (f_{-1} = b_L = 0),
  r(i, j) = [f_j − f_{i−1}; b_i − b_{j+1}] and s[i, j] = vᵀ tanh(W r(i, j) + c). The first layer is linear, so it
  splits into a term of the start and a term of the end, each computed once per position:
  W r(i, j) = A_i + B_j, and the scores cost one ``[B, n, n, span_hidden]`` tanh. (A plain MLP on
  [h_i; h_j; h_i − h_j] is the same function class as one on [h_i; h_j], since h_i − h_j folds into the linear
  layer; the LSTM-minus features instead describe what lies inside the span.)
  *Structure and estimator*: ``cfg.structure`` (must be ``binary_tree``) and ``cfg.estimator`` — any estimator of
  the §5 contract works unchanged (marginals, sparsemap, ste_i, ste_s, spigot, spigot_ce, spigot_eg,
  perturb_and_map, sfe, …): the pull-back closure ``downstream(μ)`` is the per-example cross-entropy of the
  ChartTreeLSTM + MLP fed μ, with the word vectors detached (they are upstream of the scores when the embeddings are
  shared), exactly as :class:`~latentstruct.tasks.text.LatentTreeSST` does for dependency trees.
  *Composition*: :class:`~latentstruct.models.composition.ChartTreeLSTM` reads any z — a tree, marginals, a
  SparseMAP mixture — on the word embeddings. Its cost is the chart's: O(B n³ dim) time and, with autograd,
  O(B n³ dim) memory (≈ 4.5 GB for B = 32, n = 50, dim = 128); ``task.checkpoint=true`` recomputes each width in
  the backward pass and keeps O(B n² dim) (the ListOps chart experiments set it: training batches reach n = 130).
  Evaluation is bucketed by length (below) because the test file reaches n = 939.
  *Evaluation*: the decoder is fed what ``estimator.eval_latent`` says (the ListOps experiments: ``relaxed``, i.e.
  the relaxation for marginals / SparseMAP and MAP for the others); tree metrics always use the MAP tree.

* ``gumbel_tree`` — the Gumbel Tree-LSTM (Choi et al., 2018):
  :class:`~latentstruct.models.tree_parsers.MergeParser` in ``gumbel`` mode (straight-through Gumbel-softmax at
  every merge, temperature ``task.tau``); the parser's root state → MLP. Greedy (argmax) merges at evaluation.

* ``reinforce`` — a merge parser sampling its merges (``sample`` mode), trained by the score-function estimator
  (Williams, 1992; RL-SPINN, Yogatama et al., 2017), with reward R_b = −CE_b (the example's cross-entropy,
  detached):

      loss = mean_b CE_b + reinforce_loss(log π(a_b), R_b − b_b, entropy bonus ``task.entropy_weight``)

  ``task.baseline``: ``none``, ``moving_average`` (of past batch-mean rewards, decay ``task.decay``) or
  ``self_critical`` (the reward of the greedy parse of the same example; Rennie et al., 2017). Our parser is
  Choi et al.'s easy-first merger, not SPINN's shift-reduce transitions: the same family of trees (all binary
  bracketings) under a different policy factorisation.

* ``ppo`` — Havrylov et al. (2019): the same sampled parser, trained with the clipped PPO surrogate
  (:func:`~latentstruct.models.tree_parsers.ppo_loss`, clip ε = ``task.ppo_clip``) against a self-critical baseline,
  the advantage divided by a running standard deviation (``task.normalize_advantage``; their "gradient
  normalisation"), an entropy bonus, and ``task.disjoint=true`` (below).

``task.disjoint`` (reinforce, ppo, chart): the parser (span scorer / merge parser) gets its own word embeddings and,
for reinforce / ppo, the tree is composed by a separate Tree-LSTM (a second MergeParser replaying the parser's
merges), so that syntax and semantics share no parameter, as in Havrylov et al. (2019). With ``false`` one table
of embeddings serves both and reinforce / ppo classify the parser's own root (the same cell scores and composes, as
in Choi et al. 2018 and, in spirit, RL-SPINN). ``gumbel_tree`` needs ``false``: its gradient reaches the parser
through its own composition.

PPO within the Task interface — the simplification
--------------------------------------------------
Havrylov et al. take, for every batch, one optimizer step of the composition function on the cross-entropy and
K = 15 PPO steps of the parser on the same sampled parses, re-scored after each step. ``train.py`` gives a task one
``forward(...).loss`` and one optimizer step per batch, so we keep PPO's proximal structure but change where the K
updates come from: the parses are sampled from a **behaviour policy**, a frozen copy of the parser (with its
embeddings) refreshed every ``task.ppo_refresh`` training steps (15 by default), and each step takes one clipped
step on a fresh batch:

      ρ_b = π_θ(a_b | x_b) / π_old(a_b | x_b),   a_b ~ π_old,
      loss = mean_b CE_b(a_b) + mean_b −min(ρ_b A_b, clip(ρ_b, 1 − ε, 1 + ε) A_b) − β · mean_b Σ_t H_t(π_θ)

with A_b = R_b − b_b computed from the current composer and, for ``self_critical``, the current parser's greedy
parse. The importance ratio corrects for sampling from π_old, and the clip bounds how far the K steps between two
refreshes can move the policy, which is PPO's purpose; what differs is that each of those steps sees new data
(no reuse of one batch K times), and that the composer and the parser take their steps together, from one
optimizer (``optim``, or ``optim_groups.policy`` for the parser's ``policy`` parameter group). With
``ppo_refresh=1``, ρ = 1 at every step and ``ppo`` is exactly ``reinforce`` with the same settings. Other
deviations from Havrylov et al.: Adam (they used Adadelta with learning rates 1 / 0.1 for the composer / parser,
L2 1e-4 and gradient clipping at 0.5, none of which the training loop has); the parser's leaves are the cell's
leaf transform, not an LSTM over the sequence; the entropy bonus is the sum of the per-merge entropies (they used a
normalised entropy); the classifier is an MLP (they used one linear layer).

Evaluation
----------
``evaluate(data, batch_size)`` sorts the split by length and cuts it into batches of at most ``batch_size``
examples and at most ``task.eval_max_cells`` chart cells (examples × n²), since the official test file has
expressions of up to 939 tokens. Predictions do not depend on the batching (padding is inert everywhere), so this
only saves time and memory. Metrics (means over the split's examples):

* ``acc`` (×100) and ``loss`` (cross-entropy);
* tree methods, for the MAP tree (``chart``) or the greedy parse (merge parsers) against the true tree of
  :func:`~latentstruct.data.listops.spans_to_trees`: ``tree_f1`` (sentence-level unlabelled F1 × 100, without the
  whole-sequence span, as :func:`~latentstruct.data.listops.tree_f1`), ``f1_left`` / ``f1_right`` (the same against
  the left- and right-branching trees) and ``depth`` (:func:`~latentstruct.data.listops.tree_depth`: the most
  constituents over one leaf); all vectorised (:func:`tree_scores`). Under these conventions the true trees of the
  official test file have F1 38.6 against left-branching, 0.0 against right-branching and depth 16.6; Nangia &
  Bowman report 41.6 / 8.8 / 9.6 for their ground-truth trees, so their conventions (which tokens are leaves, which
  spans count, how depth is averaged) differ from these: compare their numbers with ours only side by side.

``latent=gold`` composes along the true trees (the oracle "Tree-LSTM on ground-truth trees" row): ``chart`` runs the
ChartTreeLSTM on them, the merge methods replay them with ``given`` merges; no parser is built or trained.
``latent=none`` is only valid with ``method=lstm`` (which ignores ``latent``).

References: N. Nangia, S. Bowman (2018), "ListOps: a diagnostic dataset for latent tree learning", NAACL SRW.
J. Choi, K. M. Yoo, S. Lee (2018), "Learning to compose task-specific tree structures", AAAI. D. Yogatama et al.
(2017), "Learning to compose words into sentences with reinforcement learning", ICLR. S. Havrylov, G. Kruszewski,
A. Joulin (2019), "Cooperative learning of disjoint syntax and semantics", NAACL. M. Stern, J. Andreas, D. Klein
(2017), "A minimal span-based neural constituency parser", ACL. W. Wang, B. Chang (2016), "Graph-based dependency
parsing with bidirectional LSTM", ACL. J. Cross, L. Huang (2016), "Span-based constituency parsing with a
structure-label system and provably optimal dynamic oracles", EMNLP. S. Rennie et al. (2017), "Self-critical
sequence training for image captioning", CVPR.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from latentstruct.config import option_name
from latentstruct.data.listops import spans_to_trees
from latentstruct.models.composition import ChartTreeLSTM, LSTMClassifier
from latentstruct.models.text import BiLSTMEncoder
from latentstruct.models.tree_parsers import (
    MergeParser,
    MovingAverageBaseline,
    Parse,
    ppo_loss,
    reinforce_loss,
)
from latentstruct.structures import BinaryTree
from latentstruct.tasks.base import Task

__all__ = ["ListOps", "ListOpsOutput", "SpanScorer", "tree_scores", "METHODS", "BASELINES"]

METHODS = ("lstm", "chart", "gumbel_tree", "reinforce", "ppo")
BASELINES = ("none", "moving_average", "self_critical")
_MERGE = ("gumbel_tree", "reinforce", "ppo")


@dataclass
class ListOpsOutput:
    logits: torch.Tensor  # [batch, 10]
    loss: torch.Tensor  # scalar: the training loss (CE + the parser's surrogate) in training, the mean CE otherwise
    tree: torch.Tensor | None  # [batch, n, n] MAP / greedy tree at evaluation (BinaryTree layout); None otherwise


# ------------------------------------------------------------------------------------------------- tree metrics


def _parts(lengths: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Constituent slots ``[B, n, n]`` (i < j < L) and the same without the whole span (0, L−1)."""
    pos = torch.arange(n, device=lengths.device)
    i, j = pos.view(1, -1, 1), pos.view(1, 1, -1)
    ends = lengths.view(-1, 1, 1)
    parts = (i < j) & (j < ends)
    return parts, parts & ~((i == 0) & (j == ends - 1))


def _f1(pred: torch.Tensor, ref: torch.Tensor, nontrivial: torch.Tensor) -> torch.Tensor:
    p, g = (pred != 0) & nontrivial, (ref != 0) & nontrivial
    hit = (p & g).flatten(1).sum(-1)
    total = p.flatten(1).sum(-1) + g.flatten(1).sum(-1)
    # 2PR / (P + R) = 2·hit / (|p| + |g|); 100 when both are empty (n ≤ 2), as tree_f1
    return torch.where(total == 0, 100.0, 200.0 * hit / total.clamp_min(1))


def tree_scores(pred: torch.Tensor, gold: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example tree metrics ``[B]`` of 0/1 trees ``pred`` and ``gold`` ``[B, n, n]`` (BinaryTree layout) over
    ``lengths`` leaves: ``tree_f1`` (vs ``gold``), ``f1_left`` / ``f1_right`` (vs the left- / right-branching trees),
    all × 100 with the conventions of :func:`latentstruct.data.listops.tree_f1`, and ``depth``
    (:func:`latentstruct.data.listops.tree_depth`). Vectorised over the batch."""
    n = pred.shape[-1]
    lengths = lengths.to(pred.device).long()
    parts, nontrivial = _parts(lengths, n)
    pos = torch.arange(n, device=pred.device)
    left = parts & (pos.view(1, -1, 1) == 0)  # (0, j)
    right = parts & (pos.view(1, 1, -1) == lengths.view(-1, 1, 1) - 1)  # (i, L−1)
    tree = ((pred != 0) & parts).to(torch.int64)
    # cover[b, k] = #{(i, j) in the tree: i ≤ k ≤ j} = Σ_{i ≤ k} Σ_{j ≥ k} tree[b, i, j]
    cover = tree.flip(2).cumsum(2).flip(2).cumsum(1).diagonal(dim1=1, dim2=2)
    return {
        "tree_f1": _f1(pred, gold, nontrivial),
        "f1_left": _f1(pred, left, nontrivial),
        "f1_right": _f1(pred, right, nontrivial),
        "depth": cover.max(-1).values.to(torch.float32),
    }


# ----------------------------------------------------------------------------------------------------- modules


class SpanScorer(nn.Module):
    """Span scores from BiLSTM states (LSTM-minus features; the module docstring): ``h`` ``[B, n, 2·d]`` = [f; b]
    (forward, backward; exactly 0 at padding, as :class:`~latentstruct.models.text.BiLSTMEncoder` gives) and
    ``lengths`` → ``[B, n, n]`` with ``s[b, i, j] = vᵀ tanh(W [f_j − f_{i−1}; b_i − b_{j+1}] + c)`` for i < j < L
    and 0 elsewhere."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"dim is [forward; backward] and must be even, got {dim}")
        self.half = dim // 2
        self.proj = nn.Linear(dim, hidden)  # W on [Δf; Δb], and c
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        batch, n, _ = h.shape
        f, b = h[..., : self.half], h[..., self.half :]
        zero = h.new_zeros(batch, 1, self.half)
        f_before = torch.cat([zero, f[:, :-1]], dim=1)  # f_{i−1}
        b_after = torch.cat([b[:, 1:], zero], dim=1)  # b_{j+1} (0 past the length: padding is 0)
        w_f, w_b = self.proj.weight[:, : self.half], self.proj.weight[:, self.half :]
        start = b @ w_b.t() - f_before @ w_f.t() + self.proj.bias  # [B, n, k]: the terms of i
        end = f @ w_f.t() - b_after @ w_b.t()  # [B, n, k]: the terms of j
        scores = self.v(torch.tanh(start.unsqueeze(2) + end.unsqueeze(1))).squeeze(-1)
        parts, _ = _parts(lengths.to(h.device).long(), n)
        return scores.masked_fill(~parts, 0.0)


def _mlp(dim: int, hidden: int, num_classes: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, num_classes))


def _trim(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = batch["lengths"].long()
    return batch["x"][:, : int(lengths.max())].long(), lengths


def _gold(batch: dict[str, torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
    return spans_to_trees(batch["spans"].cpu(), n, like.dtype).to(like.device)


# -------------------------------------------------------------------------------------------------------- task


class ListOps(Task):
    """ListOps through a latent binary tree, or the LSTM baseline (module docstring: methods, PPO, metrics).

    Args:
        method: one of :data:`METHODS`.
        vocab_size, num_classes: from the data (16 and 10).
        latent: ``predicted`` (the parser's tree), ``gold`` (the true trees; tree methods) or ``none`` (lstm only).
        structure, estimator: ``chart`` only — a :class:`~latentstruct.structures.BinaryTree` and a §5 estimator.
        word_dim, hidden: word vectors; LSTM / Tree-LSTM states (also the merge parser's).
        mlp_hidden, dropout: the classifier MLP's hidden layer; dropout before its layers.
        scorer_hidden, span_hidden: ``chart`` — the BiLSTM (both directions together) and the span MLP's layer.
        checkpoint: ``chart`` — recompute the ChartTreeLSTM per width in the backward pass (O(B n² dim) memory).
        disjoint: the parser has its own embeddings and (reinforce, ppo) a separate composer.
        tau: ``gumbel_tree`` temperature.
        baseline, decay: reinforce / ppo control variate (:data:`BASELINES`) and the moving average's decay.
        entropy_weight: reinforce / ppo entropy bonus β.
        normalize_advantage, norm_decay: divide the advantage by max(1, running std) (running variance, decay).
        ppo_clip, ppo_refresh: PPO's ε; training steps between two refreshes of the behaviour policy.
        eval_max_cells: evaluation batches hold at most this many examples × n² (see the module docstring).

    Batches hold ``x`` (ids ``[B, L]``), ``lengths``, ``y`` and ``spans`` (the true trees, :func:`spans_to_trees`).
    """

    def __init__(
        self,
        method: str,
        vocab_size: int,
        num_classes: int = 10,
        latent: str = "predicted",
        structure: BinaryTree | None = None,
        estimator: nn.Module | None = None,
        word_dim: int = 128,
        hidden: int = 128,
        mlp_hidden: int = 128,
        dropout: float = 0.0,
        scorer_hidden: int = 128,
        span_hidden: int = 128,
        checkpoint: bool = False,
        disjoint: bool = False,
        tau: float = 1.0,
        baseline: str = "moving_average",
        decay: float = 0.9,
        entropy_weight: float = 0.0,
        normalize_advantage: bool = False,
        norm_decay: float = 0.9,
        ppo_clip: float = 0.2,
        ppo_refresh: int = 15,
        eval_max_cells: int = 2**20,
    ):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"task.method must be one of {METHODS}, got {method!r}")
        if latent not in ("predicted", "gold", "none"):
            raise ValueError(f"latent must be predicted, gold or none, got {latent!r}")
        if latent == "none" and method != "lstm":
            raise ValueError(f"latent=none is the sequence baseline: use task.method=lstm (got method={method})")
        if baseline not in BASELINES:
            raise ValueError(f"task.baseline must be one of {BASELINES}, got {baseline!r}")
        if method == "gumbel_tree" and disjoint:
            raise ValueError("task.disjoint=true is for reinforce / ppo / chart: the Gumbel Tree-LSTM's gradient "
                             "reaches its parser only through its own composition")
        if ppo_refresh < 1 or eval_max_cells < 1:
            raise ValueError(f"need ppo_refresh >= 1 and eval_max_cells >= 1, got {ppo_refresh}, {eval_max_cells}")
        self.method, self.latent = method, "none" if method == "lstm" else latent
        self.disjoint = disjoint and self.latent == "predicted"
        self.baseline, self.entropy_weight = baseline, float(entropy_weight)
        self.normalize_advantage, self.norm_decay = normalize_advantage, float(norm_decay)
        self.ppo_clip, self.ppo_refresh, self.eval_max_cells = float(ppo_clip), int(ppo_refresh), int(eval_max_cells)
        self.structure, self.estimator = None, None
        self.embedding = self.parser_embedding = self.encoder = self.scorer = None
        self.composer = self.parser = self.classifier = self.behaviour = self.moving_average = None

        if method == "lstm":
            self.lstm = LSTMClassifier(vocab_size, word_dim, hidden, num_classes, dropout)
            return
        self.embedding = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.classifier = _mlp(hidden, mlp_hidden, num_classes, dropout)
        predicted = self.latent == "predicted"
        if self.disjoint:
            self.parser_embedding = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        if method == "chart":
            self.composer = ChartTreeLSTM(word_dim, hidden, checkpoint=checkpoint)
            if predicted:
                if not isinstance(structure, BinaryTree):
                    raise ValueError(f"task.method=chart needs structure=binary_tree, got {type(structure).__name__}")
                if estimator is None:
                    raise ValueError("task.method=chart needs an estimator")
                self.structure, self.estimator = structure, estimator
                self.encoder = BiLSTMEncoder(word_dim, scorer_hidden)
                self.scorer = SpanScorer(scorer_hidden, span_hidden)
            return
        mode = {"gumbel_tree": "gumbel", "reinforce": "sample", "ppo": "sample"}[method]
        self.parser = MergeParser(word_dim, hidden, mode=mode, tau=tau)
        if self.disjoint:
            self.composer = MergeParser(word_dim, hidden, mode="given")
        if predicted and method in ("reinforce", "ppo"):
            if baseline == "moving_average":
                self.moving_average = MovingAverageBaseline(decay)
            if normalize_advantage:
                self.register_buffer("advantage_var", torch.tensor(1.0))
        if predicted and method == "ppo":
            own = self.parser_embedding if self.parser_embedding is not None else self.embedding
            policy = nn.ModuleDict({"embedding": own, "parser": self.parser})
            self.behaviour = copy.deepcopy(policy).requires_grad_(False)
            self.register_buffer("ppo_steps", torch.tensor(0, dtype=torch.long))

    @classmethod
    def from_config(cls, cfg, dims: dict[str, int], extras: dict | None = None) -> ListOps:
        """Reads ``task`` and ``latent``; for ``chart`` also ``structure`` and ``estimator`` (``dataset=listops``)."""
        if "vocab_size" not in dims or "num_classes" not in dims:
            raise ValueError("task=listops needs the ListOps dataset (dataset=listops)")
        t = cfg.task
        method, latent = option_name(t.method), option_name(cfg.latent)
        chart = method == "chart" and latent == "predicted"
        return cls(
            method=method,
            vocab_size=dims["vocab_size"],
            num_classes=dims["num_classes"],
            latent=latent,
            structure=instantiate(cfg.structure) if chart else None,
            estimator=instantiate(cfg.estimator) if chart else None,
            word_dim=t.word_dim,
            hidden=t.hidden,
            mlp_hidden=t.mlp_hidden,
            dropout=t.dropout,
            scorer_hidden=t.scorer_hidden,
            span_hidden=t.span_hidden,
            checkpoint=t.checkpoint,
            disjoint=t.disjoint,
            tau=t.tau,
            baseline=option_name(t.baseline),
            decay=t.decay,
            entropy_weight=t.entropy_weight,
            normalize_advantage=t.normalize_advantage,
            norm_decay=t.norm_decay,
            ppo_clip=t.ppo_clip,
            ppo_refresh=t.ppo_refresh,
            eval_max_cells=t.eval_max_cells,
        )

    # ---------------------------------------------------------------------------------------------- parameters

    def _policy_modules(self) -> list[nn.Module]:
        """The modules only the parser uses (none when the parser also composes)."""
        if self.method == "chart":
            return [m for m in (self.parser_embedding, self.encoder, self.scorer) if m is not None]
        if self.disjoint:
            return [self.parser_embedding, self.parser]
        return []

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """``default``: the composer, classifier (and, when shared, the parser); ``policy``: the parser's own
        parameters, for ``optim_groups.policy`` (Havrylov et al. trained the parser with a 10× smaller learning
        rate). The PPO behaviour copy is never optimised."""
        policy = [p for m in self._policy_modules() for p in m.parameters()]
        frozen = {id(p) for p in self.behaviour.parameters()} if self.behaviour is not None else set()
        taken = {id(p) for p in policy} | frozen
        groups = {"default": [p for p in self.parameters() if id(p) not in taken]}
        if policy:
            groups["policy"] = policy
        return groups

    # --------------------------------------------------------------------------------------------------- trees

    def span_scores(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``chart``: span scores ``[B, n, n]`` of ids ``[B, n]`` (what the structure sees)."""
        emb = self.parser_embedding if self.parser_embedding is not None else self.embedding
        return self.scorer(self.encoder(emb(ids), lengths), lengths)

    @torch.no_grad()
    def trees(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The MAP (chart) or greedy (merge) trees ``[B, n, n]`` of a batch, in evaluation mode (for figures)."""
        if self.method == "lstm":
            raise ValueError("the LSTM baseline has no tree")
        was_training = self.training
        self.eval()
        try:
            return self(batch).tree
        finally:
            self.train(was_training)

    # ------------------------------------------------------------------------------------------------- forward

    def forward(self, batch: dict[str, torch.Tensor]) -> ListOpsOutput:
        ids, lengths = _trim(batch)
        y = batch["y"]
        if self.method == "lstm":
            logits = self.lstm(ids, lengths)
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None)
        emb = self.embedding(ids)
        if self.method == "chart":
            return self._chart(batch, ids, lengths, emb, y)
        return self._merge(batch, ids, lengths, emb, y)

    def _chart(self, batch, ids, lengths, emb, y) -> ListOpsOutput:
        if self.latent == "gold":
            tree = _gold(batch, ids.shape[1], emb)
            logits = self.classifier(self.composer(emb, lengths, tree))
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None if self.training else tree)
        scores = self.span_scores(ids, lengths)
        emb_d = emb.detach()

        def downstream(mu):
            return F.cross_entropy(self.classifier(self.composer(emb_d, lengths, mu)), y, reduction="none")

        z = self.estimator(scores, self.structure, lengths, downstream)
        tree = None
        if not self.training:
            map_out = not self.estimator.relaxed or self.estimator.eval_latent == "map"  # z is already MAP
            tree = z if map_out else self.structure.map(scores.detach(), lengths)
        logits = self.classifier(self.composer(emb, lengths, z))
        return ListOpsOutput(logits, F.cross_entropy(logits, y), tree)

    def _compose(self, emb, lengths, parse: Parse) -> torch.Tensor:
        """The root state along ``parse``'s merges: the parser's own, or the separate composer's replay."""
        if self.composer is None:
            return parse.h
        return self.composer(emb, lengths, mode="given", actions=parse.actions).h

    def _merge(self, batch, ids, lengths, emb, y) -> ListOpsOutput:
        composer = self.composer if self.composer is not None else self.parser
        if self.latent == "gold":
            tree = _gold(batch, ids.shape[1], emb)
            logits = self.classifier(composer(emb, lengths, mode="given", tree=tree).h)
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None if self.training else tree)
        pemb = self.parser_embedding(ids) if self.parser_embedding is not None else emb
        if not self.training or self.method == "gumbel_tree":
            parse = self.parser(pemb, lengths)  # gumbel while training; argmax in eval mode
            logits = self.classifier(self._compose(emb, lengths, parse))
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None if self.training else parse.z)
        if self.method == "reinforce":
            parse = self.parser(pemb, lengths, mode="sample")
            old_log_probs = None
        else:
            self._maybe_refresh()
            with torch.no_grad():
                old = self.behaviour["parser"](self.behaviour["embedding"](ids), lengths, mode="sample")
            parse = self.parser(pemb, lengths, mode="given", actions=old.actions)  # π_θ on π_old's merges
            old_log_probs = old.log_probs
        logits = self.classifier(self._compose(emb, lengths, parse))
        ce = F.cross_entropy(logits, y, reduction="none")
        advantage = self._advantage(-ce.detach(), ids, lengths, emb, pemb, y)
        if old_log_probs is None:
            surrogate = reinforce_loss(parse.log_probs, parse.mask, advantage, None, parse.entropy,
                                       self.entropy_weight)
        else:
            surrogate = ppo_loss(parse.log_probs, old_log_probs, parse.mask, advantage, self.ppo_clip)
            if self.entropy_weight:
                surrogate = surrogate - self.entropy_weight * parse.entropy.masked_fill(~parse.mask, 0).sum(-1).mean()
        return ListOpsOutput(logits, ce.mean() + surrogate, None)

    def _maybe_refresh(self) -> None:
        if int(self.ppo_steps) % self.ppo_refresh == 0:
            own = self.parser_embedding if self.parser_embedding is not None else self.embedding
            self.behaviour["embedding"].load_state_dict(own.state_dict())
            self.behaviour["parser"].load_state_dict(self.parser.state_dict())
        self.ppo_steps += 1

    @torch.no_grad()
    def _advantage(self, reward, ids, lengths, emb, pemb, y) -> torch.Tensor:
        """A = R − b (detached), optionally divided by max(1, running std of A) (Havrylov et al.'s normalisation)."""
        if self.baseline == "moving_average":
            advantage = reward - self.moving_average(reward)
        elif self.baseline == "self_critical":
            was_training = self.training
            self.eval()  # the greedy parse, dropout off
            try:
                greedy = self.parser(pemb, lengths, mode="argmax")
                logits = self.classifier(self._compose(emb, lengths, greedy))
            finally:
                self.train(was_training)
            advantage = reward + F.cross_entropy(logits, y, reduction="none")
        else:
            advantage = reward
        if self.normalize_advantage:
            var = advantage.var(unbiased=False).to(self.advantage_var)
            self.advantage_var.mul_(self.norm_decay).add_((1 - self.norm_decay) * var)
            advantage = advantage / self.advantage_var.sqrt().clamp_min(1.0).to(advantage)
        return advantage

    # ------------------------------------------------------------------------------------------------ evaluate

    def _eval_batches(self, data: dict[str, torch.Tensor], batch_size: int | None) -> Iterator[dict]:
        """The split sorted by length, in batches of ≤ ``batch_size`` examples and ≤ ``eval_max_cells`` B·n²."""
        lengths = data["lengths"].detach().cpu().long()
        order = lengths.argsort(stable=True)
        cap = batch_size or len(order)
        start = 0
        sorted_lengths = lengths[order].tolist()
        while start < len(order):
            end = start + 1
            while end < len(order) and end - start < cap and (end - start + 1) * sorted_lengths[end] ** 2 <= (
                self.eval_max_cells
            ):
                end += 1
            idx = order[start:end].to(data["y"].device)
            yield {k: v[idx] for k, v in data.items()}
            start = end

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        was_training = self.training
        self.eval()
        correct, loss, count = 0.0, 0.0, 0
        sums: dict[str, float] = {}
        try:
            for batch in self._eval_batches(data, batch_size):
                out = self(batch)
                y = batch["y"]
                correct += float((out.logits.argmax(-1) == y).sum())
                loss += float(F.cross_entropy(out.logits, y, reduction="sum"))
                count += len(y)
                if out.tree is not None:
                    lengths = batch["lengths"].long()
                    gold = _gold(batch, out.tree.shape[-1], out.tree)
                    for key, values in tree_scores(out.tree, gold, lengths).items():
                        sums[key] = sums.get(key, 0.0) + float(values.sum())
        finally:
            self.train(was_training)
        metrics = {"loss": loss / count, "acc": 100 * correct / count}
        metrics.update({key: value / count for key, value in sums.items()})
        return metrics

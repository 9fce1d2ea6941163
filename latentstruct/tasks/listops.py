r"""ListOps (Nangia & Bowman 2018): the answer (0-9) of a nested list expression, learned through a latent binary
tree over its tokens, the learned trees scored against the true ones (seed 000, Parts II-III).

The model is ``task.model``: ``merge_parser`` (Choi et al.'s easy-first merges, made by ``task.estimator``:
``st_gumbel`` the Gumbel Tree-LSTM, ``sfe`` REINFORCE, ``ppo`` Havrylov et al.), ``chart_parser`` (span scores of
``task.scorer`` → ``task.estimator`` ∘ ``task.structure`` (a binary tree) → ``task.composer``, a chart Tree-LSTM that
reads any z, a tree or marginals) or ``lstm`` (the sequence baseline, ``latent=none``); each composes the word
vectors into one vector for an MLP → 10 logits. The batch: leaf ids ``x`` ``[B, n]``, ``lengths`` ``[B]``, answers
``y`` ``[B]`` and the true trees' spans.

Metrics: ``acc`` (×100), ``loss``; tree models also ``tree_f1`` (unlabelled F1 ×100 of the MAP / greedy tree),
``f1_left``, ``f1_right`` and ``depth`` (:func:`tree_scores`). Evaluation is bucketed by length and by
``task.eval_max_cells``. ``latent=gold`` composes along the true trees.

    python -m latentstruct.train +experiment=listops_gumbel_tree

The models in full, PPO within the one-step Task interface (a behaviour policy refreshed every
``task.estimator.refresh`` steps) and the evaluation conventions: docs/tasks.md#listops.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.listops import spans_to_trees, tree_scores
from latentstruct.estimators.base import Estimator
from latentstruct.models.composition import ChartTreeLSTM, SequenceLSTM, classifier_mlp
from latentstruct.models.tree_parsers import MergeParser, Parse, SpanScorer
from latentstruct.ranges import AtLeast, Part, Probability
from latentstruct.structures import BinaryTree
from latentstruct.tasks.base import Task

__all__ = ["ListOps", "ListOpsOutput", "SpanScorer", "tree_scores"]

#: the most B·n² chart cells of one batch that ``report_record`` parses (the official test set reaches n = 939)
CELLS = 1 << 22


@dataclass
class ListOpsOutput:
    logits: torch.Tensor  # [batch, 10]
    loss: torch.Tensor  # scalar: the training loss (CE + the parser's surrogate) in training, the mean CE otherwise
    tree: torch.Tensor | None  # [batch, n, n] MAP / greedy tree at evaluation (BinaryTree layout); None otherwise


# ----------------------------------------------------------------------------------------------------- helpers


def _trim(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = batch["lengths"].long()
    return batch["x"][:, : int(lengths.max())].long(), lengths


def _gold(batch: dict[str, torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
    return spans_to_trees(batch["spans"].cpu(), n, like.dtype).to(like.device)


# -------------------------------------------------------------------------------------------------------- task


def _target(part: Any) -> type | None:
    """The class a part builds: a partial's function, or the instance's class (None for a null part)."""
    return None if part is None else getattr(part, "func", type(part))


class ListOps(Task):
    """ListOps through a latent binary tree, or the LSTM baseline (docs/tasks.md#listops: models, PPO, metrics).

    Batches hold ``x`` (ids ``[B, L]``), ``lengths``, ``y`` and ``spans`` (the true trees, :func:`spans_to_trees`).
    ``kind`` says which model it is (the setting ``model``): ``sequence`` (the LSTM), ``chart`` or ``merge``.
    """

    #: the setting ``model`` -> ``kind``
    KINDS = {"merge_parser": "merge", "chart_parser": "chart", "lstm": "sequence"}

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict,
        scorer: Annotated[Any, Part(MergeParser, SpanScorer)],
        structure: Annotated[Any, Part(BinaryTree)],
        estimator: Annotated[Any, Part(Estimator)],
        composer: Annotated[Any, Part(ChartTreeLSTM, SequenceLSTM)],
        latent: Literal["predicted", "gold", "none"] = "predicted",
        model: Literal["merge_parser", "chart_parser", "lstm"] = "merge_parser",
        word_dim: Annotated[int, AtLeast(1)] = 128,
        hidden: Annotated[int, AtLeast(1)] = 128,
        mlp_hidden: Annotated[int, AtLeast(1)] = 128,
        dropout: Annotated[float, Probability] = 0.0,
        scorer_hidden: Annotated[int, AtLeast(2)] = 128,
        span_hidden: Annotated[int, AtLeast(1)] = 128,
        disjoint: bool = False,
        eval_max_cells: Annotated[int, AtLeast(1)] = 2**20,
    ) -> ListOps:
        """The model ``model`` names (docs/tasks.md#listops), from the parts it takes, sized by these settings and the
        data (``vocab_size``, ``num_classes``); the sizes are the task's so that one preset sets them whatever the
        model.

        Args:
            model: merge_parser (scorer=merge_parser, no structure or composer: the Gumbel Tree-LSTM, REINFORCE,
                PPO; latent=gold: its Tree-LSTM along the true trees), chart_parser (scorer=span_scorer,
                structure=binary_tree, composer=chart_tree_lstm, any estimator) or lstm (the sequence baseline:
                composer=sequence_lstm, latent=none, no scorer, structure or estimator)
            word_dim: word vectors (Havrylov et al. 2019: 128)
            hidden: LSTM / Tree-LSTM / merge-parser states (Havrylov et al. 2019: 128)
            mlp_hidden: hidden layer of the classifier MLP
            dropout: dropout before the classifier MLP's layers
            scorer_hidden: chart: the span scorer's BiLSTM, both directions together
            span_hidden: chart: the span MLP's tanh layer (memory [B, n, n, span_hidden])
            disjoint: the parser gets its own embeddings and (merge parser) a separate composer Tree-LSTM, as
                Havrylov et al. (2019); not with a pathwise estimator over the merges (st_gumbel)
            eval_max_cells: evaluation batches (sorted by length) hold at most this many examples × n²
        """
        if "vocab_size" not in dims or "num_classes" not in dims:
            raise ValueError("task=listops needs the ListOps dataset (dataset=listops)")
        vocab_size, num_classes = dims["vocab_size"], dims["num_classes"]
        kind = cls.KINDS[model]
        if (latent == "none") != (kind == "sequence"):
            raise ValueError(f"latent=none is the sequence baseline, task.model=lstm, and the other way round "
                             f"(got latent={latent}, task.model={model})")
        composers = {"sequence": SequenceLSTM, "chart": ChartTreeLSTM, "merge": None}
        if _target(composer) is not composers[kind]:
            wanted = {"sequence": "composer=sequence_lstm", "chart": "composer=chart_tree_lstm",
                      "merge": "no composer (composer=null: the parser composes)"}[kind]
            got = _target(composer).__name__ if composer is not None else None
            raise ValueError(f"task.model={model} takes {wanted}, got {got}")
        predicted = latent == "predicted"
        if kind == "sequence" and any(p is not None for p in (scorer, structure, estimator)):
            raise ValueError("the sequence baseline reads no tree: set scorer, structure and estimator to null")
        if kind == "merge":
            if not issubclass(_target(scorer) or type(None), MergeParser):
                raise ValueError(f"task.model=merge_parser takes scorer=merge_parser (the chart parser: "
                                 f"task.model=chart_parser), got {_target(scorer)}")
            if structure is not None:
                raise ValueError("the merge parser makes its trees merge by merge: structure=null (a binary_tree "
                                 "structure is the chart parser's: scorer=span_scorer composer=chart_tree_lstm)")
            if predicted and estimator is None:
                raise ValueError("the merge parser needs an estimator for its merges (st_gumbel, sfe, ppo)")
            if predicted and disjoint and not estimator.policy_gradient:
                raise ValueError("task.disjoint=true is for the score-function estimators (sfe, ppo) and the chart: a "
                                 "pathwise estimator's gradient reaches its merge parser only through its composition")
        if kind == "chart" and predicted:
            if not isinstance(structure, BinaryTree):
                raise ValueError(f"the chart parser needs structure=binary_tree, got {type(structure).__name__}")
            if estimator is None or scorer is None:
                raise ValueError("the chart parser needs a scorer (span_scorer) and an estimator")
        disjoint = disjoint and predicted
        # Built in this order so that a seed gives the same initial weights as every earlier version.
        embedding = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        if kind == "sequence":
            composer = composer(input_dim=word_dim, dim=hidden)
            return cls(embedding, classifier_mlp(hidden, mlp_hidden, num_classes, dropout), composer=composer,
                       latent=latent, eval_max_cells=eval_max_cells)
        classifier = classifier_mlp(hidden, mlp_hidden, num_classes, dropout)
        parser_embedding = nn.Embedding(vocab_size, word_dim, padding_idx=0) if disjoint else None
        parser = None
        if kind == "chart":
            composer = composer(input_dim=word_dim, dim=hidden)
            scorer = scorer(input_dim=word_dim, lstm_dim=scorer_hidden, hidden=span_hidden) if predicted else None
        else:
            parser, scorer = scorer(input_dim=word_dim, dim=hidden), None
            composer = _target(parser)(input_dim=word_dim, dim=hidden) if disjoint else None
        return cls(embedding, classifier, composer=composer, latent=latent, parser_embedding=parser_embedding,
                   scorer=scorer, structure=structure if predicted else None,
                   estimator=estimator if predicted else None, parser=parser, eval_max_cells=eval_max_cells)

    def __init__(
        self,
        embedding: nn.Embedding,
        classifier: nn.Module,
        composer: nn.Module | None = None,
        latent: str = "predicted",
        parser_embedding: nn.Embedding | None = None,
        scorer: nn.Module | None = None,
        structure: BinaryTree | None = None,
        estimator: nn.Module | None = None,
        parser: MergeParser | None = None,
        eval_max_cells: int = 2**20,
    ):
        """Built modules (see :meth:`build`): ``embedding`` → (``parser_embedding`` →) ``scorer`` → [``estimator`` ∘
        ``structure``] (chart), or the merge ``parser`` with its ``estimator``; ``composer`` (the chart's or sequence
        Tree-LSTM / LSTM, or the merge parser's separate replay; None: the parser composes) → ``classifier``."""
        super().__init__()
        if latent not in ("predicted", "gold", "none"):
            raise ValueError(f"latent must be predicted, gold or none, got {latent!r}")
        if eval_max_cells < 1:
            raise ValueError(f"need eval_max_cells >= 1, got {eval_max_cells}")
        self.kind = "merge" if parser is not None else "chart" if getattr(composer, "uses_tree", False) else "sequence"
        self.latent, self.eval_max_cells = latent, int(eval_max_cells)
        self.embedding, self.classifier, self.composer = embedding, classifier, composer
        self.parser_embedding, self.scorer, self.parser = parser_embedding, scorer, parser
        self.structure, self.estimator = structure, estimator
        self.disjoint = parser_embedding is not None
        self.behaviour = None
        if estimator is not None and estimator.behaviour_refresh is not None and parser is not None:
            own = parser_embedding if parser_embedding is not None else embedding
            policy = nn.ModuleDict({"embedding": own, "parser": parser})
            self.behaviour = copy.deepcopy(policy).requires_grad_(False)
            self.register_buffer("ppo_steps", torch.tensor(0, dtype=torch.long))

    # ---------------------------------------------------------------------------------------------- parameters

    def _policy_modules(self) -> list[nn.Module]:
        """The modules only the parser uses (none when the parser also composes)."""
        if self.kind == "chart":
            return [m for m in (self.parser_embedding, self.scorer) if m is not None]
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
        return self.scorer(emb(ids), lengths)

    @torch.no_grad()
    def trees(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The MAP (chart) or greedy (merge) trees ``[B, n, n]`` of a batch, in evaluation mode (for figures)."""
        if self.kind == "sequence":
            raise ValueError("the LSTM baseline has no tree")
        was_training = self.training
        self.eval()
        try:
            return self(batch).tree
        finally:
            self.train(was_training)

    def report_record(self, test: dict[str, torch.Tensor], extras: dict) -> dict | None:
        """The tree of every ``test`` example (``report.listops``: the self-F1 across seeds, the figure) as its
        constituents (i, j), and its length, in the split's order; parsed in batches of similar lengths, at most 256
        examples and 2²² B·n² chart cells each."""
        if self.kind == "sequence":
            return None
        lengths = test["lengths"]
        order, spans, start = lengths.argsort(stable=True), {}, 0
        while start < len(order):
            end = start + 1
            while end < len(order) and end - start < 256 and (end + 1 - start) * int(lengths[order[end]]) ** 2 <= CELLS:
                end += 1
            index = order[start:end]
            batch = {k: v[index] for k, v in test.items()}
            for i, z, n in zip(index.tolist(), self.trees(batch).cpu(), batch["lengths"].tolist(), strict=True):
                spans[i] = torch.triu(z[:n, :n] != 0, diagonal=1).nonzero().tolist()
            start = end
        return {"trees": "binary", "split": "test", "lengths": lengths.tolist(),
                "spans": [spans[i] for i in range(len(order))]}

    # ------------------------------------------------------------------------------------------------- forward

    def forward(self, batch: dict[str, torch.Tensor]) -> ListOpsOutput:
        ids, lengths = _trim(batch)
        y = batch["y"]
        emb = self.embedding(ids)
        if self.kind == "sequence":
            logits = self.classifier(self.composer(emb, lengths))
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None)
        if self.kind == "chart":
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
        return self.composer(emb, lengths, mode="given", actions=parse.actions, scores=False).h

    def _merge(self, batch, ids, lengths, emb, y) -> ListOpsOutput:
        composer = self.composer if self.composer is not None else self.parser
        if self.latent == "gold":
            tree = _gold(batch, ids.shape[1], emb)
            logits = self.classifier(composer(emb, lengths, mode="given", tree=tree, scores=False).h)
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None if self.training else tree)
        pemb = self.parser_embedding(ids) if self.parser_embedding is not None else emb
        if not self.training or not self.estimator.policy_gradient:
            # a pathwise estimator at every merge while training (st_gumbel: the Gumbel Tree-LSTM); greedy in eval
            parse = self.parser(pemb, lengths, mode="estimate", estimator=self.estimator)
            logits = self.classifier(self._compose(emb, lengths, parse))
            return ListOpsOutput(logits, F.cross_entropy(logits, y), None if self.training else parse.z)
        old_log_probs = None
        if self.behaviour is None:  # REINFORCE: the current policy samples
            parse = self.parser(pemb, lengths, mode="sample")
        else:  # PPO: the behaviour policy samples, the current one re-scores its merges
            self._maybe_refresh()
            with torch.no_grad():
                old = self.behaviour["parser"](self.behaviour["embedding"](ids), lengths, mode="sample")
            parse = self.parser(pemb, lengths, mode="given", actions=old.actions)  # π_θ on π_old's merges
            old_log_probs = old.log_probs
        logits = self.classifier(self._compose(emb, lengths, parse))
        ce = F.cross_entropy(logits, y, reduction="none")

        def greedy() -> torch.Tensor:  # the self-critical baseline: the greedy parse's loss, dropout off
            was_training = self.training
            self.eval()
            try:
                parse = self.parser(pemb, lengths, mode="argmax")
                return F.cross_entropy(self.classifier(self._compose(emb, lengths, parse)), y, reduction="none")
            finally:
                self.train(was_training)

        surrogate = self.estimator.policy_loss(parse.log_probs, parse.mask, ce, parse.entropy, greedy, old_log_probs)
        return ListOpsOutput(logits, ce.mean() + surrogate, None)

    def _maybe_refresh(self) -> None:
        if int(self.ppo_steps) % self.estimator.behaviour_refresh == 0:
            own = self.parser_embedding if self.parser_embedding is not None else self.embedding
            self.behaviour["embedding"].load_state_dict(own.state_dict())
            self.behaviour["parser"].load_state_dict(self.parser.state_dict())
        self.ppo_steps += 1

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

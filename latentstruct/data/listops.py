"""ListOps (Nangia & Bowman, 2018): nested list operations on digits, with gold binary trees, a generator and splits.

* :func:`read_listops` (``label<TAB>expression`` per line), :func:`parse_expression`, :func:`evaluate` (MIN, MAX,
  MED = truncated median, SM = sum mod 10), :func:`serialize` (the left-branching bracketing of the official files).
* :func:`leaves` (the model's input: operators, digits and ``]``), :func:`gold_tree` (0/1 ``[n, n]`` in the layout of
  :class:`latentstruct.structures.BinaryTree`), :func:`tree_f1` (unlabelled bracket F1 over the non-trivial
  constituents), :func:`tree_depth`, :func:`spans_to_trees`.
* :func:`generate`: unique random expressions (leaf probability 0.75 by default), deterministic in the seed.
* :func:`listops_dataset`: test = the official ``test_d20s.tsv``; train + valid generated, excluding the test
  expressions, train capped at 130 leaves; vocabulary :data:`LISTOPS_VOCAB` (``<pad>`` = 0).

Example::

    >>> tokens = "( ( ( [SM 6 ) 5 ) ] )".split()
    >>> evaluate(tokens), leaves(tokens)
    (1, ['[SM', '6', '5', ']'])

The format, the trees, the generator's recipe and why 0.75, the splits: docs/data.md#listops.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.files import first_file, read_lines
from latentstruct.data.text import pad_batch
from latentstruct.ranges import AtLeast, NonNegative

__all__ = [
    "tree_scores",
    "LISTOPS_VOCAB",
    "OPERATORS",
    "check_labels",
    "evaluate",
    "generate",
    "gold_tree",
    "leaves",
    "left_branching",
    "listops_dataset",
    "parse_expression",
    "read_listops",
    "right_branching",
    "serialize",
    "spans_to_trees",
    "tree_depth",
    "tree_f1",
    "tree_spans",
]

OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
_CLOSE = "]"
_DIGITS = tuple(str(d) for d in range(10))

#: the fixed vocabulary: ``<pad>`` = 0, the operators, ``]``, the digits 0-9
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>", *OPERATORS, _CLOSE, *_DIGITS)

#: an expression: a digit, or ``(operator token, [arguments])``
Expr = int | tuple[str, list["Expr"]]


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(statistics.median(args))
    return sum(args) % 10


def _show(tokens: Sequence[str]) -> str:
    text = " ".join(tokens)
    return text if len(text) <= 60 else text[:57] + "..."


# --- evaluation and parsing ----------------------------------------------------------------------------------------


def parse_expression(tokens: Sequence[str]) -> Expr:
    """The expression tree of ``tokens`` (brackets ignored): a digit, or ``(op, [args])``. Raises ValueError on an
    unknown token, a ``]`` without operator, an operator without arguments or without ``]``, or not exactly one
    top-level expression."""
    stack: list[tuple[str, list[Expr]]] = []
    top: list[Expr] = []
    for tok in tokens:
        if tok in ("(", ")"):
            continue
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == _CLOSE:
            if not stack:
                raise ValueError(f"']' without an open operator in {_show(tokens)!r}")
            node = stack.pop()
            if not node[1]:
                raise ValueError(f"operator {node[0]} without arguments in {_show(tokens)!r}")
            (stack[-1][1] if stack else top).append(node)
        elif tok in _DIGITS:
            (stack[-1][1] if stack else top).append(int(tok))
        else:
            raise ValueError(f"unknown token {tok!r} in {_show(tokens)!r}")
    if stack:
        raise ValueError(f"operator {stack[-1][0]} not closed by ']' in {_show(tokens)!r}")
    if len(top) != 1:
        raise ValueError(f"expected exactly one expression, found {len(top)} in {_show(tokens)!r}")
    return top[0]


def evaluate(expr_tokens: Sequence[str]) -> int:
    """The value (0-9) of a ListOps expression given as tokens (docs/data.md#listops); ``(`` and ``)`` are ignored.
    Raises ValueError on malformed input (see :func:`parse_expression`)."""
    return _value(parse_expression(expr_tokens))


def _value(expr: Expr) -> int:
    if isinstance(expr, int):
        return expr
    op, args = expr
    return _apply(op, [_value(a) for a in args])


def serialize(expr: Expr) -> list[str]:
    """The tokens of ``expr`` in the standard left-branching bracketing ``( ( [OP a1 ) a2 ) ... ] )``."""
    out: list[str] = []
    _serialize_into(expr, out)
    return out


def _serialize_into(expr: Expr, out: list[str]) -> None:
    if isinstance(expr, int):
        out.append(str(expr))
        return
    op, args = expr
    out.extend("(" * (len(args) + 1))
    out.append(op)
    for arg in args:
        _serialize_into(arg, out)
        out.append(")")
    out.extend((_CLOSE, ")"))


# --- files ---------------------------------------------------------------------------------------------------------


def read_listops(path: str | Path) -> list[tuple[list[str], int]]:
    """``(tokens, label)`` for every non-blank ``label<TAB>expression`` line of ``path`` (plain or compressed). The
    label must be an integer 0-9 and the expression well formed (:func:`parse_expression`), its brackets balanced
    (a line cut short loses closing brackets that :func:`parse_expression` ignores); errors name file:line."""
    examples = []
    for lineno, line in read_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{where}: expected 'label<TAB>expression', found {len(fields)} tab-separated fields")
        label, expr = fields[0].strip(), fields[1].split()
        if label not in _DIGITS:
            raise ValueError(f"{where}: label must be a digit 0-9, got {label!r}")
        try:
            parse_expression(expr)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if expr.count("(") != expr.count(")"):
            raise ValueError(f"{where}: unbalanced brackets ({expr.count('(')} '(' but {expr.count(')')} ')')")
        examples.append((expr, int(label)))
    return examples


def check_labels(examples: Iterable[tuple[Sequence[str], int]]) -> int:
    """The number of examples whose label differs from :func:`evaluate` of their tokens."""
    return sum(evaluate(tokens) != label for tokens, label in examples)


# --- trees ---------------------------------------------------------------------------------------------------------


def leaves(tokens: Sequence[str]) -> list[str]:
    """The tokens without ``(`` and ``)``: operators, digits and ``]`` (the model's input sequence)."""
    return [t for t in tokens if t != "(" and t != ")"]


def tree_spans(tokens: Sequence[str]) -> list[tuple[int, int]]:
    """The constituents ``(i, j)`` (i < j, leaf indices as in :func:`leaves`) of the binary tree encoded by the
    brackets, sorted. Raises ValueError unless the brackets are balanced, every group has exactly two children (a leaf
    or a group) and, for n ≥ 2 leaves, one group spans the whole sequence."""
    starts: list[int] = []  # leaf index where each open group starts
    children: list[int] = []  # children counted so far in each open group
    spans: list[tuple[int, int]] = []
    n = 0
    top = 0  # top-level items (leaves or groups)
    for tok in tokens:
        if tok == "(":
            starts.append(n)
            children.append(0)
        elif tok == ")":
            if not starts:
                raise ValueError(f"unbalanced ')' in {_show(tokens)!r}")
            start, count = starts.pop(), children.pop()
            if count != 2:
                raise ValueError(f"a bracket group with {count} children (not binary) in {_show(tokens)!r}")
            spans.append((start, n - 1))
            if children:
                children[-1] += 1
            else:
                top += 1
        else:
            n += 1
            if children:
                children[-1] += 1
            else:
                top += 1
    if starts:
        raise ValueError(f"unbalanced '(' in {_show(tokens)!r}")
    if n == 0:
        raise ValueError("empty expression")
    if top != 1:
        raise ValueError(f"{top} top-level items: the brackets do not form one tree in {_show(tokens)!r}")
    return sorted(spans)


def gold_tree(tokens: Sequence[str], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The binary tree encoded by the brackets as a 0/1 ``[n, n]`` matrix over the n = ``len(leaves(tokens))`` leaves
    (BinaryTree layout, docs/data.md#listops); ValueError unless it is a full binary tree (:func:`tree_spans`)."""
    spans = tree_spans(tokens)
    n = len(spans) + 1
    z = torch.zeros(n, n, dtype=dtype)
    if spans:
        ij = torch.tensor(spans)
        z[ij[:, 0], ij[:, 1]] = 1
    return z


def left_branching(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The left-branching tree ((((0 1) 2) 3) ...): constituents (0, j) for j = 1..n-1."""
    z = torch.zeros(n, n, dtype=dtype)
    z[0, 1:] = 1
    return z


def right_branching(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The right-branching tree (0 (1 (2 ...))): constituents (i, n-1) for i = 0..n-2."""
    z = torch.zeros(n, n, dtype=dtype)
    z[: n - 1, n - 1] = 1
    return z


def _constituents(z: torch.Tensor, n: int) -> set[tuple[int, int]]:
    upper = torch.triu(z[:n, :n] != 0, diagonal=1)
    return {(int(i), int(j)) for i, j in upper.nonzero().tolist()}


def tree_f1(pred: torch.Tensor, gold: torch.Tensor, length: int | None = None) -> float:
    """Unlabelled bracket F1 × 100 between two ``[n, n]`` trees over their first ``length`` leaves (default n).

    Convention: only constituents (i, j) with i < j count (single leaves never do), and the trivial whole-sentence span
    (0, length - 1) is excluded, since every tree has it (Williams et al., 2018; Nangia & Bowman, 2018). F1 is 100
    when both sets are empty (n ≤ 2) and 0 when exactly one is. Between two full binary trees precision, recall and
    F1 are equal (both have n - 2 non-trivial constituents)."""
    n = pred.shape[-1] if length is None else length
    trivial = {(0, n - 1)}
    p, g = _constituents(pred, n) - trivial, _constituents(gold, n) - trivial
    if not p and not g:
        return 100.0
    hit = len(p & g)
    if hit == 0:
        return 0.0
    precision, recall = hit / len(p), hit / len(g)
    return 100.0 * 2 * precision * recall / (precision + recall)


def tree_depth(z: torch.Tensor, length: int | None = None) -> int:
    """The depth of a binary tree ``[n, n]`` (first ``length`` leaves): the largest number of constituents on a
    root-to-leaf path, i.e. containing one leaf; 0 for a single leaf."""
    n = z.shape[-1] if length is None else length
    if n <= 1:
        return 0
    upper = torch.triu(z[:n, :n] != 0, diagonal=1).to(torch.int64)
    # cover[k] = #{(i, j): i ≤ k ≤ j} = Σ_{i ≤ k} Σ_{j ≥ k} upper[i, j]
    cum = upper.flip(1).cumsum(1).flip(1)  # cum[i, k] = Σ_{j ≥ k} upper[i, j]
    cover = cum.cumsum(0).diagonal()  # Σ_{i ≤ k} cum[i, k]
    return int(cover.max())


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


def spans_to_trees(spans: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild 0/1 trees ``[B, n, n]`` from ``spans`` ``[B, m, 2]`` (constituents (i, j), padding rows -1), as stored
    by :func:`listops_dataset`; spans reaching past ``n`` raise ValueError."""
    b = spans.shape[0]
    z = torch.zeros(b, n, n, dtype=dtype)
    spans = spans.to(torch.long)
    keep = spans[..., 0] >= 0
    batch = torch.arange(b).unsqueeze(1).expand(spans.shape[:2])[keep]
    i, j = spans[..., 0][keep], spans[..., 1][keep]
    if len(j) and int(j.max()) >= n:
        raise ValueError(f"a span ends at leaf {int(j.max())}, beyond n = {n}")
    z[batch, i, j] = 1
    return z


# --- generation ----------------------------------------------------------------------------------------------------


def _draw(rng: random.Random, depth: int, max_depth: int, leaf_prob: float, min_args: int, max_args: int) -> Expr:
    if depth >= max_depth or rng.random() < leaf_prob:
        return rng.randrange(10)
    op = OPERATORS[rng.randrange(len(OPERATORS))]
    k = rng.randint(min_args, max_args)
    return (op, [_draw(rng, depth + 1, max_depth, leaf_prob, min_args, max_args) for _ in range(k)])


def generate(
    n_examples: int,
    seed: int,
    max_depth: int = 20,
    leaf_prob: float = 0.75,
    min_args: int = 2,
    max_args: int = 5,
    exclude: set[str] | frozenset[str] = frozenset(),
    max_failures: int = 100_000,
) -> list[tuple[list[str], int]]:
    """``n_examples`` unique random ListOps expressions ``(tokens, label)`` (docs/data.md#listops: the root is at
    depth 1, a node at depth ``max_depth`` is a leaf, ``leaf_prob`` is the probability of a leaf, the root included).
    None is in ``exclude`` (token strings ``' '.join(tokens)``). Raises RuntimeError after ``max_failures`` draws in a
    row that gave nothing new (e.g. asking for more than 10 expressions with ``max_depth=1``)."""
    if max_depth < 1 or not 1 <= min_args <= max_args or not 0.0 <= leaf_prob <= 1.0:
        raise ValueError(f"bad settings: max_depth={max_depth}, args {min_args}..{max_args}, leaf_prob={leaf_prob}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[list[str], int]] = []
    failures = 0
    while len(out) < n_examples:
        expr = _draw(rng, 1, max_depth, leaf_prob, min_args, max_args)
        tokens = serialize(expr)
        key = " ".join(tokens)
        if key in seen or key in exclude:
            failures += 1
            if failures >= max_failures:
                raise RuntimeError(f"no new expression in {max_failures} draws after {len(out)} of {n_examples}")
            continue
        failures = 0
        seen.add(key)
        out.append((tokens, _value(expr)))
    return out


# --- dataset for train.py ------------------------------------------------------------------------------------------


def _split_tensors(examples: list[tuple[list[str], int]]) -> dict[str, torch.Tensor]:
    stoi = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
    ids, lengths = pad_batch([[stoi[t] for t in leaves(toks)] for toks, _ in examples])
    width = max(ids.shape[1] - 1, 0)
    spans = torch.full((len(examples), width, 2), -1, dtype=torch.int16)
    per_example = [tree_spans(toks) for toks, _ in examples]
    flat = [ij for s in per_example for ij in s]
    if flat:
        counts = torch.tensor([len(s) for s in per_example])
        row = torch.repeat_interleave(torch.arange(len(examples)), counts)
        col = torch.arange(len(flat)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        spans[row, col] = torch.tensor(flat, dtype=torch.int16)
    y = torch.tensor([label for _, label in examples], dtype=torch.long)
    return {"x": ids, "lengths": lengths, "y": y, "spans": spans}


def listops_dataset(
    data_dir: str | Path,
    folder: str = "listops",
    n_train: Annotated[int, AtLeast(1)] = 90_000,
    n_valid: Annotated[int, NonNegative] = 1_000,
    seed: int = 42,
    max_train_tokens: Annotated[int, AtLeast(1)] = 130,
    subset: Annotated[int | None, NonNegative] = None,
    max_eval_tokens: Annotated[int | None, AtLeast(1)] = None,
) -> TensorSplits:
    """ListOps as :class:`~latentstruct.data.base.TensorSplits` (docs/data.md#listops). Each split ``{"x": int64 [N, L]
    ids padded with 0, "lengths": int64 [N], "y": int64 [N] labels 0-9, "spans": int16 [N, L - 1, 2]}`` (the gold
    constituents, padded with -1; :func:`spans_to_trees` rebuilds ``[B, L, L]`` trees). ``dims`` = ``vocab_size``
    (16), ``num_classes`` (10); ``extras`` = ``itos`` (:data:`LISTOPS_VOCAB`).

    Args:
        data_dir: root of the real datasets (holds <folder>/test_d20s.tsv[.gz], the official test set)
        folder: the ListOps folder, relative to data_dir
        n_train: generated training expressions before the length filter (Havrylov et al. 2019: 90k)
        n_valid: generated expressions held out for validation (issue #7: 1000)
        seed: generator and split seed (issue #7: 42)
        max_train_tokens: drop training expressions with more leaves (Havrylov et al. 2019: 130)
        subset: keep the first this many training expressions (smoke runs); null = all
        max_eval_tokens: keep only valid / test expressions with at most this many leaves (reduced runs; null = all,
            the official protocol)
    """
    root = Path(data_dir) / folder
    path = first_file([root / "test_d20s.tsv", root / "test_d20s.tsv.gz"])
    if path is None:
        raise FileNotFoundError(f"ListOps test file test_d20s.tsv[.gz] not found in {root}")
    test = read_listops(path)
    generated = generate(n_train + n_valid, seed, exclude={" ".join(toks) for toks, _ in test})
    order = list(range(len(generated)))
    random.Random(seed).shuffle(order)
    valid = [generated[i] for i in order[:n_valid]]
    train = [generated[i] for i in order[n_valid:]]
    train = [ex for ex in train if len(leaves(ex[0])) <= max_train_tokens]
    if subset is not None:
        train = train[:subset]
    if max_eval_tokens is not None:
        valid, test = ([ex for ex in part if len(leaves(ex[0])) <= max_eval_tokens] for part in (valid, test))
    splits = {name: _split_tensors(data) for name, data in (("train", train), ("valid", valid), ("test", test))}
    dims = {"vocab_size": len(LISTOPS_VOCAB), "num_classes": 10}
    return TensorSplits(splits, dims=dims, extras={"itos": list(LISTOPS_VOCAB)})

"""ListOps: evaluation, the official test file, gold trees and tree metrics, the generator, the dataset splits."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest
import torch

from latentstruct.data.listops import (
    LISTOPS_VOCAB,
    OPERATORS,
    check_labels,
    evaluate,
    generate,
    gold_tree,
    leaves,
    left_branching,
    listops_dataset,
    parse_expression,
    read_listops,
    right_branching,
    serialize,
    spans_to_trees,
    tree_depth,
    tree_f1,
    tree_spans,
)


def toks(text: str) -> list[str]:
    return text.split()


# --- evaluate ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, value",
    [
        ("7", 7),
        ("( ( ( ( ( [SM 6 ) 5 ) 9 ) 0 ) ] )", 0),
        ("( ( ( ( ( [MIN 6 ) 3 ) 5 ) 0 ) ] )", 0),
        ("[MAX 3 8 1 ]", 8),
        ("[MIN 3 8 1 ]", 1),
        ("[SM 9 9 9 ]", 7),
        ("[MED 1 2 ]", 1),
        ("[MED 3 4 5 6 ]", 4),
        ("[MED 9 1 5 ]", 5),
        ("[MED 2 7 ]", 4),
        ("[MAX 2 [MIN 4 7 ] ]", 4),
        ("[SM [MAX 1 9 ] [MED 3 4 5 6 ] 0 ]", 3),
        ("[MIN [MAX [SM 5 5 ] 2 ] [MED 8 8 ] ]", 2),
    ],
)
def test_evaluate(expr: str, value: int) -> None:
    assert evaluate(toks(expr)) == value
    assert evaluate(serialize(parse_expression(toks(expr)))) == value


@pytest.mark.parametrize(
    "expr",
    ["", "( )", "[SM ]", "[SM 1 2", "1 2 ]", "[MAX 1 ] 3", "1 2", "[FOO 1 ]", "[SM 12 ]", "]", "[MIN 1 x ]"],
)
def test_evaluate_malformed(expr: str) -> None:
    with pytest.raises(ValueError):
        evaluate(toks(expr))
    with pytest.raises(ValueError):
        parse_expression(toks(expr))


def test_read_listops_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.tsv"
    good.write_text("3\t[MAX 1 3 ]\n\n0\t( ( ( [SM 5 ) 5 ) ] )\n")
    assert read_listops(good) == [(toks("[MAX 1 3 ]"), 3), (toks("( ( ( [SM 5 ) 5 ) ] )"), 0)]
    assert check_labels(read_listops(good)) == 0  # SM 5 5 = 10 % 10 = 0
    assert check_labels([(toks("[MAX 1 3 ]"), 1), (toks("[SM 5 5 ]"), 0), (toks("[MIN 4 2 ]"), 4)]) == 2
    bad_label = tmp_path / "bad_label.tsv"
    bad_label.write_text("3\t[MAX 1 3 ]\n12\t[MAX 1 3 ]\n")
    with pytest.raises(ValueError, match="bad_label.tsv:2"):
        read_listops(bad_label)
    bad_expr = tmp_path / "bad_expr.tsv"
    bad_expr.write_text("\n3\t[MAX 1 3\n")
    with pytest.raises(ValueError, match="bad_expr.tsv:2"):
        read_listops(bad_expr)
    no_tab = tmp_path / "no_tab.tsv"
    no_tab.write_text("3 [MAX 1 3 ]\n")
    with pytest.raises(ValueError, match="no_tab.tsv:1"):
        read_listops(no_tab)


# --- the official test file ----------------------------------------------------------------------------------------


def _official_test_file(root: Path) -> Path:
    """``listops/test_d20s.tsv.gz``, or the uncompressed file, under the data root."""
    found = [p for p in (root / "listops" / "test_d20s.tsv.gz", root / "listops" / "test_d20s.tsv") if p.exists()]
    assert found, f"no test_d20s.tsv[.gz] in {root / 'listops'}"
    return found[0]


@pytest.mark.real_data("listops")
def test_official_test_file(data_root: Path) -> None:
    path = _official_test_file(data_root)
    examples = read_listops(path)
    assert len(examples) == 10_000
    assert check_labels(examples) == 0
    counts = Counter(label for _, label in examples)
    assert [counts[d] for d in range(10)] == [1127, 1038, 967, 978, 991, 969, 895, 930, 964, 1141]
    for tokens, _ in examples:
        assert serialize(parse_expression(tokens)) == tokens
        n = len(leaves(tokens))
        spans = tree_spans(tokens)  # raises unless every group is binary and one tree covers all leaves
        assert len(spans) == n - 1 == len(set(spans))
        assert all(0 <= i < j < n for i, j in spans)
        if n >= 2:
            assert (0, n - 1) in spans
    for tokens, _ in examples[:200]:
        z = gold_tree(tokens)
        n = len(leaves(tokens))
        assert z.shape == (n, n) and int(z.sum()) == n - 1
        assert n < 2 or z[0, n - 1] == 1


# --- trees ---------------------------------------------------------------------------------------------------------


def test_gold_tree_by_hand() -> None:
    tokens = toks("( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) ] )")
    assert leaves(tokens) == toks("[MAX 2 [MIN 4 7 ] ]")
    assert evaluate(tokens) == 4
    assert serialize(parse_expression(tokens)) == tokens
    expected = torch.zeros(7, 7)
    for i, j in [(0, 1), (2, 3), (2, 4), (2, 5), (0, 5), (0, 6)]:
        expected[i, j] = 1
    assert torch.equal(gold_tree(tokens), expected)
    assert tree_depth(expected) == 5  # leaf 3 ("4") lies in (2,3) (2,4) (2,5) (0,5) (0,6)
    # the flat form of a serialized one-operator expression is left-branching
    assert torch.equal(gold_tree(serialize(("[SM", [6, 5, 9, 0]))), left_branching(6))
    assert torch.equal(gold_tree(["7"]), torch.zeros(1, 1))


@pytest.mark.parametrize(
    "expr",
    ["( 1 2 3 )", "( ( 1 2 ) )", "( 1 )", "( 1 2", "1 2 )", "( 1 2 ) 3", "( 1 2 ) ( 3 4 )", "( )", ""],
)
def test_gold_tree_rejects_non_binary(expr: str) -> None:
    with pytest.raises(ValueError):
        gold_tree(toks(expr))


def test_branching_shapes() -> None:
    left, right = left_branching(4), right_branching(4)
    assert left.nonzero().tolist() == [[0, 1], [0, 2], [0, 3]]
    assert right.nonzero().tolist() == [[0, 3], [1, 3], [2, 3]]
    for n in range(1, 8):
        for z in (left_branching(n), right_branching(n)):
            assert z.shape == (n, n) and int(z.sum()) == n - 1
            assert int(torch.tril(z).sum()) == 0
            assert tree_depth(z) == n - 1
    assert torch.equal(gold_tree(toks("( ( ( 0 1 ) 2 ) 3 )")), left)
    assert torch.equal(gold_tree(toks("( 0 ( 1 ( 2 3 ) ) )")), right)


def test_tree_f1() -> None:
    left, right = left_branching(4), right_branching(4)
    balanced = gold_tree(toks("( ( 0 1 ) ( 2 3 ) )"))
    assert tree_f1(left, left) == 100.0
    assert tree_f1(balanced, balanced) == 100.0
    # non-trivial spans: left {(0,1), (0,2)}, right {(1,3), (2,3)}, balanced {(0,1), (2,3)}
    assert tree_f1(left, right) == 0.0
    assert tree_f1(balanced, left) == pytest.approx(50.0)
    assert tree_f1(balanced, right) == pytest.approx(50.0)
    # n = 5: left {(0,1),(0,2),(0,3)} vs ((0 1 2)(3 4)) binarised as (((0 1) 2) (3 4)): {(0,1),(0,2),(3,4)}
    other = gold_tree(toks("( ( ( 0 1 ) 2 ) ( 3 4 ) )"))
    assert tree_f1(other, left_branching(5)) == pytest.approx(200 / 3)
    # precision ≠ recall: pred {(0,1)} vs gold {(0,1), (0,2)} on n = 4 → P = 1, R = 1/2, F1 = 2/3
    pred = torch.zeros(4, 4)
    pred[0, 1] = pred[0, 3] = 1
    assert tree_f1(pred, left) == pytest.approx(200 / 3)
    # empty-set conventions: n ≤ 2 has no non-trivial span → 100; one side empty → 0
    assert tree_f1(left_branching(2), right_branching(2)) == 100.0
    assert tree_f1(torch.zeros(1, 1), torch.zeros(1, 1)) == 100.0
    assert tree_f1(torch.zeros(4, 4), left) == 0.0
    assert tree_f1(left, torch.zeros(4, 4)) == 0.0
    # length: only the first `length` leaves of padded matrices count
    padded_l, padded_r = torch.zeros(6, 6), torch.zeros(6, 6)
    padded_l[:4, :4], padded_r[:4, :4] = left, balanced
    padded_r[4, 5] = 1  # padding, ignored
    assert tree_f1(padded_l, padded_r, length=4) == pytest.approx(50.0)


def test_tree_depth() -> None:
    assert tree_depth(torch.zeros(1, 1)) == 0
    assert tree_depth(left_branching(2)) == 1
    assert tree_depth(gold_tree(toks("( ( 0 1 ) ( 2 3 ) )"))) == 2
    assert tree_depth(gold_tree(toks("( ( ( 0 1 ) ( 2 3 ) ) ( ( 4 5 ) ( 6 7 ) ) )"))) == 3
    assert tree_depth(left_branching(9), length=3) == 2


def test_spans_to_trees() -> None:
    spans = torch.tensor([[[0, 1], [0, 2], [-1, -1]], [[0, 3], [1, 3], [2, 3]]], dtype=torch.int16)
    z = spans_to_trees(spans, 4)
    expected_0 = torch.zeros(4, 4)
    expected_0[:3, :3] = left_branching(3)
    assert torch.equal(z[0], expected_0)
    assert torch.equal(z[1], right_branching(4))
    with pytest.raises(ValueError):
        spans_to_trees(spans, 3)


# --- generation ----------------------------------------------------------------------------------------------------


def _arities_and_ops(tokens: list[str]) -> tuple[list[int], set[str], int]:
    arities, ops, stack, nesting = [], set(), [], 0
    for tok in leaves(tokens):
        if tok in OPERATORS:
            if stack:
                stack[-1] += 1
            stack.append(0)
            ops.add(tok)
            nesting = max(nesting, len(stack))
        elif tok == "]":
            arities.append(stack.pop())
        elif stack:
            stack[-1] += 1
    return arities, ops, nesting


def test_generate() -> None:
    data = generate(600, seed=3)
    assert data == generate(600, seed=3)
    assert data != generate(600, seed=4)
    keys = [" ".join(t) for t, _ in data]
    assert len(set(keys)) == 600
    all_ops: set[str] = set()
    for tokens, label in data:
        assert evaluate(tokens) == label
        assert serialize(parse_expression(tokens)) == tokens
        arities, ops, nesting = _arities_and_ops(tokens)
        all_ops |= ops
        assert all(2 <= a <= 5 for a in arities)
        assert nesting <= 19
        z = gold_tree(tokens)
        n = len(leaves(tokens))
        assert int(z.sum()) == n - 1 and (n < 2 or z[0, n - 1] == 1)
    assert all_ops == set(OPERATORS)
    assert set(label for _, label in data) == set(range(10))
    # exclude: the first half of one run is never produced by a run that excludes it
    excluded = set(keys[:300])
    other = generate(600, seed=3, exclude=excluded)
    assert not excluded & {" ".join(t) for t, _ in other}


def test_generate_depth_and_arity() -> None:
    flat = generate(300, seed=0, max_depth=2, leaf_prob=0.0)  # root an operator, its arguments forced leaves
    for tokens, _ in flat:
        expr = parse_expression(tokens)
        assert not isinstance(expr, int) and all(isinstance(a, int) for a in expr[1])
    bare = generate(10, seed=0, max_depth=1)  # the root itself is forced to be a leaf
    assert sorted(t for t, _ in bare) == [[str(d)] for d in range(10)]
    with pytest.raises(RuntimeError):
        generate(11, seed=0, max_depth=1, max_failures=500)
    capped = generate(200, seed=1, max_depth=4, leaf_prob=0.1, min_args=3, max_args=3)
    for tokens, _ in capped:
        arities, _, nesting = _arities_and_ops(tokens)
        assert nesting <= 3 and all(a == 3 for a in arities)
    assert max(_arities_and_ops(t)[2] for t, _ in capped) == 3


# --- dataset -------------------------------------------------------------------------------------------------------


def test_listops_dataset(tmp_path: Path) -> None:
    test_examples = generate(150, seed=99)
    folder = tmp_path / "listops"
    folder.mkdir()
    with gzip.open(folder / "test_d20s.tsv.gz", "wt") as f:
        for tokens, label in test_examples:
            f.write(f"{label}\t{' '.join(tokens)}\n")
    data = listops_dataset(tmp_path, n_train=400, n_valid=60, seed=5, max_train_tokens=25)
    assert data.dims == {"vocab_size": 16, "num_classes": 10}
    assert data.extras["itos"] == list(LISTOPS_VOCAB)
    assert LISTOPS_VOCAB[:6] == ("<pad>", "[MIN", "[MAX", "[MED", "[SM", "]")
    assert LISTOPS_VOCAB[6:] == tuple(str(d) for d in range(10))
    assert data.size("test") == 150 and data.size("valid") == 60
    assert 0 < data.size("train") <= 340
    raw = {"test": test_examples}
    test_keys = {" ".join(t) for t, _ in test_examples}
    for name, split in data.splits.items():
        x, lengths, y, spans = split["x"], split["lengths"], split["y"], split["spans"]
        n, width = x.shape
        assert x.dtype == lengths.dtype == y.dtype == torch.int64
        assert spans.dtype == torch.int16 and spans.shape == (n, max(width - 1, 0), 2)
        assert int(lengths.max()) == width
        positions = torch.arange(width)
        assert bool((x[positions >= lengths[:, None]] == 0).all())
        assert bool((x[positions < lengths[:, None]] > 0).all())
        assert bool(((y >= 0) & (y <= 9)).all())
        trees = spans_to_trees(spans, width)
        assert torch.equal(trees.sum((1, 2)), (lengths - 1).float())
        itos = LISTOPS_VOCAB
        for b in range(n):
            length = int(lengths[b])
            seq = [itos[i] for i in x[b, :length].tolist()]
            assert evaluate(seq) == int(y[b])
            if name in raw:
                tokens, label = raw[name][b]
                assert seq == leaves(tokens) and label == int(y[b])
                assert torch.equal(trees[b, :length, :length], gold_tree(tokens))
            # trees are valid (n - 1 constituents including the full span) and have no padding entries
            assert int(trees[b].sum()) == length - 1 and (length < 2 or trees[b, 0, length - 1] == 1)
            assert int(trees[b, length:].sum() + trees[b, :, length:].sum()) == 0
    assert int(data.splits["train"]["lengths"].max()) <= 25
    # the splits hold exactly the generated expressions, none in test
    generated = generate(460, seed=5, exclude=test_keys)
    by_leaves = {tuple(leaves(t)): (t, lab) for t, lab in generated}
    for name in ("train", "valid"):
        split = data.splits[name]
        for b in range(data.size(name)):
            seq = tuple(LISTOPS_VOCAB[i] for i in split["x"][b, : int(split["lengths"][b])].tolist())
            tokens, _ = by_leaves[seq]
            assert " ".join(tokens) not in test_keys
            assert torch.equal(spans_to_trees(split["spans"][b : b + 1], len(seq))[0], gold_tree(tokens))
    long_ones = sum(len(leaves(t)) > 25 for t, _ in generated)
    assert data.size("train") + data.size("valid") >= 460 - long_ones
    small = listops_dataset(tmp_path, n_train=400, n_valid=60, seed=5, max_train_tokens=25, subset=7)
    assert small.size("train") == 7
    assert torch.equal(small.splits["train"]["y"], data.splits["train"]["y"][:7])
    short = listops_dataset(tmp_path, n_train=400, n_valid=60, seed=5, max_train_tokens=25, max_eval_tokens=6)
    assert torch.equal(short.splits["train"]["y"], data.splits["train"]["y"])
    for name in ("valid", "test"):
        keep = data.splits[name]["lengths"] <= 6
        assert 0 < short.size(name) < data.size(name)
        assert torch.equal(short.splits[name]["y"], data.splits[name]["y"][keep])
    with pytest.raises(FileNotFoundError):
        listops_dataset(tmp_path / "nowhere")

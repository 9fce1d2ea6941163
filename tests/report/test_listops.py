"""latentstruct.report.listops: random trees, the reference-tree statistics, self-F1 across seeds written for the
tables, and the tree figure, on tiny generated ListOps runs."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from latentstruct.data.listops import listops_dataset, right_branching, tree_f1, tree_scores
from latentstruct.report import figures, tables
from latentstruct.report import listops as listops_report
from tests.helpers import final_model
from tests.tasks.test_listops import _run, short, write_listops  # noqa: F401  (short: the fixture used below)

pytestmark = pytest.mark.usefixtures("short")  # generated expressions stay short: fast runs


def _spans(z: torch.Tensor) -> frozenset:
    return frozenset(map(tuple, torch.triu(z != 0, diagonal=1).nonzero().tolist()))


def test_random_trees_are_binary_and_follow_uniform_adjacent_merges():
    lengths = torch.tensor([1, 2, 7, 5, 6] + [4] * 3000)
    z = listops_report.random_trees(lengths, 7, random.Random(0))
    for b, n in enumerate(lengths[:5].tolist()):
        spans = _spans(z[b])
        assert len(spans) == max(n - 1, 0) and all(j < n for _, j in spans)
        if n > 1:
            assert (0, n - 1) in spans
            for i, j in spans:
                listops_report._children(set(spans), i, j)  # every constituent splits into two children
    # 4 leaves: ((01)(23)) is reached by two merge orders (1/3), each of the other four trees by one (1/6)
    four = z[5:, :4, :4].flatten(1)
    counts = Counter(map(tuple, four.tolist()))
    balanced = torch.zeros(4, 4)
    balanced[0, 1] = balanced[2, 3] = balanced[0, 3] = 1
    assert len(counts) == 5 and z[5:, 4:].sum() == 0 and (four.sum(1) == 3).all()
    assert counts[tuple(balanced.flatten().tolist())] / 3000 == pytest.approx(1 / 3, abs=0.03)
    assert all(c / 3000 == pytest.approx(1 / 6, abs=0.03) for c in counts.values() if c != max(counts.values()))
    with pytest.raises(ValueError, match="not a binary tree"):
        listops_report._children({(0, 1)}, 0, 3)


def test_reference_trees_score_like_the_models(tmp_path):
    write_listops(tmp_path / "listops", n=30)
    test = listops_dataset(str(tmp_path), n_train=8, n_valid=4).splits["test"]
    stats = listops_report.reference_trees(test, seed=3)
    assert stats["true"]["tree_f1"] == 100.0
    gold = [listops_report.spans_to_trees(test["spans"][b : b + 1], int(test["lengths"][b]))[0]
            for b in range(len(test["y"]))]
    right = [tree_f1(right_branching(len(g)), g) for g in gold]
    assert stats["right"]["tree_f1"] == pytest.approx(sum(right) / len(right))
    assert stats["true"]["f1_right"] == pytest.approx(stats["right"]["tree_f1"])  # F1 is symmetric
    assert 0 < stats["random"]["self_f1"] < 100 and 0 < stats["random"]["depth"] < stats["left"]["depth"]
    md = listops_report._reference_markdown(stats, "generated", len(test["y"]), 3)
    assert "**100.0** · 100.0" in md and "30.1" in md


@pytest.mark.parametrize("seeds", [(1, 2)])
def test_self_f1_is_written_for_runs_with_other_seeds_and_read_by_the_tables(tmp_path, seeds):
    root = tmp_path / "runs"
    for seed in seeds:
        _run(tmp_path, "gumbel_tree", f"trainer.seed={seed}", f"paths.output_dir={root / f'gumbel_{seed}'}")
    _run(tmp_path, "reinforce", f"paths.output_dir={root / 'reinforce_1'}")  # alone: no self-F1
    _run(tmp_path, "lstm", "trainer.seed=1", f"paths.output_dir={root / 'lstm_1'}")  # no tree
    _run(tmp_path, "lstm", "trainer.seed=2", f"paths.output_dir={root / 'lstm_2'}")
    result = listops_report.self_f1(root, log=lambda *_: None)
    assert set(result) == {str(root / f"gumbel_{s}") for s in seeds}

    # by hand: both final models (their checkpoints) parse the test split, per-example F1, mean; and what each run
    # recorded (report.json, all the report reads) is its model's trees
    (a, data), (b, _) = (final_model(root / f"gumbel_{s}") for s in seeds)
    test = {**data.splits["test"], "index": torch.arange(len(data.splits["test"]["y"]))}
    batches = list(listops_report._batches(test))
    per = [tree_scores(a.trees(batch), b.trees(batch), batch["lengths"])["tree_f1"] for batch in batches]
    expected = float(torch.cat(per).mean())
    spans, lengths = listops_report.recorded_trees(root / "gumbel_1")
    assert torch.equal(lengths, test["lengths"])
    for batch in batches[:2]:
        for z, i, n in zip(a.trees(batch), batch["index"].tolist(), batch["lengths"].tolist(), strict=True):
            assert _spans(z[:n, :n]) == frozenset(map(tuple, spans[i]))
    for s in seeds:
        derived = json.loads((root / f"gumbel_{s}" / "derived.json").read_text())
        assert derived == {"self_f1": pytest.approx(expected), "self_f1_runs": 2}
    assert not (root / "reinforce_1" / "derived.json").exists() and not (root / "lstm_1" / "derived.json").exists()

    out = listops_report._figure(root, tmp_path / "trees.png", examples=2, seed=1, data_dir=None, log=lambda *_: None)
    assert out.stat().st_size > 1000
    drawn = json.loads(out.with_suffix(".data.json").read_text())  # the trees drawn, redrawn without the runs
    columns = drawn["columns"]  # the examples drawn: as many as the test split has of 8-14 leaves, at most 2
    assert 1 <= columns <= 2
    assert [p["title"].split("  ")[0] for p in drawn["panels"]] == ["true tree"] * columns + ["gumbel_1"] * columns
    again = figures.redraw(out.with_suffix(".data.json"), tmp_path / "again.png")
    assert again.read_bytes() == out.read_bytes()
    spec = tmp_path / "spec.yaml"  # with a spec, a method's trees are titled with its row's label
    spec.write_text(json.dumps({"rows": [{"name": "g", "label": "Gumbel (ST)", "match": {"seed": 1}}]}))
    out = listops_report._figure(root, tmp_path / "t2.png", 2, 1, None, log=lambda *_: None, spec=spec)
    titles = [p["title"] for p in json.loads(out.with_suffix(".data.json").read_text())["panels"]]
    assert titles[-1].startswith("Gumbel (ST)  (F1 ")


def test_cli_and_derived_metrics_in_the_tables(tmp_path):
    root = tmp_path / "runs"
    for seed in (1, 2):
        _run(tmp_path, "gumbel_tree", f"trainer.seed={seed}", f"paths.output_dir={root / f'g{seed}'}")
        (root / f"g{seed}" / ".hydra").mkdir()
        (root / f"g{seed}" / ".hydra" / "config.yaml").write_text(f"trainer:\n  seed: {seed}\n")
    assert listops_report.main(["self-f1", "--runs", str(root)]) == 0
    runs = tables.load_runs(root)
    assert runs["derived.self_f1"].notna().all()
    assert listops_report.main(["reference-trees", "--runs", str(root), "--out", str(tmp_path / "ref.md")]) == 0
    assert "random trees" in (tmp_path / "ref.md").read_text()
    with pytest.raises(FileNotFoundError):
        listops_report.main(["figure", "--runs", str(root), "--out", str(tmp_path / "f.png"), "--seed", "9"])


def test_batches_cover_the_split_once_in_length_order_within_the_cell_cap():
    lengths = torch.tensor([3, 939, 5, 200, 200, 2] + [10] * 600)
    split = {"lengths": lengths, "x": torch.zeros(len(lengths), 939, dtype=torch.long), "y": torch.arange(len(lengths))}
    batches = list(listops_report._batches(split, size=256, cells=1 << 22))
    assert sorted(torch.cat([b["y"] for b in batches]).tolist()) == list(range(len(lengths)))
    assert [(len(b["y"]), b["x"].shape[1]) for b in batches] == [(256, 10), (256, 10), (93, 200), (1, 939)]
    assert all(len(b["y"]) * b["x"].shape[1] ** 2 <= 1 << 22 or len(b["y"]) == 1 for b in batches)

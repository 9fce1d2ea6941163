"""bench/structures.py without timing anything that matters: the oracle timer, a worker run in another tree, the
Markdown tables on made-up numbers (the benchmark itself is `make bench-structures`)."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from latentstruct.structures import ProjectiveDepTree, Structure
from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("bench_structures", ROOT / "bench" / "structures.py")
bench = sys.modules["bench_structures"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_oracle_timer_counts_each_call_once_and_restores_the_methods():
    tree = ProjectiveDepTree()
    scores = torch.randn(2, 5, 5)
    with bench.oracle_timer(tree, torch.device("cpu")) as spent:
        Structure.map_parts(tree, scores)  # the default map_parts calls map: one outermost call
        first = spent[0]
        tree.map(scores)
    assert 0 < first < spent[0]
    assert "map" not in vars(tree) and "map_parts" not in vars(tree)


def test_a_worker_times_ours_in_the_tree_it_runs_in():
    from bench.trees import Tree, tree_env

    tree = Tree("before", ROOT, "")
    args = argparse.Namespace(batch=2, device="cpu")
    out = bench.time_baseline(tree, tree_env(tree, threads=1), "topk", 6, args)
    assert out["structure"].startswith("topk") and out["n"] == 6
    assert {"map", "marginals", "marginals+backward", "sparsemap+backward"} <= set(out)


def test_the_tables(tmp_path):
    common = {"structure": "projective", "n": 30, "reference": "SuPar DependencyCRF"}
    rows = [
        {**common, "op": "map", "ours_ms": 2.0, "before_ms": 6.0, "theirs_ms": 40.0},
        {
            **common,
            "op": "sparsemap+backward",
            "ours_ms": 100.0,
            "before_ms": 800.0,
            "theirs_ms": None,
            "iterations": 70,
            "map_calls": 66,
            "support": 38.2,
            "oracle_share": 0.9,
            "in_map": 0.75,
            "marginals_ms": 25.0,
            "before_iterations": 71,
        },
    ]
    warm = [
        {
            "structure": "projective",
            "eps": 0.01,
            "cold_calls": 70,
            "warm_calls": 20,
            "cold_iterations": 71,
            "warm_iterations": 22,
            "cold_ms": 100.0,
            "warm_ms": 40.0,
        }
    ]
    args = argparse.Namespace(batch=32, baseline="645b4f9", sizes=[30])
    out = tmp_path / "s.md"
    bench.write_markdown(
        out, rows, ["a note"], warm, [], args, torch.device("cpu"), {"commit": "645b4f9" * 5, "subject": "x"}
    )
    text = out.read_text()
    assert "| projective | 30 | 800.0 | 71 | 100.0 | 8.0× | 70 | 66 | 38 | 0.90 | 0.75 | 4.0× |" in text
    assert "| projective | 30 | map | 6.00 | 2.00 | 3.0× | SuPar DependencyCRF | 40.00 | 0.05 |" in text
    assert "| projective | 0.01 | 70 → 20 | 71 → 22 | 100.0 | 40.0 |" in text
    assert out.with_suffix(".json").is_file()

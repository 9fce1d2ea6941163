"""bench/layers.py without running it: its configurations compose, its overrides are checked, its arithmetic and its
table are right on made-up numbers (no timing here: the benchmark itself is `make bench-layers`)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from omegaconf import OmegaConf

from latentstruct.config import check_command_line
from tests.helpers import ROOT, compose

_spec = importlib.util.spec_from_file_location("bench_layers", ROOT / "bench" / "layers.py")
layers = sys.modules["bench_layers"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up there
_spec.loader.exec_module(layers)


@pytest.mark.slow
def test_every_configuration_composes_with_its_overrides_applied(tmp_path):
    configs = layers.configurations()
    assert len({c.key for c in configs}) == len(configs) == 15
    assert set(layers.TASK_BASELINE.values()) <= {c.key for c in configs}
    for config in configs:
        overrides = layers.run_overrides(config, steps=7, threads=1, device="cpu", eval_subset=32)
        cfg = compose(*check_command_line(overrides))  # as python -m latentstruct.train reads
        assert cfg.trainer.max_steps == cfg.trainer.eval_every == 7 and cfg.trainer.threads == 1
        assert cfg.trainer.batch_size == {"SST": 32, "ListOps": 64, "NER": 32}[config.task]
        if config.task == "NER":  # the method from the first step, on the campaign's word vectors
            assert cfg.trainer.phases == [] and cfg.task.phases == 0 and not cfg.embedding.freeze
            assert cfg.embedding.pretrained.startswith("glove/glove.6B.50d")
        if config.task == "SST" and config.cap != "—":
            assert cfg.task.structure.sparsemap_max_iter == (None if config.cap == "exact" else 50)
        # the run-time check reads the same file a run leaves in .hydra/
        (tmp_path / ".hydra").mkdir(exist_ok=True)
        (tmp_path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        assert layers.unapplied(tmp_path, overrides) == []
    # and it can fail: a value the config does not hold
    assert layers.unapplied(tmp_path, ["trainer.max_steps=8", "+experiment=x"]) == ["trainer.max_steps=8 (composed: 7)"]


def test_an_older_tree_gets_the_nested_experiment_names_it_knows(tmp_path):
    """The baseline tree of before the flat names has configs/experiment/sst/spigot.yaml: +experiment=sst_spigot
    reaches it as sst/spigot; this tree, and any other override, get the names as they are."""
    old = tmp_path / "old"
    (old / "configs" / "experiment" / "sst").mkdir(parents=True)
    (old / "configs" / "experiment" / "sst" / "spigot.yaml").write_text("")
    overrides = ["+experiment=sst_spigot", "+preset=listops_cpu", "trainer.seed=1"]
    before = layers.Tree("before", old, "0" * 40)
    assert layers.tree_overrides(before, overrides) == ["+experiment=sst/spigot", *overrides[1:]]
    assert layers.tree_overrides(layers.Tree("now", ROOT, "1" * 40), overrides) == overrides


def test_read_metrics_and_steady_state(tmp_path):
    assert layers.read_metrics(tmp_path)["status"] == "failed"  # no metrics.json
    (tmp_path / "metrics.json").write_text(
        json.dumps({"status": "completed", "seconds_per_step": 0.5, "steps": 4, "git_commit": "abc", "metrics": {}})
    )
    main = layers.read_metrics(tmp_path)
    assert main == {"status": "completed", "seconds_per_step": 0.5, "steps": 4, "git_commit": "abc"}
    warm = {"seconds_per_step": 1.1, "steps": 1}  # the first step: 1.1 s, the next three: 0.3 s each
    assert layers.steady_seconds(warm, main) == pytest.approx(0.3)
    assert layers.steady_seconds(None, main) == 0.5


def _fake_results():
    def done(*values):
        return [{"status": "completed", "seconds_per_step": v, "cpu_per_step": v / 2} for v in values]

    return {
        "before": {
            "sst_baseline": done(0.1, 0.3, 0.2),
            "sst_sparsemap@exact": [{"status": "timeout"}],
            "sst_marginals": done(0.8),
        },
        "now": {
            "sst_baseline": done(0.2),
            "sst_sparsemap@exact": done(1.0),
            "sst_marginals": [{"status": "failed", "error": "boom"}, *done(0.4)],
        },
    }


def test_summary_and_markdown_on_fake_numbers():
    configs = [c for c in layers.configurations() if c.key in ("sst_baseline", "sst_sparsemap@exact", "sst_marginals")]
    rows = {r["key"]: r for r in layers.summarize(_fake_results(), configs)}
    base, exact, marg = rows["sst_baseline"], rows["sst_sparsemap@exact"], rows["sst_marginals"]
    assert base["before"] == 0.2 and base["before_ratio"] == base["now_ratio"] == 1.0  # median of 3 repeats
    assert marg["speedup"] == pytest.approx(2.0) and marg["now_ratio"] == pytest.approx(2.0)
    assert marg["now_failures"] == 1 and marg["now_status"] is None
    assert exact["before"] is None and exact["before_status"] == "timeout" and "speedup" not in exact
    meta = {
        "git_commit": "abc",
        "git_dirty": True,
        "baseline": {"rev": "r", "commit": "0123456789abcdef", "subject": "s"},
        "hardware": "cpu",
        "cpu": "X",
        "cores": 2,
        "device": "cpu",
        "threads": 1,
        "torch": "2",
        "python": "3",
        "steps": 30,
        "baseline_steps": 100,
        "exact_steps": 3,
        "warmup": 1,
        "repeats": 3,
        "timeout": 60,
        "date": "today",
        "total_seconds": 90,
        "make": "make bench-layers",
        "command": "python bench/layers.py",
        "notes": ["a note"],
        "tasks": ["SST"],
    }
    meta["failures"] = layers.failures(_fake_results())
    assert meta["failures"] == [
        "before `sst_sparsemap@exact` repeat 1: timeout",
        "now `sst_marginals` repeat 1: failed: boom",
    ]
    text = layers.markdown(list(rows.values()), meta)
    assert "repeat(s), SST with random embeddings and small evaluation subsets (see Notes)" in text  # its tasks only
    assert "- git commit: abc (dirty)" in text and "0123456789ab (r: s)" in text and "- a note" in text
    assert "| SST | BiLSTM (baseline) | — | 0.200 | 0.200 | 1.00× | 1.0 | 1.0 |" in text
    assert "| SST | SparseMAP | exact | timeout | 1.000 | — | — | 5.0 |" in text
    assert "| SST | Marginals | — | 0.800 | 0.400 (1 failed) | 2.00× | 4.0 | 2.0 |" in text
    assert "- now `sst_marginals` repeat 1: failed: boom" in text
    assert "| SST | Marginals | — | 0.400 | 0.200 | 2.00× |" in text.split("## Cross-check")[1]
    # without a baseline commit: the "now" columns only
    now_only = layers.summarize({"now": _fake_results()["now"]}, configs)
    text = layers.markdown(now_only, {**meta, "baseline": None})
    assert "before" not in text.split("## Notes")[0].split("|", 1)[1] and "| SST | Marginals | — | 0.400" in text


def test_the_make_line_carries_every_option_off_its_default():
    options = layers.parser()
    args = options.parse_args(["--baseline", "fd96a4d", "--only", "ner", "--repeats", "3", "--steps", "60", "--out",
                               "results/bench/layers_ner.md"])
    assert layers.make_command(args, options) == (
        "make bench-layers BENCH_BASELINE=fd96a4d BENCH_LAYERS_ARGS='--repeats 3 --steps 60 --only ner' "
        "BENCH_LAYERS_OUT=results/bench/layers_ner.md")
    assert layers.make_command(options.parse_args([]), options) == "make bench-layers"

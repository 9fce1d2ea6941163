"""Issue 37, the front door part 2: what a new user meets first (data found one way, clear refusals)."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from latentstruct import capabilities, summary
from latentstruct.config import ConfigError, check_command_line, validate
from latentstruct.data.files import DataMissing, data_missing
from latentstruct.records import load_model_weights, model_weights
from latentstruct.report import figures
from latentstruct.train import train
from tests.helpers import ROOT, compose, final_model, run_cli
from tests.tasks.test_text import WORDS, write_glove, write_sst


def _train(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "LATENTSTRUCT_DATA"}
    return run_cli(*args, cwd=cwd, env={**base, **env})


@pytest.mark.slow
def test_a_missing_data_file_is_one_line_naming_the_file_the_root_and_the_rule(tmp_path):
    """`python -m latentstruct.train +experiment=sst_spigot` without the data: a 40-line traceback ending in
    FileNotFoundError('missing train.txt[.gz] in data/sst; ...') without a word of LATENTSTRUCT_DATA."""
    done = _train("+experiment=sst_spigot", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: missing train.txt[.gz] in ")
    assert f"The data root is {tmp_path / 'data'}" in line and "$LATENTSTRUCT_DATA is unset" in line
    assert "$LATENTSTRUCT_DATA, else paths.data_dir" in line and "docs/reference.md" in line
    assert "failed" in (tmp_path / "run" / "metrics.json").read_text()  # the run is still recorded


def test_the_data_root_from_the_environment_is_named_so(tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTSTRUCT_DATA", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataMissing) as missing:
        train(compose("+experiment=sst_spigot", f"paths.output_dir={tmp_path / 'run'}"), console=False)
    assert f"The data root is {tmp_path / 'empty'} ($LATENTSTRUCT_DATA={tmp_path / 'empty'})" in str(missing.value)


def test_data_missing_finds_the_file_error_behind_a_wrapper_and_leaves_others():
    try:
        try:
            raise FileNotFoundError("missing x.txt in data/x")
        except FileNotFoundError as inner:
            raise RuntimeError("Error in call to target 'x'") from inner
    except RuntimeError as outer:
        found = data_missing(outer, "data")
    assert isinstance(found, DataMissing) and str(found).startswith("missing x.txt in data/x. The data root is")
    assert data_missing(ValueError("a bad value"), "data") is None


def test_make_and_python_find_the_data_the_same_way():
    """The Makefile used to point LATENTSTRUCT_DATA at a folder beside the checkout, which `python -m` never did."""
    makefile = (ROOT / "Makefile").read_text()
    assert "export LATENTSTRUCT_DATA" not in makefile and "../shared" not in makefile


# ------------------------------------------------------------------ capabilities (latentstruct.capabilities)


@pytest.mark.parametrize("overrides, expected", [
    (["+experiment=planted_matching", "estimator=marginals"],
     "estimator=marginals calls marginals, which structure=matching does not have; the estimators that fit "
     "structure=matching: blackbox, direct, imle, perturbed, sparsemap, spigot, ste_i"),
    (["structure=matching"], "structure=matching does not fit dataset=synthetic_clusters, whose scores fill "
                             "categorical only; a task on planted matchings: +experiment=planted_matching"),
    (["+experiment=planted_matching", "structure=topk"], "structure=topk does not fit the planted data of "
                                                         "dataset.structure=matching"),
])
def test_a_mismatch_is_refused_at_composition_in_one_line(overrides, expected):
    """`+experiment=planted_matching estimator=marginals` loaded the data, started training, then printed a 40-line
    traceback ending in `Matching.sinkhorn(...)`; `structure=matching` on the default task, a shape error."""
    with pytest.raises(ConfigError) as refused:
        check_command_line(overrides)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    assert check_command_line(["+experiment=planted_matching", "estimator=spigot"])  # what fits goes through


@pytest.mark.slow
def test_the_cli_refuses_a_mismatch_with_status_2_before_any_run_directory(tmp_path):
    done = _train("+experiment=planted_matching", "estimator=marginals", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: estimator=marginals calls marginals")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_train_refuses_a_mismatch_before_reading_data(tmp_path):
    cfg = compose("+experiment=planted_matching", "estimator=marginals", f"paths.output_dir={tmp_path}")
    with pytest.raises(ConfigError, match="estimator=marginals calls marginals"):
        validate(cfg)


def test_the_readme_table_is_the_one_the_declarations_give():
    assert capabilities.readme_block() == capabilities.table(), "run: python -m latentstruct.capabilities --write"
    assert "| `ppo` | a sequential policy |" in capabilities.table()


def test_every_option_declares_known_capabilities():
    for cls in [*capabilities.options("estimator").values(), *capabilities.options("structure").values()]:
        declared = getattr(cls, "calls", None) or cls.has
        assert declared and set(declared) <= set(capabilities.CAPABILITIES), cls


# ------------------------------------------------------------------ the end-of-sweep summary (latentstruct.summary)


def _record(root: Path, name: str, overrides: list[str], status: str = "completed", acc: float = 50.0,
            wall: float = 120.0) -> None:
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, "trainer.threads=1"]))
    hydra = {"hydra": {"job": {"config": {"override_dirname": {"exclude_keys": ["trainer.threads"]}}}}}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    metrics = {"valid/acc": acc + 1, "test/acc": acc, "test/loss": 0.5} if status == "completed" else {}
    (run / "metrics.json").write_text(json.dumps({"status": status, "metrics": metrics, "wall_seconds": wall,
                                                  "error": None if status == "completed" else "ValueError: boom"}))


def test_the_summary_has_a_row_per_run_and_groups_the_seeds(tmp_path, capsys):
    _record(tmp_path, "a1", ["estimator=spigot", "trainer.seed=1"], acc=50.0)
    _record(tmp_path, "a2", ["estimator=spigot", "trainer.seed=2"], acc=54.0, wall=60.0)
    _record(tmp_path, "b1", ["estimator=sfe", "trainer.seed=1"], status="failed")
    assert summary.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "3 run(s) under" in printed and "seeds grouped" in printed
    md = (tmp_path / "summary.md").read_text()
    assert "| estimator=spigot trainer.seed=1 | completed | 50.00 | 0.50 | 2.00 |" in md  # test/ metrics, loss last
    assert "| estimator=spigot | 2/2 | 52.00 ± 2.83 | 0.50 ± 0.00 | 1.50 |" in md
    assert "| estimator=sfe | 0/1 | — | — | 2.00 |" in md and "- b1: ValueError: boom" in md
    rows = list(csv.reader((tmp_path / "summary.csv").open()))
    assert rows[0] == ["run", "overrides", "status", "test/acc", "test/loss", "minutes", "error"] and len(rows) == 4
    assert "trainer.threads" not in md  # the keys that do not change a run's result are left out


def test_every_multirun_ends_with_the_summary(tmp_path):
    cfg = compose(hydra=True)
    assert cfg.hydra.callbacks.summary._target_ == "latentstruct.summary.SweepSummary"
    _record(tmp_path, "a1", ["estimator=spigot"])
    callback = summary.SweepSummary()
    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(sweep)
    callback.on_multirun_end(sweep)
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "summary.csv").is_file()


def test_run_files_read_as_safe_load_reads_them(tmp_path):
    """summary.read_yaml (libyaml's parser, what the summaries and tables read a thousand runs' .hydra/ files with)
    gives the objects yaml.safe_load gives, on a composed configuration with its Hydra node (interpolations, floats
    such as 1e-3, nulls, lists of overrides) as a run writes it."""
    cfg = compose("+experiment=sst_spigot", "optim.lr=1e-3", hydra=True)
    path = tmp_path / "hydra.yaml"
    path.write_text(OmegaConf.to_yaml(cfg))
    assert "${" in path.read_text()  # interpolations stay strings: none is resolved
    assert summary.read_yaml(path) == yaml.safe_load(path.read_text())
    assert summary.read_yaml(tmp_path / "missing.yaml") is None


def test_the_readme_links_only_inside_the_checkout():
    """It pointed at ../shared/DESIGN.md and ../shared/seeds/, which a user's clone has neither of."""
    text = (ROOT / "README.md").read_text()
    assert "../" not in text
    for target in re.findall(r"\]\(([^)#]+)", text):
        assert (ROOT / target).exists(), target
    assert "docs/architecture.md" in text


# ------------------------------------------------------------------ checkpoints: what cannot be rebuilt


def _sst_run(tmp_path: Path, *overrides: str) -> dict:
    write_sst(tmp_path / "data" / "sst")
    glove = write_glove(tmp_path / "data" / "vectors.txt", WORDS, dim=8)
    return train(compose("+experiment=sst_spigot", "dataset.check_sizes=false", "trainer.batch_size=8",
                         "embedding.dim=8", "task.encoder.hidden=6", f"embedding.pretrained={glove.name}",
                         "trainer.progress=false", "trainer.device=cpu", f"paths.data_dir={tmp_path / 'data'}",
                         f"paths.output_dir={tmp_path / 'run'}", f"embedding.cache_dir={tmp_path / 'cache'}",
                         *overrides))


def test_a_checkpoint_leaves_out_the_frozen_word_vectors_and_resumes_bit_exactly(tmp_path):
    """Every SST run wrote its frozen GloVe table into checkpoint.pt (61 MB), which building the model rebuilds."""
    _sst_run(tmp_path, "trainer.max_steps=2", "trainer.eval_every=2")
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert not any("embedding" in key for key in ckpt["model"]), list(ckpt["model"])
    again = _sst_run(tmp_path, "trainer.max_steps=4", "trainer.eval_every=2", "trainer.resume=true",
                     "trainer.force=true")
    assert again["status"] == "completed" and again["steps"] == 4
    whole = _sst_run(tmp_path / "whole", "trainer.max_steps=4", "trainer.eval_every=2")
    assert again["metrics"] == whole["metrics"]  # resuming from the trimmed checkpoint changes nothing
    model, _ = final_model(tmp_path / "run")  # a model built from the run's configuration loads it
    frozen = [p for p in model.parameters() if getattr(p, "rebuilt_from_data", False)]
    assert len(frozen) == 1 and frozen[0].requires_grad is False


def test_a_checkpoint_refuses_a_model_it_does_not_fit():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    weights = model_weights(model)
    with pytest.raises(RuntimeError, match="missing"):
        load_model_weights(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)), weights)


def test_keep_checkpoint_false_removes_it_when_the_run_completes(tmp_path):
    cfg = compose("dataset.n_train=200", "dataset.n_valid=100", "dataset.n_test=100", "trainer.progress=false",
                  "trainer.max_steps=4", "trainer.keep_checkpoint=false", f"paths.output_dir={tmp_path}")
    assert train(cfg)["status"] == "completed"
    assert not (tmp_path / "checkpoint.pt").exists() and (tmp_path / "metrics.json").exists()


# ------------------------------------------------------------------ train(cfg) from Python; --help; docs/configs.md


def test_train_from_python_logs_to_train_log_and_the_console_unless_told_not_to(tmp_path, monkeypatch, capsys):
    """`train(cfg)` from Python printed nothing and wrote no train.log."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a plain script (pytest adds its own)
    tiny = ["dataset.n_train=200", "dataset.n_valid=100", "dataset.n_test=100", "trainer.progress=false",
            "trainer.max_steps=4"]
    train(compose(*tiny, f"paths.output_dir={tmp_path / 'loud'}"))
    printed = capsys.readouterr().out
    log = (tmp_path / "loud" / "train.log").read_text()
    assert "training 4 steps" in log and "test/acc" in log
    assert "training 4 steps" in printed and "test/acc" in printed
    train(compose(*tiny, f"paths.output_dir={tmp_path / 'quiet'}"), console=False)
    assert capsys.readouterr().out == "" and "test/acc" in (tmp_path / "quiet" / "train.log").read_text()
    assert not logging.getLogger("latentstruct").handlers  # nothing left behind


def test_docs_configs_gives_full_keys_and_what_each_experiment_sets():
    text = (ROOT / "docs" / "configs.md").read_text()
    assert "| `task.estimator.eta` |" in text and "| `trainer.keep_checkpoint` |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `sst_spigot` |"))
    assert "`estimator=spigot`" in row and "`task.estimator.eta=0.1`" in row and "`optim.lr=0.0001`" in row


def test_lines_that_coincide_get_markers_and_a_note_instead_of_hiding_each_other():
    """results/direct/vae_unsupervised.png: two of five methods were hidden under a third, with no marker or note."""
    x = [1, 2, 3, 4]
    series = [{"label": "A (a)", "color": 0, "x": x, "y": [10.0, 9.0, 8.0, 7.0]},
              {"label": "B", "color": 1, "x": x, "y": [10.01, 9.0, 8.01, 7.0]},
              {"label": "C", "color": 2, "x": [1.5, 2.5, 3.5], "y": [9.5, 8.5, 7.5]},  # on A's line, elsewhere
              {"label": "D", "color": 3, "x": x, "y": [0.0, 1.0, 2.0, 3.0]}]
    assert figures._overlapping(series, span=10.0) == [[0, 1, 2]]
    fig = figures.render({"figure": "curves", "panels": [{"title": "p", "series": series}]})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["overlapping (within 0.1): A = B = C"]
    markers = [line.get_marker() for line in ax.lines]
    assert markers[:3] == ["o", "s", "^"] and markers[3] in ("None", None, "")

"""scripts/energy_probe.py: on a run's model at its last step, A's accuracy is what the run's last evaluation
reports, the energy's minimum is the CRF's own decoding (and no tagging's energy lies below it), and the ranking
shares are percentages of the sentences (here citations)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from latentstruct.train import train
from scripts.energy_probe import probe
from tests.data.test_cora import write_cora
from tests.tasks.test_energy_citation import _cfg


def _run(tmp_path, data_dir, experiment):
    out = tmp_path / experiment
    cfg = _cfg(data_dir, out, experiment, "trainer.phases.0.epochs=1", "trainer.phases.1.epochs=2")
    assert train(cfg, console=False)["status"] == "completed"
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")  # what a run launched by the CLI has
    return out, pd.read_csv(out / "history.csv").iloc[-1]


def test_the_probe_reads_a_at_its_last_step_and_the_energys_exact_minimum(tmp_path):
    data_dir = write_cora(tmp_path / "data", n=30)
    for experiment in ("cd", "crf"):
        out, last = _run(tmp_path, data_dir, experiment)
        rows = {r["split"]: r for r in probe(str(out))}
        assert sorted(rows) == ["test", "train", "valid"] and rows["train"]["sentences"] == 3  # the labelled ones
        for split in ("valid", "test"):
            r = rows[split]
            # the CRF decodes with its energy's minimum: the run's own accuracy
            mine = r["acc_E"] if experiment == "crf" else r["acc_A"]
            assert abs(mine - last[f"{split}/acc"]) < 1e-9
            assert r["gap_gold"] >= -1e-6 and 0 <= r["gold_below_author"] <= 100
            assert r["f1_A"] is None and r["f1_E"] is None  # the task's metric is token accuracy
            assert r["acc_F"] is None and r["F_at_E_errors"] is None  # no cost-augmented network
            if experiment == "cd":
                assert r["gap_A"] >= -1e-6 and 0 <= r["gold_below_A"] <= 100
                assert abs(r["author_A"] - last[f"{split}/author_share"]) < 1e-9
                assert r["gap_A_relaxed"] is not None
            else:
                assert r["acc_A"] is None and r["gap_A"] is None and r["gap_A_relaxed"] is None


def test_on_ner_infnet_the_probe_gives_span_f1_beside_token_accuracy(tmp_path):
    from tests.helpers import one_epoch_per_phase
    from tests.tasks.test_energy_ner import _toy_cfg, write_conll

    out = tmp_path / "infnet"
    cfg = _toy_cfg(write_conll(tmp_path / "data"), out, "infnet")
    one_epoch_per_phase(cfg)
    assert train(cfg, console=False)["status"] == "completed"
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    last = pd.read_csv(out / "history.csv").iloc[-1]
    rows = {r["split"]: r for r in probe(str(out))}
    assert rows["train"]["sentences"] == 24  # every training sentence (no labelled subset)
    for split in ("valid", "test"):
        r = rows[split]
        assert abs(r["f1_A"] - last[f"{split}/f1"]) < 1e-9 and abs(r["acc_A"] - last[f"{split}/token_acc"]) < 1e-9
        assert 0 <= r["f1_E"] <= 100 and r["author_A"] is None and r["gold_below_author"] is None
        assert r["gap_gold"] >= -1e-6 and r["gap_A"] >= -1e-6 and 0 <= r["acc_E_unary"] <= 100
        assert r["transition_abs"] == rows["train"]["transition_abs"] > 0  # the method phase trains W
        assert 0 <= r["acc_F"] <= 100 and 0 <= r["F_at_E_errors"] <= 100


def test_swapping_the_energys_parts_with_its_base_gives_each_states_exact_minimum(tmp_path):
    from scripts.energy_probe import ENERGY_GROUPS, swap
    from tests.helpers import one_epoch_per_phase
    from tests.tasks.test_energy_ner import _toy_cfg, write_conll

    data_dir, dirs = write_conll(tmp_path / "data"), {}
    for name, epochs in (("base", 1), ("run", 2)):  # the same run, one epoch of the method phase apart
        out = tmp_path / name
        cfg = _toy_cfg(data_dir, out, "infnet")
        one_epoch_per_phase(cfg)
        cfg.trainer.phases[1].epochs = epochs
        assert train(cfg, console=False)["status"] == "completed"
        (out / ".hydra").mkdir()
        OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
        dirs[name] = str(out)
    rows = {r["split"]: r for r in swap(dirs["base"], dirs["run"])}
    probed = {name: {r["split"]: r["acc_E"] for r in probe(d)} for name, d in dirs.items()}
    assert sorted(rows) == ["train", "valid"] and "back.extras" not in rows["train"]  # no NER+ features here
    groups = set(ENERGY_GROUPS) - {"extras"}
    for split, r in rows.items():
        assert r["run"] == probed["run"][split] and r["base"] == probed["base"][split]
        assert {k.split(".", 1)[1] for k in r if "." in k} == groups
        assert all(0 <= r[k] <= 100 for k in r if k.startswith(("back.", "only.")))
    # how far each part moved, in steps of the learning rate: from the two checkpoints and the run's lr
    states = [torch.load(Path(dirs[n], "checkpoint.pt"), weights_only=False) for n in ("base", "run")]
    lr = OmegaConf.load(Path(dirs["run"], ".hydra", "config.yaml")).optim.lr
    steps = states[1]["step"] - states[0]["step"]
    assert steps > 0 and rows["train"]["steps_between"] == steps
    scale = lr * steps
    for group in groups:
        moved = torch.cat([(states[1]["model"][k] - states[0]["model"][k]).abs().flatten()
                           for k in states[1]["model"] if k.startswith(ENERGY_GROUPS[group])]) / scale
        assert 0 < rows["train"][f"step_max.{group}"] == rows["valid"][f"step_max.{group}"] == float(moved.max())
        assert abs(rows["train"][f"step_mean.{group}"] - float(moved.mean())) < 1e-9
    with pytest.raises(ValueError, match="is not after"):
        swap(dirs["run"], dirs["base"])

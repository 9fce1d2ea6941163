"""scripts/citation_energy_probe.py: on a run's model at its last step, A's accuracy is what the run's last
evaluation reports, the energy's minimum is the CRF's own decoding (and no tagging's energy lies below it), and the
ranking shares are percentages of the citations."""

from __future__ import annotations

import pandas as pd
from omegaconf import OmegaConf

from latentstruct.train import train
from scripts.citation_energy_probe import probe
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
        assert sorted(rows) == ["test", "train", "valid"] and rows["train"]["citations"] == 3  # the labelled ones
        for split in ("valid", "test"):
            r = rows[split]
            # the CRF decodes with its energy's minimum: the run's own accuracy
            mine = r["acc_E"] if experiment == "crf" else r["acc_A"]
            assert abs(mine - last[f"{split}/acc"]) < 1e-9
            assert r["gap_gold"] >= -1e-6 and 0 <= r["gold_below_author"] <= 100
            if experiment == "cd":
                assert r["gap_A"] >= -1e-6 and 0 <= r["gold_below_A"] <= 100
                assert abs(r["author_A"] - last[f"{split}/author_share"]) < 1e-9
            else:
                assert r["acc_A"] is None and r["gap_A"] is None

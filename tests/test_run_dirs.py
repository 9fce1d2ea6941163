"""A run's directory is its configuration (issue #32): the CLI derives it from the overrides that can change the
result, a directory holding another configuration's run is refused before anything is read (run.json, its
fingerprint), a completed run goes on exactly to a longer length, the threads are part of the run and its record,
and the tables refuse a directory whose record and configuration disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

import latentstruct.train as train_module
from latentstruct.records import (
    LENGTH,
    LOCATION,
    MACHINE_COLUMNS,
    NOT_RESULT,
    RUN_FILE,
    RunMismatch,
    check_run_dir,
    fingerprint,
    identity,
    write_json,
)
from latentstruct.report.tables import load_runs
from tests.helpers import CONFIGS, run_cli, train_run
from tests.test_train import TINY

STEPS = ["trainer.eval_every=10", "estimator=sfe", "trainer.batch_size=64"]  # stochastic, mini-batches


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in [*folder.glob("*"), *folder.glob(".hydra/*")] if p.is_file()}


@pytest.mark.slow
def test_the_cli_finds_the_same_directory_for_the_same_configuration_and_refuses_another(tmp_path):
    args = [*TINY, "trainer.max_steps=10", "estimator=ste_i"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # sorted, without what cannot change the result (progress) or how long it trains (max_steps)
    folder = tmp_path / "outputs" / "dataset.n_test=100,dataset.n_train=200,dataset.n_valid=100,estimator=ste_i"
    assert json.loads((folder / "metrics.json").read_text())["steps"] == 10
    assert (folder / ".hydra" / "config.yaml").is_file() and (folder / RUN_FILE).is_file()
    before = _files(folder)
    again = run_cli(*args, cwd=tmp_path)  # the same command: the same directory, the run skipped
    assert again.returncode == 0 and "already completed; skipping" in again.stdout, again.stderr
    other = run_cli(*args[:-1], "estimator=spigot", f"hydra.run.dir='{folder}'", cwd=tmp_path)  # quoted: its commas
    assert other.returncode == 2
    assert "holds the run of another configuration" in other.stderr, other.stderr
    assert "task.estimator._target_: latentstruct.estimators.SteI → latentstruct.estimators.Spigot" in other.stderr
    assert "Traceback" not in other.stderr
    after = _files(folder)
    after.pop("train.log"), before.pop("train.log")  # the refusal is logged there; nothing else changes
    assert after == before


def test_a_directory_of_another_configuration_is_refused_and_force_replaces_it(tmp_path, caplog, monkeypatch):
    train_run(tmp_path, *TINY, "trainer.max_steps=10", *STEPS)
    folder = tmp_path / "run"
    before = _files(folder)
    monkeypatch.setattr(train_module, "instantiate", lambda *a, **k: pytest.fail("data read before the guard"))
    with pytest.raises(RunMismatch, match=r"optim\.lr: 0\.001 → 0\.5"):
        train_run(tmp_path, *TINY, "trainer.max_steps=10", *STEPS, "optim.lr=0.5")
    with pytest.raises(RunMismatch, match="trainer.threads: 1 → 2"):  # the threads are part of the run
        train_run(tmp_path, *TINY, "trainer.max_steps=10", *STEPS, "trainer.threads=2")
    assert _files(folder) == before
    monkeypatch.undo()
    with caplog.at_level("INFO", logger="latentstruct"):
        replaced = train_run(tmp_path, *TINY, "trainer.max_steps=10", *STEPS, "optim.lr=0.5", "trainer.force=true")
    assert "trainer.force=true replaces the run of fingerprint" in caplog.text
    assert "optim.lr: 0.001 → 0.5" in caplog.text
    recorded = json.loads((folder / RUN_FILE).read_text())
    assert replaced["fingerprint"] == recorded["fingerprint"] == fingerprint(recorded["identity"])
    assert recorded["identity"]["optim.lr"] == 0.5


def test_a_record_without_run_json_is_refused(tmp_path):
    train_run(tmp_path, *TINY, "trainer.max_steps=5")
    (tmp_path / "run" / RUN_FILE).unlink()
    with pytest.raises(RunMismatch, match="without run.json"):
        train_run(tmp_path, *TINY, "trainer.max_steps=5")


def test_a_completed_run_goes_on_exactly_to_a_longer_length_and_refuses_a_shorter_one(tmp_path):
    straight = train_run(tmp_path, *TINY, "trainer.max_steps=24", *STEPS, "trainer.select=best", name="straight")
    # ends between evaluations
    train_run(tmp_path, *TINY, "trainer.max_steps=15", *STEPS, "trainer.select=best", name="grown")
    grown = train_run(tmp_path, *TINY, "trainer.max_steps=24", *STEPS, "trainer.select=best", name="grown")
    assert grown["metrics"] == straight["metrics"] and grown["steps"] == 24
    columns = lambda name: pd.read_csv(tmp_path / name / "history.csv").drop(columns=list(MACHINE_COLUMNS))  # noqa: E731
    pd.testing.assert_frame_equal(columns("grown"), columns("straight"))  # the evaluation at 15 is not kept
    with pytest.raises(RunMismatch, match="a shorter one"):
        train_run(tmp_path, *TINY, "trainer.max_steps=20", *STEPS, "trainer.select=best", name="grown")
    # 6 epochs of 4 batches: the same 24 steps said another way, skipped
    again = train_run(tmp_path, *TINY, "trainer.max_steps=null", "trainer.max_epochs=6", *STEPS, "trainer.select=best",
                 name="grown")
    assert again == grown


def test_the_record_says_the_threads_and_the_same_threads_give_the_same_metrics(tmp_path):
    a = train_run(tmp_path, *TINY, "trainer.max_steps=20", *STEPS, name="a")
    b = train_run(tmp_path, *TINY, "trainer.max_steps=20", *STEPS, name="b")
    assert a["threads"]["intra_op"] == b["threads"]["intra_op"] == 1 and "inter_op" in a["threads"]
    assert a["metrics"] == b["metrics"]
    assert a["fingerprint"] == b["fingerprint"]


def test_the_directory_name_leaves_out_what_the_fingerprint_leaves_out():
    hydra = yaml.safe_load((CONFIGS / "train.yaml").read_text())["hydra"]
    excluded = hydra["job"]["config"]["override_dirname"]["exclude_keys"]
    prefixes = NOT_RESULT + LENGTH
    assert all(k.startswith(prefixes) or k.rsplit(".", 1)[-1] in LOCATION for k in excluded)
    assert all(any(k.startswith(p) for k in excluded) for p in prefixes)
    assert "trainer.threads" not in excluded and not "trainer.threads".startswith(prefixes)
    assert identity({"trainer": {"threads": 1, "progress": True, "max_steps": 3}}) == {"trainer.threads": 1}


def test_where_the_data_lie_is_not_part_of_the_run(tmp_path):
    """The same run on a machine whose data root is elsewhere (the campaign's worktree, the GPU machine) is the same
    configuration: its identity leaves out the data root and the GloVe cache, and a directory whose run.json recorded
    them (made before) is not refused for them."""
    config = {"dataset": {"name": "bibtex", "data_dir": "/data/a"}, "embedding": {"cache_dir": ".cache/glove"},
              "paths": {"data_dir": "/data/a"}}
    moved = {**config, "dataset": {"name": "bibtex", "data_dir": "/elsewhere"}}
    assert identity(config) == identity(moved) == {"dataset.name": "bibtex"}
    recorded = {"dataset.name": "bibtex", "dataset.data_dir": "/data/a"}  # an identity of before
    write_json(tmp_path / RUN_FILE, {"fingerprint": fingerprint(recorded), "identity": recorded})
    assert check_run_dir(tmp_path, identity(moved))["identity"] == recorded
    with pytest.raises(RunMismatch, match="dataset.name: bibtex → delicious"):
        check_run_dir(tmp_path, {"dataset.name": "delicious"})


def test_the_tables_refuse_a_directory_whose_record_and_configuration_disagree(tmp_path):
    train_run(tmp_path, *TINY, "trainer.max_steps=5", name="sweep/a")
    assert len(load_runs(tmp_path / "sweep")) == 1
    config = tmp_path / "sweep" / "a" / ".hydra" / "config.yaml"
    if not config.exists():  # written under Hydra only: as a launch would have written it
        config.parent.mkdir(parents=True)
        config.write_text(yaml.safe_dump({"optim": {"lr": 0.001}}))
        assert len(load_runs(tmp_path / "sweep")) == 1
    config.write_text(yaml.safe_dump({"optim": {"lr": 0.5}}))
    with pytest.raises(ValueError, match=r"optim\.lr: 0\.001 \(run\.json\) ≠ 0\.5"):
        load_runs(tmp_path / "sweep")


def test_every_sweep_names_its_runs_as_a_single_run_is_named():
    for path in sorted((CONFIGS / "sweep").glob("*.yaml")):
        sweep = yaml.safe_load(path.read_text())["hydra"]["sweep"]
        assert sweep["subdir"] == "${run_name:${hydra.job.override_dirname}}", path.name


def test_the_commit_stamp_wins_over_git_where_it_is_set(monkeypatch):
    """The GPU machine's copy of the tree may carry a stale .git: the stamp made just before the call is the truth."""
    from latentstruct.records import COMMIT_ENV, git_commit

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    sha, _ = git_commit()  # this checkout's git (or "unknown" in a copy without one)
    monkeypatch.setenv(COMMIT_ENV, "0123456789ab+dirty")
    assert git_commit() == ("0123456789ab", True) != (sha, True)
    monkeypatch.setenv(COMMIT_ENV, "fedcba987654")
    assert git_commit() == ("fedcba987654", False)


def test_a_fork_goes_on_from_its_source_under_its_own_settings(tmp_path):
    """trainer.init_from: a fork of the same configuration continues its source exactly (weights, moments, random
    state, history); one with another learning rate trains on with that rate from the source's step; the source's
    fingerprint and step are its identity's, the source's path is not."""
    args = [*TINY, *STEPS, "trainer.select=best"]
    straight = train_run(tmp_path, *args, "trainer.max_steps=24", name="straight")
    source = train_run(tmp_path, *args, "trainer.max_steps=10", name="source")
    same = train_run(tmp_path, *args, "trainer.max_steps=24", f"trainer.init_from={tmp_path / 'source'}", name="same")
    assert same["metrics"] == straight["metrics"] and same["steps"] == 24
    columns = lambda name: pd.read_csv(tmp_path / name / "history.csv").drop(columns=list(MACHINE_COLUMNS))  # noqa: E731
    pd.testing.assert_frame_equal(columns("same"), columns("straight"))
    recorded = json.loads((tmp_path / "same" / RUN_FILE).read_text())
    assert recorded["identity"]["trainer.forked_from"] == f"{source['fingerprint']}@10"
    assert "trainer.init_from" not in recorded["identity"] and same["fingerprint"] != straight["fingerprint"]

    faster = train_run(tmp_path, *args, "trainer.max_steps=24", "optim.lr=0.05",
                       f"trainer.init_from={tmp_path / 'source'}", name="faster")
    assert faster["metrics"] != straight["metrics"]
    ckpt = torch.load(tmp_path / "faster" / "checkpoint.pt", weights_only=False)
    assert {g["lr"] for g in ckpt["optimizer"]["param_groups"]} == {0.05}
    assert [row["step"] for row in ckpt["history"]][:1] == [10]  # the source's evaluations are the fork's
    again = train_run(tmp_path, *args, "trainer.max_steps=24", "optim.lr=0.05",
                      f"trainer.init_from={tmp_path / 'source'}", name="faster")
    assert again == faster  # completed: skipped
    with pytest.raises(RunMismatch, match=r"trainer.forked_from: .*@10 → \(absent\)"):  # not the fork's directory
        train_run(tmp_path, *args, "trainer.max_steps=24", "optim.lr=0.05", name="faster")


def test_a_fork_needs_a_completed_source_with_its_last_checkpoint_before_its_own_end(tmp_path):
    args = [*TINY, *STEPS]
    fork = lambda steps, name="fork": train_run(  # noqa: E731
        tmp_path, *args, f"trainer.max_steps={steps}", f"trainer.init_from={tmp_path / 'source'}", name=name)
    with pytest.raises(ValueError, match="not a completed run"):
        fork(20)
    train_run(tmp_path, *args, "trainer.max_steps=10", name="source")
    with pytest.raises(ValueError, match="it ends at step 10, this run at 10"):
        fork(10)
    (tmp_path / "source" / "checkpoint.pt").unlink()
    with pytest.raises(ValueError, match="no checkpoint of its last step"):
        fork(20, name="fork2")


def test_a_fork_keeps_its_own_settings_of_the_task_s_optimizers():
    class Task(torch.nn.Module):
        def __init__(self, lr):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))
            self.inner = torch.optim.Adam([self.w], lr=lr)

    source, fork = Task(1e-3), Task(1e-4)
    source.w.grad = torch.ones(2)
    source.inner.step()
    outer = torch.optim.SGD(fork.parameters(), lr=0.5)
    with train_module._own_hyperparameters(fork, outer):
        fork.inner.load_state_dict(source.inner.state_dict())
        outer.load_state_dict(torch.optim.SGD(source.parameters(), lr=9.0).state_dict())
    assert fork.inner.param_groups[0]["lr"] == 1e-4 and outer.param_groups[0]["lr"] == 0.5
    assert fork.inner.state[fork.w]["step"] == 1  # the moments are the source's

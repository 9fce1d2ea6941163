"""Configs compose, every experiment runs, and the run record keeps its contract (DESIGN.md §6, §7, §9)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import latentstruct.train as train_module
from latentstruct.config import ConfigError, TrainerConf, validate
from latentstruct.data.images import DATASETS
from latentstruct.records import MACHINE_COLUMNS, cpu_name, flatten, load_checkpoint, save_checkpoint
from latentstruct.tasks import Task
from tests.data.test_cora import write_cora
from tests.data.test_images import write_cifar, write_mnist
from tests.helpers import CONFIGS, ROOT, run_cli, train_run
from tests.helpers import compose as _compose
from tests.tasks.test_energy import write_mlc
from tests.tasks.test_energy_ner import write_conll
from tests.tasks.test_listops import write_listops
from tests.tasks.test_text import write_snli, write_sst
from tests.tasks.test_twpos import write_twpos

TINY = ["dataset.n_train=200", "dataset.n_valid=100", "dataset.n_test=100", "trainer.progress=false"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["dataset", "encoder", "scorer", "structure", "estimator", "decoder", "energy",
                                   "infnet", "cost_net", "composer", "optim"])
@pytest.mark.slow
def test_every_group_option_composes_and_instantiates(group, tmp_path):
    # The real image datasets are read from tiny generated files in their formats.
    write_mnist(tmp_path / "mnist", n_train=12, n_test=4)
    write_mnist(tmp_path / "fashion_mnist", n_train=12, n_test=4)
    write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py", n_per_batch=3)
    write_sst(tmp_path / "sst")  # and the text datasets from generated files in the official formats
    write_snli(tmp_path / "snli")
    write_listops(tmp_path / "listops")
    for name in ("bibtex", "delicious", "eurlex", "bookmarks"):
        write_mlc(tmp_path, name, n_train=8, n_test=4)
    write_conll(tmp_path, n_train=4, n_valid=2, n_test=2)
    write_twpos(tmp_path, n=2)
    write_cora(tmp_path, n=12)
    for option in _options(group):
        tiny = ["dataset.n_valid=2"] if group == "dataset" and option in DATASETS else []
        tiny += ["dataset.check_sizes=false"] if group == "dataset" and option in ("sst", "twpos") else []
        tiny += ["dataset.n_valid=2", "dataset.n_labelled=0"] if option.startswith("semisupervised_") else []
        tiny += ["dataset.n_train=20", "dataset.n_valid=2"] if option == "listops" else []
        tiny += ["dataset.check_sizes=false", "dataset.n_test=3", "dataset.n_valid=2", "dataset.pool=2",
                 "dataset.labelled=2"] if option == "cora" else []
        tiny += ["dataset.sizes=[6,3,3]"] if option in ("bibtex", "delicious", "eurlex", "bookmarks") else []
        tiny += ["task=mlc_energy"] if group in ("energy", "infnet", "cost_net") else []  # the tasks that take them
        tiny += ["task=listops"] if group == "composer" else []  # the task whose option has a composer group
        cfg = _compose(f"{group}={option}", f"paths.data_dir={tmp_path}", *tiny)
        if group in ("encoder", "scorer", "decoder", "energy", "infnet", "cost_net", "composer", "optim"):
            continue  # need runtime sizes / parameters; built by the experiment runs below
        node = cfg[group] if group == "dataset" else cfg.task[group]  # a model part: a node under the task
        # Sizes a task fills in (e.g. num_tags) are required, not defaulted.
        missing = [k.rsplit(".", 1)[-1] for k in OmegaConf.missing_keys(node)]
        with pytest.raises(Exception, match="Missing mandatory value") if missing else contextlib.nullcontext():
            instantiate(node)
        node = OmegaConf.merge(node, dict.fromkeys(missing, 2))
        assert instantiate(node) is not None


@pytest.mark.parametrize("experiment", [e for e in _options("experiment") if e.startswith("synthetic_")])
def test_every_experiment_runs_a_few_steps(tmp_path, experiment):  # of the synthetic task; the others: tests/tasks
    for k in (3, 10):
        record = train_run(
            tmp_path,
            *TINY,
            f"+experiment={experiment}",
            f"dataset.num_clusters={k}",
            "trainer.max_steps=4",
            "trainer.eval_every=2",
            name=f"k{k}",
        )
        assert record["status"] == "completed"
        assert set(record["metrics"]) >= {"valid/acc", "test/acc", "valid/v_measure", "test/v_measure"}


def test_tuned_hyperparameters_follow_the_number_of_clusters():
    cfg = _compose("+experiment=synthetic_spigot", "dataset.num_clusters=10")
    assert (cfg.optim.lr, cfg.task.estimator.eta) == (1e-4, 0.1)
    cfg = _compose("+experiment=synthetic_spigot", "dataset.num_clusters=3")
    assert (cfg.optim.lr, cfg.task.estimator.eta) == (1e-3, 1.0)


def test_run_record_contract(tmp_path):
    record = train_run(tmp_path, *TINY, "trainer.max_steps=30", "trainer.eval_every=10")
    run = tmp_path / "run"
    on_disk = json.loads((run / "metrics.json").read_text())
    assert on_disk == record
    assert on_disk["status"] == "completed"
    for key in ("metrics", "best_epoch", "seed", "git_commit", "hardware", "torch", "wall_seconds", "cpu_seconds"):
        assert key in on_disk
    assert on_disk["hardware"] == "cpu"
    assert on_disk["cpu"] == cpu_name() and on_disk["cpu"]  # the host CPU's model: kernels differ between CPUs
    assert 0 < on_disk["cpu_seconds"] <= on_disk["wall_seconds"] * on_disk["threads"]["intra_op"] + 0.5
    history = pd.read_csv(run / "history.csv")
    assert list(history["step"]) == [10, 20, 30]
    assert {"train/loss", "valid/acc", "test/acc", "test/v_measure", *MACHINE_COLUMNS} <= set(history.columns)
    # the run's CPU seconds grow at every evaluation and never pass its wall clock by more than its threads allow;
    # the load is the machine's, so only its sign is the run's to promise
    assert (history["cpu_seconds"].diff().dropna() > 0).all()
    assert (history["cpu_seconds"] <= history["wall_seconds"] * on_disk["threads"]["intra_op"] + 0.5).all()
    assert (history["load_1min"] >= 0).all()
    assert (run / "checkpoint.pt").exists()
    assert on_disk["metrics"]["test/acc"] == pytest.approx(history["test/acc"].iloc[-1])


def test_same_seed_same_metrics_and_other_seed_differs(tmp_path):
    a = train_run(tmp_path, *TINY, "trainer.max_steps=30", "estimator=st_gumbel", name="a")
    b = train_run(tmp_path, *TINY, "trainer.max_steps=30", "estimator=st_gumbel", name="b")
    c = train_run(tmp_path, *TINY, "trainer.max_steps=30", "estimator=st_gumbel", "trainer.seed=7", name="c")
    assert a["metrics"] == b["metrics"]
    assert a["metrics"] != c["metrics"]


@pytest.mark.parametrize("batch_size", ["null", "64"])
def test_resume_after_a_crash_matches_an_uninterruptedrun(tmp_path, *TINY, monkeypatch, batch_size):
    # Stochastic estimator and mini-batches: resuming must restore the RNG and the data order too.
    common = ["trainer.max_steps=40", "trainer.eval_every=10", "estimator=sfe", f"trainer.batch_size={batch_size}"]
    full = train_run(tmp_path, *TINY, *common, name="full")

    real_write_history, calls = train_module.write_history, {"n": 0}

    def crash_on_third_evaluation(path, history):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        real_write_history(path, history)

    monkeypatch.setattr(train_module, "write_history", crash_on_third_evaluation)
    with pytest.raises(KeyboardInterrupt):
        train_run(tmp_path, *TINY, *common, name="crashed")
    monkeypatch.setattr(train_module, "write_history", real_write_history)
    crashed = json.loads((tmp_path / "crashed" / "metrics.json").read_text())  # train() records it, then raises
    assert crashed["status"] == "failed" and crashed["error"] == "KeyboardInterrupt: killed"
    ckpt_path = tmp_path / "crashed" / "checkpoint.pt"  # the CPU time before the crash counts into the resumed run's
    ckpt = load_checkpoint(ckpt_path, torch.device("cpu"))
    save_checkpoint(ckpt_path, {**ckpt, "cpu_seconds": 1000.0})
    resumed = train_run(tmp_path, *TINY, *common, "trainer.resume=true", name="crashed")
    assert resumed["metrics"] == full["metrics"]
    assert 1000 < resumed["cpu_seconds"] < 1000 + resumed["wall_seconds"]
    h_full = pd.read_csv(tmp_path / "full" / "history.csv").drop(columns=list(MACHINE_COLUMNS))
    h_resumed = pd.read_csv(tmp_path / "crashed" / "history.csv").drop(columns=list(MACHINE_COLUMNS))
    pd.testing.assert_frame_equal(h_full, h_resumed)


def test_completed_runs_are_skipped(tmp_path, monkeypatch):
    first = train_run(tmp_path, *TINY, "trainer.max_steps=10")
    monkeypatch.setattr(train_module, "build_model", lambda *a, **k: pytest.fail("a completed run was re-run"))
    assert train_run(tmp_path, *TINY, "trainer.max_steps=10") == first


def test_best_selection_reports_the_best_validation_evaluation(tmp_path):
    record = train_run(tmp_path, *TINY, "trainer.max_steps=60", "trainer.eval_every=10", "trainer.select=best")
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    best = history.loc[history["valid/acc"].idxmax()]
    assert record["best_step"] == best["step"]
    assert record["metrics"]["test/acc"] == pytest.approx(best["test/acc"])


def test_unknown_option_names_the_valid_choices():
    with pytest.raises(ConfigCompositionException, match=r"(?s)estimator/nope.*spigot_ce"):
        _compose("estimator=nope")


def test_wrong_type_and_unknown_key_name_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        _compose("task.estimator.eta=fast")
    assert "task.estimator.eta" in str(err.value.__cause__ or err.value)
    with pytest.raises(ConfigError, match=r"task.estimator.eval_latent='sometimes' is not one of 'map', 'relaxed'"):
        validate(_compose("task.estimator.eval_latent=sometimes"))  # choices: checked first thing by train()
    with pytest.raises(ConfigCompositionException, match="etta"):
        _compose("task.estimator.etta=1")
    with pytest.raises(ConfigError, match="unknown key 'task.estimator.etta'; did you mean task.estimator.eta"):
        validate(_compose("+task.estimator.etta=1"))  # Hydra lets any +key through; the schema does not


def test_latent_none_requires_a_latent_free_decoder(tmp_path):
    with pytest.raises(ValueError, match="latent='none'"):
        train_run(tmp_path, *TINY, "latent=none", "trainer.max_steps=2")


@pytest.mark.slow
def test_cli_failed_record(tmp_path):  # a completed CLI run: the logging test below
    bad = run_cli(*TINY, "trainer.device=cuda", f"hydra.run.dir={tmp_path / 'bad'}", cwd=ROOT)
    if bad.returncode == 0:
        pytest.skip("a CUDA device is present")
    record = json.loads((tmp_path / "bad" / "metrics.json").read_text())
    assert record["status"] == "failed" and "CUDA" in record["error"]


def _trainer(**settings) -> DictConfig:
    return OmegaConf.merge(OmegaConf.structured(TrainerConf), settings)


def test_the_plan_line_says_steps_epochs_phases_and_evaluations():
    def plan(sizes, step=0, **settings):
        tc = _trainer(**settings)
        phases, max_steps = train_module._plan(tc, sizes)
        return train_module._describe_plan(tc, phases, max_steps, step)

    sst = {"train": 6_920, "valid": 872, "test": 1_821}
    assert plan(sst, batch_size=32, max_epochs=2) == (
        "training 434 steps = 2 epochs × 217 batches of 32 on train; evaluating every epoch (2 evaluations)")
    assert plan({"train": 200}, batch_size=32, max_steps=300, eval_every=100) == (
        "training 300 steps = 42.9 epochs × 7 batches of 32 on train; evaluating every 100 steps (3 evaluations)")
    assert plan({"train": 200}, batch_size=32, max_steps=300, eval_every=100, step=100).endswith(
        "(3 evaluations); resuming at step 100 (200 steps and 2 evaluations to go)")
    assert plan({"train": 200}, max_steps=10_000, eval_every=500) == (
        "training 10,000 steps = 10,000 epochs × 1 batch (all of train) on train; evaluating every 500 steps "
        "(20 evaluations)")
    assert plan({"train": 70}, batch_size=32, drop_last=True, max_epochs=1, eval_every=1) == (
        "training 2 steps = 1 epoch × 2 batches of 32 (drop_last) on train; evaluating every 1 step (2 evaluations)")
    phases = [{"split": "labelled", "epochs": 2}, {"split": "train", "epochs": 3}]
    vae = {"labelled": 50, "train": 100, "valid": 10}
    assert plan(vae, batch_size=16, phases=phases) == (
        "training 29 steps in 2 phases: 2 epochs × 4 batches of 16 on labelled, then 3 epochs × 7 batches of 16 on "
        "train; evaluating every epoch (5 evaluations)")
    assert plan(vae, batch_size=16, phases=phases, max_steps=10) == (
        "training 10 of the 29 steps of 2 phases (trainer.max_steps): 2 epochs × 4 batches of 16 on labelled, then "
        "0.3 epochs × 7 batches of 16 on train; evaluating every epoch (3 evaluations)")


def test_the_position_is_the_epoch_of_the_phase():
    tc = _trainer(batch_size=10, max_steps=20)
    single, _ = train_module._plan(tc, {"train": 100})
    assert [train_module._position(single, s) for s in (0, 14, 20)] == ["epoch 0.0/2", "epoch 1.4/2", "epoch 2.0/2"]
    full, _ = train_module._plan(_trainer(max_steps=500), {"train": 100})
    assert train_module._position(full, 42) == "epoch 42/500"
    tc = _trainer(batch_size=10, phases=[{"split": "labelled", "epochs": 2}, {"split": "train", "epochs": 3}])
    phases, _ = train_module._plan(tc, {"labelled": 40, "train": 100})
    assert [train_module._position(phases, s) for s in (0, 8, 13)] == [
        "phase 1/2 (labelled) epoch 0.0/2", "phase 1/2 (labelled) epoch 2.0/2", "phase 2/2 (train) epoch 0.5/3"]


def test_the_planned_evaluations_are_those_the_loop_makes(tmp_path):
    """The plan's count of evaluations (and the progress's ETA) and the loop use one rule: the history has a row at
    each planned step, here across a phase boundary and a trainer.max_steps that stops the last phase early."""
    overrides = ["trainer.batch_size=64", "trainer.max_epochs=null", "trainer.eval_every=null", "trainer.max_steps=10",
                 "+trainer.phases=[{split: train, epochs: 2}, {split: train, epochs: 2}]"]
    train_run(tmp_path, *TINY, *overrides)
    cfg = _compose(*TINY, *overrides)
    phases, max_steps = train_module._plan(cfg.trainer, {"train": 200})
    planned = train_module._evaluation_steps(phases, cfg.trainer.eval_every, max_steps)
    assert list(pd.read_csv(tmp_path / "run" / "history.csv")["step"]) == planned == [4, 8, 10]


@pytest.mark.slow
def test_cli_run_logs_to_the_console_and_train_log_without_bar_frames(tmp_path):
    """Output that is not a terminal gets no bar, even with trainer.progress (the default), but log lines: the
    expected length, a progress line at most every trainer.log_seconds (0: every step), every evaluation and the
    metrics table; the run directory's train.log holds the same lines as the console, each once. The run's record
    and its composed config are written."""
    data = [o for o in TINY if not o.startswith("trainer.progress")]
    run = run_cli(*data, "trainer.max_steps=20", "trainer.eval_every=10", "trainer.log_seconds=0",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["status"] == "completed"
    assert (tmp_path / "run" / ".hydra" / "config.yaml").exists()
    assert "\r" not in run.stdout + run.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert run.stdout == log
    messages = [line.split("] ", 1)[1] for line in log.splitlines()]
    assert messages[0] == (f"{tmp_path / 'run'}: training 20 steps = 20 epochs × 1 batch (all of train) on train; "
                           "evaluating every 10 steps (2 evaluations)")
    steps = [m.split(" · ")[0] for m in messages if m.startswith(("step ", "evaluation "))]
    assert steps == [*(f"step {s}/20" for s in range(1, 11)), "evaluation 1/2 at step 10/20",
                     *(f"step {s}/20" for s in range(11, 21)), "evaluation 2/2 at step 20/20"]
    line = next(m for m in messages if m.startswith("step 15/20"))
    assert re.fullmatch(r"step 15/20 · epoch 15/20 · loss [\d.]+ · valid/acc [\d.]+ \(step 10\) · "
                        r"[\d.]+ s/100 steps · elapsed \d\d:\d\d · ETA \d\d:\d\d", line), line
    assert re.search(r"evaluation 2/2 at step 20/20 · epoch 20/20 · train/loss [\d.]+ · valid/loss [\d.]+ · "
                     r"valid/acc [\d.]+ .* test/acc", log)
    assert messages[-9:-6] == [f"{tmp_path / 'run'}  (last evaluation, step 20)", "metric           value",
                               "---------------  -------"]
    assert messages[-2].startswith("test/acc")


@pytest.mark.slow
def test_cli_multirun_sweeps_into_deterministic_directories(tmp_path):
    args = (*TINY, "trainer.max_steps=4", "estimator=ste_i,spigot", f"paths.multirun_dir={tmp_path}")
    result = run_cli("-m", *args, "hydra.sweep.dir=" + str(tmp_path / "sweep"), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    runs = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/metrics.json"))
    assert len(runs) == 2 and all("estimator=" in r for r in runs)
    for run in runs:  # each job's train.log holds that job's lines
        log = (tmp_path / "sweep" / run / "train.log").read_text()
        assert f"{run}: training 4 steps" in log and "test/acc" in log and log.count("training") == 1


def test_run_cli_puts_back_what_a_run_changes(tmp_path):
    """tests.helpers.run_cli runs the command line in the test process: the directory, arguments, environment,
    Hydra's global state and the logging configuration are as before it."""
    from hydra.core.global_hydra import GlobalHydra

    def state():
        loggers = [logging.getLogger(), logging.getLogger("latentstruct")]
        return os.getcwd(), sys.argv[:], dict(os.environ), [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]

    before = state()
    done = run_cli(*TINY, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                   env={**os.environ, "SOMETHING_ELSE": "1"})
    assert done.returncode == 0 and "test/acc" in done.stdout, done.stderr
    assert (tmp_path / "run" / "train.log").read_text() == done.stdout  # Hydra's logging, to the captured console
    assert state() == before and not GlobalHydra.instance().is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize("typo", ["trainer.max_step=10", "+trainer.max_step=10"])
def test_cli_refuses_an_unknown_key_with_or_without_plus(tmp_path, typo):
    """Hydra's own answer to the first is "To append to your config use +trainer.max_step=10", and it accepted the
    second: the run trained its full length."""
    result = run_cli(typo, "trainer.max_steps=1", f"hydra.run.dir={tmp_path}", cwd=ROOT)
    assert result.returncode == 2
    assert "unknown key 'trainer.max_step'; did you mean trainer.max_steps" in result.stderr
    assert "To append" not in result.stderr and not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("launcher", ["joblib", "submitit_slurm"])
def test_launchers_compose(launcher):
    cfg = _compose(f"hydra/launcher={launcher}", hydra=True)
    assert launcher.split("_")[0] in cfg.hydra.launcher._target_.lower()


def test_csv_logger_keeps_every_metric_under_one_header(tmp_path):
    train_run(tmp_path, *TINY, "logger=csv", "trainer.max_steps=20", "trainer.log_every=5", "trainer.eval_every=10")
    log = pd.read_csv(tmp_path / "run" / "train_log.csv")
    assert list(log.columns) == ["step", "metric", "value"]
    assert set(log.loc[log.step == 5, "metric"]) == {"train/loss"}
    assert {"train/loss", "valid/acc", "test/v_measure"} <= set(log.loc[log.step == 20, "metric"])


def test_wandb_logger_runs_without_network(tmp_path):
    record = train_run(tmp_path, *TINY, "logger=wandb", "logger.mode=disabled", "trainer.max_steps=4",
                       "trainer.log_every=2")
    assert record["status"] == "completed"
    assert _compose("logger=wandb").logger.mode == "offline"  # the default never touches the network


def test_resume_refuses_a_checkpoint_of_another_configuration(tmp_path, monkeypatch):
    train_run(tmp_path, *TINY, "trainer.max_steps=20", "trainer.eval_every=10")
    (tmp_path / "run" / "metrics.json").unlink()  # as if killed after the last checkpoint
    with pytest.raises(ValueError, match="optim.lr"):
        train_run(tmp_path, *TINY, "trainer.max_steps=20", "trainer.eval_every=10", "trainer.resume=true",
                  "optim.lr=0.5")
    # Extending the run is a resumption of the same run.
    record = train_run(tmp_path, *TINY, "trainer.max_steps=30", "trainer.eval_every=10", "trainer.resume=true")
    assert record["steps"] == 30


def test_resume_compares_flat_configs_where_an_empty_group_gives_no_key(tmp_path):
    """records.flatten (train, tables, the ListOps report): an empty dict gives no key, so a checkpoint written before
    an empty-by-default group existed (``optim_groups``, ``tuned``) still resumes, and a setting inside it counts."""
    assert flatten({"a": {"b": 1, "c": {}}, "d": [2], "e": {"f": {"g": None}}}) == {"a.b": 1, "d": [2], "e.f.g": None}
    config = OmegaConf.to_container(_compose())
    assert config["optim_groups"] == {} and config["tuned"] == {}
    before = {k: v for k, v in config.items() if k not in ("optim_groups", "tuned")}
    train_module._check_same_run(before, config, tmp_path / "checkpoint.pt")  # the same run
    grouped = {**config, "optim_groups": {"sigma": {"lr": 0.1}}}
    with pytest.raises(ValueError, match=r"optim_groups\.sigma\.lr: \(absent\) → 0\.1"):
        train_module._check_same_run(config, grouped, tmp_path / "checkpoint.pt")
    moved = {**config, "trainer": {**config["trainer"], "progress": False, "max_steps": 99}}
    train_module._check_same_run(config, moved, tmp_path / "checkpoint.pt")  # how it runs, how long: the same run
    threads = {**config, "trainer": {**config["trainer"], "threads": 3}}
    with pytest.raises(ValueError, match=r"trainer\.threads: 1 → 3"):  # the sums depend on it
        train_module._check_same_run(config, threads, tmp_path / "checkpoint.pt")


def test_best_is_selected_among_the_evaluations_of_the_last_phase(tmp_path, monkeypatch):
    """trainer.select=best never reports an evaluation of an earlier phase (e.g. pretraining), however good."""
    scores = iter([90.0, 10.0, 30.0, 20.0])  # one evaluation per epoch: phase 0 (2 epochs), then phase 1 (2)

    def fake(self, splits, batch_size=None):
        acc = next(scores)
        return {name: {"acc": acc} for name in splits}

    monkeypatch.setattr(Task, "evaluate_splits", fake)
    record = train_run(tmp_path, *TINY, "trainer.batch_size=100", "trainer.max_epochs=null", "trainer.eval_every=null",
                  "trainer.select=best",
                  "+trainer.phases=[{split: train, epochs: 2}, {split: train, epochs: 2}]")
    assert record["metrics"]["valid/acc"] == 30.0 and record["best_step"] == 6


def test_seconds_per_epoch_times_the_last_phase_only(tmp_path, monkeypatch):
    """With trainer.phases, seconds_per_epoch is an epoch of the last phase (the method), not an average that
    includes the steps of earlier phases (e.g. a pretraining of another cost). A fake clock: a step of phase 0
    takes 10 s, one of phase 1 takes 1 s, nothing else takes time."""
    clock = [0.0]
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: clock[0], process_time=lambda: 0.0))

    def tick(self, phase, step):
        clock[0] += 10.0 if phase == 0 else 1.0

    monkeypatch.setattr(Task, "begin_step", tick)
    record = train_run(tmp_path, *TINY, "trainer.batch_size=100", "trainer.max_epochs=null", "trainer.eval_every=null",
                  "+trainer.phases=[{split: train, epochs: 2}, {split: train, epochs: 2}]")
    assert record["seconds_per_step"] == 5.5  # (4 × 10 + 4 × 1) / 8
    assert record["seconds_per_epoch"] == 2.0  # 2 steps per epoch of phase 1


@pytest.mark.parametrize("estimator", ["blackbox", "imle", "perturbed", "sfe_rloo"])
def test_the_map_oracle_estimators_and_rloo_train_on_the_synthetic_task(tmp_path, estimator):
    """Issue #21's estimators end to end: a few steps of the default synthetic task, each with its settings set."""
    settings = {"blackbox": ["task.estimator.lam=5"], "imle": ["task.estimator.samples=2", "task.estimator.noise_k=1"],
                "perturbed": ["task.estimator.sigma=0.5", "task.estimator.samples=3"],
                "sfe_rloo": ["task.estimator.samples=3"]}
    record = train_run(tmp_path, *TINY, f"estimator={estimator}", *settings[estimator], "trainer.max_steps=4",
                  "trainer.eval_every=2")
    assert record["status"] == "completed"
    assert set(record["metrics"]) >= {"valid/acc", "test/acc"}

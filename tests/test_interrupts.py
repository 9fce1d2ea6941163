"""Runs that stop early (issue #20): stop signals save a checkpoint at the current step and resume bit-exactly,
periodic checkpoints between evaluations, a submitit job that is preempted requeues itself and resumes, and a
non-finite value fails the run in one line naming it (latentstruct/guards.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import latentstruct.train as train_module
from latentstruct.guards import Interrupted, NonFinite
from latentstruct.records import MACHINE_COLUMNS
from tests.helpers import ROOT, run_cli, train_run
from tests.test_train import TINY

# a stochastic estimator, mini-batches of 64 of 200 (4 per epoch), evaluations every 10 steps: a stop at step 13 is
# mid-epoch and between evaluations, so resuming needs the RNG, the data order and the loss since the evaluation
COMMON = [*TINY, "trainer.max_steps=30", "trainer.eval_every=10", "estimator=sfe", "trainer.batch_size=64"]


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """The uninterrupted COMMON run, once for the tests that stop and resume it: its directory."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    train_run(folder, *COMMON, name="full")
    return folder / "full"


def _history(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "history.csv").drop(columns=list(MACHINE_COLUMNS))


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def _at_step(monkeypatch, step: int, act) -> None:
    """Call ``act()`` when the model begins training step ``step`` (0-based) of the next run."""
    build = train_module.build_model

    def build_and_watch(*args, **kwargs):
        model = build(*args, **kwargs)
        begin = model.begin_step

        def begin_step(phase, in_phase):
            if in_phase == step:
                act()
            begin(phase, in_phase)

        model.begin_step = begin_step
        return model

    monkeypatch.setattr(train_module, "build_model", build_and_watch)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_checkpoints_the_step_and_the_next_run_resumes_bit_exactly(tmp_path, monkeypatch, signum, full):
    with monkeypatch.context() as m:
        _at_step(m, 12, lambda: os.kill(os.getpid(), signum))  # noted during step 13, acted on before step 14
        with pytest.raises(Interrupted) as stopped:
            train_run(tmp_path, *COMMON, name="stopped")
    assert stopped.value.step == 13 and stopped.value.signum == signum
    record = _record(tmp_path / "stopped")
    assert record["status"] == "interrupted" and record["step"] == 13
    assert record["signal"] == signal.Signals(signum).name
    assert torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=False)["step"] == 13
    assert signal.getsignal(signum) is not None  # the handlers of before are back (pytest's SIGINT handler too)
    resumed = train_run(tmp_path, *COMMON, name="stopped")  # no trainer.resume: an interrupted run goes on by itself
    assert resumed["metrics"] == _record(full)["metrics"] and resumed["steps"] == 30
    pd.testing.assert_frame_equal(_history(full), _history(tmp_path / "stopped"))


@pytest.mark.cuda
def test_on_cuda_a_stopped_run_resumes_to_the_history_of_an_uninterrupted_one(tmp_path, monkeypatch):
    """The same stop and resumption on the GPU (the checkpoint holds the CUDA generators' states too): bit-exact, as
    on the CPU, for this task's operations (linear layers, a categorical latent, SFE's draws on the device)."""
    on_gpu = [*COMMON, "trainer.device=cuda"]
    full = train_run(tmp_path, *on_gpu, name="full")
    with monkeypatch.context() as m:
        _at_step(m, 12, lambda: os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(Interrupted):
            train_run(tmp_path, *on_gpu, name="stopped")
    assert _record(tmp_path / "stopped")["hardware"] == full["hardware"] != "cpu"
    resumed = train_run(tmp_path, *on_gpu, name="stopped")
    assert resumed["metrics"] == full["metrics"] and resumed["steps"] == 30
    pd.testing.assert_frame_equal(_history(tmp_path / "full"), _history(tmp_path / "stopped"), check_exact=True)


def test_checkpoint_every_lets_a_killed_run_resume_between_evaluations(tmp_path, monkeypatch, full):
    steps_seen = []
    real_save = train_module.save_checkpoint

    def save(path, state):
        steps_seen.append(state["step"])
        real_save(path, state)

    def crash():
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as m:
        m.setattr(train_module, "save_checkpoint", save)
        _at_step(m, 17, crash)
        with pytest.raises(KeyboardInterrupt):
            train_run(tmp_path, *COMMON, "trainer.checkpoint_every=3", name="killed")
    assert steps_seen == [3, 6, 9, 10, 12, 15]  # every 3 steps, and at the evaluation of step 10
    assert _record(tmp_path / "killed")["status"] == "failed"
    resumed = train_run(tmp_path, *COMMON, "trainer.resume=true", name="killed")  # from step 15
    assert resumed["metrics"] == _record(full)["metrics"]
    pd.testing.assert_frame_equal(_history(full), _history(tmp_path / "killed"))


def test_a_signal_before_the_loop_stops_at_step_zero_and_one_after_it_is_raised_again(tmp_path, monkeypatch):
    real_build = train_module.build_model

    def build_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)
        return real_build(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(train_module, "build_model", build_then_signal)
        with pytest.raises(Interrupted):
            train_run(tmp_path, *TINY, "trainer.max_steps=5")
    assert _record(tmp_path / "run")["step"] == 0
    # a completed run skipped while a signal comes: the signal is handed on once the run is left
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: got.append(a[0]))
    try:
        real_read = train_module.read_record

        def read_then_signal(path):
            os.kill(os.getpid(), signal.SIGUSR1)
            return real_read(path)

        train_run(tmp_path, *TINY, "trainer.max_steps=5")
        with monkeypatch.context() as m:
            m.setattr(train_module, "read_record", read_then_signal)
            assert train_run(tmp_path, *TINY, "trainer.max_steps=5")["status"] == "completed"
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert got == [signal.SIGUSR1]


def _cli(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "latentstruct.train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, text: str = "", timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not show {text!r} in {timeout} s")


@pytest.mark.slow
def test_cli_sigterm_exits_143_with_an_interrupted_record_and_the_rerun_finishes(tmp_path):
    args = [*TINY, "trainer.log_seconds=null", f"hydra.run.dir={tmp_path}"]
    proc = _cli(*args, "trainer.max_steps=1000000")
    _wait_for(tmp_path / "train.log", "training 1,000,000 steps")
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, output
    record = _record(tmp_path)
    assert record["status"] == "interrupted" and record["step"] > 0 and "Traceback" not in output
    assert f"stopped by SIGTERM at step {record['step']:,}" in (tmp_path / "train.log").read_text()
    again = run_cli(*args, f"trainer.max_steps={record['step'] + 5}", cwd=ROOT)  # the rerun needs no process of its own
    assert again.returncode == 0, again.stdout + again.stderr
    assert _record(tmp_path)["steps"] == record["step"] + 5
    assert f"resumed {tmp_path} at step {record['step']}" in (tmp_path / "train.log").read_text()


# Imported by every Python process of the test's sweep (PYTHONPATH): the job's k-th launch pauses at the k-th of the
# comma-separated points — before its training loop (when the task is given its training data) or when it begins a
# chosen step — writes "paused-k" with its pid, and waits for the test's "go-k"; so the signal reaches it at that
# point, whatever the load. A launch after the last point never pauses. (A launch is the first of the job's processes
# that reaches a point; the sweep's other processes never train.)
_GATE = """
import os, pathlib, time
gate = os.environ.get("LATENTSTRUCT_TEST_GATE")
if gate:
    import latentstruct.tasks.base as base
    folder, points = pathlib.Path(gate), os.environ["LATENTSTRUCT_TEST_GATE_AT"].split(",")
    launch = []

    def pause_at(point):
        if not launch:  # this process's launch: the first point not yet passed
            launch.append(next((k for k in range(len(points)) if not (folder / f"go-{k}").exists()), None))
        k = launch[0]
        if k is None or points[k] != point:
            return
        (folder / f"paused-{k}").write_text(str(os.getpid()))
        while not (folder / f"go-{k}").exists():
            time.sleep(0.02)

    use = base.Task.use_training_data
    def use_training_data(self, *args, **kwargs):
        pause_at("before")
        return use(self, *args, **kwargs)
    base.Task.use_training_data = use_training_data

    begin = base.Task.begin_step
    def begin_step(self, phase, step):
        pause_at(str(step))
        return begin(self, phase, step)
    base.Task.begin_step = begin_step
"""


REQUEUE = ["trainer.max_steps=60", "trainer.eval_every=20", "estimator=sfe", "trainer.batch_size=64"]


@pytest.mark.slow
def test_submitit_local_requeues_a_job_preempted_twice_which_resumes_each_time(tmp_path):
    """The submitit launcher, executing locally: the job is sent submitit's preemption signal (USR2, what its
    SLURM jobs get before a preemption or the time limit) before its first step, and again mid-run after its requeue
    (at chosen points, see _GATE); each time it checkpoints, hands the signal to submitit, which requeues it, and the
    requeued job resumes from the step it stopped at; it completes with the metrics of an uninterrupted run (the same
    threads: one). One sweep for both preemptions: each launch is a process that imports torch and Hydra."""
    sweep, gate = tmp_path / "sweep", tmp_path / "gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(_GATE)
    env = {"LATENTSTRUCT_TEST_GATE": str(gate), "LATENTSTRUCT_TEST_GATE_AT": "before,30",
           "PYTHONPATH": os.pathsep.join([str(gate), str(ROOT)])}
    proc = _cli("-m", *TINY, *REQUEUE, "trainer.seed=301", "hydra/launcher=submitit_local",
                "hydra.launcher.timeout_min=60", f"hydra.sweep.dir={sweep}", f"paths.multirun_dir={tmp_path}", env=env)
    try:
        for k in range(2):  # however long the job takes to get there on a loaded machine, unless the sweep ends first
            end = time.monotonic() + 1800
            while not (gate / f"paused-{k}").exists():
                assert proc.poll() is None, f"the sweep ended before its launch {k} paused: {proc.communicate()[0]}"
                assert time.monotonic() < end, f"launch {k} never reached its pause in 30 minutes"
                time.sleep(0.05)
            os.kill(int((gate / f"paused-{k}").read_text()), signal.SIGUSR2)
            time.sleep(0.2)  # the handler runs at once; the step goes on when the gate opens
            (gate / f"go-{k}").write_text("")
    finally:
        for k in range(2):
            (gate / f"go-{k}").write_text("")
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output
    (job,) = {p.parent for p in sweep.glob("*/metrics.json")}
    log = (job / "train.log").read_text()
    for stopped_at in (0, 31):
        assert f"stopped by SIGUSR2 at step {stopped_at}" in log and f"resumed {job} at step {stopped_at}" in log
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*")).splitlines()
    assert sum(line.startswith("submitit") and "Requeued job" in line for line in logs) == 2  # its own log lines
    reference = train_run(tmp_path / "reference", *TINY, *REQUEUE, name="uninterrupted")  # in-process, one thread
    assert _record(job)["status"] == "completed" and _record(job)["steps"] == 60
    assert _record(job)["threads"]["intra_op"] == reference["threads"]["intra_op"] == 1
    assert _record(job)["metrics"] == reference["metrics"]


def _nan_at(monkeypatch, step: int, module_name: str) -> None:
    """From training step ``step`` on, the output of the model's submodule ``module_name`` is NaN."""
    build = train_module.build_model

    def build_and_break(*args, **kwargs):
        model = build(*args, **kwargs)
        seen = {"n": 0}
        module = model.get_submodule(module_name)

        def count(*_):
            seen["n"] += model.training

        def nan(mod, inputs, output):
            return output * float("nan") if model.training and seen["n"] > step else output

        module.register_forward_pre_hook(count)
        module.register_forward_hook(nan)
        return model

    monkeypatch.setattr(train_module, "build_model", build_and_break)


def test_the_run_exceptions_cross_a_process_boundary_whole():
    """A sweep's job that fails comes back to Hydra's launcher pickled (joblib's worker processes): NonFinite's
    unpickling raised TypeError, which broke joblib's pool and lost every other job of the launch (the lab matrix's
    top-k grid: 63 of 64 runs never ran after one diverged). Both come back with their message and fields;
    Interrupted without the signal handler it held, which belongs to the process it was raised in."""
    import pickle

    bad = pickle.loads(pickle.dumps(NonFinite(7, "the gradient of scorer.weight", "seen at step 9")))
    assert (bad.step, bad.tensor, str(bad)) == (7, "the gradient of scorer.weight",
                                                "non-finite value at step 7: the gradient of scorer.weight "
                                                "(seen at step 9)")
    stop = pickle.loads(pickle.dumps(Interrupted(signal.SIGTERM, 12, previous=lambda *_: None)))
    assert (stop.signum, stop.step, stop.previous, str(stop)) == (signal.SIGTERM, 12, None,
                                                                  "interrupted by SIGTERM at step 12")


def test_nan_inputs_fail_with_one_line_naming_them(tmp_path, monkeypatch):
    """(``dataset.noise=nan``, the issue's example, is refused at composition now: NaN is out of every range.)"""
    real = train_module.instantiate

    def instantiate_with_a_nan(cfg, *args, **kwargs):
        made = real(cfg, *args, **kwargs)
        if hasattr(made, "splits"):
            made.splits["train"]["x"][3, 1] = float("nan")
        return made

    monkeypatch.setattr(train_module, "instantiate", instantiate_with_a_nan)
    with pytest.raises(NonFinite, match=r"non-finite value at step 1: input 'x' of the batch \(1 NaN of"):
        train_run(tmp_path, *TINY, "trainer.max_steps=5", "trainer.batch_size=null")
    record = _record(tmp_path / "run")
    assert record["status"] == "failed" and record["reason"] == "non_finite" and record["step"] == 1
    assert "\n" not in record["error"] and "configuration:" in record["error"]


def test_nan_scores_fail_naming_the_module_that_made_them(tmp_path, monkeypatch):
    _nan_at(monkeypatch, 3, "scorer")
    with pytest.raises(NonFinite, match=r"step 4: output of scorer \(\w+\)"):
        train_run(tmp_path, *TINY, "trainer.max_steps=10")
    assert _record(tmp_path / "run")["tensor"].startswith("output of scorer")


def test_a_non_finite_gradient_fails_naming_the_parameter(tmp_path, monkeypatch):
    build = train_module.build_model

    def build_with_bad_gradient(*args, **kwargs):
        model = build(*args, **kwargs)
        name, param = next((n, p) for n, p in model.named_parameters() if p.requires_grad)
        param.register_hook(lambda g: g * float("inf"))
        model._bad = name
        return model

    monkeypatch.setattr(train_module, "build_model", build_with_bad_gradient)
    with pytest.raises(NonFinite, match=r"step 1: the gradient of \S+ \(.*inf"):
        train_run(tmp_path, *TINY, "trainer.max_steps=10")
    assert _record(tmp_path / "run")["reason"] == "non_finite"


@pytest.mark.slow
def test_cli_non_finite_single_run_says_one_line_and_exits_1(tmp_path):
    """A temperature so small that the relaxed scores overflow (inf - inf = NaN in the softmax)."""
    overrides = ["estimator=gumbel_softmax", "task.estimator.tau=1e-45"]
    proc = run_cli(*TINY, *overrides, "trainer.max_steps=5", f"hydra.run.dir={tmp_path}", cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1
    lines = [line for line in output.splitlines() if "non-finite" in line]
    assert len(lines) == 1 and "output of estimator (GumbelSoftmax)" in lines[0], output
    assert " ".join(overrides) in lines[0] and "Traceback" not in output

"""Claims (latentstruct.records.claim): one run directory is run by one process at a time, and a claim left by a
killed process is taken over; two launchers on one sweep run every run exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from latentstruct.records import CLAIM, claim
from latentstruct.train import train
from tests.helpers import ROOT
from tests.helpers import compose as _compose

_HOLD = "from latentstruct.records import claim; import sys, time; c = claim(sys.argv[1]); c.__enter__(); " \
        "print('held', flush=True); time.sleep(120)"


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process that claims ``run_dir`` and holds it."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_claimed_run_is_not_claimed_again_and_the_claim_goes_with_the_block(tmp_path):
    with claim(tmp_path / "run") as first:
        assert first and first.holder is None
        with claim(tmp_path / "run") as second:  # another open file: refused even in the same process
            assert not second and second.holder["pid"] == os.getpid()
    assert not (tmp_path / "run" / CLAIM).exists()
    with claim(tmp_path / "run") as again:
        assert again and again.holder is None


def test_a_claim_of_a_killed_process_is_taken_over(tmp_path):
    proc = _holder(tmp_path / "run")
    try:
        with claim(tmp_path / "run") as mine:
            assert not mine and mine.holder["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / "run" / CLAIM).exists()  # killed: it could not remove its claim
    with claim(tmp_path / "run") as mine:
        assert mine and mine.holder["pid"] == proc.pid  # the stale claim, taken over


def test_train_skips_a_run_another_process_is_running(tmp_path, caplog):
    cfg = _compose("trainer.max_steps=5", "trainer.progress=false", f"paths.output_dir={tmp_path / 'run'}")
    proc = _holder(tmp_path / "run")
    try:
        with caplog.at_level("INFO", logger="latentstruct"):
            record = train(cfg)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert record == {"status": "in_progress", "claimed_by": record["claimed_by"]} and \
        record["claimed_by"]["pid"] == proc.pid
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert f"is being run by pid {proc.pid} on host" in caplog.text
    assert train(cfg)["status"] == "completed"  # the holder is gone: the run is ours
    assert not (tmp_path / "run" / CLAIM).exists()


@pytest.mark.slow
def test_two_launchers_on_one_sweep_run_every_run_exactly_once(tmp_path):
    # Started together, both launchers reach run 1 at once: without claims both would train it.
    sweep = [sys.executable, "-m", "latentstruct.train", "-m", "trainer.seed=1,2,3,4", "trainer.max_steps=100",
             "dataset.n_train=200", "dataset.n_valid=100", "dataset.n_test=100", "trainer.threads=1",
             "trainer.progress=false", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=${trainer.seed}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launchers = [subprocess.Popen(sweep, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in launchers]
    assert [p.returncode for p in launchers] == [0, 0], outputs
    trained = {seed: (tmp_path / "sweep" / str(seed) / "train.log").read_text().count(": training 100 steps")
               for seed in (1, 2, 3, 4)}
    assert trained == {1: 1, 2: 1, 3: 1, 4: 1}, outputs
    skipped = "".join(outputs).count("is being run by") + "".join(outputs).count("already completed; skipping")
    assert skipped == 4  # the other launcher's turn at each run

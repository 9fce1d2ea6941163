"""scripts/carry.py: a table's runs packed within the device tool's limits and unpacked here, and a sweep stopped at
its deadline that resumes from the checkpoint that came back (the GPU runbook's loop, on the CPU, with a tiny sweep)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from latentstruct.records import FINAL_WEIGHTS
from latentstruct.train import train
from scripts import carry
from tests.helpers import alive, compose

MIB_10 = 10 * carry.MIB


def _run(sweep: Path, name: str, status: str | None, step: int | None = None, ckpt: int | bytes | None = None,
         seed: int = 301, experiment: str = "sst_spigot") -> Path:
    """A fake run directory: its record, its config's seed and experiment, and a checkpoint: ``ckpt`` random bytes,
    these bytes, or a real torch checkpoint for b"torch"."""
    run = sweep / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"seed": seed}}))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": {
        "experiment": experiment}}}}))
    if status is not None:
        record = {"status": status, **({"step": step} if status != "completed" else {"steps": step, "metrics": {}})}
        (run / "metrics.json").write_text(json.dumps(record))
    (run / "train.log").write_text(f"{name}\n")
    if ckpt == b"torch":
        torch.save({"model": {"w": torch.arange(4.0)}, "optimizer": {"state": list(range(100))}, "step": step,
                    "config": {"seed": seed}, "history": [], "rng": {}}, run / carry.CHECKPOINT)
    elif ckpt is not None:
        (run / carry.CHECKPOINT).write_bytes(ckpt if isinstance(ckpt, bytes) else os.urandom(ckpt))
    return run


def test_pack_takes_the_records_and_what_fits_and_unpack_puts_them_back(tmp_path):
    table, sweep = "spigot/table3_sst", tmp_path / "device" / "spigot_sst"  # its sweep directory under --runs
    _run(sweep, "drawn", "completed", 8680, b"torch")  # seed 301 of a row the trees step draws: its final weights
    _run(sweep, "far", "interrupted", 80, 3000)
    _run(sweep, "near", "interrupted", 50, 3000)
    _run(sweep, "big", "interrupted", 70, 40000)  # does not fit
    _run(sweep, "other_seed", "completed", 8680, 5000, seed=302)  # no report step reads it
    _run(sweep, "killed", None, None, 100)  # killed outright: a checkpoint, no record
    (sweep / "far" / "claim.json").write_text("{}")
    (sweep / "far" / ".metrics.json.x1y2").write_text("half")
    out = tmp_path / "out"
    (tmp_path / "session").write_text("the device's log\n")
    manifest = carry.pack(table, tmp_path / "device", out, files=5, part_bytes=8192, log_file=tmp_path / "session",
                          log=lambda _: None)
    fates = {rel: v["checkpoint"] for rel, v in manifest["runs"].items()}
    assert fates == {"drawn": "final weights", "far": "checkpoint", "near": "checkpoint", "big": "left behind",
                     "other_seed": None, "killed": "checkpoint"}
    parts = sorted(out.glob("checkpoints.tar.*"))
    assert [p.name for p in parts] == manifest["parts"] and 1 < len(parts) <= 4
    assert all(p.stat().st_size <= 8192 for p in parts)

    local = tmp_path / "local"
    _run(local / "spigot_sst", "other_seed", "completed", 8680, b"mine")  # completed here: never replaced
    assert carry.unpack(out, local, log=lambda _: None) == manifest
    here = local / "spigot_sst"
    for name in ("far", "near", "killed"):
        assert (here / name / "checkpoint.pt").read_bytes() == (sweep / name / "checkpoint.pt").read_bytes()
    assert json.loads((here / "far" / "metrics.json").read_text())["step"] == 80
    assert not (here / "far" / "claim.json").exists() and not list((here / "far").glob(".metrics.json.*"))
    assert (here / "big" / "train.log").is_file() and not (here / "big" / "checkpoint.pt").exists()
    assert (here / "other_seed" / "checkpoint.pt").read_bytes() == b"mine"
    (log,) = (local / "device_logs").glob("spigot-table3_sst_*.log")
    assert log.read_text() == "the device's log\n"
    weights = torch.load(here / "drawn" / "checkpoint.pt", weights_only=False)
    assert weights[FINAL_WEIGHTS] and "optimizer" not in weights and torch.equal(weights["model"]["w"],
                                                                                 torch.arange(4.0))


def test_pack_records_keeps_an_ablations_records_without_checkpoints_and_unpack_restores_them(tmp_path):
    root = tmp_path / "campaign"
    where = root / "ablations" / "probe"  # runs of no table's sweep
    _run(where, "interior-301", "completed", 8680, 3000)
    _run(where, "zero-301", "interrupted", 40, 3000)
    (where / "interior-301.out").write_text("stdout\n")
    manifest = carry.pack_records("t:ablation", where, root, tmp_path / "state", log=lambda _: None)
    assert manifest["sweep"] == "ablations/probe" and manifest["parts"] == []
    assert {rel: v["status"] for rel, v in manifest["runs"].items()} == {"interior-301": "completed",
                                                                         "zero-301": "interrupted"}
    fresh = tmp_path / "fresh"
    carry.unpack(tmp_path / "state", fresh, log=lambda _: None)
    back = fresh / "ablations" / "probe"
    assert json.loads((back / "interior-301" / "metrics.json").read_text())["status"] == "completed"
    assert (back / "interior-301.out").read_text() == "stdout\n"
    assert not list(back.rglob(carry.CHECKPOINT))


def test_unpack_leaves_alone_a_run_that_a_live_process_is_running_here(tmp_path):
    from latentstruct.records import claim

    packed = tmp_path / "there" / "spigot_sst"
    _run(packed, "busy", "interrupted", 10)
    _run(packed, "idle", "interrupted", 10)
    out = tmp_path / "out"
    carry.pack_records("t", packed, tmp_path / "there", out, log=lambda _: None)
    here = tmp_path / "here" / "spigot_sst"
    for name in ("busy", "idle"):
        (here / name).mkdir(parents=True)
        (here / name / "train.log").write_text("newer lines\n")
    lines = []
    with claim(here / "busy"):
        carry.unpack(out, tmp_path / "here", log=lines.append)
    assert (here / "busy" / "train.log").read_text() == "newer lines\n"  # its process writes it
    assert (here / "idle" / "train.log").read_text() == "idle\n"
    assert any("left busy alone" in line for line in lines)


def test_unpack_drops_an_older_checkpoint_of_a_run_that_finished_on_the_device(tmp_path):
    sweep = tmp_path / "device" / "spigot_table2"
    _run(sweep, "done", "completed", 100, 10)
    carry.pack("spigot/table2", tmp_path / "device", tmp_path / "out", log=lambda _: None)
    _run(tmp_path / "local" / "spigot_table2", "done", "interrupted", 40, 10)  # staged there at step 40
    carry.unpack(tmp_path / "out", tmp_path / "local", log=lambda _: None)
    run = tmp_path / "local" / "spigot_table2" / "done"
    assert json.loads((run / "metrics.json").read_text())["status"] == "completed"
    assert not (run / "checkpoint.pt").exists()


# a run: its claim held while it runs, SIGTERM noted and acted on after a checkpoint; and a launcher worker that
# ignores SIGTERM (a straggler the deadline kills)
_CHILD = """
import fcntl, os, pathlib, signal, subprocess, sys, time
root = pathlib.Path(sys.argv[1])
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
straggler = subprocess.Popen([sys.executable, "-c", deaf])
(root / "straggler.pid").write_text(str(straggler.pid))
stopping = []
signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
(root / "run").mkdir()
fd = os.open(root / "run" / "claim.json", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
while not stopping:
    time.sleep(0.05)
(root / "run" / "metrics.json").write_text('{"status": "interrupted"}')
os.unlink(root / "run" / "claim.json")
sys.exit(143)
"""


@contextlib.contextmanager
def _stop_when_claimed(root: Path, where: str, saved: bool = False):
    """Send this process SIGTERM (run_until's stop) once a run under ``root`` whose path holds ``where`` is claimed
    (and, with ``saved``, has written a checkpoint); until the block ends SIGTERM does nothing else here, so that a
    late one cannot end the test session."""
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    done = threading.Event()

    def ready():
        return any(where in str(p) and (not saved or (p.parent / "checkpoint.pt").is_file())
                   for p in carry.held_claims(root))

    def watch():
        while not done.is_set() and not ready():
            time.sleep(0.05)
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield previous
    finally:
        done.set()
        thread.join()
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_reaches_the_runs_waits_for_their_checkpoints_then_kills_what_is_left(tmp_path):
    with _stop_when_claimed(tmp_path, "run"):
        handler = signal.getsignal(signal.SIGTERM)
        code = carry.run_until([sys.executable, "-c", _CHILD, str(tmp_path)], 600, tmp_path, grace=60,
                               log=lambda _: None)
        assert signal.getsignal(signal.SIGTERM) is handler  # run_until's own handler is gone
    assert code == 124
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["status"] == "interrupted"
    assert not carry.held_claims(tmp_path)
    straggler = int((tmp_path / "straggler.pid").read_text())
    for _ in range(600):  # SIGKILL was sent; its delivery takes a moment
        if not alive(straggler):
            break
        time.sleep(0.05)
    assert not alive(straggler)


def test_the_deadline_stops_a_command_that_would_not_end(tmp_path):
    code = carry.run_until([sys.executable, "-c", "import time; time.sleep(600)"], 0.5, tmp_path, grace=5,
                           log=lambda _: None)
    assert code == 124


@pytest.mark.slow
def test_a_sweep_stopped_on_the_device_resumes_here_from_the_checkpoint_that_came_back(tmp_path, caplog):
    """A two-run sweep (basic launcher): one run completes, the other is stopped by the deadline runner; its records
    and checkpoint are packed, unpacked elsewhere, and the run resumes there from its step."""
    device, local = tmp_path / "device", tmp_path / "local"
    args = ["+experiment=synthetic_spigot", "dataset.n_train=50", "dataset.n_valid=20", "dataset.n_test=20",
            "trainer.eval_every=50", "trainer.threads=1", "trainer.progress=false"]
    # a sweep over lengths names the length itself: the directory of a configuration leaves it out (issue 32)
    sweep = [*args, "trainer.max_steps=5,100000", f"hydra.sweep.dir={device / 'spigot_table2'}",
             "hydra.sweep.subdir='${run_name:${hydra.job.override_dirname}},max_steps=${trainer.max_steps}'"]
    cmd = [sys.executable, "-m", "latentstruct.train", "-m", *sweep]
    with _stop_when_claimed(device, "max_steps=100000", saved=True):  # after its first evaluation
        assert carry.run_until(cmd, 600, device, grace=120, log=lambda _: None) == 124
    carry.pack("spigot/table2", device, tmp_path / "out", log=lambda _: None)
    manifest = carry.unpack(tmp_path / "out", local, log=lambda _: None)
    short, long = (next(rel for rel in manifest["runs"] if f"max_steps={n}" in rel) for n in (5, 100000))
    assert manifest["runs"][short]["status"] == "completed"
    stopped = manifest["runs"][long]
    assert stopped["status"] == "interrupted" and stopped["checkpoint"] == "checkpoint" and stopped["step"] >= 50
    run = local / "spigot_table2" / long
    with caplog.at_level(logging.INFO, logger="latentstruct"):
        resumed = train(compose(*args, f"paths.output_dir='{run}'",
                                f"trainer.max_steps={stopped['step'] + 3}"))  # max_steps may change on resuming
    assert f"resumed {run} at step {stopped['step']}" in caplog.text
    assert resumed["status"] == "completed" and resumed["steps"] == stopped["step"] + 3
    history = pd.read_csv(run / "history.csv")
    assert history["step"].iloc[-1] == stopped["step"] + 3
    again = train(compose(*args, "trainer.max_steps=5", f"paths.output_dir='{local / 'spigot_table2' / short}'"))
    assert again == json.loads((local / "spigot_table2" / short / "metrics.json").read_text())  # skipped


@pytest.mark.parametrize("table,data", [("spigot/table3_sst", ["sst"]), ("spigot/table2", [])])
def test_the_carry_list_names_the_wheels_the_stamp_the_tables_data_and_its_state(table, data):
    paths = carry.carry_list(table)
    assert paths[:2] == [".device/wheels", ".device/commit.txt"]
    assert paths[2:-1] == [f".device/data/{d}" for d in data]
    assert paths[-1] == f".device/state/{table.replace('/', '-')}"


def test_stage_before_any_run_carries_no_state(tmp_path):
    said = []
    assert carry.stage("spigot/table2", tmp_path, tmp_path / "state", budget=MIB_10, log=said.append) == {}
    assert not (tmp_path / "state").exists()
    assert said[-1] == 'carry: [".device/wheels", ".device/commit.txt"]'


def test_the_cli_says_what_is_wrong_in_one_line(tmp_path, capsys):
    assert carry.main(["unpack", str(tmp_path), "--runs", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("error: no records.tar.gz in")
    assert carry.main(["pack", "spigot/table2", "--runs", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "no runs of spigot/table2" in capsys.readouterr().err


def test_the_deadline_cli_passes_the_command_through(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.carry", "deadline", "60", "--claims", str(tmp_path), "--",
                           sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr


def test_a_run_never_resumes_from_the_final_weights_packed_for_a_report(tmp_path, caplog):
    args = ["+experiment=synthetic_spigot", "dataset.n_train=50", "dataset.n_valid=20", "dataset.n_test=20",
            "trainer.max_steps=4", "trainer.progress=false", f"paths.output_dir={tmp_path}"]
    first = train(compose(*args))
    carry._final_weights(tmp_path / "checkpoint.pt", tmp_path / "checkpoint.pt")  # what pack sends back
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "interrupted", "step": 4}))
    with caplog.at_level(logging.INFO, logger="latentstruct"):
        again = train(compose(*args))
    assert "holds only the final weights of a finished run; starting over" in caplog.text
    assert again["metrics"] == first["metrics"] and again["steps"] == 4


def test_unpack_says_which_checkpoints_left_out_of_the_pack_are_here_and_which_are_lost(tmp_path):
    """A campaign packs no checkpoint (``files=1``): on its own machine they are there and the runs resume; on a
    fresh one they are not and the runs start over. The line says which, not "lost" for both."""
    sweep = tmp_path / "here" / "spigot_sst"
    _run(sweep, "stopped", "interrupted", 80, 3000)
    carry.pack("spigot/table3_sst", tmp_path / "here", tmp_path / "out", weights=False, files=1, log=lambda _: None)
    for root, fate in ((tmp_path / "here", "but here (they resume): stopped"),
                       (tmp_path / "fresh", "nor here (lost: they start over): stopped")):
        said = []
        carry.unpack(tmp_path / "out", root, log=said.append)
        assert said[-1].endswith(f"checkpoints not in the pack {fate}"), said[-1]

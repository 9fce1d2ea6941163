"""scripts/campaign.py: a table is pinned once to a clean commit with its protocol, its sweeps run at that commit's
code with the committed records restored first, and its records are saved without checkpoints unless asked for."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts import campaign
from tests.helpers import alive


@pytest.fixture
def places(tmp_path, monkeypatch):
    monkeypatch.setattr(campaign, "STATE", tmp_path / "state")
    monkeypatch.setenv("LATENTSTRUCT_CAMPAIGN", str(tmp_path / "campaign"))
    monkeypatch.setattr(campaign, "code_dir", lambda commit: tmp_path / "campaign" / f"code-{commit[:12]}")
    return tmp_path


def test_a_table_is_pinned_once_to_a_clean_commit_and_runs_its_code(places, monkeypatch):
    answers = {"status": "", "rev-parse": "a" * 40}
    monkeypatch.setattr(campaign, "_git", lambda *args, **kw: answers[args[0]])
    entry = campaign.start("spigot/table3_sst", "301", "embedding.freeze=false")
    assert entry["commit"] == "a" * 40 and campaign.plan("spigot/table3_sst") == entry
    with pytest.raises(SystemExit, match="pinned already"):
        campaign.start("spigot/table3_sst", "", "")
    argv, env, code = campaign.command("spigot/table3_sst", entry, jobs=2)
    assert code.name == "code-aaaaaaaaaaaa" and env["PYTHONPATH"] == str(code) and argv[:3] == ["nice", "-n", "10"]
    assert argv[argv.index("--args") + 1] == "embedding.freeze=false" and argv[argv.index("--jobs") + 1] == "2"
    answers["status"] = " M latentstruct/train.py"
    with pytest.raises(SystemExit, match="uncommitted"):
        campaign.start("spigot/table2", "", "")
    with pytest.raises(SystemExit, match="not started"):
        campaign.plan("spigot/table2")


def test_repin_retires_the_runs_and_records_and_pins_head_with_the_same_protocol(places, monkeypatch):
    """A table whose code changed: its run directories move to retired/ (not deleted), its committed records and
    checkpoints leave campaign/, and it is pinned to HEAD with its seeds and args; refused while it runs, at HEAD
    already, or on uncommitted code."""
    answers = {"status": "", "rev-parse": "a" * 40}
    monkeypatch.setattr(campaign, "_git", lambda *args, **kw: answers[args[0]])
    monkeypatch.setattr(campaign, "_running", lambda table: False)
    campaign.start("energy/ner", "301", "embedding.freeze=false")
    saved = campaign.state_dir("energy/ner")
    for name in (campaign.carry.RECORDS, "checkpoints.tar.000"):
        (saved / name).write_text("x")
    sweep = campaign.carry.sweep_dir("energy/ner", places / "campaign" / "runs")
    (sweep / "run-1").mkdir(parents=True)
    with pytest.raises(SystemExit, match="HEAD already"):
        campaign.repin("energy/ner")
    answers["rev-parse"] = "b" * 40
    monkeypatch.setattr(campaign, "_running", lambda table: True)
    with pytest.raises(SystemExit, match="is running"):
        campaign.repin("energy/ner")
    monkeypatch.setattr(campaign, "_running", lambda table: False)
    answers["status"] = " M latentstruct/tasks/energy.py"
    with pytest.raises(SystemExit, match="uncommitted"):
        campaign.repin("energy/ner")
    assert (sweep / "run-1").is_dir() and (saved / campaign.carry.RECORDS).is_file()  # refused: nothing moved
    answers["status"] = ""
    entry = campaign.repin("energy/ner")
    assert entry["commit"] == "b" * 40 and (entry["seeds"], entry["args"]) == ("301", "embedding.freeze=false")
    assert campaign.plan("energy/ner") == entry and sorted(p.name for p in saved.iterdir()) == ["plan.json"]
    assert not sweep.exists()
    assert (places / "campaign" / "retired" / f"{sweep.name}-{'a' * 12}" / "run-1").is_dir()


def test_save_packs_records_without_checkpoints(places, monkeypatch):
    (places / "state" / "spigot-table2").mkdir(parents=True)
    (places / "state" / "spigot-table2" / "plan.json").write_text(json.dumps({"table": "spigot/table2",
                                                                              "commit": "b" * 40}))
    calls = {}
    monkeypatch.setattr(campaign.carry, "pack", lambda table, runs, out, **kw: calls.update(kw) or {"runs": {}})
    assert campaign.save("spigot/table2")["commit"] == "b" * 40
    assert calls["weights"] is False and calls["files"] == 1  # no room for a checkpoint part
    campaign.save("spigot/table2", checkpoints_mib=20)  # two parts of ~16 MiB
    assert calls["weights"] is False and calls["files"] == 3


def test_saved_checkpoints_of_interrupted_runs_come_back_on_a_fresh_machine(places):
    """save --checkpoints packs an interrupted run's checkpoint beside the records; a fresh machine's run restores
    both, so the run resumes from its step (records alone: it would start over)."""
    state = places / "state" / "spigot-table2"
    state.mkdir(parents=True)
    (state / "plan.json").write_text(json.dumps({"table": "spigot/table2", "commit": "b" * 40}))
    runs = places / "campaign" / "runs"
    sweep = campaign.carry.sweep_dir("spigot/table2", runs)
    run = sweep / "+experiment=a,trainer.seed=301"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- +experiment=a\n- trainer.seed=301\n")
    (run / "metrics.json").write_text(json.dumps({"status": "interrupted", "step": 7}))
    (run / "checkpoint.pt").write_bytes(os.urandom(4096))
    campaign.save("spigot/table2")
    assert not list(state.glob("checkpoints.tar.*"))
    campaign.save("spigot/table2", checkpoints_mib=1)
    assert [p.name for p in state.glob("checkpoints.tar.*")] == ["checkpoints.tar.000"]
    saved = (run / "checkpoint.pt").read_bytes()
    shutil.rmtree(places / "campaign")  # a fresh machine
    campaign._restore("spigot/table2", runs)
    assert (run / "checkpoint.pt").read_bytes() == saved and json.loads((run / "metrics.json").read_text())["step"] == 7


def test_status_counts_the_completed_runs_of_the_committed_records(places, monkeypatch):
    import io
    import tarfile

    state = places / "state" / "spigot-table2"
    state.mkdir(parents=True)
    (state / "plan.json").write_text(json.dumps({"table": "spigot/table2", "commit": "c" * 40, "seeds": "",
                                                 "args": ""}))
    manifest = json.dumps({"runs": {"a": {"status": "completed"}, "b": {"status": "completed"},
                                    "c": {"status": None}}}).encode()
    with tarfile.open(state / campaign.carry.RECORDS, "w:gz") as tar:  # the manifest travels inside the pack
        info = tarfile.TarInfo(campaign.carry.PACK_JSON)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    monkeypatch.setattr(campaign, "_running", lambda table: False)
    (line,) = campaign.status()
    assert "2 completed in the committed records" in line and "not running" in line


def test_the_lab_matrix_runs_as_a_campaign_table(places, monkeypatch):
    monkeypatch.setattr(campaign, "_git", lambda *args, **kw: {"status": "", "rev-parse": "d" * 40}[args[0]])
    entry = campaign.start(campaign.carry.LAB_MATRIX, "", "")
    argv, env, code = campaign.command(campaign.carry.LAB_MATRIX, entry, jobs=2)
    assert argv[argv.index("-m") + 1] == "latentstruct.report.matrix" and "--only" not in argv
    assert env["PYTHONPATH"] == str(code) and argv[argv.index("--jobs") + 1] == "2"
    assert campaign.carry.sweep_dir(campaign.carry.LAB_MATRIX, "R").as_posix() == "R/lab_matrix_v2"


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no scheduler autogroups here")
def test_the_campaigns_session_is_niced_not_only_its_processes():
    """nice orders processes within one autogroup only; the campaign's own session gets the niceness too."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        campaign._nice_session(proc.pid)
        assert Path(f"/proc/{proc.pid}/autogroup").read_text().split()[-1] == str(campaign.NICE) == "10"
    finally:
        proc.kill()
        proc.wait()


_SWEEP = """
import fcntl, os, pathlib, signal, subprocess, sys, time
run = pathlib.Path(sys.argv[1]) / sys.argv[3]
deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "time.sleep(600)"])  # an idle launcher worker that ignores SIGTERM
(run.parent / f"{run.name}.deaf.pid").write_text(str(deaf.pid))
stopping = []
signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
run.mkdir()
fd = os.open(run / "claim.json", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
while not stopping:
    time.sleep(0.05)
(run / "metrics.json").write_text('{"status": "interrupted"}')  # its checkpoint and record, then the claim goes
os.unlink(run / "claim.json")
os.close(fd)
time.sleep(600)  # a sweep that would go on to its next run
"""


def test_stop_waits_for_the_runs_checkpoints_then_ends_the_whole_session(places, capsys):
    runs = places / "campaign" / "runs"
    runs.mkdir(parents=True)
    assert campaign.stop("spigot/table2", grace=60) == 0 and "is not running" in capsys.readouterr().out
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (places / "campaign" / "spigot-table2.pid").write_text(str(other.pid))  # a stale pid file: another program now
    assert campaign.stop("spigot/table2", grace=60) == 0 and "is not running" in capsys.readouterr().out
    assert other.poll() is None
    other.kill()
    other.wait()
    # the campaign's leader runs latentstruct.report.reproduce (or .matrix): so does this stand-in, by its argv
    sweep = campaign.carry.sweep_dir("spigot/table2", runs)
    sweep.mkdir(parents=True)
    # two sweeps of the table (a queue widened it): its pid file and the second's
    procs = [subprocess.Popen([sys.executable, "-c", _SWEEP, str(sweep), "latentstruct.report.reproduce", name,
                               "spigot/table2"], start_new_session=True) for name in ("run", "run2")]
    (places / "campaign" / "spigot-table2.pid").write_text(str(procs[0].pid))
    (places / "campaign" / "spigot-table2.2.pid").write_text(str(procs[1].pid))
    # another table's run, which this stop does not signal, holds its claim throughout: the stop does not wait for it
    other_run = campaign.carry.sweep_dir("direct/sorting", runs) / "run"
    other_run.mkdir(parents=True)
    fd = os.open(other_run / "claim.json", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        while not all((sweep / name / "claim.json").exists() and (sweep / f"{name}.deaf.pid").exists()
                      for name in ("run", "run2")):
            assert all(proc.poll() is None for proc in procs)
            time.sleep(0.05)
        assert campaign._running("spigot/table2") and len(campaign._sessions("spigot/table2")) == 2
        # a stale pid file whose number is another table's campaign session now: not this table's
        (places / "campaign" / "direct-sorting.2.pid").write_text(str(procs[1].pid))
        assert not campaign._running("direct/sorting") and len(campaign.sessions()) == 2
        started = time.monotonic()
        assert campaign.stop("spigot/table2", grace=60) == 0
        assert time.monotonic() - started < 30
        for proc, name in zip(procs, ("run", "run2"), strict=True):
            assert proc.wait(timeout=30) == -9  # killed once its run had checkpointed, not left to start another
            assert json.loads((sweep / name / "metrics.json").read_text())["status"] == "interrupted"
            deaf = int((sweep / f"{name}.deaf.pid").read_text())
            for _ in range(200):
                if not alive(deaf):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the deaf worker outlived the stop")
        said = capsys.readouterr().out
        assert "stopping the runs: campaign stop spigot/table2" in said and "campaign save spigot/table2" in said
        assert "still holding" not in said
    finally:
        os.close(fd)
        for proc in procs:
            proc.kill()
            proc.wait()


class _World:
    """A queue's world, a poll at a time: each launched (or already running) table holds, at each poll after its
    start, the number of claims its profile says, and its session ends after the profile with its exit status."""

    def __init__(self, profiles, exits=(), left=(), outside=()):
        self.tick, self.profiles, self.exits, self.left = 0, profiles, dict(exits), dict(left)
        self.started = {table: 0 for table in outside}  # tables running already, not the queue's
        self.launched = []

    def launch(self, table, jobs, part=1):
        sweep = table if part == 1 else f"{table}#{part}"  # a widened table's second sweep: its own profile
        self.launched.append((sweep, jobs, self.tick))
        self.started[sweep] = self.tick
        world = self

        class Proc:
            returncode = None

            def poll(self):
                if world._sweep_runs(sweep):
                    return None
                self.returncode = world.exits.get(sweep, 0)
                return self.returncode

        return Proc()

    def _profile(self, sweep):  # a second sweep not profiled finds nothing left to run: it ends at the next poll
        return self.profiles.get(sweep, [0])

    def _sweep_runs(self, sweep):
        return sweep in self.started and self.tick - self.started[sweep] < len(self._profile(sweep))

    def running(self, table):
        return any(self._sweep_runs(s) for s in self.started if s.split("#")[0] == table)

    def claims(self, root):
        return [campaign.carry.sweep_dir(s.split("#")[0], root) / f"run{s}{i}" / "claim.json"
                for s, t0 in self.started.items() if self._sweep_runs(s)
                for i in range(self._profile(s)[self.tick - t0])]

    def install(self, monkeypatch):
        monkeypatch.setattr(campaign, "launch", self.launch)
        monkeypatch.setattr(campaign, "_running", self.running)
        monkeypatch.setattr(campaign, "_left", lambda table: self.left.get(table, 0))
        monkeypatch.setattr(campaign.carry, "held_claims", self.claims)
        monkeypatch.setattr(campaign.time, "sleep", lambda s: setattr(self, "tick", self.tick + 1))
        return self


def test_a_queue_starts_each_table_in_order_as_soon_as_a_slot_is_free(places, monkeypatch, capsys):
    """run T1 T2 T3: the first table at once with every slot; each next one once fewer runs than slots hold their
    claims at two polls in a row (a single poll between two runs of a sweep is no free slot), with the free slots;
    a table stopped short (its sweep's exit status, or a run left unfinished) ends the queue there, which still
    waits for the tables running; an unstarted table is refused before any runs."""
    from types import SimpleNamespace

    tables = ["spigot/table2", "direct/sorting", "energy/mlc"]
    for t in tables:
        state = places / "state" / t.replace("/", "-")
        state.mkdir(parents=True)
        (state / "plan.json").write_text(json.dumps({"table": t, "commit": "e" * 40}))
    profiles = {"spigot/table2": [2, 1, 2, 1, 1, 1, 1], "direct/sorting": [1] * 8, "energy/mlc": [1] * 3}
    world = _World(profiles).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    # tick 1's single free poll is a gap between two runs; ticks 3-4 free -> sorting, 1 job; the same for mlc
    assert world.launched == [("spigot/table2", 2, 0), ("direct/sorting", 1, 4), ("energy/mlc", 1, 8)]
    assert capsys.readouterr().out.count("complete") == 3

    world = _World(profiles, left={"spigot/table2": 1}).install(monkeypatch)  # stopped: a run checkpointed, exited
    assert campaign.queue(tables, 2, wait=True, poll=0) == 1
    assert [t for t, *_ in world.launched] == tables[:2] and world.tick == 12  # it waited for sorting to end
    said = capsys.readouterr().out
    assert "energy/mlc not started; waiting for direct/sorting" in said and "direct/sorting complete" in said

    world = _World(profiles, exits={"direct/sorting": 143}).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 143
    assert [t for t, *_ in world.launched] == tables  # mlc had started before sorting failed

    # a table that skips its completed runs for three polls before it claims one holds its job meanwhile: mlc starts
    # at the second poll with a free slot after table2 ends (8), not at ticks 5-6, when sorting had claimed nothing
    slow = {**profiles, "direct/sorting": [0, 0, 0, 1, 1, 1, 1, 1]}
    world = _World(slow).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    assert world.launched == [("spigot/table2", 2, 0), ("direct/sorting", 1, 4), ("energy/mlc", 1, 8)]
    capsys.readouterr()

    # a table running already (an earlier queue's) is waited for, and its claims count
    world = _World(profiles, outside=["spigot/table2"]).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    assert world.launched == [("direct/sorting", 1, 4), ("energy/mlc", 1, 8)]
    assert "spigot/table2 is running already" in capsys.readouterr().out
    # one running already that still skips its completed runs (no claim yet) holds a job too: mlc waits for a free
    # slot after table2 ends (6), not at ticks 1-2, when only table2's run held a claim
    world = _World({**slow, "spigot/table2": [1] * 6}, outside=["spigot/table2", "direct/sorting"]).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    assert world.launched == [("energy/mlc", 1, 7), ("energy/mlc#2", 1, 9)]  # alone from 8: widened (below)
    capsys.readouterr()
    # stopped between two runs, it leaves no unfinished run and, not the queue's, no exit status: stop's mark says it
    (places / "campaign").mkdir(parents=True, exist_ok=True)
    campaign._stopped("spigot/table2").write_text("now")
    world = _World(profiles, outside=["spigot/table2"]).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 1
    assert [t for t, *_ in world.launched] == ["direct/sorting"] and "stopped)" in capsys.readouterr().out

    world = _World(profiles).install(monkeypatch)
    with pytest.raises(SystemExit, match="not started"):
        campaign.queue([*tables, "spigot/table3_sst"], 2, wait=True)
    assert world.launched == []
    started = []  # in the background: the queue is this command again, waiting, in a session of its own
    monkeypatch.setattr(campaign.subprocess, "Popen", lambda argv, **kw: started.append((argv, kw)) or
                        SimpleNamespace(pid=1))
    assert campaign.queue(tables, 2, wait=False) == 0 and world.launched == []
    ((argv, kw),) = started
    assert argv[1:] == ["-m", "scripts.campaign", "run", *tables, "--jobs", "2", "--wait"]
    assert kw["start_new_session"] and (places / "campaign" / "queue.log").is_file()


def test_the_last_table_of_a_queue_alone_on_fewer_slots_is_widened_once_by_a_second_sweep(places, monkeypatch,
                                                                                           capsys):
    """A table launched beside the tail of the one before runs on the slot that was free; once no table is left to
    start and a slot has been free for two polls, a second sweep of it takes the rest (once); the table ends when both
    sweeps have, stopped short if either failed. A table on every slot, or one not the queue's, is never widened."""
    tables = ["spigot/table2", "energy/mlc"]
    for t in tables:
        state = places / "state" / t.replace("/", "-")
        state.mkdir(parents=True)
        (state / "plan.json").write_text(json.dumps({"table": t, "commit": "e" * 40}))
    # table2 on both slots, one from tick 2; mlc at 3 on one; table2 ends at 5; free at 5 and 6: widened at 6
    profiles = {"spigot/table2": [2, 2, 1, 1, 1], "energy/mlc": [1] * 10, "energy/mlc#2": [0, 1, 1, 1]}
    world = _World(profiles).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    assert world.launched == [("spigot/table2", 2, 0), ("energy/mlc", 1, 3), ("energy/mlc#2", 1, 6)]
    said = capsys.readouterr().out
    assert said.count("widened") == 1 and said.count("energy/mlc complete") == 1 and world.tick == 13

    world = _World(profiles, exits={"energy/mlc#2": 1}).install(monkeypatch)  # the second sweep fails
    assert campaign.queue(tables, 2, wait=True, poll=0) == 1
    assert "energy/mlc stopped short (exit 1" in capsys.readouterr().out and world.tick == 13  # it waited for both

    # table2 not the queue's, on both slots until 12: mlc launched on both when it ends, nothing to widen
    world = _World({**profiles, "spigot/table2": [2] * 12}, outside=["spigot/table2"]).install(monkeypatch)
    assert campaign.queue(tables, 2, wait=True, poll=0) == 0
    assert world.launched == [("energy/mlc", 2, 12)] and "widened" not in capsys.readouterr().out


def test_a_table_running_already_is_not_launched_again_and_waiting_waits_for_it(places, monkeypatch, capsys):
    (places / "state" / "direct-sorting").mkdir(parents=True)
    (places / "state" / "direct-sorting" / "plan.json").write_text(json.dumps({"table": "direct/sorting",
                                                                               "commit": "f" * 40}))
    monkeypatch.setattr(campaign.subprocess, "Popen", lambda *a, **kw: pytest.fail("launched a second time"))
    monkeypatch.setattr(campaign, "_running", lambda table: True)
    assert campaign.run("direct/sorting", 2, wait=False) == 0
    assert "running already" in capsys.readouterr().out
    answers = iter([True, True, True, False])  # the check, then two polls while it runs
    monkeypatch.setattr(campaign, "_running", lambda table: next(answers))
    assert campaign.run("direct/sorting", 2, wait=True, poll=0.01) == 0
    assert next(answers, "drained") == "drained"


def test_start_pin_only_pins_without_running_so_a_queue_can_take_it(places, monkeypatch, capsys):
    monkeypatch.setattr(campaign, "_git", lambda *args, **kw: {"status": "", "rev-parse": "b" * 40}[args[0]])
    monkeypatch.setattr(campaign, "run", lambda *a, **kw: pytest.fail("--pin-only ran the table"))
    assert campaign.main(["start", "energy/citation", "--pin-only", "--seeds", "301"]) == 0
    assert campaign.plan("energy/citation")["commit"] == "b" * 40 and "pinned" in capsys.readouterr().out


def test_stop_without_a_table_stops_every_running_table(places, monkeypatch, capsys):
    for t in ("spigot/table2", "direct/sorting", "energy/mlc"):
        (places / "state" / t.replace("/", "-")).mkdir(parents=True)
        (places / "state" / t.replace("/", "-") / "plan.json").write_text(json.dumps({"table": t, "commit": "a" * 40}))
    stopped = []
    monkeypatch.setattr(campaign, "stop", lambda table, grace: stopped.append(table) or 0)
    monkeypatch.setattr(campaign, "_running", lambda table: False)
    assert campaign.main(["stop"]) == 0 and stopped == [] and "no table is running" in capsys.readouterr().out
    monkeypatch.setattr(campaign, "_running", lambda table: table != "energy/mlc")
    assert campaign.main(["stop"]) == 0 and stopped == ["direct/sorting", "spigot/table2"]
    assert campaign.main(["stop", "energy/mlc"]) == 0 and stopped[-1] == "energy/mlc"

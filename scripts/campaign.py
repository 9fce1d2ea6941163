"""The reproduction campaign: paper tables built over days of CPU time, a few hours at a time, each from one code.

    python -m scripts.campaign start T [--seeds S] [--args '...'] [--pin-only]  # pin T to HEAD (once), then run
    python -m scripts.campaign repin T                 # its code changed: retire its runs, pin it to HEAD again
    python -m scripts.campaign run T [--jobs 2]        # run T's missing runs at its pinned commit (in the background)
    python -m scripts.campaign run T1 T2 ... [--jobs 2]  # a queue: each table as soon as a slot is free, in order
    python -m scripts.campaign stop [T ...] [--grace 300]  # stop T's runs (default: every running table's): each
                                                       # checkpoints its step, then exits
    python -m scripts.campaign save T [--checkpoints MIB]  # T's run records (+ interrupted runs' checkpoints)
                                                       # -> campaign/<paper>-<table>/ (to commit)
    python -m scripts.campaign status                  # every table of the campaign: commit, runs done, running?
    python -m scripts.campaign table T                 # T's tables from its runs (make table ONLY=steps)

``T`` is a table as ``make table`` takes it (``spigot/table3_sst``), or ``lab_matrix``: the lab's benchmark
(``make table-lab-matrix``, run the same way). What is committed, in
``campaign/<paper>-<table>/``:

* ``plan.json`` — the pinned commit (HEAD when the table was started: a clean tree), the seeds and overrides
  (``make table``'s SEEDS and ARGS: the protocol, e.g. GloVe 6B 50d), the date;
* ``records.tar.gz`` (its manifest ``pack.json`` inside) — every run's record (metrics.json, run.json, history.csv,
  .hydra/, train.log), as ``scripts/carry.py pack`` writes them: kilobytes a run;
* ``checkpoints.tar.000``, ... — with ``save --checkpoints MIB`` only: the interrupted runs' checkpoints (a run longer
  than a session, e.g. SST's SparseMAP at 3-4 hours, would otherwise start over on every fresh machine).

What is not: the runs themselves, under ``$LATENTSTRUCT_CAMPAIGN`` (default ``../campaign``, beside the checkout):
``runs/`` (the sweep directories, with the checkpoints of unfinished runs) and ``code-<commit>/`` (a git worktree
of the pinned commit: the code that every run of the table runs, whatever the checkout has become since). On a fresh
machine ``run`` rebuilds both: the worktree from git, the completed runs from the committed records (they are then
skipped); an unfinished run whose checkpoint did not survive starts over — from the same code, so the table stays one
code. Runs go two at a time (``--jobs``), one thread each, under ``nice``, resuming what was interrupted. A table
whose spec has several sweeps keeps them all in ``runs/``; ``save`` packs the table's first sweep directory and any
other under the same root (``latentstruct.report.reproduce.sweep_root``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import carry  # noqa: E402

STATE = ROOT / "campaign"
NICE = 10  # the runs' niceness, their processes' and their session's (_nice_session)


def campaign_root() -> Path:
    return Path(os.environ.get("LATENTSTRUCT_CAMPAIGN", ROOT.parent / "campaign")).resolve()


def _beside(table: str, suffix: str) -> Path:
    """The campaign root's file of ``table`` (``direct-sorting.pid``, ``.log``, ``.stopped``)."""
    return campaign_root() / f"{table.replace('/', '-')}{suffix}"


def state_dir(table: str) -> Path:
    return STATE / table.replace("/", "-")


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def plan(table: str) -> dict:
    path = state_dir(table) / "plan.json"
    if not path.is_file():
        raise SystemExit(f"error: {table} is not started: python -m scripts.campaign start {table} [--args ...]")
    return json.loads(path.read_text())


def pinned(state: Path | None = None) -> list[tuple[str, Path]]:
    """The started tables, each with its folder of committed state (under ``state``, default :data:`STATE`)."""
    return [(json.loads(p.read_text())["table"], p.parent) for p in sorted((state or STATE).glob("*/plan.json"))]


def _require_committed_code() -> None:
    """Refuse uncommitted changes to latentstruct/ or configs/ (a table runs one committed code)."""
    if _git("status", "--porcelain", "--untracked-files=no", "--", "latentstruct", "configs"):
        raise SystemExit("error: latentstruct/ or configs/ has uncommitted changes: commit them first (a table runs "
                         "one committed code)")


def start(table: str, seeds: str, args: str) -> dict:
    """Pin ``table`` to HEAD with its protocol (refused once pinned, or on a tree with uncommitted code)."""
    path = state_dir(table) / "plan.json"
    if path.is_file():
        raise SystemExit(f"error: {table} is pinned already ({path}): `run` goes on with it")
    _require_committed_code()
    entry = {"table": table, "commit": _git("rev-parse", "HEAD"), "seeds": seeds, "args": args,
             "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1) + "\n")
    return entry


def repin(table: str) -> dict:
    """Pin ``table`` again, to HEAD, with its plan's seeds and args, when the code it runs changed (a table is one
    code): refused while it runs, at the commit it is pinned to, or on uncommitted code. Its run directories move to
    ``<campaign root>/retired/<sweep directory>-<old commit>`` (kept there, never run or packed again) and its
    committed records, checkpoints and plan leave ``campaign/<paper>-<table>/`` (git history keeps them: commit the
    removal with the new plan); ``run`` then starts the table over at HEAD."""
    old = plan(table)
    if _running(table):
        raise SystemExit(f"error: {table} is running: `python -m scripts.campaign stop {table}` first")
    if old["commit"] == _git("rev-parse", "HEAD"):
        raise SystemExit(f"error: {table} is pinned to HEAD already ({old['commit'][:12]})")
    _require_committed_code()
    sweep = carry.sweep_dir(table, campaign_root() / "runs")
    if sweep.is_dir():
        retired = campaign_root() / "retired" / f"{sweep.name}-{old['commit'][:12]}"
        retired.parent.mkdir(parents=True, exist_ok=True)
        sweep.rename(retired)
        print(f"campaign: {table}'s runs at {old['commit'][:12]} retired to {retired}", flush=True)
    saved = state_dir(table)
    for path in [saved / carry.RECORDS, *saved.glob("checkpoints.tar.*"), saved / "plan.json"]:
        path.unlink(missing_ok=True)
    return start(table, old.get("seeds", ""), old.get("args", ""))


def code_dir(commit: str) -> Path:
    """The worktree of ``commit`` under the campaign root, made if absent."""
    where = campaign_root() / f"code-{commit[:12]}"
    if not where.is_dir():
        where.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit], check=True)
    return where


def _restore(table: str, runs: Path) -> None:
    """The committed records into ``runs``, for the runs not there (a fresh machine: completed runs are skipped)."""
    saved = state_dir(table)
    if (saved / carry.RECORDS).is_file():
        carry.unpack(saved, runs, log=lambda line: print(f"campaign: {line}"))


def command(table: str, entry: dict, jobs: int) -> tuple[list[str], dict, Path]:
    """The sweeps of ``table`` at its pinned code: argv, environment, working directory."""
    code, runs = code_dir(entry["commit"]), campaign_root() / "runs"
    what = ["latentstruct.report.matrix"] if table == carry.LAB_MATRIX else \
        ["latentstruct.report.reproduce", table, "--only", "sweeps"]
    argv = ["nice", "-n", str(NICE), sys.executable, "-m", *what, "--runs", str(runs), "--jobs", str(jobs),
            "--seeds", entry.get("seeds", ""), "--args", entry.get("args", "")]
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    return argv, env, code


def _part(part: int) -> str:
    """The suffix of a table's ``part``-th session's files: ``direct-vae.pid``, then ``direct-vae.2.pid``, ..."""
    return "" if part == 1 else f".{part}"


def _pid_files(table: str) -> list[Path]:
    """The pid files of ``table``'s sessions: its sweep's, and a second sweep's where a queue widened it."""
    name = table.replace("/", "-")
    return sorted(campaign_root().glob(f"{name}.pid")) + sorted(campaign_root().glob(f"{name}.[0-9]*.pid"))


def launch(table: str, jobs: int, part: int = 1) -> subprocess.Popen:
    """Start ``table``'s missing runs at its pinned code, ``jobs`` at a time, in a session of their own (its pid file
    names it), the committed records restored first. ``part`` 2: a second sweep of a table running already (a queue
    widening it into free slots, :func:`queue`), its own pid file and log: the runs' claims keep the two sweeps off
    each other's runs, each taking the next run that no one has claimed."""
    entry = plan(table)
    runs = campaign_root() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    if part == 1:
        _stopped(table).unlink(missing_ok=True)
        _restore(table, runs)
    argv, env, code = command(table, entry, jobs)
    log = _beside(table, f"{_part(part)}.log")
    print(f"campaign: {table} at {entry['commit'][:12]} in {code}, {jobs} at a time; runs in {runs}; log {log}",
          flush=True)
    with open(log, "a") as out:
        proc = subprocess.Popen(argv, cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    _nice_session(proc.pid)
    _beside(table, f"{_part(part)}.pid").write_text(str(proc.pid))
    return proc


def run(table: str, jobs: int, wait: bool, poll: float = 60.0) -> int:
    """Launch ``table``'s missing runs at its pinned code (``wait``: until they end; its exit status). A table running
    already is not launched again: ``wait`` waits for that session to end."""
    plan(table)
    if _running(table):
        print(f"campaign: {table} is running already{'; waiting for it' if wait else ''}", flush=True)
        while wait and _running(table):
            time.sleep(poll)
        return 0
    proc = launch(table, jobs)
    return proc.wait() if wait else 0


def _left(table: str) -> int:
    """The run directories of ``table``'s sweep that are not completed."""
    return sum(r.status != "completed" for r in carry.find_runs(carry.sweep_dir(table, campaign_root() / "runs")))


def queue(tables: list[str], jobs: int, wait: bool, poll: float = 60.0) -> int:
    """Run ``tables`` in order, ``jobs`` runs at a time in all, so that the machine goes on between sessions. A table
    starts as soon as a slot is free — fewer of the campaign's runs holding their claims
    (:func:`scripts.carry.held_claims`) than ``jobs``: at once when no table of the queue runs, otherwise at two
    polls in a row (a sweep between two runs is no free slot; a table launched counts as holding its jobs until a run
    of it holds a claim, a table found running already one job) — with the free slots as its jobs. So the tail of one
    table, its last runs, overlaps the head of the next instead of leaving a core idle until the longest of them
    ends. When no table is left to start and the last one launched runs on fewer slots than ``jobs`` (it started
    beside the tail of the one before), it is widened once into the slots that came free: a second sweep of it
    (``launch`` part 2) takes, run by run, the runs no one has claimed; the table ends when both sweeps have. A
    table running already (``run`` of it, or an earlier queue's) is waited for, not launched again. A table that
    stops short (``stop``: its mark, :func:`_stopped`; a failed run: its sweep's exit status is not 0, or a run
    of it is not completed) ends the queue there: no table after it starts, and the queue waits for those running.
    Without ``wait``, the queue itself waits in the background (a session of its own, its log ``queue.log``);
    ``stop`` of the running tables ends it."""
    if len(tables) == 1:
        return run(tables[0], jobs, wait)
    for table in tables:
        plan(table)  # every table is started (pinned) before any runs
    if not wait:
        log = campaign_root() / "queue.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as out:
            proc = subprocess.Popen([sys.executable, "-m", "scripts.campaign", "run", *tables, "--jobs", str(jobs),
                                     "--wait"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        print(f"campaign: queue {' -> '.join(tables)} (pid {proc.pid}); log {log}")
        return 0
    todo, active, code, free_before = list(tables), {}, 0, 0  # active: table -> its processes (None: not ours)
    # a table launched here holds its jobs until a run of it holds a claim: its sweep may spend minutes on the runs it
    # skips (completed ones) before it claims one, and those minutes are no free slot
    starting: dict[str, int] = {}
    given: dict[str, int] = {}  # the jobs of each table the queue launched
    while todo or active:
        for table, procs in list(active.items()):
            if any((p.poll() is None) if p else _running(table) for p in procs):
                continue
            del active[table]
            # rc: the first failed sweep's (unknown, 0, for a table not ours); left: after all its sweeps ended
            rc, left = next((p.returncode for p in procs if p and p.returncode), 0), _left(table)
            stopped = _stopped(table).is_file()
            if rc or left or stopped:
                print(f"campaign: {table} stopped short (exit {rc}, {left} runs not completed"
                      f"{', stopped' if stopped else ''}); the queue ends "
                      f"there: {' '.join(todo) or 'nothing'} not started"
                      f"{'; waiting for ' + ' '.join(active) if active else ''}", flush=True)
                todo, code = [], code or rc or 1
            else:
                print(f"campaign: {table} complete", flush=True)
        if todo and _running(todo[0]):
            print(f"campaign: {todo[0]} is running already; waiting for it", flush=True)
            table = todo.pop(0)
            # an earlier queue's table may be skipping its completed runs, holding no claim yet: a job of it counts
            active[table], starting[table] = [None], 1
            continue
        # ours, launched on fewer slots, not widened yet (one sweep), none after a table stopped short
        narrow = [t for t, procs in active.items() if given.get(t, jobs) < jobs and len(procs) == 1 and not code]
        if todo or narrow:
            runs = campaign_root() / "runs"
            claims = carry.held_claims(runs)  # the campaign's runs running now
            for table in list(starting):
                if table not in active or any(carry.sweep_dir(table, runs) in c.parents for c in claims):
                    del starting[table]
            free = jobs - len(claims) - sum(starting.values())
            if free > 0 and (not active or free_before > 0):
                if todo:
                    table = todo.pop(0)
                    starting[table] = given[table] = min(free, free_before) if active else free
                    active[table], free = [launch(table, starting[table])], 0
                else:  # the last table, alone now on fewer slots than the queue's: a second sweep takes the rest
                    table, wider = narrow[0], min(free, free_before, jobs - given[narrow[0]])
                    print(f"campaign: {table} widened: a second sweep, {wider} more at a time", flush=True)
                    active[table].append(launch(table, wider, part=2))
                    free = 0
            free_before = free
        if todo or active:
            time.sleep(poll)
    return code


def _nice_session(pid: int, nice: int = NICE) -> None:
    """Give the campaign's session the niceness its processes have. Linux orders processes by nice only within one
    autogroup (a session's, with ``sched_autogroup_enabled``, the default), and the campaign runs in its own session:
    without this it takes a full core from the user's work whatever its nice (measured: a fresh clone's ``.ci/run``
    beside a one-job campaign, pytest 775 and 883 s against 378 s idle). No autogroups (another kernel or OS): nice
    alone."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass


def session(pid_file: Path, table: str | None = None) -> int | None:
    """The process group of the campaign session whose leader ``pid_file`` names (``run`` started it in a session of
    its own), or None when it is not running. A pid file outlives its process, and the number may be another
    program's now: a leader that does not run ``latentstruct.report`` is not the campaign's, and, given ``table``,
    one whose arguments do not name it is another table's (the lab's matrix names none)."""
    try:
        pgid = os.getpgid(int(pid_file.read_text()))
        cmdline = Path(f"/proc/{pgid}/cmdline")
        if cmdline.exists():
            args = cmdline.read_bytes()
            if b"latentstruct.report" not in args or (table and table != carry.LAB_MATRIX
                                                        and table.encode() not in args.split(b"\0")):
                return None
        return pgid
    except (OSError, ValueError):
        return None


def sessions() -> list[int]:
    """The process groups of every running table of the campaign (``bench/suite.py`` pauses them)."""
    return sorted({g for path in campaign_root().glob("*.pid") if (g := session(path)) is not None})


def stop(table: str, grace: float) -> int:
    """Stop ``table``'s runs (``run`` started them in a session of their own): every run checkpoints at its next step
    and exits, then what is left of the session is killed (:func:`scripts.carry.stop_group`); ``run`` resumes them."""
    pgids = _sessions(table)
    if not pgids:
        print(f"campaign: {table} is not running")
        return 0
    _stopped(table).write_text(datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC\n"))
    # its own runs' claims only: another table's runs, not signalled, would hold theirs for the whole grace
    carry.stop_group(pgids, carry.sweep_dir(table, campaign_root() / "runs"), f"campaign stop {table}", grace,
                     log=lambda line: print(f"campaign: {line}"))
    print(f"campaign: {table} stopped; `python -m scripts.campaign save {table}` packs its records (then commit)")
    return 0


def save(table: str, checkpoints_mib: float = 0.0) -> dict:
    """Pack ``table``'s records into ``campaign/<paper>-<table>/``; with ``checkpoints_mib``, also the checkpoints of
    its interrupted runs (gzipped, the most advanced first) in ~16 MiB parts, as many as that many MiB round up to, so
    that a run longer than a machine's life goes on from its step on a fresh one (``run`` unpacks them) instead of
    starting over. A checkpoint that does not fit is left behind (the pack says which)."""
    entry = plan(table)
    parts = math.ceil(checkpoints_mib * carry.MIB / carry.PART_BYTES)
    # the number of parts is the limit here (a commit, not a device call's 64 MiB way back): no byte budget
    return carry.pack(table, campaign_root() / "runs", state_dir(table), weights=False, files=1 + parts,
                      budget=2**40, log=lambda line: print(f"campaign: {line}")) | {"commit": entry["commit"]}


def _sessions(table: str) -> list[int]:
    """The process groups of ``table``'s running sweeps (one, or two where a queue widened it)."""
    return [g for path in _pid_files(table) if (g := session(path, table)) is not None]


def _running(table: str) -> bool:
    return bool(_sessions(table))


def _stopped(table: str) -> Path:
    """The mark ``stop`` leaves for a queue (removed at the table's next launch): a table stopped between two runs
    leaves no unfinished run, and a queue that did not launch it has no exit status to read."""
    return _beside(table, ".stopped")


def _manifest(saved: Path) -> dict:
    """The manifest (``pack.json``) inside the committed ``records.tar.gz`` of ``saved``; no runs if none is saved."""
    if not (saved / carry.RECORDS).is_file():
        return {"runs": {}}
    with tarfile.open(saved / carry.RECORDS, "r:gz") as tar:
        return json.loads(tar.extractfile(carry.PACK_JSON).read())


def status() -> list[str]:
    lines = []
    for table, saved in pinned():
        entry, runs = plan(table), campaign_root() / "runs"
        sweep = carry.sweep_dir(table, runs)
        found = carry.find_runs(sweep) if sweep.is_dir() else []
        done = sum(r.status == "completed" for r in found)
        committed = sum(v["status"] == "completed" for v in _manifest(saved)["runs"].values())
        lines.append(f"{table}: commit {entry['commit'][:12]}, seeds {entry['seeds'] or 'the spec'}, args "
                     f"{entry['args'] or '—'}; here {done} of {len(found)} run directories completed, {committed} "
                     f"completed in the committed records; {'running' if _running(table) else 'not running'}")
    return lines or ["no table started (python -m scripts.campaign start T)"]


def table_steps(table: str) -> int:
    runs = os.path.relpath(campaign_root() / "runs", ROOT)  # relative: the pages print the command
    if table == carry.LAB_MATRIX:  # the page from the records there are, launching nothing
        return subprocess.call([sys.executable, "-m", "latentstruct.report.matrix", "--report-only", "--runs", runs],
                               cwd=ROOT)
    return subprocess.call(["make", "table", f"T={table}", "ONLY=steps", f"RUNS={runs}"], cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.campaign", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("start", help="pin a table to HEAD with its protocol, then run it")
    s.add_argument("table")
    s.add_argument("--seeds", default="")
    s.add_argument("--args", default="")
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--wait", action="store_true")
    s.add_argument("--pin-only", action="store_true",
                   help="pin it without running it (to queue it behind a running table: `run T1 T2`)")
    sub.add_parser("repin", help="the table's code changed: retire its runs and records, pin it to HEAD again with "
                                 "its seeds and args (then `run` it)").add_argument("table")
    r = sub.add_parser("run", help="run a started table's missing runs at its pinned commit; several tables: a queue, "
                                   "each started in order as soon as a slot is free")
    r.add_argument("table", nargs="+")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--wait", action="store_true", help="wait for the runs (default: in the background)")
    t = sub.add_parser("stop", help="stop tables' runs (default: every running table's): each checkpoints its step and "
                                    "exits; `run` resumes them")
    t.add_argument("table", nargs="*")
    t.add_argument("--grace", type=float, default=300.0,
                   help="seconds to wait for the runs' checkpoints before killing what is left (default 300)")
    v = sub.add_parser("save", help="pack a table's run records (and, with --checkpoints, its interrupted runs' "
                                    "checkpoints) into campaign/<paper>-<table>/, to commit")
    v.add_argument("table")
    v.add_argument("--checkpoints", type=float, default=0.0, metavar="MIB",
                   help="also the interrupted runs' checkpoints, within MIB rounded up to 16 MiB parts "
                        "(default 0: records only)")
    sub.add_parser("table").add_argument("table")
    sub.add_parser("status")
    a = parser.parse_args(argv)
    if a.verb == "start":
        print(f"campaign: pinned {json.dumps(start(a.table, a.seeds, a.args))}")
        return 0 if a.pin_only else run(a.table, a.jobs, a.wait)
    if a.verb == "repin":
        print(f"campaign: pinned {json.dumps(repin(a.table))}")
        return 0
    if a.verb == "run":
        return queue(a.table, a.jobs, a.wait)
    if a.verb == "stop":
        tables = a.table or [table for table, _ in pinned() if _running(table)]
        if not tables:
            print("campaign: no table is running")
        return max((stop(table, a.grace) for table in tables), default=0)
    if a.verb == "save":
        save(a.table, a.checkpoints)
        return 0
    if a.verb == "table":
        return table_steps(a.table)
    print("\n".join(status()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: how long CI's test suite takes — ``.ci/run`` in a fresh clone of HEAD, as CI runs it — on this machine,
idle and with one core busy (issue #32's targets: pytest at most 8 minutes on 2 idle cores, at most 12 with one busy).

    python bench/suite.py [--conditions idle busy] [--pause-campaign] [--out results/bench/suite.json]
    python bench/suite.py --page results/bench/suite.json > results/bench/suite.md

Per condition: a fresh ``git clone`` of this checkout's HEAD (what is committed: uncommitted changes are not
measured, and a warning says so) in a temporary folder, then ``bash .ci/run`` there (``make test``: the install, then
``pytest -n <cores>``), with ``LATENTSTRUCT_DATA`` as this process has it, else ``../shared/data`` beside this
checkout (where CI finds it: the clone's own ``..`` is the temporary folder). *busy*: a CPU-bound process
(``python -c 'while True: pass'``) runs beside it in a session of its own — its own scheduler autogroup on Linux, so
the suite gets about one core of two — from before the clone to the end. ``--pause-campaign``: the campaign's running
tables (``scripts/campaign.py``) are stopped with SIGSTOP for the measurement and continued with SIGCONT after
(nothing of theirs is lost: they only wait). Recorded per measurement: the commit, the condition, pytest's own wall
time (its summary line), the wall time and the CPU seconds (user, system: the whole process tree, install included)
of ``.ci/run``, the tests passed / skipped / failed, the load average before, the CPU model and the core count.
Each measurement is appended to ``--out``; the page lists them all, newest first, against the targets.

The busy measurement varies by tens of seconds between runs of the same code here (the page says how much where a
commit was measured more than once): compare the idle rows for a change's effect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.trees import git  # noqa: E402
from latentstruct.records import cpu_name  # noqa: E402

#: issue #32's targets for pytest's wall time, seconds, per condition
TARGETS = {"idle": 8 * 60, "busy": 12 * 60}
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s", re.M)


def pytest_summary(output: str) -> dict:
    """The counts and wall seconds of pytest's last summary line (``2670 passed, 204 skipped, 36 warnings in
    346.53s``); empty when there is none."""
    found = list(SUMMARY.finditer(output))
    if not found:
        return {}
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", found[-1]["counts"])}
    return {"pytest_seconds": float(found[-1]["seconds"]), "passed": counts.get("passed", 0),
            "skipped": counts.get("skipped", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)}


@contextlib.contextmanager
def busy_core(on: bool):
    """A CPU-bound process in a session of its own while the block runs (nothing when ``on`` is false)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) if on else None
    try:
        yield proc
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def paused(groups: list[int]):
    """The process groups stopped (SIGSTOP) while the block runs, continued (SIGCONT) after, whatever happens."""
    stopped = []
    try:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGSTOP)
                stopped.append(pgid)
        yield stopped
    finally:
        for pgid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)


def measure(condition: str, command: list[str], cwd: Path, log: Path, pause: list[int] = ()) -> dict:
    """Run ``command`` in ``cwd`` under ``condition`` (idle, busy), its output into ``log``; its record."""
    load = os.getloadavg()[0]
    with paused(list(pause)) as stopped, busy_core(condition == "busy"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        with open(log, "w") as out:
            code = subprocess.call(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"condition": condition, "exit": code, "ci_seconds": round(wall, 1),
            "cpu_user": round(after.ru_utime - before.ru_utime, 1),
            "cpu_sys": round(after.ru_stime - before.ru_stime, 1),
            **pytest_summary(log.read_text(errors="replace")), "load_before": round(load, 2),
            "campaign_paused": len(stopped)}


def run(conditions: list[str], pause_campaign: bool, out: Path) -> list[dict]:
    if git("status", "--porcelain", "--untracked-files=no"):
        print("warning: uncommitted changes are not measured: the clone is HEAD's", file=sys.stderr)
    commit = git("rev-parse", "--short=12", "HEAD")
    groups = []
    if pause_campaign:
        from scripts import campaign

        groups = campaign.sessions()
    records = json.loads(out.read_text()) if out.is_file() else []
    os.environ.setdefault("LATENTSTRUCT_DATA", str(ROOT.parent / "shared" / "data"))  # CI's, not the clone's ..
    for condition in conditions:
        with tempfile.TemporaryDirectory(prefix="suite-") as tmp:
            clone = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            log = Path(tmp) / "ci.log"
            print(f"suite: {condition}: .ci/run in a fresh clone of {commit} ...", flush=True)
            record = {"commit": commit, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      **measure(condition, ["bash", ".ci/run"], clone, log, groups),
                      "cpu": cpu_name(), "cores": os.cpu_count()}
            if record["exit"] != 0:
                record["tail"] = log.read_text(errors="replace")[-2000:]
            print(f"suite: {condition}: pytest {record.get('pytest_seconds')} s, .ci/run {record['ci_seconds']} s, "
                  f"CPU {record['cpu_user']} + {record['cpu_sys']} s, exit {record['exit']}", flush=True)
            records.append(record)  # written before the clone (and its venv) is deleted, which takes minutes
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(records, indent=1) + "\n")
    return records


def page(records: list[dict]) -> str:
    latest = {}
    for r in sorted(records, key=lambda r: r["date"]):
        latest[r["condition"]] = r
    said = [f"{c} {r.get('pytest_seconds', '—')} s at {r['commit']} "
            f"({'met' if (r.get('pytest_seconds') or 1e9) <= TARGETS[c] else 'missed'}: ≤ {TARGETS[c]} s)"
            for c, r in sorted(latest.items(), key=lambda kv: kv[0] != "idle")]
    lines = ["# The test suite's time (`make bench-suite`)", "",
             f"**Status:** the latest pytest wall time per condition: {'; '.join(said) or 'none measured'} — a "
             "timing benchmark of CI's suite, not a paper table.", "",
             "`.ci/run` (`make test`: install, then `pytest -n <cores>`) in a fresh clone of the commit, as CI runs "
             "it. *idle*: nothing else running (the campaign paused where a row says so); *busy*: one CPU-bound "
             "process beside it in a session of its own (the suite gets about one core). Targets (issue #32): pytest "
             f"≤ {TARGETS['idle']} s idle, ≤ {TARGETS['busy']} s with one core busy. CPU: user + system seconds of "
             "the whole `.ci/run` (install included). Regenerate: `make bench-suite` (bench/suite.py).", "",
             "| date | commit | condition | pytest s | target | `.ci/run` s | CPU s | passed / skipped / failed | "
             "load before | campaign paused | machine |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: r["date"], reverse=True):
        seconds = r.get("pytest_seconds")
        verdict = "—" if seconds is None else ("met" if seconds <= TARGETS[r["condition"]] else "**missed**")
        exited = "" if r["exit"] == 0 else f" (exit {r['exit']})"
        lines.append(f"| {r['date']} | {r['commit']} | {r['condition']} | {seconds if seconds is not None else '—'} | "
                     f"{verdict} | {r['ci_seconds']} | {r['cpu_user']} + {r['cpu_sys']} | {r.get('passed', '—')} / "
                     f"{r.get('skipped', '—')} / {r.get('failed', '—')}{exited} | "
                     f"{r['load_before']} | {r['campaign_paused']} | {r['cpu']}, {r['cores']} cores |")
    spread = {}
    for r in records:
        if r.get("pytest_seconds") is not None:
            spread.setdefault((r["commit"], r["condition"]), []).append(r["pytest_seconds"])
    repeated = {k: v for k, v in spread.items() if len(v) > 1}
    if repeated:
        lines += ["", "Repeated measurements of one commit (the noise of this measurement):", ""]
        lines += [f"- {c} {cond}: {min(v)}–{max(v)} s over {len(v)} runs" for (c, cond), v in sorted(repeated.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conditions", nargs="+", choices=sorted(TARGETS), default=["idle", "busy"])
    parser.add_argument("--pause-campaign", action="store_true",
                        help="SIGSTOP the campaign's running tables for the measurement, SIGCONT after")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "suite.json")
    parser.add_argument("--page", type=Path, help="print the page of this record file and stop")
    a = parser.parse_args(argv)
    if a.page:
        print(page(json.loads(a.page.read_text())), end="")
        return 0
    records = run(a.conditions, a.pause_campaign, a.out)
    return max(r["exit"] != 0 for r in records[-len(a.conditions):])


if __name__ == "__main__":
    sys.exit(main())

"""bench/suite.py without running the suite: pytest's summary line is read, the busy process and the paused campaign
are there exactly while the measured command runs, and the page judges each row against its target."""

from __future__ import annotations

import subprocess
import sys

from bench import suite
from tests.helpers import process_state


def test_pytest_summary_reads_the_counts_and_the_seconds():
    out = "....\n== 2670 passed, 204 skipped, 36 warnings in 346.53s (0:05:46) ==\n"
    assert suite.pytest_summary(out) == {"pytest_seconds": 346.53, "passed": 2670, "skipped": 204, "failed": 0}
    assert suite.pytest_summary("2 failed, 10 passed, 1 error in 3.5s")["failed"] == 3
    assert suite.pytest_summary("no summary") == {}


_SPINNING = """
import pathlib, sys
spinning = 0
for p in pathlib.Path("/proc").iterdir():
    try:
        spinning += p.name.isdigit() and (p / "cmdline").read_bytes().split(b"\\0")[-2:-1] == [b"while True: pass"]
    except OSError:
        pass
print(pathlib.Path(f"/proc/{sys.argv[1]}/stat").read_text().split(")")[-1].split()[0])
print(spinning)
print("== 3 passed in 0.50s ==")
"""


def test_the_busy_core_and_the_pause_last_exactly_as_long_as_the_command(tmp_path):
    """The command reports what it sees: the campaign's state, and how many busy processes spin."""
    campaign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    probe = [sys.executable, "-c", _SPINNING, str(campaign.pid)]
    try:
        idle = suite.measure("idle", probe, tmp_path, tmp_path / "log")
        state, spinning_idle = (tmp_path / "log").read_text().splitlines()[:2]
        assert state != "T" and idle["campaign_paused"] == 0
        record = suite.measure("busy", probe, tmp_path, tmp_path / "log", [campaign.pid])
        state, spinning = (tmp_path / "log").read_text().splitlines()[:2]
        assert state == "T" and int(spinning) == int(spinning_idle) + 1  # stopped, and one busy process beside it
        assert process_state(campaign.pid) != "T"  # continued after
        assert record["condition"] == "busy" and record["exit"] == 0 and record["campaign_paused"] == 1
        assert record["pytest_seconds"] == 0.5 and record["passed"] == 3
    finally:
        campaign.kill()
        campaign.wait()


def test_the_page_judges_each_row_against_its_condition_s_target():
    row = {"commit": "abc", "date": "2026-11-27 12:00 UTC", "exit": 0, "ci_seconds": 500.0, "cpu_user": 600.0,
           "cpu_sys": 40.0, "passed": 10, "skipped": 1, "failed": 0, "load_before": 0.1, "campaign_paused": 1,
           "cpu": "a CPU", "cores": 2}
    text = suite.page([{**row, "condition": "idle", "pytest_seconds": 470.0},
                       {**row, "condition": "busy", "pytest_seconds": 730.0},
                       {**row, "condition": "busy", "pytest_seconds": 700.0, "date": "2026-11-27 13:00 UTC"}])
    lines = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert [line.split(" | ")[4] for line in lines] == ["met", "met", "**missed**"]  # newest first
    assert "abc busy: 700.0–730.0 s over 2 runs" in text
    assert "**Status:** the latest pytest wall time per condition: idle 470.0 s at abc (met: ≤ 480 s); busy 700.0 s " \
           "at abc (met: ≤ 720 s)" in text

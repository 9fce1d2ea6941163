"""The small version of ``make reliability`` (``reliability/``): a SIGKILLed run resumed to the same end, a
run killed in the middle of a checkpoint write, and the report's table. The other checks have their own small
versions: stop signals and submitit (test_interrupts.py), concurrent launchers (test_claims.py), damaged files
(test_damaged_files.py), out-of-range values (test_ranges.py)."""

from __future__ import annotations

import random

import pytest

from reliability import __main__ as suite
from reliability import faults
from tests.helpers import train_run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):  # shared: the uninterrupted reference run is made once
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture
def short_task(monkeypatch, workdir):
    """A 150-step SFE run; its uninterrupted reference trained here, in-process (where faults.reference finds it,
    as a process of its own would have left it): one Python process fewer a test, the same numbers at one thread."""
    overrides = [*faults.TASKS["synthetic_sfe"], "trainer.max_steps=150"]
    monkeypatch.setitem(faults.TASKS, "short", overrides)
    if faults._record(workdir / "reference" / "short").get("status") != "completed":
        train_run(workdir / "reference", *overrides, "trainer.log_seconds=null", name="short")
    return "short"


@pytest.mark.slow
def test_a_sigkilled_run_resumes_to_the_uninterrupted_end(workdir, short_task):
    fault = faults.kill_and_resume(short_task, "sigkill", 1, random.Random(3), workdir)
    assert fault.survived, fault.detail
    assert fault.injected == 1 and fault.detail.startswith("1 stops") and len(fault.steps) == 1  # killed once


@pytest.mark.slow
def test_a_kill_during_a_checkpoint_write_leaves_the_one_before(workdir, short_task):
    fault = faults.kill_during_write(short_task, "checkpoint.pt", 2, workdir)
    assert fault.survived, fault.detail
    assert "the one before: whole (step 7)" in fault.detail and fault.steps == [7]
    assert "left 1 half-written file, removed by the resumed run" in fault.detail


def test_the_report_counts_each_section_and_flags_a_miss(tmp_path):
    found = [faults.Fault("kill", "sigkill", "t", True, detail="2 stops; identical history and metrics",
                          steps=[5, 9], injected=2),
             faults.Fault("kill", "sigterm", "t", False, 1, detail="1 stops; metrics differ"),
             faults.Fault("launchers", "launchers:3", "t", True, detail="6 runs", injected=3)]
    args = suite.argparse.Namespace(quick=False, kills=1, stops_per_run=2, seed=0, examples=1)
    text = "\n".join(suite._report(found, [], [], args, 60.0))
    assert "TARGETS MISSED" in text
    assert "| kills and stop signals at random steps, resumed | 3 | 2 | 1 | 0 |" in text  # counted in stops
    assert "| concurrent launchers on one sweep | 3 | 3 | 0 | 0 |" in text  # counted in launchers
    assert "| t | sigterm | 1 | " in text and "**lost**" in text

"""Fixtures and hooks shared by every test: one CPU thread, and the real datasets.

Every test starts on one torch thread: its tensors are tiny, so more threads only add overhead (several times over for
the LSTMs, on a busy machine), and a test whose run sets ``trainer.threads`` (or ``trainer.flush_denormal``) cannot
change the speed (or the arithmetic) of the tests after it.

A test that reads a real dataset is marked ``@pytest.mark.real_data("sst", ...)`` (paths relative to the data root: a
dataset folder or one file in it) and takes the root from the ``data_root`` fixture, which only marked tests may use.
The root is ``paths.data_dir`` as the package resolves it (``$LATENTSTRUCT_DATA``, else ``data``; see
``tests/helpers.py``), so the tests find the data exactly where a run would.

- Where a path named by the marker is absent, the test is skipped with a reason that names it and the root.
- A marked test cannot be skipped for any other reason: such a skip is reported as a failure.
- A ``LATENTSTRUCT_DATA`` that names no directory stops the session before any test runs.
- The session ends with the number of real-data tests that ran and that were skipped, by dataset.

A test that needs a GPU is marked ``@pytest.mark.cuda`` and skipped where torch sees no CUDA device;
``scripts/gpu_check.sh`` runs them all on the GPU machine (``pytest -m cuda``).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests import helpers

pytest_plugins = ("pytester",)  # tests/test_real_data.py runs sessions of its own

MARK = "real_data"
_ROOT = pytest.StashKey[Path]()
_ABSENT = pytest.StashKey[list[str]]()


class RealData:
    """The session's data root, and how many real-data tests ran and were skipped, in all and per dataset."""

    def __init__(self, root: Path):
        self.root = root
        self.tests = Counter()  # "ran" / "skipped" → tests
        self.datasets = {"ran": Counter(), "skipped": Counter()}  # → dataset → tests

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        names = dict(report.user_properties).get(MARK)
        outcome = "ran" if report.when == "call" else "skipped" if report.skipped else None
        if names is not None and outcome is not None:
            self.tests[outcome] += 1
            self.datasets[outcome].update(names)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        ran, skipped = (", ".join(f"{k} {n}" for k, n in sorted(self.datasets[o].items())) for o in ("ran", "skipped"))
        terminalreporter.write_sep("-", f"real data in {self.root}")
        terminalreporter.write_line(f"{self.tests['ran']} real-data tests ran" + (f": {ran}" if ran else ""))
        terminalreporter.write_line(
            f"{self.tests['skipped']} skipped" + (f", their data absent: {skipped}" if skipped else "")
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(*paths): reads these real datasets (relative to the data root); skipped where absent"
    )
    value, root = os.environ.get("LATENTSTRUCT_DATA"), helpers.data_root()
    if value is not None and (not value or not root.is_dir()):
        raise pytest.UsageError(
            f"LATENTSTRUCT_DATA={value!r} names no directory (resolved: {root}): point it at the real datasets, or "
            "unset it to use data/ (the real-data tests are then skipped where it lacks them)"
        )
    config.stash[_ROOT] = root
    config.pluginmanager.register(RealData(root), "latentstruct-real-data")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.stash[_ROOT]
    no_cuda = pytest.mark.skip(reason="needs CUDA") if not torch.cuda.is_available() else None
    for item in items:
        if no_cuda is not None and item.get_closest_marker("cuda"):
            item.add_marker(no_cuda)
        marker = item.get_closest_marker(MARK)
        if marker is None:
            continue
        if not marker.args or not all(isinstance(name, str) for name in marker.args):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK} needs the paths it reads")
        item.user_properties.append((MARK, marker.args))  # carried by every report, also from xdist workers
        missing = [name for name in marker.args if not (root / name).exists()]
        if missing:
            item.stash[_ABSENT] = missing
            item.add_marker(pytest.mark.skip(reason=f"real data absent: {', '.join(missing)} not in {root}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    expected = _ABSENT in item.stash or hasattr(report, "wasxfail")
    if report.skipped and item.get_closest_marker(MARK) and not expected:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"a real-data test may be skipped only where its data is absent, not for: {reason}"
    return report


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    if torch.get_num_threads() != 1:  # the first test, or one after a run that set trainer.threads
        torch.set_num_threads(1)
    torch.set_flush_denormal(False)  # nor does a run with trainer.flush_denormal change the arithmetic after it


@pytest.fixture
def data_root(request: pytest.FixtureRequest) -> Path:
    """The root of the real datasets, for the tests marked ``real_data`` (the marker says what they read)."""
    if request.node.get_closest_marker(MARK) is None:
        pytest.fail(f"data_root is for tests marked @pytest.mark.{MARK}(<the paths they read>)")
    return request.config.stash[_ROOT]

"""Every script of ``examples/`` runs as a user would run it (``python <script>``, from another directory), exits 0
and prints what its docstring promises; so do the code blocks of ``docs/library.md``, one after the other. In the test
process (:func:`tests.helpers.run_cli`): a new interpreter would add seconds of imports to each."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.helpers import ROOT, run_cli

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
NUMBER = r"(\d+\.\d+)"


def _custom_model(out: str) -> None:
    """SPIGOT and SPIGOT-CE each train the tree model, and the test loss goes down."""
    for name in ("spigot", "spigot_ce"):
        found = re.search(rf"^{name}: test loss {NUMBER} -> {NUMBER}$", out, re.M)
        assert found, f"no summary line for {name}"
        first, last = map(float, found.groups())
        assert last < first, f"{name}: the test loss did not go down ({first} -> {last})"


def _compare_estimators(out: str) -> None:
    """One row per estimator: a test accuracy and a V-measure, both in [0, 100]."""
    for name in (
        "ste_i",
        "ste_s",
        "spigot",
        "spigot_ce",
        "spigot_eg",
        "marginals",
        "sparsemap",
        "gumbel_softmax",
        "st_gumbel",
        "sfe",
        "direct",
    ):
        found = re.search(rf"^{name} +{NUMBER} +{NUMBER}$", out, re.M)
        assert found, f"no row for {name}"
        assert all(0 <= float(v) <= 100 for v in found.groups())


PROMISES = {"custom_model.py": _custom_model, "compare_estimators.py": _compare_estimators}


def test_every_example_has_a_check():
    assert EXAMPLES, "examples/ holds no script"
    assert {p.name for p in EXAMPLES} == set(PROMISES) == set(SMALL), "add the new example's check to PROMISES"


#: each example at the size its docstring names as the tests' (its promise holds there too)
SMALL = {"custom_model.py": ["--steps", "20"], "compare_estimators.py": ["--steps", "50"]}


def _run(path, cwd, *args: str) -> str:
    """Run a Python file as ``python <path> <args>`` would from ``cwd``; its stdout (it must exit 0)."""
    done = run_cli(*args, cwd=cwd, script=path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    PROMISES[path.name](_run(path, tmp_path, *SMALL[path.name]))


@pytest.mark.slow
def test_library_page_runs(tmp_path):
    """docs/library.md's indented code blocks that are Python (not the one-line call signature) run as one script:
    the structure's arc counts, SPIGOT-CE from one's own model, and a tiny run composed from Python."""
    page = (ROOT / "docs" / "library.md").read_text()
    blocks = [textwrap.dedent(b) for b in re.findall(r"\n\n((?:    .*\n|\n)+)", page)]
    code = [b for b in blocks if "import" in b]
    assert len(code) >= 4, "docs/library.md lost its examples"
    script = tmp_path / "library.py"
    script.write_text("\n".join(code) + "\nassert model is not None and callable(downstream)\n")
    out = _run(script, tmp_path)
    assert "tensor([4., 3.])" in out and "completed" in out
    assert (tmp_path / "runs" / "spigot_ce_k10" / "metrics.json").is_file()

"""The real-data marker of tests/conftest.py, on pytest sessions of its own: a marked test runs where its data is and is
skipped, naming the data and the root, where it is not; it fails if it is skipped for any other reason; only marked
tests get the data root; a LATENTSTRUCT_DATA that names no directory stops the session; the summary counts both."""

from __future__ import annotations

import pytest

TESTS = """
import pytest

@pytest.mark.real_data("sst")
def test_reads_sst(data_root):
    assert (data_root / "sst" / "train.txt").read_text() == "(3 good)"

@pytest.mark.real_data("snli", "glove/vectors.txt")
def test_reads_snli_and_glove(data_root):
    assert (data_root / "glove" / "vectors.txt").is_file()

def test_reads_nothing():
    pass
"""

OTHER_SKIPS = """
@pytest.mark.real_data("sst")
def test_skips_itself(data_root):
    pytest.skip("no GPU here")

@pytest.mark.real_data("sst")
@pytest.mark.skipif(True, reason="some condition")
def test_skipped_by_a_mark(data_root):
    pass

def test_unmarked(data_root):
    pass
"""


def _session(pytester: pytest.Pytester, tests: str = TESTS) -> pytest.RunResult:
    pytester.makepyfile(test_inner=tests)
    # In-process; without hypothesis's plugin, which would import hypothesis anew in every session (1 s each).
    return pytester.runpytest("-p", "tests.conftest", "-p", "no:hypothesispytest", "-p", "no:cacheprovider", "-rs")


def _write(root, *files):
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("(3 good)")


def test_without_the_variable_the_root_is_data_in_the_working_directory(pytester, monkeypatch):
    monkeypatch.delenv("LATENTSTRUCT_DATA", raising=False)
    _write(pytester.path / "data", "sst/train.txt")
    result = _session(pytester, TESTS + OTHER_SKIPS)
    # test_skipped_by_a_mark is skipped at its setup, test_unmarked fails there: errors, not failures.
    result.assert_outcomes(passed=2, skipped=1, failed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*may be skipped only where its data is absent, not for: *some condition*",
            "*data_root is for tests marked @pytest.mark.real_data*",
            "*may be skipped only where its data is absent, not for: *no GPU here*",
            "*2 real-data tests ran: sst 2",  # test_reads_sst, and test_skips_itself (which failed)
            "*1 skipped, their data absent: glove/vectors.txt 1, snli 1",
        ]
    )
    root = pytester.path / "data"
    result.stdout.fnmatch_lines([f"SKIPPED * test_inner.py:*: real data absent: snli, glove/vectors.txt not in {root}"])


def test_the_variable_names_the_root(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("LATENTSTRUCT_DATA", str(tmp_path))
    _write(tmp_path, "sst/train.txt", "snli/dev.tsv", "glove/vectors.txt")
    _write(pytester.path / "data", "sst/train.txt")  # not looked at
    result = _session(pytester)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [f"*real data in {tmp_path}*", "*2 real-data tests ran: glove/vectors.txt 1, snli 1, sst 1", "*0 skipped"]
    )


def test_a_variable_that_names_no_directory_or_a_bare_marker_stops_the_session(pytester, monkeypatch):
    for value in (str(pytester.path / "nowhere"), ""):
        monkeypatch.setenv("LATENTSTRUCT_DATA", value)
        result = _session(pytester)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*LATENTSTRUCT_DATA={value!r} names no directory*"])
    monkeypatch.delenv("LATENTSTRUCT_DATA")
    result = _session(pytester, "import pytest\n\n@pytest.mark.real_data\ndef test_x(data_root):\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*@pytest.mark.real_data needs the paths it reads"])

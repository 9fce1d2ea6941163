"""One table, one code (issue #34): a table's runs' commits compared by the code they ran, in a tiny git repository
made here, and the verdict in the table's status line and in results/README.md."""

import json
import subprocess
from pathlib import Path

import pytest

from latentstruct.report import code, report, tables
from tests.report.test_status import _table


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "x")
    return _git(repo, "rev-parse", "--short=12", "HEAD")


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    base = _commit(repo, {"latentstruct/model.py": "a = 1\n", "configs/train.yaml": "lr: 1\n",
                          "latentstruct/report/tables.py": "r = 1\n", "docs/x.md": "x\n", "tests/test_x.py": "t\n"})
    return repo, base


def test_commits_that_differ_only_outside_the_code_ran_one_code(repo):
    repo, base = repo
    later = _commit(repo, {"latentstruct/report/tables.py": "r = 2\n", "docs/x.md": "y\n", "tests/test_x.py": "u\n",
                           "latentstruct/README.md": "notes\n", "results/t.md": "table\n"})
    assert code.code_diff(base, later, repo) == ()
    found = code.verdict([base, later], is_known=lambda c: code.known(c, repo),
                         diff=lambda a, b: code.code_diff(a, b, repo))
    assert found["verdict"] == "one" and found["groups"] == [sorted([base, later])]
    assert code.sentence(found).startswith("One code: its runs' 2 commits")
    assert code.sentence(code.verdict([base], is_known=lambda c: True, diff=lambda a, b: ())) == ""


def test_a_change_to_the_package_or_the_configs_mixes_code_and_unknown_commits_are_unverifiable(repo):
    repo, base = repo
    model = _commit(repo, {"latentstruct/model.py": "a = 2\n"})
    config = _commit(repo, {"configs/train.yaml": "lr: 2\n"})

    def verdict(commits, dirty=()):
        return code.verdict(commits, dirty, is_known=lambda c: code.known(c, repo),
                            diff=lambda a, b: code.code_diff(a, b, repo))

    mixed = verdict([base, model, config])
    assert mixed["verdict"] == "mixed" and len(mixed["groups"]) == 3
    assert mixed["files"] == ["configs/train.yaml", "latentstruct/model.py"]
    assert "**Mixed code**: its runs ran 3 different codes" in code.sentence(mixed)
    stranger = verdict([config, "0123456789ab"])  # not in this history
    assert stranger["verdict"] == "unverifiable"
    assert stranger["unverifiable"] == [{"commit": "0123456789ab", "why": code.UNKNOWN}]
    dirty = verdict([f"{config}+dirty"])  # a GPU machine's stamp
    assert dirty["verdict"] == "unverifiable" and dirty["unverifiable"][0]["why"] == code.UNCOMMITTED
    assert verdict([config], dirty=[config])["verdict"] == "unverifiable"  # a run recorded git_dirty
    assert verdict([base, model, "0123456789ab"])["verdict"] == "mixed"  # two known codes are enough
    assert verdict([])["verdict"] == "none" and code.sentence(verdict([])) == ""


def test_a_table_of_mixed_code_says_so_in_its_status_line_and_the_report(tmp_path, monkeypatch):
    differs = {frozenset({"aaa", "bbb"}): ("latentstruct/model.py",)}
    monkeypatch.setattr(code, "known", lambda c, repo=None: c in ("aaa", "bbb"))
    monkeypatch.setattr(code, "code_diff", lambda a, b, repo=None: differs.get(frozenset({a, b}), ()))
    md, data = _table(tmp_path)  # four runs recorded at commit abc1234: not in history
    assert data["code"]["verdict"] == "unverifiable" and "Code unverifiable: abc1234" in md.splitlines()[2]
    for i, path in enumerate(sorted((tmp_path / "runs").rglob("metrics.json"))):  # two codes
        path.write_text(json.dumps({**json.loads(path.read_text()), "git_commit": "aaa" if i % 2 else "bbb"}))
    out = tmp_path / "results" / "p" / "t1.md"
    tables.main([str(tmp_path / "spec.yaml"), "--runs", str(tmp_path / "runs"), "--out", str(out)])
    line = out.read_text().splitlines()[2]
    assert line.endswith("**Mixed code**: its runs ran 2 different codes (commits aaa; bbb; 1 file(s) of "
                         "latentstruct/ and configs/ differ: latentstruct/model.py).")
    assert report.main(["--results", str(tmp_path / "results")]) == 0
    page = (tmp_path / "results" / "README.md").read_text()
    assert "1 mix code, 0 with code unverifiable." in page and "**Mixed code**: its runs ran 2" in page
    differs.clear()  # the same commits seen again with a git that finds one code: make report rewrites the line
    assert report.main(["--results", str(tmp_path / "results")]) == 0
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["code"]["verdict"] == "one" and out.read_text().splitlines()[2] == again["status_line"]
    assert again["status_line"] == line.split(" **Mixed code**")[0] + " One code: its runs' 2 commits ran the " \
                                                                       "same latentstruct/ and configs/."
    assert "0 mix code" in (tmp_path / "results" / "README.md").read_text()

"""One table, one code: whether the runs behind a table ran the same code.

A run records the commit checked out when it started (``git_commit``, and ``git_dirty`` when tracked files differed
from it: :func:`latentstruct.records.environment`). Two commits ran the same code when ``git diff`` between them shows
no file under :data:`CODE` outside :data:`NOT_CODE` — the package and the configs, not the report (which only reads
records), the docs or the tests. A comment or docstring edit in the package still counts: git cannot tell it apart.

:func:`verdict` groups a table's commits by their code and says ``one`` (one group), ``mixed`` (two or more: the files
that differ are named) or ``unverifiable`` (one group among the commits this git knows, but some commit is not in
its history, or a run had uncommitted changes — ``<sha>+dirty``, or ``git_dirty`` — so its code cannot be known);
``none`` when no commit is recorded. ``mixed`` wins over ``unverifiable``: two known commits that differ are enough.
The sidecar keeps the verdict and its sentence ends the table's status line (:mod:`latentstruct.report.status`);
``make report`` (:func:`latentstruct.report.report.main`) computes it again for every sidecar with the git at hand.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["CODE", "NOT_CODE", "known", "code_diff", "verdict", "sentence"]

REPO = Path(__file__).resolve().parents[2]
#: the paths whose changes change what a run computes ...
CODE = ("latentstruct", "configs")
#: ... except these (the report reads records, it does not make them) and documentation files
NOT_CODE = ("latentstruct/report", "*.md")
#: a commit stamp of a checkout with uncommitted changes (``scripts/bundle.py``, ``LATENTSTRUCT_GIT_COMMIT``)
DIRTY = "+dirty"
#: why a commit is unverifiable
UNKNOWN, UNCOMMITTED = "not in this git's history", "uncommitted changes"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


@functools.lru_cache(maxsize=4096)
def known(commit: str, repo: Path = REPO) -> bool:
    """Whether ``commit`` (a sha, possibly abbreviated) is a commit of ``repo``'s history."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode == 0
    except OSError:
        return False


@functools.lru_cache(maxsize=4096)
def code_diff(a: str, b: str, repo: Path = REPO) -> tuple[str, ...]:
    """The files under :data:`CODE`, outside :data:`NOT_CODE`, that differ between commits ``a`` and ``b``."""
    paths = [*CODE, *(f":(exclude,glob)**/{p}" if p.startswith("*") else f":(exclude){p}" for p in NOT_CODE)]
    done = _git(repo, "diff", "--name-only", a, b, "--", *paths)
    if done.returncode:
        raise RuntimeError(f"git diff {a} {b}: {done.stderr.strip()}")
    return tuple(sorted(done.stdout.split()))


def verdict(commits: Iterable[str], dirty: Iterable[str] = (), diff: Callable[[str, str], tuple] | None = None,
            is_known: Callable[[str], bool] | None = None) -> dict:
    """Whether ``commits`` (a table's runs' ``git_commit`` values; ``dirty``: those of runs with uncommitted
    changes) ran one code (module docstring). ``diff`` and ``is_known`` stand in for git (tests)."""
    diff, is_known = diff or code_diff, is_known or known
    commits = sorted({str(c) for c in commits if c is not None and str(c) not in ("", "unknown", "nan")})
    dirty = {str(c) for c in dirty}
    unverifiable, clean = {}, []
    for commit in commits:
        sha = commit.removesuffix(DIRTY)
        if commit.endswith(DIRTY) or commit in dirty:
            unverifiable[sha] = UNCOMMITTED
        elif not is_known(sha):
            unverifiable[sha] = UNKNOWN
        else:
            clean.append(sha)
    groups: list[list[str]] = []
    files: set[str] = set()
    for sha in clean:
        for group in groups:
            if not diff(group[0], sha):
                group.append(sha)
                break
        else:
            if groups:
                files.update(diff(groups[0][0], sha))
            groups.append([sha])
    shas = sorted({c.removesuffix(DIRTY) for c in commits})
    if len(groups) > 1:
        state = "mixed"
    elif unverifiable:
        state = "unverifiable"
    else:
        state = "one" if groups else "none"
    return {"verdict": state, "commits": shas, "groups": groups, "files": sorted(files),
            "unverifiable": [{"commit": c, "why": why} for c, why in sorted(unverifiable.items())]}


def _few(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def sentence(found: dict | None) -> str:
    """The status line's words for a :func:`verdict` ('' for one commit, or none)."""
    if not found or found["verdict"] == "none" or (found["verdict"] == "one" and len(found["commits"]) < 2):
        return ""
    if found["verdict"] == "one":
        return f"One code: its runs' {len(found['commits'])} commits ran the same latentstruct/ and configs/."
    if found["verdict"] == "mixed":
        groups = "; ".join(_few(g, 3) for g in found["groups"])
        return (f"**Mixed code**: its runs ran {len(found['groups'])} different codes (commits {groups}; "
                f"{len(found['files'])} file(s) of latentstruct/ and configs/ differ: {_few(found['files'])}).")
    why = "; ".join(f"{u['commit']}: {u['why']}" for u in found["unverifiable"])
    return f"Code unverifiable: {why}."

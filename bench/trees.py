"""What both benchmarks need to time this checkout beside an older commit: the checkouts ("trees") and the machine.

``baseline_tree(rev, work)`` checks REV out into a temporary ``git worktree`` under ``work`` (removed on exit); a
subprocess run with ``PYTHONPATH=<tree>`` and the tree as its working directory imports that tree's
``latentstruct`` (``check_import`` makes sure of it).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Tree:
    """A checkout whose ``latentstruct`` is run: "now" (this one) or "before" (a worktree of the baseline)."""

    label: str
    path: Path
    commit: str  # full hash of its HEAD


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def this_tree() -> Tree:
    return Tree("now", ROOT, git("rev-parse", "HEAD"))


@contextlib.contextmanager
def baseline_tree(rev: str, work: Path) -> Iterator[tuple[Tree, dict[str, str]]]:
    """The "before" tree at ``rev`` (a worktree under ``work``) and a description of it for the results header."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = work / "baseline"
    git("worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        subject = git("log", "-1", "--format=%s", commit)
        yield Tree("before", path, commit), {"rev": rev, "commit": commit, "subject": subject}
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def tree_env(tree: Tree, threads: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that must import ``tree``'s latentstruct."""
    env = dict(os.environ, PYTHONPATH=str(tree.path), **extra)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def check_import(tree: Tree, env: dict[str, str]) -> str:
    """The ``latentstruct/__init__.py`` a subprocess of this tree imports; raises unless it is the tree's own."""
    out = subprocess.run(
        [sys.executable, "-c", "import latentstruct; print(latentstruct.__file__)"],
        cwd=tree.path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.path.resolve()):
        raise RuntimeError(f"the {tree.label} tree imports latentstruct from {out}, not from {tree.path}")
    return out


def stamp(*paths: str) -> dict[str, str]:
    """What a one-process benchmark's sheet records of where it ran: this checkout's commit ("(dirty)" when any of
    ``paths`` has uncommitted changes), the machine and the time."""
    dirty = git("status", "--porcelain", *paths)
    return {"commit": git("rev-parse", "--short=12", "HEAD") + (" (dirty)" if dirty else ""),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def write_sheet(out: Path, sheet: dict, page: str) -> None:
    """The sheet as ``out`` with ``.json``, its Markdown page as ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(sheet, indent=1) + "\n")
    out.write_text(page)
    print(f"wrote {out} and {out.with_suffix('.json')}")

"""Where the tests find the real datasets: ``$LATENTSTRUCT_DATA`` (what ``.ci/run`` and the Makefile set), else
``../shared/data`` beside the checkout (the layout CI clones into). Tests that need a file skip when neither has it."""

from __future__ import annotations

import os
from pathlib import Path

_ROOTS = (os.environ.get("LATENTSTRUCT_DATA"), Path(__file__).resolve().parents[2] / "shared" / "data")


def real_data(name: str) -> Path | None:
    """The data root (resolved) that holds ``name`` (a folder or a file, relative to it), or None."""
    for root in _ROOTS:
        if root and (Path(root) / name).exists():
            return Path(root).resolve()
    return None


def real_dir(name: str) -> Path | None:
    """``real_data(name) / name``, or None."""
    root = real_data(name)
    return None if root is None else root / name

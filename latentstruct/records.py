"""Run records (DESIGN.md §7, a contract): metrics.json, history.csv and checkpoint.pt, written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch

__all__ = ["RESUMABLE", "flatten", "flat_experiment", "write_json", "read_record", "write_history", "save_checkpoint",
           "load_checkpoint", "environment"]

# The flat config keys (and prefixes) that may change between a run and its resumption: how it runs, not what it
# computes. Two configurations that differ only in these are the same run (a checkpoint resumes; a report groups them).
RESUMABLE = ("paths", "logger", "trainer.resume", "trainer.force", "trainer.progress", "trainer.log_seconds",
             "trainer.threads", "trainer.device", "trainer.max_steps", "trainer.max_epochs")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys: ``{"a": {"b": 1, "c": {}}, "d": [2]}`` -> ``{"a.b": 1, "d": [2]}``.

    Lists are values. An empty dict holds no setting and gives no key, so a config where a group is empty
    (``optim_groups: {}``) flattens like one written before that group existed: resuming compares the same keys.
    """
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return flat


def flat_experiment(name: str) -> str:
    """An experiment's name as ``+experiment=`` takes it: ``sst_spigot`` for the nested ``sst/spigot`` of the records
    (and notes) written before the experiments got flat ``<task>_<method>`` names; a flat name is kept."""
    return name.replace("/", "_")


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: dict[str, Any]) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")

    _atomic(Path(path), write)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's metrics.json, or None if it has none (or an unreadable one)."""
    try:
        return json.loads((Path(run_dir) / "metrics.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_history(path: Path, history: list[dict[str, float]]) -> None:
    _atomic(Path(path), lambda tmp: pd.DataFrame(history).to_csv(tmp, index=False))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    _atomic(Path(path), lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=False)


def _git_commit() -> tuple[str, bool | None]:
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return sha, bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None


def environment(device: torch.device) -> dict[str, Any]:
    """git commit, hardware ("cpu" or the GPU's name) and the torch version, for the run record."""
    sha, dirty = _git_commit()
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"git_commit": sha, "git_dirty": dirty, "hardware": hardware, "torch": torch.__version__}

"""Run records (DESIGN.md §7, a contract): metrics.json, history.csv and checkpoint.pt, written atomically, and the
claim that keeps two launchers from running one run at once (claim.json, :func:`claim`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

__all__ = ["RESUMABLE", "COMMIT_ENV", "FINAL_WEIGHTS", "CLAIM", "Claim", "claim", "describe_claim", "flatten",
           "flat_experiment", "write_json", "remove_partial_writes", "read_record", "write_history", "save_checkpoint",
           "load_checkpoint", "model_weights", "load_model_weights", "environment"]

# The flat config keys (and prefixes) that may change between a run and its resumption: how it runs, not what it
# computes. Two configurations that differ only in these are the same run (a checkpoint resumes; a report groups them).
RESUMABLE = ("paths", "logger", "trainer.resume", "trainer.force", "trainer.progress", "trainer.log_seconds",
             "trainer.threads", "trainer.device", "trainer.max_steps", "trainer.max_epochs", "trainer.checkpoint_every",
             "trainer.checkpoint_seconds", "trainer.keep_checkpoint")


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


#: the run files written through a temporary file (``.<name>.<random>``) that a killed writer may leave behind
_WRITTEN = ("metrics.json", "history.csv", "checkpoint.pt")


def remove_partial_writes(run_dir: Path) -> list[Path]:
    """Remove the temporary files of writes that never finished (a process killed mid-write leaves one beside the
    file it was replacing, which is whole); call it only while holding the run's claim. Returns those removed."""
    removed = [p for name in _WRITTEN for p in Path(run_dir).glob(f".{name}.*") if p.is_file()]
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


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


#: the key, true, of a checkpoint that keeps only a completed run's final weights (model, config, step, history), as
#: ``scripts/carry.py`` packs them for the report steps that read weights: such a checkpoint cannot resume a run
FINAL_WEIGHTS = "final_weights_only"


def _rebuilt(model: torch.nn.Module) -> set[str]:
    """The state keys of the parameters that building the model rebuilds from the data (frozen pretrained word
    vectors: a parameter marked ``rebuilt_from_data``), which a checkpoint need not hold."""
    return {name for name, p in model.named_parameters(remove_duplicate=False)
            if getattr(p, "rebuilt_from_data", False) and not p.requires_grad}


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` less what building the model rebuilds from the data (:func:`_rebuilt`)."""
    skip = _rebuilt(model)
    return {k: v for k, v in model.state_dict().items() if k not in skip}


def load_model_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load a checkpoint's ``model`` (:func:`model_weights`, or a full state dict of an older checkpoint) into
    ``model``, which was built from the same data: only the rebuilt parameters may be missing."""
    result = model.load_state_dict(weights, strict=False)
    missing = set(result.missing_keys) - _rebuilt(model)
    if missing or result.unexpected_keys:
        raise RuntimeError(f"the checkpoint's model does not fit: missing {sorted(missing)}, unexpected "
                           f"{sorted(result.unexpected_keys)}")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    _atomic(Path(path), lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=False)


#: where a checkout without git (a copy of the tree on a GPU machine) finds its commit: ``<sha>`` or ``<sha>+dirty``,
#: as ``scripts/bundle.py`` stamps it (the scripts that run there export it from ``.device/commit.txt``)
COMMIT_ENV = "LATENTSTRUCT_GIT_COMMIT"


def _git_commit() -> tuple[str, bool | None]:
    """The checkout's commit and whether tracked files differ from it; without git, :data:`COMMIT_ENV`'s stamp."""
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
        stamp = os.environ.get(COMMIT_ENV, "").strip()
        if not stamp:
            return "unknown", None
        sha, _, dirty = stamp.partition("+")
        return sha, dirty == "dirty"


def environment(device: torch.device) -> dict[str, Any]:
    """git commit, hardware ("cpu" or the GPU's name) and the torch version, for the run record."""
    sha, dirty = _git_commit()
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"git_commit": sha, "git_dirty": dirty, "hardware": hardware, "torch": torch.__version__}


# ------------------------------------------------------------------------------------------------------ claims
#: the file that claims a run directory while a process runs it
CLAIM = "claim.json"


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found: ``held``, whether this process now holds the run; ``holder``, the claim written by
    another process — the live one that holds it (``held`` false), or one that died holding it, whose stale claim
    this process took over (``held`` true) — or None."""

    held: bool
    holder: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return self.held


def _read_claim(fd: int) -> dict[str, Any] | None:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode()) or None
    except (OSError, ValueError):
        return None


def describe_claim(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h since 2026-11-25 23:15:02 UTC`` (``an unknown process`` for a claim without content)."""
    if not holder:
        return "an unknown process"
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"


@contextlib.contextmanager
def claim(run_dir: str | Path) -> Iterator[Claim]:
    """Claim ``run_dir`` for this process while the ``with`` block runs.

    The claim is ``claim.json`` in the run directory (host, pid, since) under an exclusive ``flock``, held as long as
    the block runs and released by the kernel when the process ends, however it ends: a claim left by a killed
    process is stale and the next claimant takes it over (``Claim.holder`` then tells whose it was). If a live
    process holds it, the block runs at once with a false :class:`Claim` naming that process, and nothing is
    written. On leaving the block the file is removed (a directory without claim.json is claimed by no one).
    """
    path = Path(run_dir) / CLAIM
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_claim(fd)
            os.close(fd)
            yield Claim(False, holder)
            return
        try:  # the holder before us may have removed the file between our open and our lock: claim the new one
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    try:
        stale = _read_claim(fd)
        mine = {"host": socket.gethostname(), "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        yield Claim(True, stale)
    finally:
        path.unlink(missing_ok=True)  # before the lock goes: a newcomer then claims a new file, not ours
        os.close(fd)

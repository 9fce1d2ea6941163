"""Run records (DESIGN.md §7, a contract): metrics.json, history.csv and checkpoint.pt, written atomically, and the
claim that keeps two launchers from running one run at once (claim.json, :func:`claim`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["NOT_RESULT", "LENGTH", "LOCATION", "RUN_FILE", "REPORT_FILE", "RunMismatch", "identity", "location",
           "fingerprint", "differences", "check_run_dir", "write_run_file", "threads", "COMMIT_ENV", "git_commit",
           "FINAL_WEIGHTS", "CLAIM", "Claim", "claim", "describe_claim", "flatten", "LEGACY_PARTS", "nested",
           "write_json", "remove_partial_writes", "read_record", "write_history", "save_checkpoint", "load_checkpoint",
           "model_weights", "load_model_weights", "cpu_name", "environment"]

# What a run computes is its configuration minus these flat keys (and prefixes): where its files go, how it reports
# progress, when it checkpoints, whether it resumes, and the device (a run may move between CPU and GPU; the record
# says which ran it). They are left out of the run's directory name (configs/train.yaml's override_dirname
# exclude_keys, kept equal by a test) and of its fingerprint. trainer.threads is NOT among them: the thread count
# changes the floating-point sums, so it is part of both.
NOT_RESULT = ("paths", "logger", "sweep", "trainer.resume", "trainer.force", "trainer.progress", "trainer.log_seconds",
              "trainer.log_every", "trainer.device", "trainer.checkpoint_every", "trainer.checkpoint_seconds",
              "trainer.keep_checkpoint")
#: how long a run trains: not part of its identity either, since a run goes on exactly to a longer length in the same
#: directory (train.py); a shorter one than a directory's completed run is refused there
LENGTH = ("trainer.max_steps", "trainer.max_epochs")
#: where a run finds its inputs (the data root a dataset reads, the GloVe cache, the run a fork starts from: its
#: fingerprint and step are in the identity instead, as ``trainer.forked_from``, train.py): settings of every depth
#: whose last name is one of these are not part of its identity either, so that the same run resumes and is skipped on
#: a machine whose data lie elsewhere (the campaign's, the GPU machine's); an identity recorded with them is compared
#: without them
LOCATION = ("data_dir", "cache_dir", "init_from")
#: the file of a run directory that records what the run computes (its identity) and its fingerprint
RUN_FILE = "run.json"
#: the file of a completed run that holds what the reports draw of its final model (``Task.report_record``)
REPORT_FILE = "report.json"
#: the environment variables that set torch's CPU threads, recorded with the counts in force
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


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


#: the model parts that records made before the task was one nested node (commit 8eb003f and earlier) hold at the top
#: level of their configuration (``estimator.eta``, and ``decoder: null`` for a part the task did not take); they are
#: under the task now (``task.estimator.eta``), and :func:`nested` reads an old record's keys so
LEGACY_PARTS = ("encoder", "scorer", "structure", "estimator", "decoder", "sigma_net", "energy", "infnet", "cost_net",
                "composer")


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat keys of a run's configuration or identity (:func:`flatten`) in the current layout: a record written
    before the task was one nested node has its model parts at the top level, ``estimator.eta`` → ``task.estimator.eta``
    and ``encoder._target_`` → ``task.encoder._target_``; its null part slots (``decoder: null``, a part the task did
    not take) are dropped, as the current layout has none. A record of the current layout is returned as it is. Where
    records are read (:func:`latentstruct.report.tables.load_runs`: the tables, the figures, the lab's matrix; the
    ListOps reports), so that a table spec's keys (``task.estimator.eta``) match the runs of either layout; the record
    files themselves are not rewritten (their fingerprints stay those they were made with)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        head = key.split(".", 1)[0]
        if head in LEGACY_PARTS:
            if key == head and value is None:
                continue
            key = f"task.{key}"
        out[key] = value
    return out


def _located(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in LOCATION


def identity(config: dict) -> dict[str, Any]:
    """What a run computes: the flat keys of its resolved ``config`` but those of :data:`NOT_RESULT`, :data:`LENGTH`
    and :data:`LOCATION`."""
    return {k: v for k, v in flatten(config).items() if not k.startswith(NOT_RESULT + LENGTH) and not _located(k)}


def fingerprint(ident: dict[str, Any]) -> str:
    """A short hash (12 hex digits) of an :func:`identity`: equal identities, equal fingerprints."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per key whose value differs between two identities: ``estimator._target_: a.Spigot → a.SFE``."""
    missing = "(absent)"
    return [f"{k}: {old.get(k, missing)} → {new.get(k, missing)}" for k in sorted(old.keys() | new.keys())
            if old.get(k, missing) != new.get(k, missing) and not _located(k)]


class RunMismatch(ValueError):
    """A run directory holds the record of another configuration (or one that cannot be checked)."""


def check_run_dir(run_dir: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """The identity recorded in ``run_dir`` (its :data:`RUN_FILE`), or None for a directory without a run; raises
    :class:`RunMismatch` when it differs from ``ident`` (one line per differing key), or when the directory holds a
    record without a :data:`RUN_FILE` (its configuration cannot be checked). Reads nothing else."""
    run_dir = Path(run_dir)
    try:
        recorded = json.loads((run_dir / RUN_FILE).read_text())
    except FileNotFoundError:
        if (run_dir / "metrics.json").exists():
            raise RunMismatch(f"{run_dir} holds a run record without {RUN_FILE}: what it computed cannot be checked "
                              "against this configuration") from None
        return None
    except json.JSONDecodeError as err:
        raise RunMismatch(f"{run_dir / RUN_FILE} is damaged ({err})") from None
    lines = differences(recorded.get("identity", {}), ident)
    if lines:
        raise RunMismatch(f"{run_dir} holds the run of another configuration (fingerprint "
                          f"{recorded.get('fingerprint')}, this one {fingerprint(ident)}):\n  " + "\n  ".join(lines))
    return recorded


def location(config: dict) -> dict[str, Any]:
    """Where the run of the resolved ``config`` finds its inputs: its flat :data:`LOCATION` keys (not part of its
    identity; recorded beside it, for the reports that rebuild a run's data)."""
    return {k: v for k, v in flatten(config).items() if _located(k)}


def write_run_file(run_dir: Path, ident: dict[str, Any], located: dict[str, Any] | None = None) -> str:
    """Record ``ident``, its fingerprint and where the run's inputs lie (``located``, :func:`location`; not
    fingerprinted) in ``run_dir``/:data:`RUN_FILE`; returns the fingerprint."""
    fp = fingerprint(ident)
    write_json(Path(run_dir) / RUN_FILE, {"fingerprint": fp, "identity": ident, "located": located or {}})
    return fp


def threads() -> dict[str, Any]:
    """torch's CPU thread counts in force (intra- and inter-op) and the environment variables that set them."""
    env = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}
    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(), "env": env}


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
_WRITTEN = ("metrics.json", "history.csv", "checkpoint.pt", RUN_FILE)


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


#: history.csv's columns that measure the machine, not the run: the run's wall clock and its process CPU seconds since
#: it began (each summed over the processes that resumed it) and the machine's 1-minute load average, at each
#: evaluation. A run starved by other work shows CPU seconds growing slower than its wall clock and a load above its
#: threads. They, and a task's own timings, are what ``reads_the_machine`` tells apart from the results.
MACHINE_COLUMNS = ("wall_seconds", "cpu_seconds", "load_1min")


def reads_the_machine(key: str) -> bool:
    """Whether a history column or metric reads the machine (a clock, its load) rather than the run:
    ``MACHINE_COLUMNS``, any ``*seconds`` (``valid/infer_seconds``) and the ``time/`` shares of a step. Two runs that
    compute the same differ only in these."""
    return key in MACHINE_COLUMNS or key.endswith("seconds") or key.startswith("time/")


def write_history(path: Path, history: list[dict[str, float]]) -> None:
    import pandas as pd  # here, not at the top: a process that never evaluates (a refusal, --cfg) saves its 0.4 s

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


def git_commit() -> tuple[str, bool | None]:
    """The code's commit and whether tracked files differ from it: :data:`COMMIT_ENV`'s stamp where it is set (the
    GPU machine, whose copy of the tree may carry a stale ``.git``: the stamp is made from this checkout just before
    the call), else git's answer for the checkout, else ``("unknown", None)``."""
    stamp = os.environ.get(COMMIT_ENV, "").strip()
    if stamp:
        sha, _, dirty = stamp.partition("+")
        return sha, dirty == "dirty"
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


def cpu_name() -> str:
    """The host CPU's model (``/proc/cpuinfo``'s model name, else what :mod:`platform` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    """git commit, hardware ("cpu" or the GPU's name), the host CPU's model, the torch version and its threads, for
    the run record. The CPU's model is there because one code and seed can compute differently on two CPUs (the
    kernels a library picks differ): issue #34's NER InfNet run, epoch 11 valid span F1 78.55 on one machine, 79.21
    on another, from bit-identical pretraining."""
    sha, dirty = git_commit()
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"git_commit": sha, "git_dirty": dirty, "hardware": hardware, "cpu": cpu_name(), "torch": torch.__version__,
            "threads": threads()}


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

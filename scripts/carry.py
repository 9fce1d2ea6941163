"""A table's runs between this machine and a GPU machine, within what a device call carries (``scripts/gpu_table.sh``).

    python -m scripts.carry deadline SECONDS --claims DIR [--grace 90] -- CMD ...   # there: stop the runs in time
    python -m scripts.carry pack T --runs multirun --out $OUT                         # there: what comes back
    python -m scripts.carry unpack DIR --runs multirun                                # here: the files that came back
    python -m scripts.carry stage T --runs multirun                                   # here: what the next call carries

``T`` is a table as ``make table`` takes it (``spigot/table3_sst``); its runs are the sweep directory under ``--runs``
that ``latentstruct.report.reproduce`` gives it. The device tool brings back at most 8 files of at most 16 MiB, 64 MiB
together, and a call carries at most 64 MiB: the working tree, the bundle's folders and the folders named in
``carry`` together. A run's record (metrics.json, history.csv, .hydra/, train.log) takes a few kB; its checkpoint is
the model, the optimizer state and the RNG states: 58 MiB for SST and CoNLL-2003 (5 M trainable parameters, most of
them the random-initialised embeddings, and Adam's two moments), 7 MiB for the multi-label energy models, 4 MiB for
ListOps, kilobytes for the synthetic tasks. So records always travel, and checkpoints as they fit:

* **pack** writes ``records.tar.gz`` — every run directory of the table without its checkpoint, with ``pack.json``
  (each run's status, step and what became of its checkpoint) and ``--log`` — and then one tar of checkpoints, each
  gzip-compressed (level 1: ~6% off float32 weights), split into parts ``checkpoints.tar.000``, ``.001``, ... of at
  most 16 MiB, as many as fit in the 7 files and the 64 MiB left: first those of the interrupted runs (their next
  launch resumes from them), the one that went furthest first; then, for the completed runs that a report step of the
  table reads weights from (the SST tree drawings: the spec's seed of each row; the ListOps trees: every run), their
  final weights alone (model, configuration, step, history: ``latentstruct.records.FINAL_WEIGHTS``, no optimizer
  state). A checkpoint that does not fit stays behind and is lost with the machine: that interrupted run starts over
  at its next launch, that completed run's report step cannot run here. ``pack.json`` and the last line of pack say
  which.
* **unpack** puts what came back into the sweep directory here: the records, then the checkpoints; the session's log
  goes to ``<runs>/device_logs/``. A run completed here, or one a live process runs here (its claim held), is never
  replaced; a run that completed on the device keeps no older checkpoint of its own (it would hold the weights of an
  earlier step). It prints how many runs are completed
  or interrupted, and which checkpoints were left on the device.
* **stage** packs the same way, for the next device call, into ``.device/state/<paper>-<table>/``: the records (so
  that completed runs are skipped there) and the interrupted runs' checkpoints that fit in what that call may carry
  beside the working tree, the wheels and the table's data (``--budget-mib``; by default computed from their sizes).
  It prints the ``carry`` list to give the device tool.
* **deadline** runs a command in its own process group and, at the deadline or when it is itself sent SIGTERM or
  SIGINT, sends SIGTERM to that group: every run checkpoints at its next step, records ``status: interrupted`` and
  exits (latentstruct.guards). It waits until no run under ``--claims`` holds its claim any more (at most ``--grace``
  seconds), then kills what is left of the group (idle launcher workers). Exit status: the command's, or 124 when it
  was stopped.

The 58 MiB checkpoints (54 MiB compressed) are what limits the text tables: one of them fills a call's way back, and
a call carries one at most beside the working tree (4.3 MiB), the wheels and the table's data. So an SST or NER run
that does not finish within one session can only go on in the next if it is the one interrupted run that travels;
size each session (runs at a time, seeds, methods) so that runs finish in it: docs/gpu.md.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
#: what a device call brings back (files, bytes per file, bytes in all) and what it carries
BACK_FILES, PART_BYTES, BACK_BYTES = 8, 16 * MIB - 64 * 1024, 64 * MIB  # parts a little under the limit
CARRY_BYTES = 64 * MIB
RECORDS = "records.tar.gz"
PARTS = "checkpoints.tar"
PACK_JSON = "pack.json"
SESSION_LOG = "session.log"
CHECKPOINT = "checkpoint.pt"
#: files of a run directory that never travel in the records: the checkpoint (apart), the claim; and the temporary
#: files of unfinished writes (latentstruct.records writes through ``.<name>.<random>``)
_NEVER = (CHECKPOINT, "claim.json")
_UNFINISHED = tuple(f".{name}." for name in ("metrics.json", "history.csv", CHECKPOINT))
#: the data-root folders each table's runs read (what stage counts towards the carried bytes)
TABLE_DATA = {
    "spigot/table3_sst": ["sst"], "spigot/table3_snli": ["snli"], "listops/table": ["listops"],
    "energy/mlc": ["bibtex", "delicious"], "energy/ner": ["conll2003"], "energy/pos": ["twpos"],
    "direct/knn": ["mnist"], "direct/vae": ["mnist"],
}


class CarryError(RuntimeError):
    """A pack cannot be made or read; the message says why in one line."""


# ------------------------------------------------------------------------------------------------------ the runs


@dataclass
class Run:
    """A run directory of the table (``rel``: its path under the sweep directory) and what its record says."""

    path: Path
    rel: str
    status: str | None
    step: int | None

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT


def find_runs(sweep: Path) -> list[Run]:
    """Every run directory under ``sweep``: a directory with a metrics.json, a checkpoint or a .hydra/ folder."""
    dirs = {p.parent for name in ("metrics.json", CHECKPOINT) for p in sweep.rglob(name)}
    dirs |= {p.parent for p in sweep.rglob(".hydra") if p.is_dir()}
    runs = []
    for d in sorted(dirs):
        try:
            record = json.loads((d / "metrics.json").read_text())
        except (OSError, ValueError):
            record = {}
        step = record.get("step", record.get("steps"))  # an interrupted record's step, a completed one's steps
        runs.append(Run(d, d.relative_to(sweep).as_posix(), record.get("status"), step))
    return runs


#: the lab's benchmark (``latentstruct.report.matrix``, its spec ``experiments/lab_matrix.yaml``): carried and run by
#: the campaign like a paper table, under this name
LAB_MATRIX = "lab_matrix"


def sweep_dir(table: str, runs: str | Path) -> Path:
    """The directory under ``runs`` holding the table's runs (``latentstruct.report.reproduce.sweep_root``; for
    :data:`LAB_MATRIX`, its spec's ``sweep_dir``)."""
    if table == LAB_MATRIX:
        from latentstruct.report.matrix import SPEC, load_spec

        return Path(runs, load_spec(SPEC)["sweep_dir"])
    from latentstruct.report.reproduce import sweep_root

    return Path(sweep_root(table, str(runs)))


def weights_needed(table: str, sweep: Path, runs: list[Run]) -> list[Run]:
    """The completed runs whose weights a report step of the table reads: the runs a ``trees`` step draws with (the
    spec's seed of each of its rows) and, for a ``listops`` step, every completed run; in the spec's order."""
    from latentstruct.report.reproduce import spec_path
    from latentstruct.report.tables import load_spec

    spec = load_spec(spec_path(table))
    done = {r.path.resolve(): r for r in runs if r.status == "completed"}
    chosen: dict[Path, Run] = {}
    for step in (spec.get("reproduce") or {}).get("steps") or []:
        if "trees" in step and done:
            from latentstruct.report.trees import seed_runs

            for run_dir in seed_runs(spec, sweep, step["seed"], step.get("rows")).values():
                if Path(run_dir).resolve() in done:
                    chosen.setdefault(Path(run_dir).resolve(), done[Path(run_dir).resolve()])
        if "listops" in step:
            chosen.update({k: v for k, v in done.items() if k not in chosen})
    return [r for r in chosen.values() if r.checkpoint.is_file()]


# ----------------------------------------------------------------------------------------------------- pack


def _records_tar(sweep: Path, runs: list[Run], manifest: dict, log_file: Path | None, out: Path) -> int:
    """``records.tar.gz``: every file of the sweep directory but checkpoints, claims and unfinished writes; then
    pack.json and the log. Returns its size."""
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(p for p in sweep.rglob("*") if p.is_file()):
            if path.name in _NEVER or path.name.startswith(_UNFINISHED):
                continue
            tar.add(path, arcname=f"runs/{path.relative_to(sweep).as_posix()}")
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(PACK_JSON)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        if log_file is not None and Path(log_file).is_file():
            tar.add(log_file, arcname=SESSION_LOG)
    return out.stat().st_size


def _final_weights(path: Path, into: Path) -> Path:
    """A copy of a completed run's checkpoint with its final weights alone (no optimizer or RNG state)."""
    import torch

    from latentstruct.records import FINAL_WEIGHTS

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    slim = {k: ckpt[k] for k in ("model", "config", "step", "history", "wall_seconds") if k in ckpt}
    torch.save({**slim, FINAL_WEIGHTS: True}, into)
    return into


def _gzip(path: Path, into: Path) -> Path:
    """``path`` gzip-compressed at level 1 into ``into``: float32 weights and Adam moments shrink by ~6% (SST's 58 MiB
    checkpoint to 54 MiB, which a device call can then carry beside the working tree, the wheels and the data)."""
    with open(path, "rb") as f, gzip.open(into, "wb", compresslevel=1) as g:
        shutil.copyfileobj(f, g, 4 * MIB)
    return into


def _write_parts(entries: list[tuple[str, Path]], out: Path, part_bytes: int) -> list[Path]:
    """One tar of ``(arcname, file)`` entries, split into ``out/checkpoints.tar.NNN`` of at most ``part_bytes``."""
    parts: list[Path] = []

    class Splitter(io.RawIOBase):
        def __init__(self):
            self.file, self.left = None, 0

        def writable(self):
            return True

        def write(self, b):
            view, done = memoryview(b), 0
            while done < len(view):
                if self.left == 0:
                    if self.file:
                        self.file.close()
                    parts.append(out / f"{PARTS}.{len(parts):03d}")
                    self.file, self.left = open(parts[-1], "wb"), part_bytes
                n = min(self.left, len(view) - done)
                self.file.write(view[done:done + n])
                done, self.left = done + n, self.left - n
            return done

        def close(self):
            if self.file:
                self.file.close()
            super().close()

    sink = Splitter()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in entries:
            tar.add(path, arcname=arcname)
    sink.close()
    return parts


def _tar_bytes(size: int) -> int:
    """A file's room in a tar: its header and its content padded to 512 bytes."""
    return 512 + -(-size // 512) * 512


def pack(table: str, runs_root: str | Path, out: str | Path, *, budget: int = BACK_BYTES, files: int = BACK_FILES,
         part_bytes: int = PART_BYTES, weights: bool = True, log_file: str | Path | None = None, log=print) -> dict:
    """Pack the table's runs into ``out`` (module docstring): ``records.tar.gz`` and checkpoint parts within
    ``budget`` bytes and ``files`` files; ``weights``: also the final weights of the completed runs that report steps
    read (the way back; not when staging). Returns the manifest (``pack.json``)."""
    sweep, out = sweep_dir(table, runs_root), Path(out)
    if not sweep.is_dir():
        raise CarryError(f"no runs of {table} under {runs_root} ({sweep} does not exist)")
    out.mkdir(parents=True, exist_ok=True)
    runs = find_runs(sweep)
    interrupted = sorted((r for r in runs if r.status != "completed" and r.checkpoint.is_file()),
                         key=lambda r: -(r.step or 0))
    needed = weights_needed(table, sweep, runs) if weights else []
    with tempfile.TemporaryDirectory(prefix="carry-") as tmp:
        slim = {r.rel: _final_weights(r.checkpoint, Path(tmp) / f"{i}.pt") for i, r in enumerate(needed)}
        candidates = [(r, r.checkpoint, "checkpoint") for r in interrupted]
        candidates += [(r, slim[r.rel], "final weights") for r in needed]
        manifest = {"table": table, "sweep": sweep.relative_to(runs_root).as_posix(),
                    "packed": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                    "runs": {r.rel: {"status": r.status, "step": r.step, "checkpoint": None} for r in runs}}
        for r, _, _ in candidates:
            manifest["runs"][r.rel]["checkpoint"] = "left behind"
        # the records first (their size depends on the manifest only through its checkpoint fields: room for both)
        records = _records_tar(sweep, runs, manifest, log_file, out / RECORDS)
        room = min(budget - records - 64 * 1024, (files - 1) * part_bytes) - 1024  # the tar's end blocks
        chosen, used = [], 0
        for i, (r, path, kind) in enumerate(candidates):
            if used + path.stat().st_size // 2 > room:  # no checkpoint compresses to half: not worth trying
                continue
            packed = _gzip(path, Path(tmp) / f"{i}.gz")
            size = _tar_bytes(packed.stat().st_size) + 1024  # a pax header may precede the entry
            if used + size <= room:
                chosen.append((f"{r.rel}/{CHECKPOINT}.gz", packed))
                manifest["runs"][r.rel]["checkpoint"] = kind
                used += size
            else:
                packed.unlink()
        for old in out.glob(f"{PARTS}.*"):
            old.unlink()
        parts = _write_parts(chosen, out, part_bytes) if chosen else []
        manifest["parts"] = [p.name for p in parts]
        _records_tar(sweep, runs, manifest, log_file, out / RECORDS)
    left = [rel for rel, v in manifest["runs"].items() if v["checkpoint"] == "left behind"]
    counts = _counts(manifest)
    log(f"packed {len(runs)} runs of {table} ({counts}) into {out}: {RECORDS} and {len(parts)} checkpoint part(s), "
        f"{sum(p.stat().st_size for p in [out / RECORDS, *parts]) / MIB:.1f} MiB"
        + (f"; {len(left)} checkpoint(s) left behind: {', '.join(left)}" if left else ""))
    return manifest


def pack_records(name: str, sweep: Path, runs_root: Path, out: Path, log=print) -> dict:
    """The records alone (no checkpoints) of the runs under ``sweep`` — runs of no table's sweep, an ablation's —
    into ``out``/records.tar.gz under the name ``name``; :func:`unpack` puts them back under ``runs_root``."""
    runs = find_runs(sweep)
    manifest = {"table": name, "sweep": sweep.relative_to(runs_root).as_posix(), "parts": [],
                "packed": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "runs": {r.rel: {"status": r.status, "step": r.step, "checkpoint": None} for r in runs}}
    out.mkdir(parents=True, exist_ok=True)
    size = _records_tar(sweep, runs, manifest, None, out / RECORDS)
    log(f"packed the records of {len(runs)} runs of {name} ({_counts(manifest)}) into {out}: {size / 1024:.0f} kB")
    return manifest


def _counts(manifest: dict) -> str:
    statuses = [v["status"] or "no record" for v in manifest["runs"].values()]
    return ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))


# ---------------------------------------------------------------------------------------------------- unpack


def unpack(source: str | Path, runs_root: str | Path, log=print) -> dict:
    """Put a pack (``records.tar.gz`` and its checkpoint parts, in ``source``) into the sweep directory under
    ``runs_root`` (module docstring). Returns the pack's manifest."""
    source, runs_root = Path(source), Path(runs_root)
    if not (source / RECORDS).is_file():
        raise CarryError(f"no {RECORDS} in {source}: not a pack of scripts/carry.py")
    with tarfile.open(source / RECORDS, "r:gz") as tar:
        manifest = json.loads(tar.extractfile(PACK_JSON).read())
        sweep = runs_root / manifest["sweep"]
        live = {c.parent.relative_to(sweep).as_posix() for c in held_claims(sweep)} & set(manifest["runs"])
        # never replaced: a run completed here, or one a live process holds (its files are being written)
        kept = {rel for rel in manifest["runs"] if run_status(sweep / rel) == "completed" or rel in live}
        for member in tar.getmembers():
            if member.name == SESSION_LOG:  # the device session's log, kept beside the runs
                logs = runs_root / "device_logs"
                logs.mkdir(parents=True, exist_ok=True)
                stamp = manifest["packed"].replace(" UTC", "").replace(" ", "_").replace(":", "")
                name = f"{manifest['table'].replace('/', '-')}_{stamp}.log"
                (logs / name).write_bytes(tar.extractfile(member).read())
            if not member.name.startswith("runs/") or not member.isfile():
                continue
            rel = member.name.removeprefix("runs/")
            if any(rel.startswith(f"{k}/") for k in kept) or not _inside(sweep, rel):
                continue
            target = sweep / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as f, open(target, "wb") as g:
                shutil.copyfileobj(f, g)
    for rel, v in manifest["runs"].items():  # a finished run keeps no checkpoint of an earlier step
        if rel not in kept and v["status"] == "completed" and v["checkpoint"] != "final weights":
            (sweep / rel / CHECKPOINT).unlink(missing_ok=True)
    parts = [source / name for name in manifest.get("parts", [])]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CarryError(f"{', '.join(missing)} missing from {source}: the checkpoints cannot be read")
    if parts:
        with _Joined(parts) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                rel = member.name.removesuffix(f"/{CHECKPOINT}.gz")
                if rel in kept or not member.isfile() or not _inside(sweep, member.name):
                    continue
                target = sweep / rel / CHECKPOINT
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{CHECKPOINT}.unpack")
                with tar.extractfile(member) as f, gzip.open(f) as z, open(tmp, "wb") as g:
                    shutil.copyfileobj(z, g, 4 * MIB)
                os.replace(tmp, target)
    changed = [rel for rel in kept - live if manifest["runs"][rel]["status"] != "completed"]
    for rel in sorted(changed):
        log(f"  kept {rel}: completed here, {manifest['runs'][rel]['status']} in the pack")
    for rel in sorted(live):
        log(f"  left {rel} alone: a live process is running it here")
    left = [rel for rel, v in manifest["runs"].items() if v["checkpoint"] == "left behind"]
    here = [rel for rel in left if (sweep / rel / CHECKPOINT).is_file()]  # the packing machine's own (a campaign's)
    lost = [rel for rel in left if rel not in here]
    log(f"unpacked {len(manifest['runs'])} runs of {manifest['table']} into {sweep} ({_counts(manifest)})"
        + (f"; checkpoints not in the pack but here (they resume): {', '.join(here)}" if here else "")
        + (f"; checkpoints not in the pack nor here (lost: they start over): {', '.join(lost)}" if lost else ""))
    return manifest


def run_status(run_dir: Path) -> str | None:
    """The status a run directory's metrics.json records (None without a readable one)."""
    try:
        return json.loads((run_dir / "metrics.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _inside(root: Path, rel: str) -> bool:
    return not Path(rel).is_absolute() and ".." not in Path(rel).parts


class _Joined(io.RawIOBase):
    """The concatenation of files, read in order (the checkpoint parts as one tar stream)."""

    def __init__(self, paths: list[Path]):
        self.paths, self.file = list(paths), None

    def readable(self):
        return True

    def readinto(self, b):
        while True:
            if self.file is None:
                if not self.paths:
                    return 0
                self.file = open(self.paths.pop(0), "rb")
            n = self.file.readinto(b)
            if n:
                return n
            self.file.close()
            self.file = None

    def close(self):
        if self.file:
            self.file.close()
        super().close()


# ----------------------------------------------------------------------------------------------------- stage


def state_dir(table: str) -> Path:
    """``.device/state/<paper>-<table>``: where stage puts what the next device call carries for ``table``."""
    return ROOT / ".device" / "state" / table.replace("/", "-")


def carry_list(table: str, bundle: Path = ROOT / ".device") -> list[str]:
    """The paths to name in the device tool's ``carry`` for a ``gpu_table.sh`` call on ``table``."""
    data = [f"{bundle.relative_to(ROOT)}/data/{d}" for d in TABLE_DATA.get(table, [])]
    rel = bundle.relative_to(ROOT)
    return [f"{rel}/wheels", f"{rel}/commit.txt", *data, str(state_dir(table).relative_to(ROOT))]


def carry_budget(table: str, bundle: Path = ROOT / ".device") -> int:
    """What a ``gpu_table.sh`` call on ``table`` may carry in its state folder: 64 MiB less the working tree, the
    wheels, the stamp and the table's data, less 1 MiB to spare."""
    from scripts.bundle import tree_bytes

    if not (bundle / "wheels").is_dir():
        raise CarryError(f"no {bundle / 'wheels'}: run make device-bundle first")
    used = tree_bytes() + MIB
    for rel in carry_list(table, bundle)[:-1]:
        path = ROOT / rel
        used += path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return CARRY_BYTES - used


def stage(table: str, runs_root: str | Path, out: str | Path | None = None, budget: int | None = None,
          log=print) -> dict:
    """Pack the table's records and the interrupted runs' checkpoints that fit for the next device call."""
    out = Path(out) if out is not None else state_dir(table)
    budget = carry_budget(table) if budget is None else budget
    if out.exists():
        shutil.rmtree(out)
    if not sweep_dir(table, runs_root).is_dir():
        log(f"no runs of {table} under {runs_root} yet: the first call carries no state")
        log(f"carry: {json.dumps(carry_list(table)[:-1])}")
        return {}
    manifest = pack(table, runs_root, out, budget=budget, files=10**6, weights=False, log=log)
    log(f"carry: {json.dumps(carry_list(table))}  (state: {budget / MIB:.1f} MiB at most)")
    return manifest


# -------------------------------------------------------------------------------------------------- deadline


def held_claims(root: Path) -> list[Path]:
    """The claims under ``root`` that a live process holds (a claim left by a killed run is not held)."""
    held = []
    for path in Path(root).rglob("claim.json") if Path(root).is_dir() else []:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(path)
        finally:
            os.close(fd)  # closing drops the probe's lock, if it got one
    return held


def run_until(cmd: list[str], seconds: float, claims: Path, grace: float = 90.0, log=print) -> int:
    """Run ``cmd`` in its own process group until it ends, ``seconds`` pass, or this process is sent SIGTERM or
    SIGINT; then stop it as the module docstring says. Returns its exit status, or 124 when it was stopped."""
    stop = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        end = time.monotonic() + seconds
        while proc.poll() is None and not stop and time.monotonic() < end:
            time.sleep(0.2)
        stopped = proc.poll() is None
        if stopped:
            why = signal.Signals(stop[0]).name if stop else f"the deadline ({seconds:.0f} s)"
            stop_group(proc.pid, claims, why, grace, log, until_ended=lambda: proc.poll() is not None)
        _signal_group(proc.pid, signal.SIGKILL)  # what is left: idle launcher workers, resource trackers
        code = proc.wait()
        return 124 if stopped else code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_group(pgid: int | list[int], claims: Path, why: str, grace: float = 90.0, log=print,
               until_ended=None) -> None:
    """Stop the runs of process group ``pgid`` (or of each of a list, together): SIGTERM (each run saves a checkpoint
    at its next step, records ``status: interrupted`` and exits), then wait until no run under ``claims`` holds its
    claim (and, given ``until_ended``, until it says the group's command ended), at most ``grace`` seconds; then
    SIGKILL what is left of the group (idle launcher workers, a sweep that would start its next run, resource
    trackers)."""
    pgids = pgid if isinstance(pgid, list) else [pgid]
    _say(log, f"stopping the runs: {why}; each saves a checkpoint at its next step")
    for group in pgids:
        _signal_group(group, signal.SIGTERM)
    end = time.monotonic() + grace
    while ((until_ended is not None and not until_ended()) or held_claims(claims)) and time.monotonic() < end:
        time.sleep(0.5)
    if held_claims(claims):
        _say(log, f"runs still holding their claims after {grace:.0f} s are killed: "
                  f"{', '.join(str(p.parent) for p in held_claims(claims))}")
    for group in pgids:
        _signal_group(group, signal.SIGKILL)


def _say(log, line: str) -> None:
    log(line)
    sys.stdout.flush()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.carry", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deadline", help="run a command, stop its runs cleanly at the deadline")
    d.add_argument("seconds", type=float)
    d.add_argument("--claims", type=Path, required=True, help="the directory whose runs' claims to wait for")
    d.add_argument("--grace", type=float, default=90.0, help="seconds the runs get to checkpoint (default 90)")
    p = sub.add_parser("pack", help="pack a table's runs for the way back")
    p.add_argument("table")
    p.add_argument("--runs", default="multirun")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--log", type=Path, help="a log file to pack with the records")
    u = sub.add_parser("unpack", help="put a pack into the sweep directory here")
    u.add_argument("source", type=Path)
    u.add_argument("--runs", default="multirun")
    s = sub.add_parser("stage", help="pack a table's records and interrupted checkpoints for the next device call")
    s.add_argument("table")
    s.add_argument("--runs", default="multirun")
    s.add_argument("--out", type=Path, help="default: .device/state/<paper>-<table>")
    s.add_argument("--budget-mib", type=float, help="default: 64 MiB less the tree, wheels and the table's data")
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []  # deadline's command
    args = parser.parse_args(argv[:len(argv) - len(cmd) - ("--" in argv)])
    try:
        if args.command == "deadline":
            if not cmd:
                parser.error("deadline needs a command: ... deadline SECONDS --claims DIR -- CMD ...")
            return run_until(cmd, args.seconds, args.claims, args.grace)
        if args.command == "pack":
            pack(args.table, args.runs, args.out, log_file=args.log)
        elif args.command == "unpack":
            unpack(args.source, args.runs)
        else:
            budget = None if args.budget_mib is None else int(args.budget_mib * MIB)
            stage(args.table, args.runs, args.out, budget)
    except (CarryError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

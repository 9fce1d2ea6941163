"""Benchmark: seconds per training step and per epoch of every paper table's configuration on one device, and from
them the device-hours of each full table (``scripts/gpu_check.sh`` runs it on the GPU machine).

    python bench/tables.py --device cuda --out timing.json [--tables spigot/table3_sst energy/ner ...]
                           [--deadline UNIX_SECONDS] [--max-configs N] [--warmup 2] [--min-seconds 1] [--max-steps 40]
                           [--memory-gib 8] [--config-seconds 600] [--threads 1] [--resume] [--max-per-experiment N]
                           [--eval-examples N] [--skip PATTERN ...] [--retime PATTERN ...]
    python bench/tables.py --render timing.json            # the sheet as Markdown (scripts/gpu_report.py uses it)
    python bench/tables.py --page cpu.json > cpu.md         # the CPU plan (make bench-cpu: results/bench/cpu.md)

**Configurations.** A table is a spec of ``experiments/`` with a ``reproduce`` block, taken in :data:`ORDER` (the
runbook's). Its sweeps' grids are expanded as Hydra's basic sweeper expands them: the sweep config's
``hydra.sweeper.params``, with the spec's ``overrides`` and ``seeds`` replacing the keys they name (as
``latentstruct.report.reproduce`` passes them on the command line); ``glob(...)`` over the group's options. The seeds
only multiply a cell: each distinct configuration is timed once, composed as a sweep job is (``+sweep=<sweep>``, the
cell's overrides, ``trainer.device``).

**Timing.** Each configuration is built as ``latentstruct/train.py`` builds it — its data (once per dataset
configuration and device), the model, the optimizer(s) — and trained as train.py's loop trains: per phase of its
schedule (``trainer.phases``, else the one phase over ``train``), ``--warmup`` steps (lazy initialisations, the first
allocations, cuDNN's choices), then steps in doubling chunks, the device synchronised at the ends of each chunk only,
until ``--min-seconds`` have passed or ``--max-steps`` were timed: that phase's seconds per step. Then one evaluation of
valid and test (``evaluate_splits``, as train.py calls it after a step; with ``--eval-examples N`` on the first N
examples of each, its time scaled by the splits' sizes: ``eval_scale``; linear, so an evaluation with a fixed cost is
over-estimated: k-NN's, 178 s in full against 936-1,290 s scaled ×20 from 500 examples on this loaded CPU). On CUDA one
more step runs under ``torch.cuda.set_sync_debug_mode("warn")`` and the synchronising calls it makes are counted: host
round trips per step. A run's device-seconds = Σ over phases of its steps × s/step + its evaluations
(``latentstruct.train.plan``) × s/eval; a cell's = that × its seeds; a table's = Σ over its cells. Not counted: data
loading, checkpoint writes (one per evaluation) and what train.py adds per step (the loss and gradient-norm finiteness
check,
about 1%). Runs are timed alone: several runs at once on one GPU (``gpu_table.sh`` runs one per CPU core) overlap, so a
table's wall time can be far below its device-hours, never below its longest run.

**Isolation.** Each configuration is timed in a process of its own (this script with ``--one``), so that one
configuration's memory never adds to the next's and none can take the machine down: the parent watches the child's
resident memory (``/proc/<pid>/status``, four times a second) and kills it above ``--memory-gib`` (on the CPU the
child's address space is also capped, ``RLIMIT_AS``, a little above it, so an allocation too fast for the watch fails
in the child instead); such a configuration is reported "over N GiB" — the full protocol does not fit in memory here.
A child still running after ``--config-seconds`` (or past the deadline) is killed and reported "over N s"; its
run is then estimated (``~``) from the phases it had timed and the steps it had taken in the next, warm-up included
(which can over-estimate), without the later phases and the evaluations (which under-estimates). The child writes
what it has done after each step it takes untimed and each chunk it times, with its peak resident memory; the parent
records the load average (``os.getloadavg``) before and after each configuration: on a shared machine the timings
are taken under that load (and the campaign's runs took longer still: see "Against the runs"). The data are loaded
again for each configuration (not counted).

**Budget.** ``--max-per-experiment N`` times only the first N configurations of each experiment of a table (the
others are estimated, below). Configurations run in order until ``--deadline`` (a Unix time) would be passed by
another like the slowest so far, or ``--max-configs`` are done. A configuration not timed is estimated from the
timed ones of the same experiment in the same table (their median run-seconds, marked ``≈``); one without such a
sibling stays unknown, and its table's device-hours are then a lower bound. A configuration that fails (missing
data: SNLI's training split) says why. With ``--resume``, ``--retime PATTERN`` times again the configurations of
the asked tables whose overrides match (the code they run changed); every configuration timed records the commit it
was timed at (``commit``), and the page names those timed at another commit than the sheet's first.

**Against the runs.** The page (``--page``) sets what the campaign's committed runs took (their records' wall clocks,
``campaign/<paper>-<table>/records.tar.gz``) against what the sheet plans for the same configurations, and lists the
configurations more than twice off (:func:`campaign_costs`): an estimate copied from a sibling that costs less (a
sorting run's time grows with the sequence length d) shows there.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's latentstruct

CONFIGS = ROOT / "configs"
LAB_COST = ROOT / "results" / "lab" / "matrix.json"  # what the lab matrix cost (make table-lab-matrix writes it)
#: the tables in the runbook's order (docs/gpu.md); any other table with a reproduce block follows
ORDER = ("spigot/table3_sst", "energy/ner", "energy/pos", "energy/mlc", "listops/table", "direct/knn", "direct/vae",
         "spigot/table3_snli", "direct/sorting", "direct/sorting_time", "spigot/table2", "spigot/figure3_inner_steps")
#: minutes of runs that one device session holds: a 10-minute command less install, packing and the stop's grace
SESSION_MINUTES = 8.0


@dataclass
class Cell:
    """A distinct configuration of a table: its sweep, its overrides (without the seed) and how many seeds run it."""

    table: str
    sweep: str
    overrides: list[str]
    seeds: int
    experiment: str = ""
    status: str = "untimed"  # timed, estimated, failed, memory (over the cap), time (over the limit), untimed
    error: str | None = None
    steps: list[int] = field(default_factory=list)  # per phase, in a run
    per_epoch: list[int] = field(default_factory=list)  # batches per epoch, per phase
    s_per_step: list[float | None] = field(default_factory=list)
    evaluations: int = 0
    s_eval: float | None = None
    syncs_per_step: int | None = None
    run_seconds: float | None = None
    took: float | None = None  # seconds this configuration took to time
    peak_rss_gib: float | None = None  # the timing process's peak resident memory
    load: list[float] = field(default_factory=list)  # 1-minute load average before and after timing it
    partial: list = field(default_factory=list)  # [phase, steps done, seconds] of the phase being timed
    eval_scale: float = 1.0  # s_eval = the evaluation's seconds on --eval-examples per split x this
    commit: str | None = None  # the commit it was timed at (None: a sheet from before this field, its own commit)


#: what became of a configuration, in the sheet's order
STATUSES = ("timed", "estimated", "failed", "memory", "time", "untimed")


# -------------------------------------------------------------------------------------------------------- grids


def tables() -> list[str]:
    """Every table with a reproduce block, in :data:`ORDER` first."""
    found = sorted(f"{p.parent.name}/{p.stem}" for p in (ROOT / "experiments").glob("*/*.yaml")
                   if "reproduce" in (yaml.safe_load(p.read_text()) or {}))
    return [t for t in ORDER if t in found] + [t for t in found if t not in ORDER]


def _values(key: str, value) -> list[str]:
    """The values a sweeper param takes (``a,b``, ``range(1,4)``, ``glob(synthetic_*)``), as override strings."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    override = OverridesParser.create().parse_override(f"{key}={value}")
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    sweep = override.value()
    if isinstance(sweep, Glob):
        options = sorted(p.stem for p in (CONFIGS / key.lstrip("+~")).glob("*.yaml"))
        return [o for o in options if any(fnmatch(o, g) for g in sweep.include)
                and not any(fnmatch(o, g) for g in sweep.exclude)]
    return list(override.sweep_string_iterator())


def cells(table: str) -> list[Cell]:
    """The distinct configurations of ``table``'s sweeps and each one's seeds (module docstring)."""
    from latentstruct.report.reproduce import spec_path
    from latentstruct.report.tables import load_spec

    out = []
    for sweep in load_spec(spec_path(table))["reproduce"]["sweeps"]:
        config = yaml.safe_load((CONFIGS / "sweep" / f"{sweep['sweep']}.yaml").read_text())
        params = {**config["hydra"]["sweeper"]["params"], **(sweep.get("overrides") or {})}
        if sweep.get("seeds") is not None:
            params["trainer.seed"] = sweep["seeds"]
        seeds = len(_values("trainer.seed", params.pop("trainer.seed"))) if "trainer.seed" in params else 1
        axes = [[f"{k}={v}" for v in _values(k, value)] for k, value in params.items()]
        for combination in itertools.product(*axes):
            experiment = next((o.split("=", 1)[1] for o in combination if o.startswith("+experiment=")), "")
            out.append(Cell(table, sweep["sweep"], list(combination), seeds, experiment))
    return out


# ------------------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batches(split: dict, batch_size, seed: int, drop_last: bool):
    """Batches of ``split`` for ever, epoch after epoch, as train.py draws them."""
    from latentstruct.data.base import iterate_batches

    for epoch in itertools.count():
        yield from iterate_batches(split, batch_size, None if batch_size is None else seed * 100_003 + epoch,
                                   drop_last=drop_last)


def count_syncs(step) -> int:
    """The synchronising CUDA calls ``step()`` makes (torch's sync debug mode, as warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _train_step(model, optimizer, batches, phase: int, taken, phase_steps: int) -> None:
    """One step of train.py's loop (without its finiteness check)."""
    model.begin_step(phase, next(taken) % phase_steps)
    loss = model(next(batches)).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _heads(splits: dict, n: int | None) -> tuple[dict, float]:
    """The first ``n`` examples of each split (all of a smaller one), and (examples in all) / (examples kept)."""
    heads, full, kept = {}, 0, 0
    for name, split in splits.items():
        size = len(next(iter(split.values())))
        keep = size if not n else min(n, size)
        heads[name] = {k: v[:keep] if len(v) == size else v for k, v in split.items()}
        full, kept = full + size, kept + keep
    return heads, full / max(kept, 1)


@dataclass
class Built:
    """A configuration built as train.py builds it: its config, data (and splits on the device), model, optimizer,
    phases."""

    cfg: Any
    data: Any
    splits: dict
    model: Any
    optimizer: Any
    phases: list
    max_steps: int
    evaluations: list  # the steps a run evaluates after (latentstruct.train.plan)


def build_cell(cell: Cell, device: torch.device, data_cache: dict, extra: Sequence[str] = ()) -> Built:
    """Compose ``cell`` as a sweep job (+ the overrides ``extra``) and build it (data from ``data_cache``, filled)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import latentstruct.optim
    from latentstruct.train import build_model, plan

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"+sweep={cell.sweep}", *cell.overrides, *extra,
                                          f"trainer.device={device.type}"])
    torch.manual_seed(cfg.trainer.seed)
    key = (OmegaConf.to_yaml(cfg.dataset, resolve=True), str(device))
    if key not in data_cache:
        data = instantiate(cfg.dataset)
        data_cache.clear()  # one dataset at a time on the device
        data_cache[key] = (data, {name: {k: v.to(device) for k, v in split.items()}
                                  for name, split in data.splits.items()})
    data, splits = data_cache[key]
    model = build_model(cfg, data.dims, data.extras).to(device)
    model.use_training_data(splits["train"])
    optimizer = latentstruct.optim.build(cfg.optim, cfg.optim_groups, model.param_groups())
    phases, max_steps, evaluations = plan(cfg.trainer, {name: data.size(name) for name in data.splits})
    return Built(cfg, data, splits, model, optimizer, phases, max_steps, evaluations)


def time_cell(cell: Cell, device: torch.device, data_cache: dict, args, progress=None) -> None:
    """Time one configuration (module docstring), filling ``cell`` in place; ``progress()`` is called after each
    phase (the child writes what it has so far)."""
    built = build_cell(cell, device, data_cache, getattr(args, "override", None) or ())
    splits, model, optimizer = built.splits, built.model, built.optimizer
    phases, max_steps, tc = built.phases, built.max_steps, built.cfg.trainer
    cell.evaluations = len(built.evaluations)
    model.train()
    for index, phase in enumerate(phases):
        steps = max(0, min(phase.steps, max_steps - phase.start))
        cell.steps.append(steps)
        cell.per_epoch.append(phase.per_epoch)
        if not steps:
            cell.s_per_step.append(None)
            continue
        batches = _batches(splits[phase.split], tc.batch_size, tc.seed, tc.drop_last)
        step = functools.partial(_train_step, model, optimizer, batches, index, itertools.count(), phase.steps)
        began = time.perf_counter()
        for done in range(1, args.warmup + 1):
            step()
            cell.partial = [index, done, time.perf_counter() - began]  # what a configuration killed here had done
            if progress is not None:
                progress()
        if device.type == "cuda" and index == len(phases) - 1:
            _sync(device)
            cell.syncs_per_step = count_syncs(step)
        _sync(device)
        timed, chunk, start = 0, 1, time.perf_counter()
        while True:
            for _ in range(chunk):
                step()
            _sync(device)
            timed += chunk
            elapsed = time.perf_counter() - start
            if elapsed >= args.min_seconds or timed >= args.max_steps:
                break
            cell.partial = [index, args.warmup + timed, time.perf_counter() - began]
            if progress is not None:
                progress()
            chunk = min(2 * chunk, args.max_steps - timed)
        cell.s_per_step.append(elapsed / timed)
        if progress is not None:
            progress()
    _sync(device)
    heads, scale = _heads({split: splits[split] for split in ("valid", "test")}, getattr(args, "eval_examples", None))
    start = time.perf_counter()
    model.evaluate_splits(heads, tc.batch_size)
    _sync(device)
    cell.s_eval, cell.eval_scale = (time.perf_counter() - start) * scale, scale
    cell.run_seconds = sum(n * s for n, s in zip(cell.steps, cell.s_per_step, strict=True) if n) + (
        cell.evaluations * cell.s_eval)
    cell.status = "timed"


def _estimate(all_cells: list[Cell]) -> None:
    """Untimed configurations from the timed ones of the same experiment in the same table (median run-seconds)."""
    for cell in all_cells:
        if cell.status != "untimed":
            continue
        siblings = [c.run_seconds for c in all_cells if c.status == "timed" and c.table == cell.table
                    and c.experiment == cell.experiment]
        if siblings:
            cell.run_seconds, cell.status = statistics.median(siblings), "estimated"


def summarise(all_cells: list[Cell]) -> list[dict]:
    """Per table: its runs, how many cells were timed, estimated or not known, its device-hours, its longest run."""
    from latentstruct.report.reproduce import spec_path
    from latentstruct.report.tables import load_spec

    out = []
    for table in dict.fromkeys(c.table for c in all_cells):
        mine = [c for c in all_cells if c.table == table]
        known = [c for c in mine if c.run_seconds is not None and c.status in ("timed", "estimated")]  # not ~
        seconds = sum(c.run_seconds * c.seeds for c in known)
        longest = max((c.run_seconds for c in known), default=None)
        counts = {s: sum(c.seeds for c in mine if c.status == s) for s in STATUSES}
        sessions = None
        if known and all(c.status in ("timed", "estimated") for c in mine):  # one run per CPU core, as gpu_table.sh
            sessions = max(math.ceil(longest / 60 / SESSION_MINUTES),
                           math.ceil(seconds / 60 / (SESSION_MINUTES * (os.cpu_count() or 1))))
        out.append({"table": table, "title": load_spec(spec_path(table)).get("title", table),
                    "runs": sum(c.seeds for c in mine), "cells": len(mine),
                    **{f"runs_{k}": v for k, v in counts.items()},
                    "device_hours": seconds / 3600 if known else None,
                    "complete": all(c.status in ("timed", "estimated") for c in mine),
                    "longest_run_minutes": None if longest is None else longest / 60,
                    "over_memory": [" ".join(c.overrides) for c in mine if c.status == "memory"],
                    "over_time": [" ".join(c.overrides) for c in mine if c.status == "time"],
                    "sessions_at_least": sessions})
    return out


GIB = 2**30


def _rss_gib(pid: int) -> float | None:
    """The resident memory of process ``pid`` in GiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError):
        return None
    return None


def _peak_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # kB on Linux


def _child(path: Path, args) -> int:
    """``--one``: time the configuration in ``path`` (a Cell as JSON) and write it back, after each phase too."""
    cell = Cell(**json.loads(path.read_text()))

    def save():
        cell.peak_rss_gib = _peak_gib()
        _write(path, asdict(cell))

    try:
        time_cell(cell, torch.device(args.device), {}, args, progress=save)
    except MemoryError:
        cell.status, cell.error = "memory", "MemoryError"
    except Exception as err:  # noqa: BLE001 — a configuration that cannot run is a result (missing data)
        message = str(err).splitlines()[0] if str(err) else ""
        cell.status, cell.error = "failed", f"{type(err).__name__}: {message}"
        if "can't allocate memory" in message or "out of memory" in message.lower():
            cell.status = "memory"
    save()
    return 0


def _limit_memory(gib: float) -> None:
    import resource

    cap = int(gib * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def watch(cmd: list[str], env: dict, log: Path, memory_gib: float, timeout: float,
          hard_gib: float | None = None) -> tuple[int, str | None, float]:
    """Run ``cmd`` (its output to ``log``), killed once its resident memory passes ``memory_gib`` or it has run
    ``timeout`` seconds; ``hard_gib`` caps its address space. (return code, "memory" / "time" / None, peak GiB)."""
    import signal
    import subprocess

    with log.open("w") as out:
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out,
                                 preexec_fn=None if hard_gib is None else functools.partial(_limit_memory, hard_gib))
    start, peak, killed = time.monotonic(), 0.0, None
    while child.poll() is None:
        rss = _rss_gib(child.pid)
        peak = max(peak, rss or 0.0)
        if rss is not None and rss > memory_gib:
            killed = "memory"
        elif time.monotonic() - start > timeout:
            killed = "time"
        if killed:
            child.send_signal(signal.SIGKILL)
            child.wait()
            break
        time.sleep(0.25)
    return child.returncode, killed, peak


def time_isolated(cell: Cell, args, timeout: float) -> None:
    """Time ``cell`` in a child process (``--one``) under the memory cap and ``timeout`` (module docstring)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_tables_") as tmp:
        path, log = Path(tmp) / "cell.json", Path(tmp) / "stderr.txt"
        _write(path, asdict(cell))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(path), "--device", args.device,
               "--warmup", str(args.warmup), "--min-seconds", str(args.min_seconds), "--max-steps",
               str(args.max_steps)]
        if getattr(args, "eval_examples", None):
            cmd += ["--eval-examples", str(args.eval_examples)]
        if getattr(args, "override", None):
            cmd += ["--override", *args.override]
        env = dict(os.environ)
        if args.threads:
            cmd += ["--threads", str(args.threads)]
            env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        hard = None if torch.device(args.device).type == "cuda" else args.memory_gib + 4  # address space, not RSS
        returncode, killed, peak = watch(cmd, env, log, args.memory_gib, timeout, hard)
        done = Cell(**json.loads(path.read_text()))
        for key, value in asdict(done).items():
            setattr(cell, key, value)
        cell.peak_rss_gib = max(peak, cell.peak_rss_gib or 0.0)
        phases = sum(s is not None for s in cell.s_per_step)
        if killed == "memory":
            cell.status, cell.error = "memory", f"over {args.memory_gib:g} GiB ({phases} phase(s) timed)"
        elif killed == "time":
            cell.status, cell.error = "time", f"over {timeout:.0f} s ({phases} phase(s) timed)"
        elif returncode != 0 or cell.status == "untimed":
            tail = log.read_text().strip().splitlines()
            cell.status = "failed"
            cell.error = f"exit {returncode}: {tail[-1] if tail else ''}"
        cell.run_seconds = None if cell.status != "timed" else cell.run_seconds
        if killed == "time":  # from its steps so far (module docstring)
            pairs = zip(cell.steps, cell.s_per_step, strict=False)  # the phase it was in has no time yet
            known = sum(n * s for n, s in pairs if n and s is not None)
            if cell.partial and cell.partial[0] == len(cell.s_per_step):  # steps of the phase it was killed in
                phase, done, seconds = cell.partial
                known += cell.steps[phase] * seconds / done
                cell.error += f"; phase {phase + 1}: {done} step(s) in {seconds:.0f} s"
            cell.run_seconds = known or None


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available")
    asked = args.tables or tables()
    chosen, resumed, before = list(asked), [], {}
    if args.resume and args.out is not None and args.out.is_file():  # keep what an earlier sheet already measured
        earlier = json.loads(args.out.read_text())
        # its tables stay in the sheet (first, in its order), timed only where asked again
        chosen = list(dict.fromkeys([t["table"] for t in earlier["tables"]] + chosen))
        resumed = [{k: earlier.get(k) for k in ("git_commit", "hardware", "cpu", "generated")},
                   *earlier.get("resumed", [])]
        before = {(c["table"], tuple(c["overrides"])): c for c in earlier["configs"]
                  if c["status"] not in ("untimed", "estimated") and not _retimed(c, asked, args)}
    all_cells = [c for t in chosen for c in cells(t)]
    for cell in all_cells:
        for key, value in before.get((cell.table, tuple(cell.overrides)), {}).items():
            setattr(cell, key, value)
    from latentstruct.records import environment

    slowest, done = 0.0, 0
    started, env = time.time(), environment(device)
    commit = _commit(env)
    tried: dict = {}  # configurations timed (or tried) per experiment of a table
    for cell in all_cells:
        key = (cell.table, cell.experiment)
        if cell.status != "untimed":  # resumed
            tried[key] = tried.get(key, 0) + 1
            continue
        if cell.table not in asked:  # an earlier sheet's table not asked for again: kept as it was
            continue
        if args.max_per_experiment is not None and tried.get(key, 0) >= args.max_per_experiment:
            continue  # estimated from its siblings
        if any(fnmatch(" ".join(cell.overrides), pattern) for pattern in args.skip or ()):
            continue  # left untimed
        tried[key] = tried.get(key, 0) + 1
        if args.max_configs is not None and done >= args.max_configs:
            break
        if args.deadline is not None and time.time() + slowest > args.deadline:
            print(f"deadline: {sum(c.status == 'untimed' for c in all_cells)} configurations left untimed", flush=True)
            break
        timeout = args.config_seconds
        if args.deadline is not None:  # a child past the deadline is stopped with the rest
            timeout = max(5.0, min(timeout, args.deadline + 30 - time.time()))
        t0, load = time.perf_counter(), os.getloadavg()[0]
        time_isolated(cell, args, timeout)
        cell.commit = commit
        cell.took, cell.load = time.perf_counter() - t0, [round(load, 2), round(os.getloadavg()[0], 2)]
        slowest, done = max(slowest, cell.took), done + 1
        steps = ", ".join("—" if s is None else f"{s * 1e3:.1f}" for s in cell.s_per_step)
        print(f"  {cell.table:22s} {' '.join(cell.overrides):70.70s} {cell.status:7s} ms/step [{steps}] "
              f"eval {cell.s_eval or 0:.2f} s ({cell.took:.1f} s, {cell.peak_rss_gib or 0:.1f} GiB, load "
              f"{cell.load[0]:.1f}-{cell.load[1]:.1f}){'  ' + cell.error if cell.error else ''}", flush=True)
        if args.out is not None:  # after each configuration: a sheet survives a command killed at its limit
            _write(args.out, _sheet(all_cells, device, args, started, resumed, env))
    return _sheet(all_cells, device, args, started, resumed, env)


def _retimed(config: dict, asked: list[str], args) -> bool:
    """Whether ``--retime`` asks for an earlier sheet's ``config`` to be timed again (a table asked for, a pattern
    matching its overrides)."""
    return config["table"] in asked and any(fnmatch(" ".join(config["overrides"]), pattern)
                                            for pattern in getattr(args, "retime", None) or ())


def _commit(env: dict) -> str:
    """The code's commit of ``env`` (``latentstruct.records.environment``), + ``-dirty`` with uncommitted changes."""
    return f"{env['git_commit']}{'-dirty' if env['git_dirty'] else ''}"


def _sheet(all_cells: list[Cell], device: torch.device, args, started: float, resumed: list | None = None,
           env: dict | None = None) -> dict:
    """The sheet of ``all_cells`` as timed so far, the untimed ones estimated (on copies); ``resumed``: the earlier
    sheets whose configurations it kept (their commit, hardware, date), newest first; ``env``: the code and machine
    (``latentstruct.records.environment`` when the timing began: the sheet it writes would make the tree dirty)."""
    from latentstruct.records import environment

    cells = [Cell(**asdict(c)) for c in all_cells]
    _estimate(cells)
    return {"device": device.type, **(env or environment(device)), "torch_threads": torch.get_num_threads(),
            "cpu_cores": os.cpu_count(),  # environment's "cpu", the model: a sheet of another machine reads otherwise
            "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.time() - started,
            "options": {k: getattr(args, k, None) for k in ("warmup", "min_seconds", "max_steps", "max_configs",
                                                             "max_per_experiment", "eval_examples", "memory_gib",
                                                             "config_seconds", "threads", "skip")},
            "session_minutes": SESSION_MINUTES, "resumed": resumed or [],
            "tables": summarise(cells), "configs": [asdict(c) for c in cells]}


def _write(path: Path, sheet: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(sheet, indent=1) + "\n")
    tmp.replace(path)


# -------------------------------------------------------------------------------------------------------- report


def _num(x, digits=1, unit=""):
    return "—" if x is None else f"{x:,.{digits}f}{unit}"


def resumed_note(sheet: dict) -> str:
    """A sentence naming the earlier sheets a resumed sheet kept configurations of ('' for none)."""
    earlier = [f"{r.get('git_commit') or '?'} on {r.get('hardware') or '?'} ({r.get('cpu') or 'CPU model not recorded'}"
               f", {r.get('generated') or '?'})"
               for r in sheet.get("resumed") or ()]
    note = f" It resumes the sheet(s) timed at {'; '.join(earlier)}: their configurations are kept as timed there." \
        if earlier else ""
    first = (sheet.get("resumed") or [{}])[-1].get("git_commit") or sheet.get("git_commit")
    later: dict[str, dict[str, int]] = {}
    for c in sheet["configs"]:
        if c.get("commit") and c["commit"].removesuffix("-dirty") != first:
            experiments = later.setdefault(c["commit"], {})
            name = f"{c['table']} `{c['experiment'] or ' '.join(c['overrides'])}`"
            experiments[name] = experiments.get(name, 0) + 1
    for commit, experiments in later.items():
        note += (f" Timed at {commit} (`--retime`, or added since): "
                 + ", ".join(f"{name} ({n} configuration{'s' if n > 1 else ''})" for name, n in experiments.items())
                 + ".")
    return note


def render(sheet: dict) -> list[str]:
    """The timing sheet as Markdown lines: a line per table, then each table's configurations."""
    lines = [
        "| table | runs | timed / estimated / failed / over memory / over time / untimed runs | device-hours (one run "
        "at a time) | longest run (min) | sessions, at least |",
        "|---|---|---|---|---|---|",
    ]
    for t in sheet["tables"]:
        hours = _num(t["device_hours"], 2) + ("" if t["complete"] else " (lower bound)")
        counts = " / ".join(str(t.get(f"runs_{k}", 0)) for k in STATUSES)
        lines.append(f"| {t['table']} | {t['runs']} | {counts} | {hours} | {_num(t['longest_run_minutes'])} | "
                     f"{t['sessions_at_least'] if t['sessions_at_least'] is not None else '—'} |")
    for t in sheet["tables"]:
        mine = [c for c in sheet["configs"] if c["table"] == t["table"]]
        lines += ["", f"### {t['table']}: {t['title']}", "",
                  "| configuration | seeds | s/step per phase | batches/epoch | s/epoch (last phase) | "
                  "s/eval × evals | syncs/step | peak GiB | min per run |", "|---|---|---|---|---|---|---|---|---|"]
        for c in mine:
            last = next((s for s in reversed(c["s_per_step"]) if s is not None), None)
            epoch = None if last is None or not c["per_epoch"] else last * c["per_epoch"][-1]
            per_step = " / ".join(_num(s, 4) for s in c["s_per_step"]) if c["s_per_step"] else "—"
            minutes = _num(None if c["run_seconds"] is None else c["run_seconds"] / 60)
            mark = {"estimated": "≈ ", "failed": "failed: ", "untimed": "not timed", "time": "~ "}.get(c["status"], "")
            peak = c.get("peak_rss_gib")
            scale = c.get("eval_scale") or 1.0
            scaled = f" (scaled ×{scale:.1f})" if scale != 1.0 and c["s_eval"] is not None else ""
            minutes = (f"{mark}{minutes}" if c["status"] in ("timed", "estimated") else
                       f"{mark}{minutes} ({c['error']})" if c["status"] == "time" and c["run_seconds"] is not None
                       else f"{mark}{c['error'] or ''}")
            lines.append(f"| {' '.join(c['overrides'])} | {c['seeds']} | {per_step} | "
                         f"{' / '.join(map(str, c['per_epoch'])) or '—'} | {_num(epoch, 2)} | "
                         f"{_num(c['s_eval'], 2)}{scaled} × {c['evaluations']} | "
                         f"{'—' if c['syncs_per_step'] is None else c['syncs_per_step']} | {_num(peak)} | "
                         f"{minutes} |")
    return lines


def _plan_of(table: str) -> dict:
    """The spec's ``cpu_plan`` block: what the campaign runs of it on this CPU ({} if the spec does not say)."""
    from latentstruct.report.reproduce import spec_path
    from latentstruct.report.tables import load_spec

    try:
        return load_spec(spec_path(table)).get("cpu_plan") or {}
    except (OSError, KeyError, ValueError):
        return {}


def _plan_hours(configs: list[dict], table: str, plan: dict) -> float | None:
    """The CPU-hours of what the campaign runs of ``table``: the spec's ``cpu_plan.cpu_hours`` where it states a
    number; else from the sheet, the configurations that match one of its ``only`` patterns (fnmatch on the
    overrides; default: every one), ``seeds`` runs each where it says (default: the protocol's); None while one of
    them has no time (untimed, failed, over a limit) or the spec has no plan."""
    if not plan or isinstance(plan.get("cpu_hours"), (int, float)):
        return plan.get("cpu_hours")
    mine = [c for c in configs if c["table"] == table
            and any(fnmatch(" ".join(c["overrides"]), p) for p in plan.get("only") or ["*"])]
    if not mine or any(c["status"] not in ("timed", "estimated") or c["run_seconds"] is None for c in mine):
        return None
    return sum(c["run_seconds"] * plan.get("seeds", c["seeds"]) for c in mine) / 3600


def _lab_plan() -> list[str]:
    """The lab's matrix (experiments/lab_matrix.yaml, not a paper table): its runs, counted from its grid, and the
    spec's ``cpu_plan`` (what they cost here, estimated from the first matrix's measured run times)."""
    from latentstruct.report import matrix
    from latentstruct.report.tables import load_spec

    spec = load_spec(ROOT / "experiments" / "lab_matrix.yaml")
    cells = matrix.cells(spec)
    more = len(set(spec["seeds"]) - {spec["select"]["seed"]})  # the selection seed's run is the grid's
    runs = sum(len(matrix.grid_points(spec, c)) + more for c in cells)
    plan = spec.get("cpu_plan") or {}
    measured = json.loads(LAB_COST.read_text()) if LAB_COST.is_file() else {}
    said = (f" Measured (results/lab/matrix.md, `make table-lab-matrix`, commit(s) {', '.join(measured['commits'])}): "
            f"{measured['runs']:,} runs ({measured['completed']:,} completed), "
            f"{measured['wall_seconds'] / 3600:.1f} hours of training summed over the runs (each run's own wall clock,"
            " two at a time beside other work; the processes' start-up and the sweeps' bookkeeping not counted)."
            if measured else "")
    return ["", "## The lab", "",
            f"The estimator × structure matrix (experiments/lab_matrix.yaml, issue #38; `python -m scripts.campaign "
            f"start lab_matrix`): {len(cells)} cells, {runs:,} runs (each cell's grid points at the selection seed, "
            f"then the other {more} seeds at the chosen point), "
            f"{_num(plan.get('cpu_hours'), 1)} CPU-hours — {plan.get('run', 'no cpu_plan in the spec')}. It shares the "
            "cores with the campaign: it runs after the campaign's first four items, or on cores they leave idle."
            + said]


def steady_seconds(history: str, wall: float) -> float:
    """A run's seconds at its steady pace: its steps at the median seconds per step of its evaluation intervals
    (history.csv's ``step`` and cumulative ``wall_seconds``), so that intervals slowed by other work on the machine
    (a benchmark, a test suite beside the campaign) do not count; its wall clock where it has fewer than 3 intervals."""
    import csv
    import io
    from itertools import pairwise

    rows = [(float(r["step"]), float(r["wall_seconds"])) for r in csv.DictReader(io.StringIO(history))
            if r.get("step") and r.get("wall_seconds")]
    paces = [(w1 - w0) / (s1 - s0) for (s0, w0), (s1, w1) in pairwise([(0.0, 0.0), *rows]) if s1 > s0]
    return rows[-1][0] * statistics.median(paces) if len(paces) >= 3 else wall


def campaign_runs(state: Path) -> list[dict]:
    """The completed runs in a campaign table's committed records (``<state>/records.tar.gz``): each one's overrides,
    wall-clock seconds, as its record says, and seconds at its steady pace (:func:`steady_seconds`)."""
    import tarfile

    import yaml

    from scripts.carry import RECORDS

    pack, runs = state / RECORDS, {}
    if not pack.is_file():
        return []
    with tarfile.open(pack, "r:gz") as tar:
        for member in tar.getmembers():
            folder, name = member.name.rsplit("/", 1) if "/" in member.name else ("", member.name)
            if name == "metrics.json":
                runs.setdefault(folder, {})["record"] = json.loads(tar.extractfile(member).read())
            elif name == "history.csv":
                runs.setdefault(folder, {})["history"] = tar.extractfile(member).read().decode()
            elif name == "overrides.yaml" and folder.endswith("/.hydra"):
                runs.setdefault(folder.removesuffix("/.hydra"), {})["overrides"] = yaml.safe_load(
                    tar.extractfile(member).read())
    return [{"overrides": r.get("overrides") or [], "seconds": (wall := r["record"]["wall_seconds"]),
             "steady": steady_seconds(r.get("history", ""), wall)} for r in runs.values()
            if r.get("record", {}).get("status") == "completed" and r["record"].get("wall_seconds") is not None]


def _planned(configs: list[dict], table: str, overrides: list[str]) -> dict | None:
    """The sheet's configuration of ``table`` that a run with ``overrides`` ran: the one with the most overrides,
    all of them among the run's (the run adds its seed, the protocol's arguments, its directories)."""
    mine = [c for c in configs if c["table"] == table and set(c["overrides"]) <= set(overrides)]
    return max(mine, key=lambda c: len(c["overrides"]), default=None)


def campaign_costs(configs: list[dict], state: Path | None = None) -> list[dict]:
    """Per campaign table with committed records (under ``state``, default scripts/campaign.py's ``STATE``): its
    completed runs, the hours they took (their wall clocks), the hours this sheet plans for the same runs (None while
    one of their configurations has no time), and per configuration the median run against the planned run. A plan
    at a budget the sheet did not time (its spec's ``cpu_plan`` states its ``runs`` and ``cpu_hours``) is compared
    with those instead, as a whole."""
    from scripts import campaign

    tables = []
    for table, saved in campaign.pinned(state):
        runs = campaign_runs(saved)
        if not runs:
            continue
        by_config: dict[int, list] = {}
        for r in runs:
            c = _planned(configs, table, r["overrides"])
            by_config.setdefault(id(c), [c, []])[1].append(r)
        if (stated := _plan_of(table)).get("runs"):
            known, planned = [], stated["cpu_hours"] * len(runs) / stated["runs"]
        else:
            known = [{"config": c, "runs": len(took),
                      "median": (median := statistics.median(r["seconds"] for r in took)),
                      "ratio": median / c["run_seconds"], "steady": statistics.median(r["steady"] for r in took)}
                     for c, took in by_config.values() if c is not None and c.get("run_seconds")]
            planned = (sum(k["config"]["run_seconds"] * k["runs"] for k in known) / 3600
                       if len(known) == len(by_config) else None)
        spent = sum(r["seconds"] for r in runs) / 3600
        steady = sum(r["steady"] for r in runs) / 3600
        tables.append({"table": table, "runs": len(runs), "hours": spent, "steady_hours": steady, "planned": planned,
                       "ratio": spent / planned if planned else None,
                       "steady_ratio": steady / planned if planned else None, "configs": known,
                       "steady_each": statistics.median(r["steady"] for r in runs),
                       "completed": {_key(c): len(took) for c, took in by_config.values() if c is not None}})
    return tables


def _key(config: dict) -> tuple:
    return config["table"], tuple(config["overrides"])


def _device_completed(configs: list[dict], state: Path | None = None) -> dict:
    """Per configuration (:func:`_key`), the completed runs in the records a GPU machine brought back
    (``<state>/device/<paper>-<table>/records.tar.gz``)."""
    from scripts import campaign

    counts: dict[tuple, int] = {}
    for pack in sorted(((state or campaign.STATE) / "device").glob("*/"), key=str):
        table = pack.name.replace("-", "/", 1)
        for r in campaign_runs(pack):
            c = _planned(configs, table, r["overrides"])
            if c is not None:
                counts[_key(c)] = counts.get(_key(c), 0) + 1
    return counts


def campaign_remains(configs: list[dict], tables: list[dict], costs: list[dict],
                     state: Path | None = None) -> list[dict]:
    """Per table with a ``cpu_plan`` that runs something: the runs the plan makes of it (its configurations, its
    ``seeds`` each), those completed in the committed records (:func:`campaign_costs`, and a GPU machine's), and the
    CPU-hours of the rest — by this sheet, and forecast at the steady pace of the runs so far (:func:`steady_seconds`:
    CPU time, not the hours other work on the machine took from them): a configuration's median completed run where
    it has one (``own``: how many configurations left), else the sheet's run times the table's steady took / plan
    (``scaled``), else the sheet's run. None while a configuration of the rest has no time. A plan at a budget the
    sheet did not time (``runs`` and ``cpu_hours`` in its ``cpu_plan``): the rest at the median steady run of its
    completed runs, or at the plan's hours pro rata before it has any."""
    done, device = {t["table"]: t for t in costs}, _device_completed(configs, state)
    rows = []
    for t in tables:
        plan = _plan_of(t["table"])
        if not plan or plan.get("cpu_hours") == 0:
            continue
        cost = done.get(t["table"]) or {}
        if plan.get("runs"):
            runs, ran = plan["runs"], min(plan["runs"], cost.get("runs", 0))
            sheet = plan["cpu_hours"] * (runs - ran) / runs
            how = "median" if cost.get("steady_each") else "plan"
            rows.append({"table": t["table"], "runs": runs, "completed": ran, "left": runs - ran, "sheet_hours": sheet,
                         "forecast_hours": (runs - ran) * cost["steady_each"] / 3600 if how == "median" else sheet,
                         "ratio": cost.get("steady_ratio"), "basis": {how: runs - ran}})
            continue
        paced = {_key(k["config"]): k["steady"] for k in cost.get("configs", [])}
        mine = [c for c in configs if c["table"] == t["table"]
                and any(fnmatch(" ".join(c["overrides"]), p) for p in plan.get("only") or ["*"])]
        planned = completed = left = 0
        sheet, forecast, basis = 0.0, 0.0, {"own": 0, "scaled": 0, "sheet": 0, "untimed": 0}
        for c in mine:
            runs = plan.get("seeds", c["seeds"])
            ran = min(runs, cost.get("completed", {}).get(_key(c), 0) + device.get(_key(c), 0))
            planned, completed, left = planned + runs, completed + ran, left + runs - ran
            if runs == ran:
                continue
            seconds = c.get("run_seconds") if c["status"] in ("timed", "estimated") else None
            how = ("untimed" if seconds is None else "own" if _key(c) in paced
                   else "scaled" if cost.get("steady_ratio") else "sheet")
            basis[how] += 1
            if seconds is None or sheet is None:
                sheet = forecast = None
                continue
            sheet += (runs - ran) * seconds / 3600
            scale = cost.get("steady_ratio") or 1.0
            each = {"own": paced.get(_key(c)), "scaled": seconds * scale}.get(how, seconds)
            forecast += (runs - ran) * each / 3600
        rows.append({"table": t["table"], "runs": planned, "completed": completed, "left": left,
                     "sheet_hours": sheet, "forecast_hours": forecast, "ratio": cost.get("steady_ratio"),
                     "basis": basis})
    return rows


def unsheeted(tables: list[dict], state: Path | None = None) -> list[dict]:
    """The campaign's pinned tables that this sheet did not time and whose plan states its runs and hours (a table
    added after the sheet, e.g. energy/ner_vectors), so that what remains counts them too."""
    from scripts import campaign

    timed = {t["table"] for t in tables}
    return [{"table": t} for t, _ in campaign.pinned(state) if t not in timed and _plan_of(t).get("runs")]


def _basis(row: dict) -> str:
    """How a forecast was made: the configurations left by their own runs, by the sheet scaled, by the sheet."""
    b = row["basis"]
    said = {"own": "from their runs", "scaled": f"by the sheet × {_num(row['ratio'], 1)}", "sheet": "by the sheet",
            "untimed": "not timed", "median": "runs at the median of its runs", "plan": "runs at the plan's hours"}
    return "; ".join(f"{b[k]} {said[k]}" for k in said if b.get(k)) or "—"


def campaign_left(rows: list[dict]) -> list[str]:
    """cpu.md's section of :func:`campaign_remains`."""
    if not rows:
        return []
    known = [r["forecast_hours"] for r in rows if r["left"]]
    total = sum(known) if None not in known else None
    lines = ["", "## What remains of the plan", "",
             "Per table of *what we will run* above: its runs (configurations × the plan's seeds), those completed in "
             "the committed campaign records, and the CPU-hours of the rest — by this sheet, and forecast from the "
             "runs so far at their steady pace (each run's steps at the median seconds per step of its evaluation "
             "intervals, so that intervals slowed by other work on the machine do not count; a configuration's "
             "median completed run where it has one, else the sheet's run times the table's steady took / plan, else "
             "the sheet's run; a plan at a budget the sheet did not time states its runs and CPU-hours, and its rest "
             "goes at the median of its completed runs, or at its stated hours before it has any). A run interrupted "
             "with a checkpoint counts whole. "
             "The campaign runs two at a time: its wall clock is about half the CPU-hours.", "",
             "| table | runs of the plan | completed (committed) | left | their CPU-hours, this sheet | "
             "forecast CPU-hours | the configurations left, forecast |", "|---|---|---|---|---|---|---|",
             *[f"| {r['table']} | {r['runs']:,} | {r['completed']:,} | {r['left']:,} | "
               f"{_num(r['sheet_hours'] if r['left'] else 0.0, 1)} | "
               f"{_num(r['forecast_hours'] if r['left'] else 0.0, 1)} | {_basis(r) if r['left'] else 'done'} |"
               for r in rows],
             f"| **all** | {sum(r['runs'] for r in rows):,} | {sum(r['completed'] for r in rows):,} | "
             f"{sum(r['left'] for r in rows):,} | — | {_num(total, 1)} | |"]
    return lines


def campaign_spent(costs: list[dict]) -> list[str]:
    """cpu.md's section of :func:`campaign_costs`: per table, then the configurations whose runs took more than twice
    (or less than half) the plan."""
    if not costs:
        return []
    off = sorted((k for t in costs for k in t["configs"] if not 0.5 <= k["ratio"] <= 2), key=lambda k: -k["ratio"])
    lines = ["", "## What the campaign's runs took, against this plan", "",
             "From the committed records (`campaign/<paper>-<table>/records.tar.gz`, `python -m scripts.campaign "
             "save`): each completed run's own wall clock (`wall_seconds`: one thread, two runs at a time beside "
             "other work, evaluations included; a run paused by `make bench-suite --pause-campaign` counts its "
             "pause), against the run time this sheet gives the configuration the run ran (timed, or *estimated* "
             "from a timed sibling); and at their steady pace (each run's steps at the median seconds per step of its "
             "evaluation intervals: intervals slowed by other work on the machine do not count).", "",
             "| table | completed runs | their hours | at their steady pace | this plan's hours for the same runs | "
             "took / plan | steady / plan |",
             "|---|---|---|---|---|---|---|",
             *[f"| {t['table']} | {t['runs']:,} | {t['hours']:.1f} | {t['steady_hours']:.1f} | "
               f"{_num(t['planned'], 1)} | {_num(t['ratio'], 1, '×')} | {_num(t['steady_ratio'], 1, '×')} |"
               for t in costs]]
    if off:
        lines += ["", "Configurations whose runs took more than twice, or less than half, the plan (median run):", "",
                  "| configuration | runs | median run (s) | the plan's run (s) | took / plan |",
                  "|---|---|---|---|---|",
                  *[f"| {k['config']['table']} `{' '.join(k['config']['overrides'])}` | {k['runs']} | "
                    f"{k['median']:,.0f} | {k['config']['run_seconds']:,.0f} ({k['config']['status']}) | "
                    f"{k['ratio']:.1f}× |" for k in off]]
    return lines


def page(sheet: dict, command: str = "make bench-cpu") -> list[str]:
    """results/bench/cpu.md: per table the CPU-hours of the paper's protocol (one run at a time, one thread), its
    longest run, what does not fit here, and what the campaign runs (the spec's ``cpu_plan``), then the sheet."""
    configs = sheet["configs"]
    loads = [x for c in configs for x in c.get("load") or []]
    peaks = [c["peak_rss_gib"] for c in configs if c.get("peak_rss_gib")]
    counts = {k: sum(c["status"] == k for c in configs) for k in STATUSES}
    options = sheet.get("options") or {}
    status = (f"**Status: {counts['timed']} of {len(configs)} configurations timed** ({counts['failed']} failed, "
              f"{counts['memory']} over {options.get('memory_gib', '?'):g} GiB, {counts['time']} over "
              f"{options.get('config_seconds', 0):.0f} s, {counts['untimed']} not reached) on "
              f"{sheet.get('cpu_cores', '?')} shared CPU cores ({sheet.get('cpu') or 'CPU model not recorded'}), "
              "load average "
              f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f}, each time taken under that load.")
    costs = campaign_costs(configs)
    longer = [f"{t['table']} {t['steady_ratio']:.1f}× ({t['ratio']:.1f}× by their wall clocks)" for t in costs
              if t["steady_ratio"] and t["steady_ratio"] > 1]
    if longer:
        status += (f" **The campaign's runs took longer than planned**, at their steady pace ({', '.join(longer)}: "
                   "below); the CPU-hours of this plan are lower bounds for these tables.")
    lines = [
        "# The CPU plan: what each paper table costs on this CPU", "", status, "",
        f"Generated by `{command}` (`bench/tables.py --device cpu --threads 1`, rendered with `--page`) on "
        f"{sheet.get('generated', '?')}, commit {sheet.get('git_commit', '?')}"
        f"{' (dirty)' if sheet.get('git_dirty') else ''}, torch {sheet.get('torch', '?')}, "
        f"{sheet.get('torch_threads', '?')} torch thread(s), {sheet.get('seconds', 0) / 3600:.1f} h of timing."
        f"{resumed_note(sheet)} "
        "Each configuration of a table's sweeps is timed alone, in its own process (one thread, `nice`), at "
        "initialisation: seconds per step per phase and per evaluation, times the protocol's steps and "
        "evaluations (bench/tables.py's docstring). The machine is shared: the 1-minute load average before and "
        "after each configuration is in cpu.json (`load`), and a run alone on an idle core would be faster. "
        f"A configuration whose resident memory passed {options.get('memory_gib', '?'):g} GiB was stopped (*over "
        f"memory*: the full protocol does not fit here beside the other work); one still timing after "
        f"{options.get('config_seconds', 0):.0f} s was stopped and its run estimated from the steps it took (~). "
        f"Peak resident memory of a timing process: up to {max(peaks, default=0):.1f} GiB.",
        "",
        "**What we will run** is the spec's `cpu_plan` block where the spec states one (— where it does not): `run`, "
        "the budget in words; its CPU-hours from the configurations below that the plan runs (its `only` patterns, "
        "`seeds` runs each where it says), or the plan's own `cpu_hours`; — while one of them has no time. A plan's "
        "`note` (what the timing cannot see) follows the table.",
        "",
        "| table | runs | timed / estimated / failed / over memory / over time / untimed runs | CPU-hours, paper's "
        "protocol (one run at a time) | longest run (h) | what we will run | its CPU-hours |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = []  # the plans' notes, under the table
    for t in sheet["tables"]:
        plan = _plan_of(t["table"])
        if plan.get("note"):
            notes.append(f"- {t['table']}: {plan['note']}")
        hours = _num(t["device_hours"], 1) + ("" if t["complete"] else " (lower bound)")
        longest = None if t["longest_run_minutes"] is None else t["longest_run_minutes"] / 60
        counts = " / ".join(str(t.get(f"runs_{k}", 0)) for k in STATUSES)
        lines.append(f"| {t['table']} | {t['runs']} | {counts} | {hours} | {_num(longest, 2)} | "
                     f"{plan.get('run', '—')} | {_num(_plan_hours(configs, t['table'], plan), 1)} |")
    lines += ["", *notes] if notes else []
    over = [c for c in configs if c["status"] in ("memory", "time", "failed")]
    lines += ["", "## What the full protocol cannot do here", ""]
    lines += [f"- {c['table']} `{' '.join(c['overrides'])}`: {'failed: ' if c['status'] == 'failed' else ''}"
              f"{c['error']}, peak {_num(c.get('peak_rss_gib'))} GiB resident" for c in over] or ["- nothing"]
    untimed = [t["table"] for t in sheet["tables"] if t.get("runs_untimed")]
    if untimed:
        flags = " ".join(f"--{k.replace('_', '-')} {' '.join(map(repr, v)) if isinstance(v, list) else v}"
                         for k, v in options.items() if k in ("max_per_experiment", "eval_examples", "config_seconds",
                                                               "skip") and v)
        flags = flags.replace("'", '"')
        lines += ["", f"Not timed yet (resumed by `{command}" + (f" BENCH_CPU_ARGS='{flags}'" if flags else "")
                  + f"`): configurations of {', '.join(untimed)}."]
    remains = campaign_left(campaign_remains(configs, [*sheet["tables"], *unsheeted(sheet["tables"])], costs))
    return lines + campaign_spent(costs) + remains + _lab_plan() + ["", "## Every configuration", "", *render(sheet)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="the sheet (JSON)")
    parser.add_argument("--tables", nargs="*", help="<paper>/<table> (default: every table with a reproduce block)")
    parser.add_argument("--deadline", type=float, help="a Unix time to stop by")
    parser.add_argument("--max-configs", type=int, help="time at most this many configurations")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per phase first (default 2)")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time steps for at least this long (default 1)")
    parser.add_argument("--max-steps", type=int, default=40, help="or at most this many steps (default 40)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--memory-gib", type=float, default=8.0,
                        help="kill a configuration whose resident memory passes this (default 8)")
    parser.add_argument("--config-seconds", type=float, default=600.0,
                        help="kill a configuration still timing after this long (default 600)")
    parser.add_argument("--max-per-experiment", type=int,
                        help="time at most this many configurations of each experiment of a table; the others are "
                             "estimated from them (≈)")
    parser.add_argument("--skip", nargs="*", metavar="PATTERN",
                        help="leave untimed the configurations whose overrides match a pattern ('*listops_chart_*')")
    parser.add_argument("--retime", nargs="*", metavar="PATTERN",
                        help="with --resume: time again the asked tables' configurations whose overrides match "
                             "('*ner_infnet*': their code changed)")
    parser.add_argument("--eval-examples", type=int,
                        help="time the evaluation on the first N examples of valid and test, scaled to their sizes")
    parser.add_argument("--resume", action="store_true",
                        help="keep the configurations --out already holds (timed, failed, over a limit); time the rest")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child: time one configuration
    parser.add_argument("--override", nargs="*", help="config overrides added to every configuration (e.g. "
                        "task.inverse_solver=cg; a key a configuration lacks fails it)")
    parser.add_argument("--render", type=Path, metavar="SHEET", help="print a sheet as Markdown and exit")
    parser.add_argument("--page", type=Path, metavar="SHEET", help="print results/bench/cpu.md of a sheet and exit")
    args = parser.parse_args(argv)
    if args.render or args.page:
        sheet = json.loads((args.render or args.page).read_text())
        if args.page:  # the tables summed again by this code
            sheet["tables"] = summarise([Cell(**c) for c in sheet["configs"]])
        print("\n".join(render(sheet) if args.render else page(sheet)))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        return _child(args.one, args)
    if args.out is None:
        parser.error("--out is required")
    sheet = run(args)
    _write(args.out, sheet)
    print(f"wrote {args.out} ({sheet['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: seconds per training step and per epoch of every paper table's configuration on one device, and from
them the device-hours of each full table (``scripts/gpu_check.sh`` runs it on the GPU machine).

    python bench/tables.py --device cuda --out timing.json [--tables spigot/table3_sst energy/ner ...]
                           [--deadline UNIX_SECONDS] [--max-configs N] [--warmup 2] [--min-seconds 1] [--max-steps 40]
    python bench/tables.py --render timing.json            # the sheet as Markdown (scripts/gpu_report.py uses it)

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
until ``--min-seconds`` have passed or ``--max-steps`` were timed: that phase's seconds per step. Then one evaluation
of valid and test (``evaluate_splits``, as train.py calls it after a step). On CUDA one more step runs under
``torch.cuda.set_sync_debug_mode("warn")`` and the synchronising calls it makes are counted: host round trips per
step. A run's device-seconds = Σ over phases of its steps × s/step + its evaluations (``_evaluation_steps``) × s/eval;
a cell's = that × its seeds; a table's = Σ over its cells. Not counted: data loading, checkpoint writes (one per
evaluation) and what train.py adds per step (the loss and gradient-norm finiteness check, about 1%). Runs are timed
alone: several runs at once on one GPU (``gpu_table.sh`` runs one per CPU core) overlap, so a table's wall time can
be far below its device-hours, never below its longest run.

**Budget.** Configurations run in order until ``--deadline`` (a Unix time) would be passed by another like the slowest
so far, or ``--max-configs`` are done. A configuration not timed is estimated from the timed ones of the same
experiment in the same table (their median run-seconds, marked ``≈``); one without such a sibling stays unknown,
and its table's device-hours are then a lower bound. A configuration that fails (missing data: SNLI's training
split) says why.
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
    status: str = "untimed"  # timed, estimated, failed, untimed
    error: str | None = None
    steps: list[int] = field(default_factory=list)  # per phase, in a run
    per_epoch: list[int] = field(default_factory=list)  # batches per epoch, per phase
    s_per_step: list[float | None] = field(default_factory=list)
    evaluations: int = 0
    s_eval: float | None = None
    syncs_per_step: int | None = None
    run_seconds: float | None = None
    took: float | None = None  # seconds this configuration took to time


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


def build_cell(cell: Cell, device: torch.device, data_cache: dict, extra: Sequence[str] = ()) -> Built:
    """Compose ``cell`` as a sweep job (+ the overrides ``extra``) and build it (data from ``data_cache``, filled)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import latentstruct.optim
    from latentstruct.train import _plan, build_model

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
    phases, max_steps = _plan(cfg.trainer, {name: data.size(name) for name in data.splits})
    return Built(cfg, data, splits, model, optimizer, phases, max_steps)


def time_cell(cell: Cell, device: torch.device, data_cache: dict, args) -> None:
    """Time one configuration (module docstring), filling ``cell`` in place."""
    from latentstruct.train import _evaluation_steps

    built = build_cell(cell, device, data_cache, getattr(args, "override", None) or ())
    splits, model, optimizer = built.splits, built.model, built.optimizer
    phases, max_steps, tc = built.phases, built.max_steps, built.cfg.trainer
    cell.evaluations = len(_evaluation_steps(phases, tc.eval_every, max_steps))
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
        for _ in range(args.warmup):
            step()
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
            chunk = min(2 * chunk, args.max_steps - timed)
        cell.s_per_step.append(elapsed / timed)
    _sync(device)
    start = time.perf_counter()
    model.evaluate_splits({split: splits[split] for split in ("valid", "test")}, tc.batch_size)
    _sync(device)
    cell.s_eval = time.perf_counter() - start
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
        known = [c for c in mine if c.run_seconds is not None]
        seconds = sum(c.run_seconds * c.seeds for c in known)
        longest = max((c.run_seconds for c in known), default=None)
        counts = {s: sum(c.seeds for c in mine if c.status == s) for s in ("timed", "estimated", "failed", "untimed")}
        sessions = None
        if known and len(known) == len(mine):  # runs at once: one per CPU core, as gpu_table.sh launches them
            sessions = max(math.ceil(longest / 60 / SESSION_MINUTES),
                           math.ceil(seconds / 60 / (SESSION_MINUTES * (os.cpu_count() or 1))))
        out.append({"table": table, "title": load_spec(spec_path(table)).get("title", table),
                    "runs": sum(c.seeds for c in mine), "cells": len(mine),
                    **{f"runs_{k}": v for k, v in counts.items()},
                    "device_hours": seconds / 3600 if known else None, "complete": len(known) == len(mine),
                    "longest_run_minutes": None if longest is None else longest / 60,
                    "sessions_at_least": sessions})
    return out


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available")
    chosen = args.tables or tables()
    all_cells = [c for t in chosen for c in cells(t)]
    data_cache: dict = {}
    slowest, done = 0.0, 0
    started = time.time()
    for cell in all_cells:
        if args.max_configs is not None and done >= args.max_configs:
            break
        if args.deadline is not None and time.time() + slowest > args.deadline:
            print(f"deadline: {sum(c.status == 'untimed' for c in all_cells)} configurations left untimed", flush=True)
            break
        t0 = time.perf_counter()
        try:
            time_cell(cell, device, data_cache, args)
        except Exception as err:  # noqa: BLE001 — a configuration that cannot run is a result (missing data)
            cell.status, cell.error = "failed", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        cell.took = time.perf_counter() - t0
        slowest, done = max(slowest, cell.took), done + 1
        steps = ", ".join("—" if s is None else f"{s * 1e3:.1f}" for s in cell.s_per_step)
        print(f"  {cell.table:22s} {' '.join(cell.overrides):70.70s} {cell.status:7s} ms/step [{steps}] "
              f"eval {cell.s_eval or 0:.2f} s ({cell.took:.1f} s){'  ' + cell.error if cell.error else ''}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.out is not None:  # after each configuration: a sheet survives a command killed at its limit
            _write(args.out, _sheet(all_cells, device, args, started))
    return _sheet(all_cells, device, args, started)


def _sheet(all_cells: list[Cell], device: torch.device, args, started: float) -> dict:
    """The sheet of ``all_cells`` as timed so far, the untimed ones estimated (on copies)."""
    from latentstruct.records import environment

    cells = [Cell(**asdict(c)) for c in all_cells]
    _estimate(cells)
    return {"device": device.type, **environment(device), "torch_threads": torch.get_num_threads(),
            "cpu_cores": os.cpu_count(),
            "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.time() - started,
            "options": {k: getattr(args, k) for k in ("warmup", "min_seconds", "max_steps", "max_configs")},
            "session_minutes": SESSION_MINUTES,
            "tables": summarise(cells), "configs": [asdict(c) for c in cells]}


def _write(path: Path, sheet: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(sheet, indent=1) + "\n")
    tmp.replace(path)


# -------------------------------------------------------------------------------------------------------- report


def _num(x, digits=1, unit=""):
    return "—" if x is None else f"{x:,.{digits}f}{unit}"


def render(sheet: dict) -> list[str]:
    """The timing sheet as Markdown lines: a line per table, then each table's configurations."""
    lines = [
        "| table | runs | timed / estimated / failed / untimed runs | device-hours (one run at a time) | longest run "
        "(min) | sessions, at least |",
        "|---|---|---|---|---|---|",
    ]
    for t in sheet["tables"]:
        hours = _num(t["device_hours"], 2) + ("" if t["complete"] else " (lower bound)")
        counts = " / ".join(str(t[f"runs_{k}"]) for k in ("timed", "estimated", "failed", "untimed"))
        lines.append(f"| {t['table']} | {t['runs']} | {counts} | {hours} | {_num(t['longest_run_minutes'])} | "
                     f"{t['sessions_at_least'] if t['sessions_at_least'] is not None else '—'} |")
    for t in sheet["tables"]:
        mine = [c for c in sheet["configs"] if c["table"] == t["table"]]
        lines += ["", f"### {t['table']}: {t['title']}", "",
                  "| configuration | seeds | s/step per phase | batches/epoch | s/epoch (last phase) | "
                  "s/eval × evals | syncs/step | min per run |", "|---|---|---|---|---|---|---|---|"]
        for c in mine:
            last = next((s for s in reversed(c["s_per_step"]) if s is not None), None)
            epoch = None if last is None or not c["per_epoch"] else last * c["per_epoch"][-1]
            per_step = " / ".join(_num(s, 4) for s in c["s_per_step"]) if c["s_per_step"] else "—"
            minutes = _num(None if c["run_seconds"] is None else c["run_seconds"] / 60)
            mark = {"estimated": "≈ ", "failed": "failed: ", "untimed": "not timed"}.get(c["status"], "")
            minutes = f"{mark}{minutes}" if c["status"] in ("timed", "estimated") else f"{mark}{c['error'] or ''}"
            lines.append(f"| {' '.join(c['overrides'])} | {c['seeds']} | {per_step} | "
                         f"{' / '.join(map(str, c['per_epoch'])) or '—'} | {_num(epoch, 2)} | "
                         f"{_num(c['s_eval'], 2)} × {c['evaluations']} | "
                         f"{'—' if c['syncs_per_step'] is None else c['syncs_per_step']} | {minutes} |")
    return lines


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
    parser.add_argument("--override", nargs="*", help="config overrides added to every configuration (e.g. "
                        "task.inverse_solver=cg; a key a configuration lacks fails it)")
    parser.add_argument("--render", type=Path, metavar="SHEET", help="print a sheet as Markdown and exit")
    args = parser.parse_args(argv)
    if args.render:
        print("\n".join(render(json.loads(args.render.read_text()))))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if args.threads:
        torch.set_num_threads(args.threads)
    sheet = run(args)
    _write(args.out, sheet)
    print(f"wrote {args.out} ({sheet['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The estimator × structure matrix (issue #22): seed 001's Table 2 protocol on every planted structure.

    python -m latentstruct.report.matrix [--spec experiments/lab_matrix.yaml] [--runs multirun] [--results results]
        [--jobs 2] [--seeds 301,302] [--rows spigot,spigot_ce] [--args 'trainer.max_steps=20'] [--report-only]
        [--dry-run]

(``make table-lab-matrix``.) The spec (``experiments/lab_matrix.yaml``, not a paper table spec of
``experiments/<paper>/``) names the structures (its ``settings``, each a ``planted_<structure>`` experiment), the
methods (its ``rows``: overrides, the grid keys they tune, the structures they apply to), the grid, the seeds and the
selection rule. For every applicable cell (row × setting):

1. **grid**: one run per grid point (the product of the row's grid keys' values) at the selection seed;
2. **selection**: the point with the highest ``select.metric`` (validation accuracy) of that seed (ties: the first
   in grid order); the test split is never looked at;
3. **seeds**: every seed of ``seeds`` at the chosen point (the selection seed's run is the one of step 1).

Runs are launched as ``python -m latentstruct.train --multirun`` (joblib, ``--jobs`` at a time, one thread each),
the jobs of a structure that share all but their swept values grouped into one launch, all under
``<runs>/<sweep_dir>``. A run is found by its record, never by its directory name (each override ``key=value``
matches the run's ``choices.<key>``, a config group, or else its ``<key>``), and a job whose run has completed is not
launched again, so the command reruns only what is missing (a failed run is launched again; ``--report-only``: no
runs at all). Step 1 goes a structure at a time; step 3 a seed at a time over every cell, so a benchmark stopped
part-way leaves every cell with the same number of seeds. Then the table:
``results/lab/matrix.md`` (median ± s.e. of test accuracy and recovery ×100 per cell, best per column in bold, the
recovery a latent unrelated to z* gets — the MAP of random scores —, seed 001's findings tested per structure),
``matrix.csv`` (every cell with its chosen point and per-seed values), ``matrix.png`` (the recovery heat map) and
``matrix.json`` (its runs and their summed wall time, which results/bench/cpu.md reports).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from latentstruct.records import REPORT_FILE
from latentstruct.report.tables import aggregate, filter_runs, load_runs, load_spec, notes, provenance

__all__ = ["Cell", "cells", "grid_points", "find", "pending", "launches", "select", "plan", "main"]

SPEC = "experiments/lab_matrix.yaml"
#: keys whose values a launch sweeps (the rest of a job's overrides must be shared by the jobs of one launch)
SWEPT = ("+experiment", "latent", "estimator", "decoder", "optim.lr", "task.estimator.eta", "task.estimator.lam",
         "task.estimator.tau", "task.estimator.sigma", "task.estimator.samples", "trainer.seed")
#: how every launch runs: local parallel jobs, one thread each, no progress bars, a finished run skipped
LAUNCHER = ("hydra/launcher=joblib", "hydra.launcher.n_jobs={jobs}", "trainer.progress=false",
            "trainer.resume=true")


@dataclass(frozen=True)
class Cell:
    """One row × setting of the spec: its name pair, the overrides every run of it has, and the grid keys it tunes."""

    row: str
    setting: str
    overrides: tuple[tuple[str, str], ...]
    grid: tuple[str, ...] = ()
    values: tuple[tuple[str, tuple], ...] = ()  # the row's own values of grid keys (``grid_values``), if any


def _pairs(overrides: list[str]) -> list[tuple[str, str]]:
    out = []
    for override in overrides:
        key, eq, value = override.partition("=")
        if not eq:
            raise ValueError(f"override {override!r} is not key=value")
        out.append((key, value))
    return out


def cells(spec: dict) -> list[Cell]:
    """The applicable cells, row-major: a row's ``only`` / ``skip`` say which settings it applies to."""
    out = []
    for row in spec["rows"]:
        for setting in spec["settings"]:
            name = setting["name"]
            if ("only" in row and name not in row["only"]) or name in row.get("skip", ()):
                continue
            overrides = [("+experiment", setting["experiment"]), *_pairs(row.get("overrides", []))]
            own = tuple((k, tuple(v)) for k, v in (row.get("grid_values") or {}).items())
            out.append(Cell(row["name"], name, tuple(overrides), tuple(row.get("grid", ())), own))
    return out


def _value(value) -> str:
    """A grid value as an override writes it (``0.003``, ``1.0``)."""
    return repr(value) if isinstance(value, float) else str(value)


def grid_points(spec: dict, cell: Cell) -> list[tuple[tuple[str, str], ...]]:
    """The cell's grid points in grid order, each a tuple of (key, value) overrides (one empty point without keys);
    a row's ``grid_values`` replace the spec's values of those keys."""
    own = dict(cell.values)
    values = [[(key, _value(v)) for v in own.get(key, spec["grid"][key])] for key in cell.grid]
    return [tuple(point) for point in itertools.product(*values)]


def _column(runs: pd.DataFrame, key: str) -> str:
    key = key.lstrip("+")
    return f"choices.{key}" if f"choices.{key}" in runs else key


def find(runs: pd.DataFrame, overrides) -> pd.DataFrame:
    """The runs (of :func:`latentstruct.report.tables.load_runs`) a job's overrides describe (module docstring)."""
    if not len(runs):
        return runs
    return filter_runs(runs, {_column(runs, key): _number(value) for key, value in overrides})


def _number(value: str):
    """An override's value as the records hold it: a number where it reads as one (``0.01``, ``301``), else text."""
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def _job(cell: Cell, point, seed: int) -> tuple[tuple[str, str], ...]:
    return (*cell.overrides, *point, ("trainer.seed", str(seed)))


def _as_seed(job) -> tuple[tuple[str, str], ...]:
    """A job as :func:`find` matches it: ``trainer.seed`` is the record's ``seed``."""
    return tuple(("seed", v) if k == "trainer.seed" else (k, v) for k, v in job)


def pending(jobs, runs: pd.DataFrame) -> list:
    """The jobs without a completed run."""
    out = []
    for job in jobs:
        found = find(runs, _as_seed(job))
        if not (len(found) and found["completed"].any()):
            out.append(job)
    return out


def launches(jobs) -> list[list[tuple[str, str]]]:
    """Group jobs into launches: one launch sweeps the :data:`SWEPT` values of jobs that share everything else, as
    long as the jobs are the whole product of those values (else it splits on the swept key with the fewest values).
    Each launch is a list of (key, value or ``v1,v2,...``) overrides."""
    groups: dict[tuple, list] = {}
    for job in jobs:
        fixed = tuple((k, v) for k, v in job if k not in SWEPT)
        shape = tuple(k for k, _ in job)
        groups.setdefault((fixed, shape), []).append(dict(job))
    out = []
    for (fixed, shape), members in groups.items():
        out += _split(list(fixed), [k for k in shape if k in SWEPT], members)
    return out


def _split(fixed, keys, members) -> list[list[tuple[str, str]]]:
    values = {k: list(dict.fromkeys(m[k] for m in members)) for k in keys}
    product = math.prod(len(v) for v in values.values()) == len(members)
    # Hydra composes a multirun's configuration first without its sweeps, with the default estimator: a key of the
    # estimators' own (task.estimator.tau) given one value beside several estimators is refused there (the
    # default, SPIGOT, has no τ) and the whole launch fails; such a launch goes an estimator at a time
    lone = len(values.get("estimator", ())) > 1 and any(k.startswith("task.estimator.") and len(values[k]) == 1
                                                         for k in keys)
    if product and not lone:
        return [fixed + [(k, ",".join(values[k])) for k in keys]]
    key = "estimator" if product else min((k for k in keys if len(values[k]) > 1), key=lambda k: len(values[k]))
    return [launch for value in values[key]
            for launch in _split(fixed + [(key, value)], [k for k in keys if k != key],
                                 [m for m in members if m[key] == value])]


def select(spec: dict, cell: Cell, runs: pd.DataFrame) -> tuple[tuple[tuple[str, str], ...] | None, str]:
    """The cell's chosen grid point and why: the completed run of the selection seed with the highest
    ``select.metric`` (ties: the first point); None while a point has no run yet, or when all of them failed."""
    rule = spec["select"]
    column, best, best_value, failed = f"metric.{rule['metric']}", None, -math.inf, 0
    for point in grid_points(spec, cell):
        found = find(runs, _as_seed(_job(cell, point, rule["seed"])))
        done = found[found["completed"]] if len(found) else found
        if not len(done):
            if len(found):
                failed += 1
                continue
            return None, "not run yet"
        value = float(done[column].iloc[0]) if column in done else math.nan
        if math.isnan(value):  # a completed run without the metric: no basis for choosing it
            failed += 1
        elif value > best_value:
            best, best_value = point, value
    if best is None:
        return None, f"all {failed} grid points failed"
    return best, f"{rule['metric']} {best_value:.2f}" + (f" ({failed} points failed)" if failed else "")


def plan(spec: dict, runs: pd.DataFrame, seeds: list[int], setting: str | None = None) -> tuple[list, list]:
    """The jobs still to run (of one setting, or all): the grid's (step 1) and, for the cells whose point is chosen,
    the seeds' (step 3)."""
    todo = [c for c in cells(spec) if setting in (None, c.setting)]
    grid = [_job(c, p, spec["select"]["seed"]) for c in todo for p in grid_points(spec, c)]
    chosen = [(c, select(spec, c, runs)[0]) for c in todo]
    rest = [_job(c, p, s) for c, p in chosen if p is not None for s in seeds]
    return pending(grid, runs), pending(rest, runs)


def _argv(launch, runs_dir: Path, jobs: int, args: list[str]) -> list[str]:
    launcher = [s.format(jobs=jobs) for s in LAUNCHER]
    return [sys.executable, "-m", "latentstruct.train", "--multirun", *(f"{k}={v}" for k, v in launch),
            *args, *launcher, f"hydra.sweep.dir={runs_dir}"]


def _run(todo, runs_dir: Path, jobs: int, args: list[str], dry: bool, what: str) -> None:
    groups = launches(todo)
    print(f"{what}: {len(todo)} runs to go in {len(groups)} launches", flush=True)
    for i, launch in enumerate(groups, 1):
        argv = _argv(launch, runs_dir, jobs, args)
        print(f"[{what} {i}/{len(groups)}] {shlex.join(argv[1:])}", flush=True)
        if not dry and subprocess.run(argv).returncode:
            print("*** some runs of this launch failed: the table lists them", flush=True)


#: the grid keys as the page names them
_NAMES = {"optim.lr": "lr", "task.estimator.eta": "η", "task.estimator.lam": "λ", "task.estimator.tau": "τ",
          "task.estimator.sigma": "σ", "task.estimator.samples": "M"}


def _point_text(point) -> str:
    return ", ".join(f"{_NAMES.get(k, k)} {float(v):g}" for k, v in point) if point else "—"


def chosen(spec: dict, runs: pd.DataFrame) -> dict[Cell, tuple]:
    """Every applicable cell's :func:`select`: its chosen point and why (the page's tables and edges read it)."""
    return {cell: select(spec, cell, runs) for cell in cells(spec)}


def summarize(spec: dict, runs: pd.DataFrame, seeds: list[int], picked: dict | None = None) -> pd.DataFrame:
    """One line per applicable cell: its chosen point and why (``picked``, :func:`chosen`'s, computed when not
    given), and per metric (the setting's own metric, else the metric's ``default``) the median, s.e. and per-seed
    values over the completed runs of ``seeds`` there."""
    settings = {s["name"]: s for s in spec["settings"]}
    out = []
    for cell, (point, why) in (picked or chosen(spec, runs)).items():
        line = {"row": cell.row, "setting": cell.setting, "point": _point_text(point), "selected_by": why,
                "n": 0, "n_failed": 0, "wall_seconds": math.nan}
        found = find(runs, (*cell.overrides, *point)) if point is not None else runs.iloc[0:0]
        found = found[found["seed"].isin(seeds)] if len(found) else found
        done = found[found["completed"]].sort_values("seed") if len(found) else found
        line.update(n=len(done), n_failed=int(len(found) - len(done)), seeds=", ".join(str(s) for s in done.get(
            "seed", [])), wall_seconds=float(done["wall_seconds"].sum()) if len(done) else math.nan)
        for metric in spec["metrics"]:
            name = metric["name"]
            column = "metric." + settings[cell.setting].get(name, metric["default"])
            values = done[column] if column in done else pd.Series(dtype=float)
            line[name], line[f"{name}_se"] = aggregate(values)
            line[f"{name}_metric"] = column.removeprefix("metric.")
            line[f"{name}_per_seed"] = ", ".join(f"{v:.2f}" for v in values.dropna())
        out.append(line)
    return pd.DataFrame(out)


def chance(spec: dict, runs: pd.DataFrame) -> dict[str, float]:
    """Per setting, the recovery (its metric) of the MAP of random scores, N(0, 1) per part, against z* on the test
    split: what a latent that carries no information about z* scores. Read from the first completed run of the
    setting that recorded it (``report.json``'s ``chance``, written by the planted task); a setting without one is
    left out."""
    metric = next(m for m in spec["metrics"] if m["name"] == "recovery")
    out = {}
    done = runs[runs["completed"]] if len(runs) else runs
    for setting in spec["settings"]:
        name = setting.get("recovery", metric["default"]).split("/")[-1]
        found = done[done["choices.experiment"] == setting["experiment"]] if "choices.experiment" in done else done
        for run_dir in found.get("run_dir", []):
            path = Path(run_dir) / REPORT_FILE
            recorded = json.loads(path.read_text()).get("chance", {}) if path.is_file() else {}
            if name in recorded:
                out[setting["name"]] = recorded[name]
                break
    return out


def _fmt(x: float) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.1f}"


def _best(table: pd.DataFrame, spec: dict) -> set[tuple[str, str, str]]:
    """The (row, setting, metric) of the best method per column: the highest median among the non-reference rows."""
    methods = {r["name"] for r in spec["rows"] if not r.get("reference")}
    best = set()
    for (setting,), part in table[table["row"].isin(methods)].groupby(["setting"]):
        for metric in spec["metrics"]:
            top = part[metric["name"]].max()
            if not math.isnan(top):
                best |= {(r, setting, metric["name"]) for r in part[part[metric["name"]] == top]["row"]}
    return best


def _grid_table(table: pd.DataFrame, spec: dict, seeds: list[int]) -> list[str]:
    """Methods as rows, structure × metric as columns; the best method per column in bold; † fewer seeds."""
    by = table.set_index(["row", "setting"])
    best = _best(table, spec)
    header = ["Method"] + [f"{s['name']} {m['label']}" for s in spec["settings"] for m in spec["metrics"]]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in spec["rows"]:
        texts = [row.get("label", row["name"])]
        for setting in spec["settings"]:
            for metric in spec["metrics"]:
                key = (row["name"], setting["name"])
                if key not in by.index:
                    texts.append("n/a")
                    continue
                c, name = by.loc[key], metric["name"]
                if not c["n"] or math.isnan(c[name]):
                    texts.append("— (0)" if not c["n"] else "—")
                    continue
                value = f"**{_fmt(c[name])}**" if (row["name"], setting["name"], name) in best else _fmt(c[name])
                spread = f" ± {_fmt(c[f'{name}_se'])}" if c["n"] > 1 else ""
                texts.append(value + spread + (f" ({c['n']})†" if c["n"] < len(seeds) else ""))
        lines.append("| " + " | ".join(texts) + " |")
    return lines


def _point_table(table: pd.DataFrame, spec: dict) -> list[str]:
    by = table.set_index(["row", "setting"])
    lines = ["| Method | " + " | ".join(s["name"] for s in spec["settings"]) + " |",
             "|---" * (len(spec["settings"]) + 1) + "|"]
    for row in spec["rows"]:
        cells_ = [by.loc[(row["name"], s["name"]), "point"] if (row["name"], s["name"]) in by.index else "n/a"
                  for s in spec["settings"]]
        lines.append(f"| {row.get('label', row['name'])} | " + " | ".join(cells_) + " |")
    return lines


def edges(spec: dict, picked: dict) -> list[str]:
    """Per grid key, how many chosen points (``picked``: :func:`chosen`'s) sit at its smallest or largest value (of
    the cells that tune it over more than one value): there the grid may not bracket the best setting."""
    low, high, tuned = {}, {}, {}
    for cell, (point, _) in picked.items():
        own = dict(cell.values)
        for key, value in point or ():
            values = sorted(float(v) for v in own.get(key, spec["grid"][key]))
            if len(values) < 2:
                continue
            tuned[key] = tuned.get(key, 0) + 1
            low[key] = low.get(key, 0) + (float(value) == values[0])
            high[key] = high.get(key, 0) + (float(value) == values[-1])
    return [f"{_NAMES.get(key, key)}: {high[key]} at the largest value, {low[key]} at the smallest, of {n} cells"
            for key, n in tuned.items()]


def _cell(table: pd.DataFrame, row: str, setting: str):
    found = table[(table["row"] == row) & (table["setting"] == setting)]
    return found.iloc[0] if len(found) and found.iloc[0]["n"] else None


def _apart(a, b, metric: str) -> int:
    """+1 / -1 when a's median is above / below b's by more than twice their combined s.e., else 0."""
    gap = a[metric] - b[metric]
    return int(math.copysign(1, gap)) if abs(gap) > 2 * math.hypot(a[f"{metric}_se"], b[f"{metric}_se"]) else 0


def _versus(table: pd.DataFrame, spec: dict, a: str, others: list[str], metric: str, best: bool = False):
    """Per setting where ``a`` and ``others`` have runs: the numbers, whether ``a`` is clearly below all of them (or,
    ``best``, below the best of them; :func:`_apart`), and the fewest seeds behind a cell compared.
    Returns (texts, settings where it holds, settings compared, fewest seeds)."""
    parts, below, compared, fewest = [], 0, 0, math.inf
    labels = {r["name"]: r.get("label", r["name"]) for r in spec["rows"]}
    for setting in spec["settings"]:
        mine = _cell(table, a, setting["name"])
        theirs = [(o, _cell(table, o, setting["name"])) for o in others]
        theirs = [(o, c) for o, c in theirs if c is not None and not math.isnan(c[metric])]
        if mine is None or not theirs or math.isnan(mine[metric]):
            continue
        theirs = [max(theirs, key=lambda oc: oc[1][metric])] if best else theirs
        clear = all(_apart(mine, c, metric) < 0 for _, c in theirs)
        compared, below = compared + 1, below + clear
        fewest = min([fewest, mine["n"], *(c["n"] for _, c in theirs)])
        shown = (lambda c: f"acc {_fmt(c['acc'])} / rec. {_fmt(c['recovery'])}") if best else (
            lambda c: _fmt(c[metric]))
        parts.append(f"{setting['name']} ({labels[a]} {shown(mine)}; "
                     + ", ".join(f"{labels[o]} {shown(c)}" for o, c in theirs) + ")" + (" ✓" if clear else ""))
    return parts, below, compared, fewest


def _ranks(table: pd.DataFrame, spec: dict, names: list[str]) -> list[str]:
    """Where the newer estimators stand: their rank among the methods of each structure by accuracy and recovery."""
    methods = [r["name"] for r in spec["rows"] if not r.get("reference")]
    labels = {r["name"]: r.get("label", r["name"]) for r in spec["rows"]}
    lines = []
    for name in names:
        texts = []
        for setting in spec["settings"]:
            done = table[(table["setting"] == setting["name"]) & table["row"].isin(methods) & (table["n"] > 0)]
            if name not in set(done["row"]):
                continue
            ranks = {m: int(done[m].rank(ascending=False, method="min")[done["row"] == name].iloc[0])
                     for m in ("acc", "recovery")}
            texts.append(f"{setting['name']} {ranks['acc']}/{ranks['recovery']} of {len(done)}")
        if texts:
            lines.append(f"- {labels[name]}: " + "; ".join(texts))
    return lines


def findings(table: pd.DataFrame, spec: dict, random: dict[str, float] | None = None) -> list[str]:
    """Seed 001 Table 2's findings, tested per structure on the numbers of ``table`` (a difference counts when the
    medians are more than twice their combined s.e. apart; ✓ marks the structures where the statement holds). A
    statement resting on a cell of one seed is an observation, else a finding."""
    out, names = [], {r["name"] for r in spec["rows"]}
    labels = {r["name"]: r.get("label", r["name"]) for r in spec["rows"]}

    def say(claim: str, parts: list[str], hits: int, compared: int, fewest: float) -> None:
        if compared:
            kind = "finding" if fewest > 1 else "observation (one seed)"
            out.append(f"- **{claim}**: holds on {hits} of {compared} structures ({kind}): " + "; ".join(parts) + ".")

    recovering = [n for n in ("ste_i", "spigot_ce", "spigot_eg") if n in names]
    say("SPIGOT recovers the latent worse than STE-I, SPIGOT-CE and SPIGOT-EG",
        *_versus(table, spec, "spigot", recovering, "recovery"))
    say("SPIGOT-CE is more accurate than SPIGOT", *_versus(table, spec, "spigot", ["spigot_ce"], "acc"))
    say("SPIGOT-CE recovers more than SPIGOT", *_versus(table, spec, "spigot", ["spigot_ce"], "recovery"))
    for r in [n for n in ("marginals", "sparsemap", "gumbel_softmax") if n in names]:
        say(f"{labels[r]} mixes the latent: recovery below the best of STE-I / SPIGOT-CE / SPIGOT-EG",
            *_versus(table, spec, r, recovering, "recovery", best=True))
    if {"imle", "st_gumbel"} <= names:
        say("I-MLE is more accurate than perturb-and-MAP", *_versus(table, spec, "st_gumbel", ["imle"], "acc"))
        say("I-MLE recovers more than perturb-and-MAP", *_versus(table, spec, "st_gumbel", ["imle"], "recovery"))
    if random:
        methods = [r["name"] for r in spec["rows"] if not r.get("reference")]
        done = table[table["row"].isin(methods) & (table["n"] > 0)]
        best = done.groupby("setting")["recovery"].max()
        out.append("- **The best method's recovery against chance** (the MAP of random scores): " + "; ".join(
            f"{s} {_fmt(best[s])} vs {_fmt(random[s])}" for s in random if s in best) + ".")
    newer = [n for n in ("sfe_rloo", "blackbox", "imle", "perturbed", "direct") if n in names]
    ranked = _ranks(table, spec, newer)
    if ranked:
        out += ["", "Where the newer estimators stand: rank by accuracy / by recovery among the methods of each "
                "structure (1 = best):", "", *ranked]
    return out + ["", *_closed(table, spec)]


def _closed(table: pd.DataFrame, spec: dict) -> list[str]:
    """Per structure: the linear and gold accuracy, and the methods that close most of the gap between them."""
    methods = [r["name"] for r in spec["rows"] if not r.get("reference")]
    labels = {r["name"]: r.get("label", r["name"]) for r in spec["rows"]}
    lines = ["How much of the gap between the linear model and the gold latent each structure's best methods close "
             "(test accuracy, (acc − linear) / (gold − linear)):", ""]
    for setting in spec["settings"]:
        lin, gold = _cell(table, "linear", setting["name"]), _cell(table, "gold", setting["name"])
        done = [(m, _cell(table, m, setting["name"])) for m in methods]
        done = sorted([(m, c) for m, c in done if c is not None], key=lambda mc: -mc[1]["acc"])
        if lin is None or gold is None or not done:
            continue
        gap = gold["acc"] - lin["acc"]
        top = ", ".join(f"{labels[m]} {_fmt(c['acc'])} ({(c['acc'] - lin['acc']) / gap:.0%})" for m, c in done[:3])
        lines.append(f"- {setting['name']}: linear {_fmt(lin['acc'])}, gold {_fmt(gold['acc'])}; best {top}")
    return lines


def figure(table: pd.DataFrame, spec: dict, path: Path) -> Path:
    """The heat map of recovery (and, beside it, test accuracy): methods × structures, medians written in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows, settings = spec["rows"], spec["settings"]
    fig, axes = plt.subplots(1, len(spec["metrics"]), figsize=(5.2 * len(spec["metrics"]), 0.34 * len(rows) + 1.6))
    for ax, metric in zip(np.atleast_1d(axes), spec["metrics"], strict=True):
        grid = np.full((len(rows), len(settings)), np.nan)
        for i, row in enumerate(rows):
            for j, setting in enumerate(settings):
                c = _cell(table, row["name"], setting["name"])
                grid[i, j] = c[metric["name"]] if c is not None else np.nan
        shown = np.ma.masked_invalid(grid)
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
        image = ax.imshow(shown, cmap=cmap, aspect="auto", vmin=np.nanmin(grid) if metric["name"] == "acc" else 0,
                          vmax=100)
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02).ax.tick_params(labelsize=7)
        for i in range(len(rows)):
            for j in range(len(settings)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=6.5,
                            color="white" if grid[i, j] < 60 else "black")
        ax.set_xticks(range(len(settings)), [s["name"].replace("_", " ") for s in settings], rotation=35,
                      ha="right", fontsize=7)
        ax.set_yticks(range(len(rows)), [r.get("label", r["name"]) for r in rows], fontsize=7)
        title = f"test {metric['name']} ×100 (median over seeds)" + (
            "; exact match for matching, top-k" if metric["name"] == "recovery" else "")
        ax.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write(spec: dict, runs: pd.DataFrame, seeds: list[int], out: Path, seconds: float, command: str) -> Path:
    """results/lab/matrix.md, .csv, .png and .json (its runs and their summed wall time) from the runs (module
    docstring)."""
    picked = chosen(spec, runs)
    table, random = summarize(spec, runs, seeds, picked), chance(spec, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out.with_suffix(".csv"), index=False)
    figure(table, spec, out.with_suffix(".png"))
    used = runs[runs["seed"].isin([*seeds, spec["select"]["seed"]])] if len(runs) else runs
    full = int((table["n"] >= len(seeds)).sum())
    fewer = table[(table["n"] > 0) & (table["n"] < len(seeds))]
    empty = table[table["n"] == 0]
    status = (f"**Status:** {full} of {len(table)} cells with all {len(seeds)} seeds"
              + (f"; {len(fewer)} with fewer (marked †)" if len(fewer) else "")
              + (f"; {len(empty)} without a completed run" if len(empty) else "") + ".")
    wall = float(runs["wall_seconds"].fillna(0).sum()) if len(runs) else 0.0
    lines = [f"# {spec['title']}", "", status, "", *provenance(used, command),
             f"- wall time: {wall / 60:.1f} min of training in {len(runs)} runs (grid and seeds, summed over runs run "
             f"two at a time on the cores); this command's last invocation took {seconds / 60:.1f} min",
             "", "Each cell: test accuracy (acc) or latent recovery (rec.) ×100, **median** ± s.e. over the seeds at "
             "the grid point chosen on validation; the best method per column in bold (references excluded); "
             "† fewer seeds than the protocol's (their number in parentheses); n/a: the method does not apply.",
             "", "## Accuracy and recovery", "", *_grid_table(table, spec, seeds), "",
             "Chance recovery (the MAP of random N(0, 1) scores against z*, test split): "
             + ", ".join(f"{name} {_fmt(value)}" for name, value in random.items()) + ".",
             "", "## Findings", "",
             "Seed 001's Table 2 findings, tested per structure on the numbers above: a difference counts when the "
             "two medians are more than twice their combined s.e. apart (✓: it holds on that structure).", "",
             *findings(table, spec, random),
             "", "## The grid point chosen on validation", "", *_point_table(table, spec)]
    edge = edges(spec, picked)
    if edge:
        lines += ["", "Chosen at an edge of its grid (there the best setting may lie beyond the grid): "
                  + "; ".join(edge) + "."]
    if len(empty):
        lines += ["", "Cells without a completed run: " + "; ".join(
            f"{r.row} × {r.setting} ({r.selected_by})" for r in empty.itertuples())]
    lines += notes(spec)
    out.write_text("\n".join(lines) + "\n")
    commits = sorted({str(c) for c in runs["git_commit"].dropna()}) if len(runs) else []
    out.with_suffix(".json").write_text(json.dumps({  # what the lab cost, for results/bench/cpu.md (bench/tables.py)
        "runs": len(runs), "completed": int(runs["completed"].sum()) if len(runs) else 0,
        "wall_seconds": round(wall, 1), "commits": commits}, indent=1) + "\n")
    return out



def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=SPEC, help=f"the matrix spec (default {SPEC})")
    parser.add_argument("--runs", default="multirun", help="root of the run directories (default multirun)")
    parser.add_argument("--results", default="results", help="written instead of results/ (default results)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="runs at a time (default: the cores)")
    parser.add_argument("--seeds", default="", help="run only these seeds in step 3, e.g. 301,302 (default: the "
                        "spec's; the table always counts the spec's)")
    parser.add_argument("--args", default="", help="more Hydra overrides of every run, shell-quoted")
    parser.add_argument("--rows", default="", help="run only these rows of the spec, e.g. spigot,spigot_ce (default: "
                        "all; the table always shows every row)")
    parser.add_argument("--report-only", action="store_true", help="launch nothing: the table from the runs there are")
    parser.add_argument("--dry-run", action="store_true", help="print the launches, run nothing")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(spec["seeds"])
    runs_dir = Path(args.runs, spec["sweep_dir"])
    extra = shlex.split(args.args)
    start = time.perf_counter()
    rows = args.rows.split(",") if args.rows else [r["name"] for r in spec["rows"]]
    unknown = set(rows) - {r["name"] for r in spec["rows"]}
    if unknown:
        sys.exit(f"error: --rows names no row of {args.spec}: {', '.join(sorted(unknown))}")
    todo = {**spec, "rows": [r for r in spec["rows"] if r["name"] in rows]}
    for setting in [] if args.report_only else [s["name"] for s in spec["settings"]]:  # a structure at a time
        grid, _ = plan(todo, load_runs(runs_dir), seeds, setting)
        _run(grid, runs_dir, args.jobs, extra, args.dry_run, f"{setting} grid")
    for seed in [] if args.report_only else seeds:  # then a seed at a time, every cell's
        _, rest = plan(todo, load_runs(runs_dir), [seed])
        _run(rest, runs_dir, args.jobs, extra, args.dry_run, f"seed {seed}")
    if args.dry_run:
        return 0
    runs = load_runs(runs_dir)
    if not len(runs):
        sys.exit(f"error: no run records under {runs_dir}")
    out = Path(args.results, "lab", "matrix.md")
    command = "make table-lab-matrix" + (f" (python -m latentstruct.report.matrix {shlex.join(argv or sys.argv[1:])})"
                                         if (argv or sys.argv[1:]) else "")
    table_seeds = list(spec["seeds"])  # --seeds says which seeds to run; the table counts the protocol's
    print(f"wrote {write(spec, runs, table_seeds, out, time.perf_counter() - start, command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

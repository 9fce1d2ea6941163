"""Benchmark: one training step of the paper configurations, this tree next to an older commit ("before" / "now").

    python bench/layers.py --out results/bench/layers.md [--baseline 645b4f9] [--repeats 1] [--steps 30]

Every configuration is trained through the public entry point, ``python -m latentstruct.train +experiment=...``, in
a subprocess, and timed by its run record: ``metrics.json``'s ``seconds_per_step`` (training time per step without
the evaluations, docs/reference.md "Run records"). The configurations:

* SST (seed 001 Table 3; real data from ``$LATENTSTRUCT_DATA``, else ``data``, as ``paths.data_dir``;
  batch 32 as the experiments set it): ``sst_baseline`` (the BiLSTM step every SST row is compared with),
  ``sst_marginals``, and ``sst_sparsemap``, ``sst_spigot``, ``sst_spigot_ce`` each with the experiments' truncated
  SparseMAP (``task.structure.sparsemap_max_iter=50``) and exact (``task.structure.sparsemap_max_iter=null``);
* NER (seed 004 Table 3, issue #34's campaign: real CoNLL-2003 and GloVe 6B 50d fine-tuned, as the campaign runs
  it; batch 32): ``ner_mbce`` (the BiLSTM baseline), ``ner_infnet``, ``ner_infnet_plus``, ``ner_explicit_cd``, each
  with ``trainer.phases=[]``: the method's step from the first (the timed steps are those of the table's method
  phase, not of its pretraining);
* ListOps (issue #7) with ``+preset=listops_cpu`` (batch 64, sizes 64, training expressions of <= 20 leaves; at the
  full sizes, batch 128 up to 130 leaves, two chart × SPIGOT-CE steps did not finish in 400 s on 2 CPU cores):
  ``listops_lstm`` (the baseline), ``listops_chart_marginals`` and ``listops_chart_spigot_ce`` (BinaryTree's SparseMAP
  is always exact).

**Steady-state seconds per step.** ``seconds_per_step`` averages over every step of a run, the first one included,
which costs several later ones (lazy initialisations, first allocations: 0.37 s against 0.066 s for the SST
BiLSTM), so that ``seconds_per_step`` over 5 steps of it is twice the steady value and over 30 steps still 9% above.
Each configuration is therefore run twice with the same seed, for W (``--warmup``) and for W + N steps; the first W
steps of both runs see the same batches and the same parameters, so ``(T(W + N) - T(W)) / N``, with T =
``seconds_per_step × steps``, is the time of steps W + 1 .. W + N alone. ``--warmup 0`` reports ``seconds_per_step``
of the N-step run as it is. The difference carries the noise of two first steps, hence N = ``--baseline-steps``
(100) for the baselines, whose steps are the shortest and the denominators of every ratio; ``--steps`` (30) for the
other rows, ``--exact-steps`` (3) for exact SparseMAP on SST (seconds per step before the speed-ups).

**Cheap evaluations.** One evaluation at the end (``trainer.eval_every`` = the run's steps), on
``dataset.eval_subset`` (SST: 32 valid / 32 test sentences) or ``dataset.max_eval_tokens`` (ListOps: the valid / test
expressions of at most 4 leaves); ListOps generates ``dataset.n_train=10000`` training expressions instead of 90,000
(the same generator, hence the same length distribution; 15 s less per run). Embeddings are SST's default random
trainable ones (timing does not depend on their values). Evaluations, data loading and the checkpoint written after
the evaluation (there is no option to skip it) are outside ``seconds_per_step``. ``trainer.threads`` is fixed
(``--threads``) and recorded. Every run goes under a temporary directory (``hydra.run.dir``), removed at the end.

**Before / now.** ``--baseline REV`` checks REV out into a temporary ``git worktree`` (removed afterwards) and runs
the same configurations there with the same Python, ``PYTHONPATH=<that worktree>`` (so that its own ``latentstruct``
and ``configs/`` are used: checked once per tree by printing ``latentstruct.__file__``, and per run by the commit
in ``metrics.json``), interleaved with this tree's runs (before, now, before, now, ...) so that the load of the
machine hits both alike; the order within a pair alternates between repeats. ``--repeats K`` runs everything K
times and reports the median. Each run's composed config (``.hydra/config.yaml``) is checked to hold every override.
The machine may be shared: a second table gives the same steps in process CPU time, (CPU(W + N) - CPU(W)) / N of
the two processes (user + system, from ``getrusage``), which other processes on the cores barely change at a fixed
thread count; the wall-time table is the one that counts, the CPU table tells load noise from a real change.
A run that fails or exceeds ``--timeout`` seconds is reported in its cell (a configuration that timed out in a tree
is not run again there).

Output: the Markdown table at ``--out`` (per configuration: seconds per step before / now, the speed-up, and the
ratio to its task's baseline step) and every run's raw numbers in the JSON beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's latentstruct (its commit heads the table), not another installed copy

from bench.trees import Tree, baseline_tree, check_import, this_tree, tree_env  # noqa: E402
from latentstruct.records import environment  # noqa: E402


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration: ``key`` names it (``--only`` matches its prefix), ``overrides`` define it;
    ``exact`` marks exact SparseMAP rows, which run ``--exact-steps`` steps."""

    key: str
    task: str
    method: str
    cap: str  # "50", "exact" or "—"
    overrides: tuple[str, ...]
    exact: bool = False


def configurations() -> list[Config]:
    sst = [
        Config("sst_baseline", "SST", "BiLSTM (baseline)", "—", ("+experiment=sst_baseline",)),
        Config("sst_marginals", "SST", "Marginals", "—", ("+experiment=sst_marginals",)),
    ]
    for name, method in (("sparsemap", "SparseMAP"), ("spigot", "SPIGOT"), ("spigot_ce", "SPIGOT-CE")):
        for cap, value in (("50", "50"), ("exact", "null")):
            sst.append(
                Config(
                    f"sst_{name}@{cap}",
                    "SST",
                    method,
                    cap,
                    (f"+experiment=sst_{name}", f"task.structure.sparsemap_max_iter={value}"),
                    cap == "exact",
                )
            )
    listops = [
        Config(f"listops_{name}", "ListOps", method, cap, (f"+experiment=listops_{name}", "+preset=listops_cpu"))
        for name, method, cap in (
            ("lstm", "LSTM (baseline)", "—"),
            ("chart_marginals", "chart × Marginals", "—"),
            ("chart_spigot_ce", "chart × SPIGOT-CE", "exact"),
        )
    ]
    ner = [
        Config(f"ner_{name}", "NER", method, "—", (f"+experiment=ner_{name}",))
        for name, method in (
            ("mbce", "BiLSTM (baseline)"),
            ("infnet", "InfNet"),
            ("infnet_plus", "InfNet+"),
            ("explicit_cd", "explicit L_CD"),
        )
    ]
    return sst + listops + ner


TASK_BASELINE = {"SST": "sst_baseline", "ListOps": "listops_lstm", "NER": "ner_mbce"}
# Per task: evaluations kept small (see the module docstring); NER: the campaign's word vectors, the method's step
# from the first (no pretraining phase).
TASK_OVERRIDES = {
    "SST": ("dataset.eval_subset={eval_subset}",),
    "ListOps": ("dataset.n_train=10000", "dataset.max_eval_tokens=4"),
    "NER": ("dataset.eval_subset={eval_subset}", "trainer.phases=[]",
            "embedding.pretrained=glove/glove.6B.50d.sst_conll_snli.txt.xz", "embedding.lowercase=true",
            "embedding.freeze=false"),
}


def run_overrides(config: Config, steps: int, threads: int, device: str, eval_subset: int) -> list[str]:
    """Every override of one run but ``hydra.run.dir``: the configuration's, its task's cheap evaluations, then
    the protocol (steps, one evaluation at the end, threads, device, no progress bar)."""
    task = [o.format(eval_subset=eval_subset) for o in TASK_OVERRIDES[config.task]]
    protocol = [
        f"trainer.max_steps={steps}",
        f"trainer.eval_every={steps}",
        f"trainer.threads={threads}",
        f"trainer.device={device}",
        "trainer.progress=false",
        "trainer.seed=301",
    ]
    return [*config.overrides, *task, *protocol]


# -------------------------------------------------------------------------------------------------------- run records


def read_metrics(run_dir: Path) -> dict[str, Any]:
    """A run's ``metrics.json`` as ``{"status", "seconds_per_step", "steps", "git_commit", "error"}``; a missing or
    unreadable file reads as a failed run."""
    try:
        record = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError) as err:
        return {"status": "failed", "error": f"no readable metrics.json ({type(err).__name__})"}
    keys = ("status", "seconds_per_step", "steps", "git_commit", "error")
    return {k: record.get(k) for k in keys if k in record}


def unapplied(run_dir: Path, overrides: list[str]) -> list[str]:
    """The ``key=value`` overrides (not ``+group=...``) whose value is not in the run's composed config."""
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    missing = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.startswith("+"):
            continue
        node = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != yaml.safe_load(value):
            missing.append(f"{override} (composed: {node!r})")
    return missing


def steady_seconds(warm: dict[str, Any] | None, main: dict[str, Any]) -> float:
    """Seconds per step of the steps after the warm-up: (T(W + N) - T(W)) / N, T = seconds_per_step × steps."""
    if warm is None:
        return main["seconds_per_step"]
    total = main["seconds_per_step"] * main["steps"] - warm["seconds_per_step"] * warm["steps"]
    return total / (main["steps"] - warm["steps"])


# ----------------------------------------------------------------------------------------------------------- running


def _env(tree: Tree, data_dir: Path, threads: int) -> dict[str, str]:
    return tree_env(tree, threads, LATENTSTRUCT_DATA=str(data_dir), HYDRA_FULL_ERROR="1")


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far (the runs are sequential)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_overrides(tree: Tree, overrides: list[str]) -> list[str]:
    """``overrides`` as ``tree`` reads them: ``+experiment=sst_spigot`` as the nested ``+experiment=sst/spigot`` in an
    older tree (``--baseline``) whose ``configs/experiment/`` has only the nested names."""
    out = []
    for override in overrides:
        key, _, name = override.partition("=")
        experiments = tree.path / "configs" / "experiment"
        if key == "+experiment" and not (experiments / f"{name}.yaml").is_file():
            nested = name.replace("_", "/", 1)
            if (experiments / f"{nested}.yaml").is_file():
                override = f"{key}={nested}"
        out.append(override)
    return out


def run_once(
    tree: Tree, overrides: list[str], run_dir: Path, data_dir: Path, threads: int, timeout: float
) -> dict[str, Any]:
    """Train one configuration in a subprocess; its record (``read_metrics``) plus ``wall`` and ``cpu`` (the whole
    process's wall and CPU seconds); status ``timeout`` past ``timeout`` seconds (its process group is killed)."""
    cmd = [sys.executable, "-m", "latentstruct.train", *tree_overrides(tree, overrides), f"hydra.run.dir={run_dir}"]
    run_dir.mkdir(parents=True, exist_ok=True)
    start, cpu0 = time.perf_counter(), _children_cpu()
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=tree.path,
            env=_env(tree, data_dir, threads),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"status": "timeout", "wall": time.perf_counter() - start}
        except BaseException:  # e.g. Ctrl-C, which its own session does not receive
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    record = {**read_metrics(run_dir), "wall": wall, "cpu": cpu}
    if rc != 0 or record["status"] != "completed":
        tail = (run_dir.parent / f"{run_dir.name}.log").read_text().strip().splitlines()[-3:]
        return {**record, "status": "failed", "error": record.get("error") or " / ".join(tail) or f"exit code {rc}"}
    # A wrong commit or a dropped override would time something else: such a run counts as failed.
    if record.get("git_commit") and not tree.commit.startswith(record["git_commit"]):
        return {**record, "status": "failed", "error": f"ran commit {record['git_commit']}, not {tree.commit}"}
    missing = unapplied(run_dir, overrides)
    if missing:
        return {**record, "status": "failed", "error": f"overrides not applied: {'; '.join(missing)}"}
    return record


def measure(tree: Tree, config: Config, steps: int, warmup: int, args, work: Path, repeat: int) -> dict[str, Any]:
    """One repeat of one configuration in one tree: the warm-up run (if any), then the W + N-step run."""
    runs = {}
    for name, n in (("warm", warmup), ("main", warmup + steps)):
        if n == 0:
            continue
        run_dir = work / tree.label / config.key.replace("/", "_").replace("@", "_") / f"r{repeat}_{name}{n}"
        overrides = run_overrides(config, n, args.threads, args.device, args.eval_subset)
        runs[name] = run_once(tree, overrides, run_dir, args.data_dir, args.threads, args.timeout)
        if runs[name]["status"] != "completed":
            return {"status": runs[name]["status"], "error": runs[name].get("error"), "runs": runs}
    seconds = steady_seconds(runs.get("warm"), runs["main"])
    # Both processes load, evaluate and save alike: their CPU times differ by the N steps (None without a warm-up).
    cpu = (runs["main"]["cpu"] - runs["warm"]["cpu"]) / steps if "warm" in runs else None
    return {"status": "completed", "seconds_per_step": seconds, "cpu_per_step": cpu, "runs": runs}


def steps_of(config: Config, args) -> int:
    """Timed steps of a configuration: more for the cheap baselines (the denominators of every ratio, whose step
    is shortest and so the most exposed to noise), fewer for exact SparseMAP."""
    if config.key in TASK_BASELINE.values():
        return args.baseline_steps
    return args.exact_steps if config.exact else args.steps


def benchmark(trees: list[Tree], configs: list[Config], args, work: Path, log=print) -> dict[str, dict[str, list]]:
    """``results[tree label][config key]`` = one ``measure`` dict per repeat, the trees interleaved per config."""
    results = {t.label: {c.key: [] for c in configs} for t in trees}
    for repeat in range(args.repeats):
        order = trees if repeat % 2 == 0 else trees[::-1]
        for config in configs:
            steps = steps_of(config, args)
            for tree in order:
                done = results[tree.label][config.key]
                if any(m["status"] == "timeout" for m in done):
                    done.append({"status": "skipped", "error": "timed out in an earlier repeat"})
                    log(f"  [{repeat + 1}/{args.repeats}] {tree.label:6s} {config.key:24s} skipped", flush=True)
                    continue
                m = measure(tree, config, steps, args.warmup, args, work, repeat)
                done.append(m)
                value = f"{m['seconds_per_step']:.4f} s/step" if m["status"] == "completed" else m["status"]
                wall = sum(r.get("wall", 0.0) for r in m.get("runs", {}).values())
                log(
                    f"  [{repeat + 1}/{args.repeats}] {tree.label:6s} {config.key:24s} {value}  ({wall:.0f} s)",
                    flush=True,
                )
    return results


# ------------------------------------------------------------------------------------------------------------ report


def summarize(results: dict[str, dict[str, list]], configs: list[Config]) -> list[dict[str, Any]]:
    """One row per configuration: per tree, the median seconds per step over completed repeats (or the status of
    the first failure when none completed), the speed-up before / now and the ratio to the task's baseline step."""
    rows = []
    for config in configs:
        row = {"key": config.key, "task": config.task, "method": config.method, "cap": config.cap}
        for label, by_key in results.items():
            done = by_key[config.key]
            ok = [m["seconds_per_step"] for m in done if m["status"] == "completed"]
            row[label] = statistics.median(ok) if ok else None
            cpu = [m["cpu_per_step"] for m in done if m["status"] == "completed" and m.get("cpu_per_step") is not None]
            row[f"{label}_cpu"] = statistics.median(cpu) if cpu else None
            failed = [m for m in done if m["status"] != "completed"]
            row[f"{label}_status"] = f"{failed[0]['status']}" if failed and not ok else None
            row[f"{label}_failures"] = len(failed)
        rows.append(row)
    by_key = {r["key"]: r for r in rows}
    for row in rows:
        base = by_key.get(TASK_BASELINE[row["task"]], {})
        for label in results:
            value, ref = row[label], base.get(label)
            row[f"{label}_ratio"] = value / ref if value is not None and ref else None
        if "before" in results and row.get("before") and row.get("now"):
            row["speedup"] = row["before"] / row["now"]
        if "before" in results and row.get("before_cpu") and row.get("now_cpu"):
            row["speedup_cpu"] = row["before_cpu"] / row["now_cpu"]
    return rows


def _fmt(x: float | None, fmt: str, missing: str = "—") -> str:
    return missing if x is None else format(x, fmt)


def _cell(row: dict, label: str) -> str:
    if row[label] is None:
        return row[f"{label}_status"] or "—"
    flag = f" ({row[f'{label}_failures']} failed)" if row[f"{label}_failures"] else ""
    return f"{row[label]:.3f}{flag}"


def markdown(rows: list[dict], meta: dict[str, Any]) -> str:
    """The results file: header facts, the table, the protocol notes."""
    before = meta.get("baseline") is not None
    tasks = meta.get("tasks", list(TASK_PROTOCOL))
    exact_steps = f", {meta['exact_steps']} for exact SparseMAP on SST" if "SST" in tasks else ""
    lines = [
        "# Training-step benchmark",
        "",
        f"**Status: reduced protocol** — a timing benchmark, not a paper table: {meta['steps']} timed steps per run "
        f"({meta['baseline_steps']} for the baselines{exact_steps}), "
        f"{meta['repeats']} repeat(s), "
        + ", ".join(TASK_PROTOCOL[t] for t in tasks) + " (see Notes).",
        "",
        "Seconds per training step of the paper configurations through `python -m latentstruct.train` (steady "
        "state: the warm-up steps subtracted, see Notes), median over repeats"
        + (
            f"; **before** = baseline commit {meta['baseline']['commit'][:12]}, **now** = this tree, run interleaved."
            if before
            else "."
        ),
        "",
        f"- git commit: {meta['git_commit']}{' (dirty)' if meta['git_dirty'] else ''}",
        "- baseline commit: "
        + (
            f"{meta['baseline']['commit'][:12]} ({meta['baseline']['rev']}: {meta['baseline']['subject']})"
            if before
            else "none (`--baseline` not given)"
        ),
        f"- hardware: {meta['hardware']} ({meta['cpu']}, {meta['cores']} cores), device {meta['device']}, "
        f"trainer.threads={meta['threads']}",
        f"- torch {meta['torch']}, Python {meta['python']}",
        f"- timed steps per run: {meta['steps']} ({meta['baseline_steps']} for the baselines{exact_steps}) "
        f"after {meta['warmup']} warm-up step(s); "
        f"repeats: {meta['repeats']} (median); per-run timeout {meta['timeout']:.0f} s",
        f"- generated: {meta['date']}; the whole benchmark took {meta['total_seconds'] / 60:.1f} min",
        f"- regenerate with: `{meta['make']}` (`{meta['command']}`)",
        "",
    ]
    if before:
        lines += [
            "| task | method | SparseMAP cap | before (s/step) | now (s/step) | speed-up (before / now) | "
            "× baseline step, before | × baseline step, now |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['task']} | {r['method']} | {r['cap']} | {_cell(r, 'before')} | {_cell(r, 'now')} | "
                f"{_fmt(r.get('speedup'), '.2f')}× | {_fmt(r['before_ratio'], '.1f')} | "
                f"{_fmt(r['now_ratio'], '.1f')} |".replace("—×", "—")
            )
    else:
        lines += ["| task | method | SparseMAP cap | now (s/step) | × baseline step |", "|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['task']} | {r['method']} | {r['cap']} | {_cell(r, 'now')} | {_fmt(r['now_ratio'], '.1f')} |"
            )
    if any(r.get("now_cpu") is not None for r in rows):
        lines += [
            "",
            "## Cross-check: CPU seconds per step",
            "",
            "The same steps in process CPU time (user + system) rather than wall time: (CPU(W + N) − CPU(W)) / N of "
            "the two processes. At a fixed thread count it barely grows when other processes share the cores, so a "
            "speed-up that shows here and not in the wall-time table above was load noise in the latter.",
            "",
        ]
        labels = ["before", "now"] if before else ["now"]
        lines += [
            "| task | method | SparseMAP cap | "
            + " | ".join(f"{lb} (CPU s/step)" for lb in labels)
            + (" | speed-up (before / now) |" if before else " |"),
            "|---|---|---|" + "---|" * (len(labels) + before),
        ]
        for r in rows:
            cells = [_fmt(r.get(f"{lb}_cpu"), ".3f") for lb in labels]
            if before:
                cells.append(_fmt(r.get("speedup_cpu"), ".2f") + ("×" if r.get("speedup_cpu") else ""))
            lines.append(f"| {r['task']} | {r['method']} | {r['cap']} | " + " | ".join(cells) + " |")
    lines += ["", "## Notes", "", *[f"- {n}" for n in meta["notes"]]]
    if meta.get("failures"):
        lines += ["", "## Runs that did not complete", "", *[f"- {f}" for f in meta["failures"]]]
    return "\n".join(lines) + "\n"


#: the status line's words for each task's protocol
TASK_PROTOCOL = {
    "SST": "SST with random embeddings and small evaluation subsets",
    "ListOps": "ListOps with `+preset=listops_cpu`",
    "NER": "NER's method step from the first, with GloVe 6B 50d fine-tuned",
}


def protocol_notes(args, tasks: list[str] | None = None) -> list[str]:
    """The page's notes: the protocol, with a note per task of ``tasks`` (default: every task)."""
    tasks = list(TASK_PROTOCOL) if tasks is None else tasks
    per_task = {
        "SST": "SST: real data from $LATENTSTRUCT_DATA, the experiments' batch 32 and lr, random trainable 300-d "
        "embeddings (the experiments' default: no GloVe file); `dataset.eval_subset="
        f"{args.eval_subset}` for the one evaluation at the end. SparseMAP cap 50 = the experiments' "
        "`task.structure.sparsemap_max_iter=50` (as the authors' lp-sparsemap), exact = `null` (duality gap ≤ 1e-6).",
        "ListOps": "ListOps: `+preset=listops_cpu` (batch 64, word / hidden sizes 64, training expressions of ≤ 20 "
        "leaves), `dataset.n_train=10000` (the same generator and length filter, less generation time), "
        "`dataset.max_eval_tokens=4` (a small evaluation); the chart's `task.composer.checkpoint=true` as the "
        "experiments set it. BinaryTree's SparseMAP (SPIGOT-CE's projection) has no iteration cap: always exact.",
        "NER": "NER: real CoNLL-2003 from $LATENTSTRUCT_DATA, batch 32, BiLSTMs of 100 units, "
        "`embedding.pretrained=glove/glove.6B.50d.sst_conll_snli.txt.xz embedding.lowercase=true "
        "embedding.freeze=false` (energy/ner's campaign protocol), `trainer.phases=[]` (no pretraining: every timed "
        "step is the method's, whose cost does not depend on the parameters' values), `dataset.eval_subset="
        f"{args.eval_subset}`.",
    }
    baselines = "; ".join(f"{t}: `{TASK_BASELINE[t]}`" for t in tasks)
    return [
        f"× baseline step: the row's seconds per step over its task's baseline step in the same tree ({baselines}); "
        "the baseline rows read 1.0.",
        f"Steady state: each configuration runs W = {args.warmup} and W + N steps with the same seed; seconds per step "
        "= (T(W + N) − T(W)) / N with T = `seconds_per_step` × `steps` of the run's metrics.json (the first step "
        "costs several later ones; `--warmup 0` reports `seconds_per_step` as is).",
        *[per_task[t] for t in tasks],
        "Outside the timed steps: data loading, the evaluation, the checkpoint written after it (no option skips "
        "it), process start. Runs go to a temporary directory that is removed afterwards.",
        "A cell reads `timeout` or `failed` when no repeat of that configuration completed in that tree; "
        "`(k failed)` after a number counts the repeats that did not complete. The raw numbers of every run are in "
        "the JSON file beside this one.",
    ]


def failures(results: dict[str, dict[str, list]]) -> list[str]:
    """One line per repeat that did not complete: tree, configuration, status and the first line of its error."""
    lines = []
    for label, by_key in results.items():
        for key, done in by_key.items():
            for i, m in enumerate(done):
                if m["status"] != "completed":
                    error = (m.get("error") or "").strip().splitlines()
                    lines.append(f"{label} `{key}` repeat {i + 1}: {m['status']}" + (f": {error[0]}" if error else ""))
    return lines


DEFAULT_OUT = Path("results/bench/layers.md")


def make_command(args, parser: argparse.ArgumentParser) -> str:
    """The ``make bench-layers`` line that runs ``args`` again: every option off its default in BENCH_LAYERS_ARGS
    (``--data-dir`` is the environment's)."""
    make = "make bench-layers" + (f" BENCH_BASELINE={args.baseline}" if args.baseline else "")
    extra = [f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in vars(args).items()
             if k not in ("out", "baseline", "data_dir") and v is not None and v != parser.get_default(k)]
    if extra:
        make += f" BENCH_LAYERS_ARGS='{' '.join(extra)}'"
    return make + (f" BENCH_LAYERS_OUT={args.out}" if args.out != DEFAULT_OUT else "")


def _default_data_dir() -> Path:
    return Path(os.environ.get("LATENTSTRUCT_DATA") or "data").resolve()  # paths.data_dir's default


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="the Markdown table; the raw numbers go to the same name with .json",
    )
    parser.add_argument("--baseline", metavar="REV", help="a git revision to run beside this tree (the 'before')")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every configuration per tree (median)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--baseline-steps", type=int, default=100, help="timed steps of the BiLSTM / LSTM baselines")
    parser.add_argument("--exact-steps", type=int, default=3, help="timed steps of the exact-SparseMAP SST rows")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps subtracted (0: none, see above)")
    parser.add_argument("--threads", type=int, default=1, help="trainer.threads of every run")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="trainer.device of every run")
    parser.add_argument("--eval-subset", type=int, default=32, help="SST dataset.eval_subset")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one training process may take")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=_default_data_dir(),
        help="$LATENTSTRUCT_DATA of the runs (default: it, else data, as paths.data_dir)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        help="configuration key prefixes, e.g. sst_baseline listops (default: all; a task's baseline is always added)",
    )
    return parser


def main(argv=None) -> int:
    options = parser()
    args = options.parse_args(argv)
    args.data_dir = args.data_dir.resolve()

    configs = configurations()
    if args.only:
        wanted = {c.key for c in configs if c.key.startswith(tuple(args.only))}
        wanted |= {TASK_BASELINE[c.task] for c in configs if c.key in wanted}
        configs = [c for c in configs if c.key in wanted]
    env = environment(torch.device("cpu"))
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-layers-"))
    trees = [this_tree()]
    baseline = None
    try:
        with contextlib.ExitStack() as stack:
            if args.baseline:
                tree, baseline = stack.enter_context(baseline_tree(args.baseline, work))
                trees.insert(0, tree)
            for tree in trees:
                imported = check_import(tree, _env(tree, args.data_dir, args.threads))
                print(f"{tree.label}: {tree.commit[:12]} imports {imported}")
            print(f"{len(configs)} configurations × {len(trees)} tree(s) × {args.repeats} repeat(s); runs in {work}")
            results = benchmark(trees, configs, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = summarize(results, configs)
    tasks = list(dict.fromkeys(c.task for c in configs))
    make = make_command(args, options)
    meta = {
        **env,
        "baseline": baseline,
        "cores": os.cpu_count(),
        "device": args.device,
        "threads": args.threads,
        "python": platform.python_version(),
        "steps": args.steps,
        "baseline_steps": args.baseline_steps,
        "exact_steps": args.exact_steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "timeout": args.timeout,
        "eval_subset": args.eval_subset,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "total_seconds": time.perf_counter() - start,
        "make": make,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "tasks": tasks,
        "notes": protocol_notes(args, tasks),
        "failures": failures(results),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(rows, meta))
    overrides = {
        c.key: run_overrides(c, steps_of(c, args), args.threads, args.device, args.eval_subset) for c in configs
    }
    raw = {"meta": meta, "rows": rows, "runs": results, "overrides (the N-step run)": overrides}
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')} ({meta['total_seconds'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

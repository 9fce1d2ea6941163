"""Run one short experiment of every family and compare its record with an earlier run of the same list, bit for bit.

A refactoring that must not change a number (issue #36) is checked by running the list once before it and once after:

    python -m scripts.bitcheck run <dir>          # train every run of RUNS under <dir>/<name> (one thread each)
    python -m scripts.bitcheck compare <a> <b>    # the metrics and history of every run: equal, or what differs
    python -m scripts.bitcheck run <dir> --only vae_direct,knn_direct_sigma1

Each run is ``+experiment=<name>`` with a few steps and ``trainer.threads=1`` (data from ``$LATENTSTRUCT_DATA``), all
in one process (the same process layout before and after). ``compare`` reads ``metrics.json`` (``metrics``,
``best_step``, ``steps``) and ``history.csv``, every value but the timings (``wall_seconds``, ``infer_seconds``,
``time/*``), and exits 1 on any difference or a run missing from either side. The baseline is made from the base
commit's tree (``git archive <commit> | tar -x -C <dir>``, this script copied in, run from there).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

import latentstruct.config  # noqa: F401  (registers the config schemas)
from latentstruct.records import reads_the_machine

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

LISTOPS = ["dataset.n_train=64", "dataset.n_valid=20", "dataset.max_eval_tokens=20"]
CHART = ["dataset.max_train_tokens=20", "trainer.batch_size=16", "task.eval_max_cells=4096"]  # the chart is O(B n³)
PHASES = ["trainer.phases=[{split:labelled,epochs:1},{split:train,epochs:1}]"]  # 1 labelled step, then the rest
IMAGES = ["dataset.subset=1000", "dataset.n_valid=100"]

#: name -> overrides: one or more experiments of every family, a few steps each
RUNS: dict[str, list[str]] = {
    "synthetic_spigot": ["+experiment=synthetic_spigot", "trainer.max_steps=5"],
    "synthetic_sfe": ["+experiment=synthetic_sfe", "trainer.max_steps=5"],
    "synthetic_gumbel_softmax": ["+experiment=synthetic_gumbel_softmax", "trainer.max_steps=5"],
    "planted_binary_tree": ["+experiment=planted_binary_tree", "trainer.max_steps=3"],
    "planted_matching": ["+experiment=planted_matching", "trainer.max_steps=3"],
    "sst_spigot": ["+experiment=sst_spigot", "trainer.max_steps=2"],
    "sst_baseline": ["+experiment=sst_baseline", "trainer.max_steps=2"],
    "listops_reinforce": ["+experiment=listops_reinforce", "trainer.max_steps=1", *LISTOPS],
    "listops_ppo": ["+experiment=listops_ppo", "trainer.max_steps=1", *LISTOPS],
    "listops_gumbel_tree": ["+experiment=listops_gumbel_tree", "trainer.max_steps=1", *LISTOPS],
    "listops_lstm": ["+experiment=listops_lstm", "trainer.max_steps=1", *LISTOPS],
    "listops_chart_spigot": ["+experiment=listops_chart_spigot", "trainer.max_steps=1", *LISTOPS, *CHART],
    "sorting_direct_sigma1": ["+experiment=sorting_direct_sigma1", "trainer.max_steps=3"],
    "sorting_direct_learned": ["+experiment=sorting_direct_learned", "trainer.max_steps=3"],
    "sorting_gumbel_sinkhorn": ["+experiment=sorting_gumbel_sinkhorn", "trainer.max_steps=3"],
    "knn_direct_sigma1": ["+experiment=knn_direct_sigma1", "trainer.max_steps=2", "task.k=3", *IMAGES],
    "knn_neuralsort": ["+experiment=knn_neuralsort", "trainer.max_steps=2", "task.k=3", *IMAGES],
    "vae_direct": ["+experiment=vae_direct", "trainer.max_steps=3", "dataset.n_valid=200"],
    "vae_gsm": ["+experiment=vae_gsm", "trainer.max_steps=3", "dataset.n_valid=200"],
    "vae_direct_phases": ["+experiment=vae_direct", "trainer.max_steps=3", "dataset.n_valid=200", *PHASES],
    "vae_gsm_phases": ["+experiment=vae_gsm", "trainer.max_steps=3", "dataset.n_valid=200", *PHASES],
    "vae_unsup_direct": ["+experiment=vae_unsup_direct", "trainer.max_steps=3", "dataset.n_valid=200"],
    "vae_unsup_exact": ["+experiment=vae_unsup_exact", "trainer.max_steps=3", "dataset.n_valid=200"],
    "vae_unsup_sfe": ["+experiment=vae_unsup_sfe", "trainer.max_steps=3", "dataset.n_valid=200"],
    "vae_unsup_st_gumbel": ["+experiment=vae_unsup_st_gumbel", "trainer.max_steps=3", "dataset.n_valid=200"],
    "mlc_spen": ["+experiment=mlc_spen", "trainer.max_steps=2"],
    "mlc_infnet": ["+experiment=mlc_infnet", "trainer.max_steps=2"],
    "ner_crf": ["+experiment=ner_crf", "trainer.max_steps=2"],
    "citation_crf": ["+experiment=citation_crf", "trainer.max_steps=2"],
}

COMMON = ["trainer.threads=1", "trainer.progress=false", "logger=none"]


def run(root: Path, only: list[str] | None) -> None:
    from latentstruct.train import train

    for name, overrides in RUNS.items():
        if only and name not in only:
            continue
        out = root / name
        start = time.process_time()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=[*overrides, *COMMON, f"paths.output_dir={out}", "trainer.force=true"])
        record = train(cfg, console=False)
        print(f"{name}: {record.get('status')} in {time.process_time() - start:.1f} CPU s", flush=True)


def _record(folder: Path) -> dict | None:
    if not (folder / "metrics.json").exists():
        return None
    metrics = json.loads((folder / "metrics.json").read_text())
    with open(folder / "history.csv", newline="") as f:
        history = [_untimed(row) for row in csv.DictReader(f)]
    return {"metrics": _untimed(metrics.get("metrics") or {}), "best_step": metrics.get("best_step"),
            "steps": metrics.get("steps"), "history": history}


def _untimed(values: dict) -> dict:
    """``values`` without what reads the machine (``records.reads_the_machine``: clocks, load, the implicit term's
    share of a step): the clock is not a result."""
    return {k: v for k, v in values.items() if not reads_the_machine(k)}


def compare(a: Path, b: Path, only: list[str] | None) -> int:
    bad = 0
    for name in RUNS:
        if only and name not in only:
            continue
        ra, rb = _record(a / name), _record(b / name)
        if ra is None or rb is None:
            print(f"{name}: MISSING in {a if ra is None else b}")
            bad += 1
        elif ra != rb:
            keys = [k for k in ra if ra[k] != rb[k]]
            print(f"{name}: DIFFERS in {', '.join(keys)}: {ra['metrics']} vs {rb['metrics']}")
            bad += 1
        else:
            print(f"{name}: identical")
    print(f"{bad} of the runs differ or are missing" if bad else "all identical")
    return int(bool(bad))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("root", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    for p in (r, c):
        p.add_argument("--only", default=None, help="comma-separated names of RUNS")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if args.command == "run":
        run(args.root, only)
        return 0
    return compare(args.a, args.b, only)


if __name__ == "__main__":
    sys.exit(main())

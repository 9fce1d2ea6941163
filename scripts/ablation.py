"""Ablations of a campaign table's rows: runs that change one thing, made at the table's own pinned code and protocol
(``campaign/<paper>-<table>/plan.json``), so that they compare with the table's runs and with nothing else.

    python -m scripts.ablation citation-lambda [--only summary]   # make ablation-citation-lambda
    python -m scripts.ablation citation-energies [--only summary] # make ablation-citation-energies
    python -m scripts.ablation vae-direct-anneal [--only summary] # make ablation-vae-direct-anneal
    python -m scripts.ablation sorting-sigma-lr [--only summary]  # make ablation-sorting-sigma-lr
    python -m scripts.ablation ner-infnet [--only summary] [--seeds 301,302]  # make ablation-ner-infnet [SEEDS=...]
    python -m scripts.ablation pos-infnet [--only summary] [--seeds 301,302]  # make ablation-pos-infnet [SEEDS=...]
    python -m scripts.ablation ner-infnet-energies [--only summary]  # make ablation-ner-infnet-energies
    python -m scripts.ablation pos-infnet-energies [--only summary]  # make ablation-pos-infnet-energies
    python scripts/spigot_ce_probe.py ablation [--only summary]   # make ablation-spigot-ce (its runs go through here)

An ablation's runs go one at a time, one thread, under ``nice``, from the campaign's worktree of the table's commit
(:func:`scripts.campaign.code_dir`), each into ``$LATENTSTRUCT_CAMPAIGN/ablations/<name>/<label>`` (its stdout beside
it, ``<label>.out``); a completed run is skipped. After each, the records of all of them (no checkpoints) are packed
into ``campaign/ablations-<name>/records.tar.gz`` (``scripts/carry.py``), which is committed: a fresh machine restores
them first, so it runs only what is missing. ``--only summary`` runs nothing and refuses while a run is missing.

citation-lambda (issue #34, energy/citation's reading: L_CD falls below the floor at 5 and 10 labelled citations, not
at 50), three variants of its L_CD (:data:`CITATION_VARIANTS`), every other setting the table's, at 5, 10 and 50
labelled, seeds 301-303 (27 runs, ~1-10 min each): eq. 6's λ E(x, A(x)) set to 0 (``task.lam=0``: A no longer pulled
by the energy, and no implicit term); the implicit term alone dropped (``task.solver_max_iter=0``: MINRES returns
w = 0, so φ's gradient is ∂L_CD/∂φ; A still pulled by λ E); a von Neumann series, the seed's kind of H⁻¹v (20 terms,
α = 5e-3), for the table's MINRES (``task.inverse_solver=neumann``). A run that fails (the series' diverge) is
recorded as failed and shown with its error. The page sets them beside the table's L_CD (λ = 1) and floor
runs, with each run's valid token accuracy after pretraining, at the selected and at the last method epoch, and the
share of valid tokens tagged author -> ``results/energy/citation_lambda_ablation.md`` (``.json``).

citation-energies (issue #34, the same reading: is it the energy or A that fails?): no runs of its own; each L_CD
run of the table (λ = 1), of citation-lambda (its variants) and each floor run at 5, 10 and 50 labelled, its model at
its last step, through ``scripts/energy_probe.py`` at the table's code: A's and the energy's exact minimum's
token accuracy and author share, where the energy ranks the gold -> ``results/energy/citation_energies.md``
(``.json``). A run whose weights are not here (the records keep none) is re-made from its configuration at that code
(:func:`last_state`), its metrics checked equal to its record's.

vae-direct-anneal (issue #34, direct/vae_unsupervised at the full schedule: direct, the seed's method, ends worst on
the categorical latent, its valid bound stalled from the first epochs): direct with |ε| annealed faster
(``task.anneal_rate`` in :data:`VAE_RATES` for the table's 1e-5), K = 10 and 50, and on the 20-bit latent at
:data:`VAE_BITS_RATE`, seed 301, 20 epochs; the page sets their curves beside the table's direct, Gumbel-softmax,
ST-Gumbel and exact runs (20 bits: direct and Gumbel-softmax, the table's two) at equal steps ->
``results/direct/vae_unsupervised_direct_anneal.md`` (``.json``).

sorting-sigma-lr (issue #34, direct/sorting at 20 repetitions: learned σ does not beat σ = 0 and σ = 1 as seed 002's
prose says; its σ hardly moves under the paper's SGD lr 1e-6, median 0.70 -> 0.62 at d = 100): the σ-network's
learning rate raised (:data:`SORTING_LRS`), d = 100, seeds 301-303; the page sets them beside the table's σ = 0,
σ = 1 and learned-σ runs of the same seeds, with each run's σ path -> ``results/direct/sorting_sigma_lr.md``
(``.json``).

ner-infnet, pos-infnet (issue #34, energy/ner and energy/pos: InfNet ends below the BiLSTM it starts from, every NER
run reporting the first method epoch): the table's InfNet configuration (NER: without features), seeds 301-303, each
trained to the end of pretraining (the base, whose identity is the table's run's), then forks of it
(``trainer.init_from``) that change one setting from the method phase on for 6 epochs (:data:`INFNET_ARMS`):
nothing, the energy's lr (frozen), the inference networks' lr, their cross-entropy (InfNet+). At
:data:`FORK_COMMIT`, not the tables' code, which cannot fork (their protocol otherwise) ->
``results/energy/{ner,pos}_infnet_ablation.md`` (``.json``).

ner-infnet-energies, pos-infnet-energies (the same reading: does the energy's minimum leave the labels, or A the
energy's minimum?): the InfNet ablation's runs, each at its last step, through ``scripts/energy_probe.py`` at
:data:`FORK_COMMIT` (POS: the as-run arm also stopped at each method epoch, :data:`INFNET_PROBE_EPOCHS`, and arms of
its own, :data:`INFNET_PROBE_ARMS`, by forks of the base) -> ``results/energy/{ner,pos}_infnet_energies.md``
(``.json``). A run whose weights are not here is made again in its folder (:func:`ensure` with ``weights``), its
metrics checked equal to its record's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import campaign, carry  # noqa: E402


def _log(line: str) -> None:
    print(f"ablation: {line}", flush=True)


def at_code(code: Path, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """``python argv`` under the pinned worktree's package (``PYTHONPATH``, working directory), one thread, under
    ``nice``; raises if it fails (``check``)."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    return subprocess.run(["nice", "-n", str(campaign.NICE), sys.executable, *argv], cwd=code, env=env, check=check,
                          **kw)


DONE = ("completed", "failed")  # an ablation's run that is not run again


def run_at_protocol(entry: dict, argv: list[str], run_dir: Path, check: bool = True) -> subprocess.CompletedProcess:
    """``python argv`` at the table's pinned code (``entry``: its plan) followed by its protocol (the plan's args)
    into ``run_dir`` (``hydra.run.dir``; resumed if interrupted), its output appended to ``<run_dir>.out``."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{run_dir}.out", "a") as out:
        return at_code(campaign.code_dir(entry["commit"]),
                       [*argv, *entry["args"].split(), "trainer.progress=False", "trainer.resume=True",
                        f"hydra.run.dir={run_dir}"], check=check, stdout=out, stderr=subprocess.STDOUT)


def ensure(name: str, table: str, runs: dict[str, list[str]], only_summary: bool, minutes: str,
           entry: dict | None = None, sources: dict[str, str] | None = None,
           weights: bool = False) -> tuple[Path, dict]:
    """Run the ablation ``name`` of ``table``: each ``label: argv`` of ``runs`` not done, in order, as ``python argv``
    followed by the table's protocol (its plan's args) and ``hydra.run.dir``, at the table's code (``entry``: the
    plan with another commit or args, where the ablation needs what the table's code lacks). Returns (its runs'
    folder, the plan).
    Done: completed, or failed with its record saying why (a run is deterministic at one code: run again, it fails
    again; its page shows the error); a run that fails without a record stops the ablation.
    ``sources``: ``fork label: source label`` for runs that start from another's last checkpoint
    (``trainer.init_from``); the records keep no checkpoints, so a source restored without one is run again (exactly,
    at one code) when a fork of it is still to run — the source first, as ``runs`` orders them. ``weights``: every run
    is to end with its weights (``checkpoint.pt``, for a probe): one restored without them is run again the same way,
    and its metrics (timings aside) checked equal to its record's."""
    entry = entry or campaign.plan(table)
    root, state = campaign.campaign_root(), campaign.STATE / f"ablations-{name}"
    where = root / "ablations" / name
    if (state / carry.RECORDS).is_file():
        carry.unpack(state, root, log=_log)
    needed = set(runs) if weights else {source for fork, source in (sources or {}).items()
                                        if carry.run_status(where / fork) not in DONE}
    unweighted = [label for label in runs if label in needed and carry.run_status(where / label) == "completed"
                  and not (where / label / "checkpoint.pt").is_file()]
    todo = [label for label in runs if carry.run_status(where / label) not in DONE]
    if todo and only_summary:
        raise SystemExit(f"error: {len(todo)} runs of the ablation {name} not completed ({', '.join(todo)}): run "
                         "it without --only summary first")
    if unweighted and only_summary:
        raise SystemExit(f"error: {len(unweighted)} runs of the ablation {name} keep no weights here "
                         f"({', '.join(unweighted)}): run it without --only summary to make them again")
    recorded = {label: _metrics(where / label) for label in unweighted}  # to compare with them made again
    for label in unweighted:
        for file in ("metrics.json", "run.json"):
            (where / label / file).unlink(missing_ok=True)
    todo = [label for label in runs if label in todo or label in recorded]  # those reset join, in the runs' order

    def pack() -> None:
        carry.pack_records(f"{table}:{name}", where, root, state, log=_log)

    if not todo and not only_summary and not (state / carry.RECORDS).is_file():
        pack()  # runs made before their records were kept
    for i, label in enumerate(todo, 1):
        run_dir = where / label
        _log(f"{label} ({i} of {len(todo)}) at {entry['commit'][:12]} -> {run_dir} ({minutes} min, one thread)")
        done = run_at_protocol(entry, runs[label], run_dir, check=False)
        if done.returncode and carry.run_status(run_dir) != "failed":
            raise SystemExit(f"error: {label} exited {done.returncode} without a record of its failure: {run_dir}.out")
        if done.returncode:
            _log(f"{label} failed: {json.loads((run_dir / 'metrics.json').read_text()).get('error', '')[:200]}")
        if label in recorded and _metrics(run_dir) != recorded[label]:
            raise SystemExit(f"error: {label} made again at {entry['commit'][:12]} differs from its record: "
                             f"{_metrics(run_dir)} against {recorded[label]}")
        pack()
    return where, entry


def _metrics(run_dir: Path) -> dict:
    """A record's metrics but its timings (which differ between two runs of one code; the rest may not)."""
    return {k: v for k, v in json.loads((run_dir / "metrics.json").read_text()).get("metrics", {}).items()
            if not k.endswith("seconds")}


def table_runs(table: str):
    """The table's campaign runs as :func:`latentstruct.report.tables.load_runs` reads them (its committed records
    restored first, where runs are missing here)."""
    from latentstruct.report.reproduce import sweep_root
    from latentstruct.report.tables import load_runs

    runs = campaign.campaign_root() / "runs"
    if (campaign.state_dir(table) / carry.RECORDS).is_file():
        carry.unpack(campaign.state_dir(table), runs, log=_log)
    return load_runs(sweep_root(table, str(runs)))


def seeds_row(label: str, runs, metrics: tuple[str, ...]) -> dict:
    """One row of an ablation's page: the completed runs' seeds, commits, each metric per seed with its mean and
    sample sd (NaN values left out: a baseline has no tree depth), and run times; ``_dirs``, the run directories, is
    this machine's (:func:`write` leaves it out)."""
    runs = runs[runs["completed"]].sort_values("seed")
    row = {"row": label, "seeds": [int(s) for s in runs["seed"]], "commits": sorted(set(runs["git_commit"])),
           "_dirs": list(runs["run_dir"]), "wall_seconds": [round(float(v)) for v in runs["wall_seconds"]]}
    for metric in metrics:
        values = [float(v) for v in runs.get(f"metric.{metric}", []) if v == v]
        row[metric] = values
        row[f"{metric} mean"] = statistics.fmean(values) if values else float("nan")
        row[f"{metric} sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return row


def write(summary: dict, out: Path, page) -> None:
    """``out``.json (the summary without this machine's paths: keys starting with _) and ``out``.md (``page``)."""
    summary = {**summary, "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in summary["rows"]]}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    out.with_suffix(".md").write_text(page(summary))
    _log(f"wrote {out.with_suffix('.md')} and .json")


def header(title: str, summary: dict, of: str, protocol: str, made_by: str, details: str) -> list[str]:
    """An ablation page's title and status line: what it ablates, the table's commit and protocol, the runs and the
    commits they recorded, the command that made it."""
    rows = summary["rows"]
    commits = sorted({c for r in rows for c in r["commits"]})
    return [f"# {title}", "",
            f"Status: **ablation** of {of} at the table's code and protocol (commit {summary['commit'][:12]}; "
            f"{protocol}), CPU, one thread a run, {sum(len(r['seeds']) for r in rows)} runs (commits recorded: "
            f"{', '.join(commits)}). Made by {made_by}; {details}", ""]


def cell(row: dict, metric: str) -> str:
    """``mean ± sd (v1 / v2 / ...)``, or – where the row has no value."""
    values = row[metric]
    if not values:
        return "–"
    return f"{row[metric + ' mean']:.2f} ± {row[metric + ' sd']:.2f} ({' / '.join(f'{v:.2f}' for v in values)})"


# ------------------------------------------------------------------------------------------- citation-lambda

CITATION = "energy/citation"
CITATION_LABELLED = (5, 10, 50)
CITATION_SEEDS = (301, 302, 303)
CITATION_OUT = ROOT / "results" / "energy" / "citation_lambda_ablation"


def citation_trajectory(run_dir: str | Path) -> dict:
    """From a citation run's history.csv: valid token accuracy after pretraining (phase 0's last evaluation), at the
    best method epoch by valid accuracy (what ``select=best`` reports) and at the last, the share of valid tokens
    tagged author at the last (%, as the history records it), and the best method epoch."""
    import pandas as pd

    history = pd.read_csv(Path(run_dir, "history.csv"))
    config = json.loads(Path(run_dir, "run.json").read_text())["identity"]
    pretrain = int(config["trainer.phases"][0]["epochs"])
    method = history[history["epoch"] > pretrain]
    best = method.loc[method["valid/acc"].idxmax()]
    return {"pretrained": float(history.loc[history["epoch"] == pretrain, "valid/acc"].iloc[0]),
            "best": float(best["valid/acc"]), "best_epoch": int(best["epoch"]) - pretrain,
            "last": float(method["valid/acc"].iloc[-1]),
            "author_last": float(method["valid/author_share"].iloc[-1]), "method_epochs": len(method)}


#: the citation-lambda ablation's variants of the table's L_CD: label prefix -> (row, overrides)
CITATION_VARIANTS = {
    "lam0": ("L_CD, λ = 0", ["task.lam=0"]),
    # MINRES capped at 0 products returns w = 0: φ's gradient is ∂L_CD/∂φ alone, A still pulled by λ E(x, A(x))
    "noimp": ("L_CD, λ = 1, no implicit term", ["task.solver_max_iter=0"]),
    # the seed's kind of H⁻¹v: the von Neumann series, 20 terms, step α = 5e-3 (Tu & Gimpel's; the seed gives none),
    # for the table's MINRES at tol 0.2
    "series": ("L_CD, 20-term series (α = 5e-3)", ["task.inverse_solver=neumann"]),
}


def citation_rows(n: int, table, mine) -> list[tuple[str, str, str, list[str], object]]:
    """The rows the citation ablations compare at ``n`` labelled: (row, short name, experiment, the overrides the
    runs add to it, the runs) for the table's floor and L_CD and each of :data:`CITATION_VARIANTS` (``mine``: the
    citation-lambda ablation's runs, each variant by its directory's prefix)."""
    from latentstruct.report.tables import filter_runs

    match = {"dataset.labelled": n}
    variant = mine["run_dir"].map(lambda d: Path(d).name.split("-", 1)[0])
    return [("floor (BiLSTM-CRF)", "crf", "citation_crf", [],
             filter_runs(table, {**match, "choices.experiment": "citation_crf"})),
            ("L_CD, λ = 1 (the table's)", "cd", "citation_cd", [],
             filter_runs(table, {**match, "choices.experiment": "citation_cd"}))] + [
            (label, short, "citation_cd", extra, filter_runs(mine[variant == short], match))
            for short, (label, extra) in CITATION_VARIANTS.items()]


def citation_argv(experiment: str, labelled: int, seed: int, extra: list[str]) -> list[str]:
    """The training command of a citation run (``python argv``), before the table's protocol."""
    return ["-m", "latentstruct.train", f"+experiment={experiment}", f"dataset.labelled={labelled}",
            f"trainer.seed={seed}", *extra]


def citation_lambda_runs() -> dict[str, list[str]]:
    return {f"{short}-labelled{n}-{s}": citation_argv("citation_cd", n, s, extra)
            for short, (_, extra) in CITATION_VARIANTS.items() for n in CITATION_LABELLED for s in CITATION_SEEDS}


def citation_lambda(only_summary: bool) -> None:
    from latentstruct.report.tables import load_runs

    where, entry = ensure("citation_lambda", CITATION, citation_lambda_runs(), only_summary, "~3-10")
    table, mine = table_runs(CITATION), load_runs(where)
    rows = []
    for n in CITATION_LABELLED:
        for label, _, _, _, runs_n in citation_rows(n, table, mine):
            row = seeds_row(label, runs_n, ("valid/acc", "test/acc"))
            failed = runs_n[~runs_n["completed"]].sort_values("seed")
            row.update(labelled=n, trajectory=[citation_trajectory(d) for d in row["_dirs"]],
                       failed=[{"seed": int(s), "error": str(e)} for s, e in zip(failed["seed"], failed["error"],
                                                                                   strict=True)])
            rows.append(row)
    write({"commit": entry["commit"], "args": entry["args"], "rows": rows}, CITATION_OUT, citation_page)


def citation_page(summary: dict) -> str:
    rows = summary["rows"]
    lines = header(
        "Cora citations (seed 004 Table 4): L_CD without eq. 6's λ E(x, A(x)), without its implicit term, or with "
        "the seed's series, by ablation", summary,
        "`results/energy/citation.md`'s L_CD rows at 5, 10 and 50 labelled citations",
        "its full schedule: 5 + 10 epochs, 250 unlabelled citations; the table's args: "
        f"`{summary['args'] or '(none)'}`",
        "`make ablation-citation-lambda` (`python -m scripts.ablation citation-lambda`)",
        "the λ = 0 runs differ from the table's L_CD runs in `task.lam` alone (A no longer pulled by the energy, and "
        "no implicit term), the no-implicit-term runs in `task.solver_max_iter=0` alone (MINRES returns w = 0: φ's "
        "gradient is ∂L_CD/∂φ, A still pulled by λ E(x, A(x))), the series runs in `task.inverse_solver=neumann` "
        "alone (the seed's kind of H⁻¹v, a von Neumann series: 20 terms, α = 5e-3, Tu & Gimpel's, the seed giving "
        "none; for the table's MINRES at tol 0.2). Valid and test: token "
        "accuracy at the "
        "method epoch `select=best` picks; after pretraining / best / last: valid token accuracy after phase 0, at the "
        "best and at the last method epoch (of 10); author: the share of valid tokens tagged author at the last epoch "
        "(gold 22.7 %).") + [
        "| labelled | row | seeds | valid acc | test acc | after pretraining → best (epoch) → last, author % at the "
        "last, per seed | run time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        path = "; ".join([f"{t['pretrained']:.1f} → {t['best']:.1f} ({t['best_epoch']}) → {t['last']:.1f}, "
                          f"{t['author_last']:.0f} %" for t in r["trajectory"]] +
                         [f"seed {f['seed']} failed: {f['error'].split('; configuration')[0]}"
                          for f in r.get("failed", [])])
        lines.append(f"| {r['labelled']} | {r['row']} | {', '.join(map(str, r['seeds']))} | {cell(r, 'valid/acc')} | "
                     f"{cell(r, 'test/acc')} | {path} | {', '.join(map(str, r['wall_seconds']))} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- citation-energies

ENERGIES_OUT = ROOT / "results" / "energy" / "citation_energies"
PROBE = ROOT / "scripts" / "energy_probe.py"


def last_state(label: str, run_dir: str | Path, argv: list[str], name: str, entry: dict,
               make: bool = True) -> tuple[Path, bool]:
    """A run directory holding ``run_dir``'s run at its last step (``checkpoint.pt``): ``run_dir`` itself where this
    machine ran it, else (a fresh machine: the committed records keep no weights) the same run re-made from ``argv``
    at the table's code into ``ablations/<name>/remade/<label>``, its metrics checked equal to the record's (runs
    are deterministic at one code; ``make`` false: refused). Returns (the directory, whether it was re-made)."""
    if Path(run_dir, "checkpoint.pt").is_file():
        return Path(run_dir), False
    again = campaign.campaign_root() / "ablations" / name / "remade" / label
    if not (again / "checkpoint.pt").is_file() and not make:
        raise SystemExit(f"error: {label}: {run_dir} keeps no weights here; run without --only summary to re-make it")
    if not (again / "checkpoint.pt").is_file():
        _log(f"{label}: {run_dir} keeps no weights here: re-making it at {entry['commit'][:12]} -> {again}")
        run_at_protocol(entry, argv, again)
    made, recorded = _metrics(again), _metrics(Path(run_dir))
    if made != recorded:
        raise SystemExit(f"error: {label} re-made at {entry['commit'][:12]} differs from its record: {made} against "
                         f"{recorded}")
    return again, True


def citation_energies(only_summary: bool) -> None:
    """The citation table's L_CD (λ = 1) and floor runs and the citation-lambda ablation's, at 5, 10 and 50
    labelled: what each trained energy prefers (:mod:`scripts.energy_probe`, at the table's code)."""
    from latentstruct.report.tables import load_runs

    table = table_runs(CITATION)
    # citation-lambda's runs, its committed records restored (refused while one is missing: run that ablation first)
    mine, entry = ensure("citation_lambda", CITATION, citation_lambda_runs(), True, "")
    mine = load_runs(mine)
    rows, remade = [], 0
    for n in CITATION_LABELLED:
        for label, short, experiment, extra, runs_n in citation_rows(n, table, mine):
            row = seeds_row(label, runs_n, ("valid/acc", "test/acc"))
            row.update(labelled=n, _weights=[])
            for seed, run_dir in zip(row["seeds"], row["_dirs"], strict=True):
                where, again = last_state(f"{short}-labelled{n}-{seed}", run_dir,
                                          citation_argv(experiment, n, seed, extra), "citation_energies", entry,
                                          make=not only_summary)
                row["_weights"].append(str(where))
                remade += again
            rows.append(row)
    # one probe process for every run (its lines in the order of the directories given, each naming its own)
    out = at_code(campaign.code_dir(entry["commit"]), [str(PROBE), *(d for r in rows for d in r["_weights"])],
                  capture_output=True, text=True)
    probed = [json.loads(line) for line in out.stdout.splitlines()]
    for row in rows:
        mine_ = [p for p in probed if p["run_dir"] in row["_weights"]]
        row["probe"] = {split: [{k: v for k, v in p.items() if k not in ("run_dir", "split")}
                                for p in mine_ if p["split"] == split] for split in ("train", "valid", "test")}
    write({"commit": entry["commit"], "args": entry["args"], "remade": remade, "rows": rows}, ENERGIES_OUT,
          energies_page)


def energies_page(summary: dict) -> str:
    rows = summary["rows"]

    def per_seed(r: dict, split: str, key: str, digits: int = 1) -> str:
        """Mean (each seed's); – where the probe has no value (A's columns of a run without A: the floor)."""
        values = [p[key] for p in r["probe"][split]]
        if any(v is None for v in values):
            return "–"
        return f"{statistics.fmean(values):.{digits}f} ({' / '.join(f'{v:.{digits}f}' for v in values)})"

    lines = header(
        "Cora citations (seed 004 Table 4): what the trained energies prefer", summary,
        "`results/energy/citation.md`'s L_CD and floor rows and `results/energy/citation_lambda_ablation.md`'s "
        "runs at 5, 10 and 50 labelled citations",
        "its full schedule: 5 + 10 epochs, 250 unlabelled citations; the table's args: "
        f"`{summary['args'] or '(none)'}`",
        "`make ablation-citation-energies` (`python -m scripts.ablation citation-energies`: "
        "`scripts/energy_probe.py` on each run's model at its last step, at the table's code)",
        f"nothing is trained ({summary['remade']} runs re-made from their configurations where this machine kept no "
        "weights, their metrics checked equal to the records'). E_φ is a linear chain, so argmin_y E_φ(x, y) is exact "
        "(Viterbi). Per row, the mean over the seeds, then each seed's value.") + [
        "Columns: **A**: token accuracy of the inference network's argmax (what the run reports, here at its last "
        "step, not the epoch `select=best` picks); **argmin E**: token accuracy of the energy's own minimum; "
        "**author %**: the share of tokens each tags author (gold 22.7 % on valid); **gold < all-author**: % of "
        "citations whose gold tagging has a lower energy than tagging every token author; **gold < A**: % whose gold "
        "has a lower energy than A's argmax (ties, as where A is right, count as not lower); **E gap gold / A**: "
        "E_φ(x, y) − min E_φ per token for the gold y and for A's argmax (0: the minimum). The floor's A is an "
        "untrained network (the CRF decodes with its energy), left out.", "",
    ]
    for split, title in (("valid", "Valid (100 citations)"), ("train", "The labelled training citations"),
                         ("test", "Test (100 citations)")):
        lines += [f"## {title}", "",
                  "| labelled | row | seeds | A | argmin E | author % (A / argmin E) | gold < all-author | gold < A | "
                  "E gap gold / A |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if not r["probe"][split]:  # every run of the row failed (the citation-lambda page says how)
                lines.append(f"| {r['labelled']} | {r['row']} | – | no completed run | | | | | |")
                continue
            lines.append(f"| {r['labelled']} | {r['row']} | {', '.join(map(str, r['seeds']))} | "
                         f"{per_seed(r, split, 'acc_A')} | {per_seed(r, split, 'acc_E')} | "
                         f"{per_seed(r, split, 'author_A', 0)} / {per_seed(r, split, 'author_E', 0)} | "
                         f"{per_seed(r, split, 'gold_below_author', 0)} | {per_seed(r, split, 'gold_below_A', 0)} | "
                         f"{per_seed(r, split, 'gap_gold', 2)} / {per_seed(r, split, 'gap_A', 2)} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- vae-direct-anneal

VAE = "direct/vae_unsupervised"
VAE_OUT = ROOT / "results" / "direct" / "vae_unsupervised_direct_anneal"
VAE_RATES = ("1e-4", "3.5e-4")  # 3.5e-4: the former table's compressed schedule (|ε| 1 -> its floor 0.1 by step ~6,600)
VAE_BITS_RATE = "3.5e-4"  # the 20-bit latent: the rate that closed the categorical gap only
VAE_EPOCHS = 20
VAE_AT = (1, 5, 10, 15, 20)  # the epochs the page compares at


def vae_direct_anneal(only_summary: bool) -> None:
    from latentstruct.report.tables import filter_runs, load_runs

    def direct(experiment: str, rate: str, *size: str) -> list[str]:
        return ["-m", "latentstruct.train", f"+experiment={experiment}", *size, "trainer.seed=301",
                f"task.anneal_rate={rate}", f"trainer.max_epochs={VAE_EPOCHS}"]

    runs = {f"rate{r}-K{k}": direct("vae_unsup_direct", r, f"task.size={k}") for r in VAE_RATES for k in (10, 50)}
    runs[f"rate{VAE_BITS_RATE}-bits"] = direct("vae_unsup_bits_direct", VAE_BITS_RATE)
    where, entry = ensure("vae_direct_anneal", VAE, runs, only_summary, "~5-20")
    table, mine = table_runs(VAE), load_runs(where)
    rows = []
    groups = [(k, {"choices.structure": "categorical", "task.size": k, "choices.encoder": "dvae"},
               ("direct", "Gumbel-softmax", "ST-Gumbel", "exact"), VAE_RATES) for k in (10, 50)]
    groups.append(("20 bits", {"choices.structure": "binary_vector", "task.size": 20, "choices.encoder": "dvae"},
                   ("direct", "Gumbel-softmax"), (VAE_BITS_RATE,)))  # the table runs these two only on bits
    estimators = {"direct": "direct", "Gumbel-softmax": "gumbel_softmax", "ST-Gumbel": "st_gumbel", "exact": "exact"}
    for size, match, names, rates in groups:
        chosen = [(f"{name} (the table's: rate 1e-5, 100 epochs)",
                   filter_runs(table, {**match, "choices.estimator": estimators[name]})) for name in names]
        chosen += [(f"direct, rate {r}, {VAE_EPOCHS} epochs",
                    filter_runs(mine, {**match, "task.anneal_rate": float(r)})) for r in rates]
        for label, runs_k in chosen:
            row = seeds_row(label, runs_k, ("test/bound",))
            row.update(size=size, curve=[vae_curve(d) for d in row["_dirs"]])
            rows.append(row)
    write({"commit": entry["commit"], "args": entry["args"], "rows": rows}, VAE_OUT, vae_page)


def vae_curve(run_dir: str | Path) -> dict:
    """From an unsupervised VAE run's history.csv: the valid bound, the valid runner-up log q, the valid KL(q(z|x) ‖
    uniform) and the annealed |ε| / τ (``max(exp(-rate · step), floor)``, the run's own rate) at the epochs of
    :data:`VAE_AT`."""
    import pandas as pd

    from latentstruct.tasks.vae import annealed

    history = pd.read_csv(Path(run_dir, "history.csv")).set_index("epoch")
    identity = json.loads(Path(run_dir, "run.json").read_text())["identity"]
    rate, floor = float(identity["task.anneal_rate"]), float(identity["task.anneal_floor"])
    at = [e for e in VAE_AT if float(e) in history.index]
    return {"epochs": at, "valid/bound": [float(history.loc[float(e), "valid/bound"]) for e in at],
            "valid/runner_up_log_q": [float(history.loc[float(e), "valid/runner_up_log_q"]) for e in at],
            "valid/kl": [float(history.loc[float(e), "valid/kl"]) for e in at],
            "temperature": [annealed(1.0, rate, floor, int(history.loc[float(e), "step"])) for e in at]}


def vae_page(summary: dict) -> str:
    rows = summary["rows"]
    lines = header(
        "Unsupervised discrete VAE (seed 003): direct optimisation's |ε| schedule, by ablation", summary,
        "`results/direct/vae_unsupervised.md`'s direct rows (categorical latent, the literature's 300-unit networks)",
        "seed 301", "`make ablation-vae-direct-anneal` (`python -m scripts.ablation vae-direct-anneal`)",
        "the ablation's runs differ from the table's direct runs in `task.anneal_rate` and in their length "
        f"({VAE_EPOCHS} epochs: `trainer.max_epochs`, which changes nothing before it), so the curves compare at equal "
        "steps. Test bound: at the run's last epoch (nats, lower is better). Curves: valid bound, valid runner-up log "
        "q, valid KL(q(z|x) ‖ uniform) (nats; log K when every image's code is certain) and the annealed |ε| (direct) "
        f"or τ (the relaxations) at epochs {', '.join(map(str, VAE_AT))}.") + [
        "| K | row | test bound (last epoch) | valid bound at the epochs | runner-up log q | KL(q ‖ uniform) | "
        "|ε| or τ | run time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for c in r["curve"]:
            lines.append(f"| {r['size']} | {r['row']} | {cell(r, 'test/bound')} | "
                         f"{' / '.join(f'{v:.1f}' for v in c['valid/bound'])} | "
                         f"{' / '.join(f'{v:.1f}' for v in c['valid/runner_up_log_q'])} | "
                         f"{' / '.join(f'{v:.2f}' for v in c['valid/kl'])} | "
                         f"{' / '.join(f'{v:.2f}' for v in c['temperature'])} | "
                         f"{', '.join(map(str, r['wall_seconds']))} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- sorting-sigma-lr

SORTING = "direct/sorting"
SORTING_D = 100
SORTING_SEEDS = (301, 302, 303)
SORTING_LRS = ("1e-4", "1e-2")  # the σ-network's SGD learning rate; the paper's (and the table's): 1e-6
SORTING_OUT = ROOT / "results" / "direct" / "sorting_sigma_lr"


def sigma_path(run_dir: str | Path) -> dict:
    """From a sorting run's history.csv: the valid mean σ at the first and the last evaluation, and its range over
    the run (σ = 0 / 1 runs have none: {})."""
    import pandas as pd

    history = pd.read_csv(Path(run_dir, "history.csv"))
    if "valid/sigma" not in history:
        return {}
    sigma = history["valid/sigma"]
    return {"first": float(sigma.iloc[0]), "last": float(sigma.iloc[-1]), "min": float(sigma.min()),
            "max": float(sigma.max())}


def sorting_sigma_lr(only_summary: bool) -> None:
    from latentstruct.report.tables import filter_runs, load_runs

    runs = {f"lr{lr}-{s}": ["-m", "latentstruct.train", "+experiment=sorting_direct_learned",
                            f"dataset.num_items={SORTING_D}", f"trainer.seed={s}", f"optim_groups.sigma.lr={lr}"]
            for lr in SORTING_LRS for s in SORTING_SEEDS}
    where, entry = ensure("sorting_sigma_lr", SORTING, runs, only_summary, "~5-8")
    table, mine = table_runs(SORTING), load_runs(where)
    match = {"dataset.num_items": SORTING_D}
    chosen = [(label, filter_runs(table, {**match, "choices.experiment": experiment}))
              for label, experiment in (("Direct σ=0 (the table's)", "sorting_direct_sigma0"),
                                        ("Direct σ=1 (the table's)", "sorting_direct_sigma1"),
                                        ("learned σ, SGD lr 1e-6 (the table's, the paper's)",
                                         "sorting_direct_learned"))]
    chosen += [(f"learned σ, SGD lr {lr}", filter_runs(mine, {**match, "optim_groups.sigma.lr": float(lr)}))
               for lr in SORTING_LRS]
    rows = []
    for label, found in chosen:
        found = found[found["seed"].isin(SORTING_SEEDS)]
        row = seeds_row(label, found, ("test/acc", "test/prop_wrong"))
        row["sigma"] = [sigma_path(d) for d in row["_dirs"]]
        rows.append(row)
    write({"commit": entry["commit"], "args": entry["args"], "rows": rows}, SORTING_OUT, sorting_page)


def sorting_page(summary: dict) -> str:
    lines = header(
        "Sorting (seed 002 Table 1): does learned σ beat σ = 0 and σ = 1 when σ moves? By ablation", summary,
        f"`results/direct/sorting.md`'s rows at d = {SORTING_D}", f"seeds {', '.join(map(str, SORTING_SEEDS))}",
        "`make ablation-sorting-sigma-lr` (`python -m scripts.ablation sorting-sigma-lr`)",
        "the ablation's runs differ from the table's learned-σ runs in the σ-network's SGD learning rate "
        "(`optim_groups.sigma.lr`) alone. Test: % sorted and Prop. wrong at the evaluation `select=best` picks (best "
        "valid % sorted). σ: the valid mean σ at the first evaluation (step 50) → the last (step 2000), and its range "
        "over the run, per seed.") + [
        "| row | seeds | % sorted | Prop. wrong | σ first → last [range], per seed | run time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        sigma = "; ".join(f"{p['first']:.3f} → {p['last']:.3f} [{p['min']:.3f}, {p['max']:.3f}]" if p else "–"
                          for p in r["sigma"])
        lines.append(f"| {r['row']} | {', '.join(map(str, r['seeds']))} | {cell(r, 'test/acc')} | "
                     f"{cell(r, 'test/prop_wrong')} | {sigma} | {', '.join(map(str, r['wall_seconds']))} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- ner-infnet, pos-infnet

#: the first commit with trainer.init_from (a fork): the tables' own (NER cb8c191, POS 81c19b8) have none. The page
#: checks per seed that the base run's identity is its table's InfNet run's and that its pretraining computes the same
FORK_COMMIT = "8ba1b42fbeca9674ef9a66b9fb2cf99c258d7c34"
INFNET_PRETRAIN_EPOCHS = 10  # the tables' pretraining (configs/trainer/ner_energy.yaml)
INFNET_METHOD_EPOCHS = 6
INFNET_SEEDS = (301, 302, 303)  # the tables' seeds
#: the tables an InfNet ablation forks: name -> (table, what the base adds to the table's protocol, which of the
#: table's runs it is, batches per epoch, the metric's history column and name)
INFNET_TABLES = {
    "ner": ("energy/ner", ["dataset.features=false"], {"dataset.features": False}, 439, "valid/f1",
            "span F1 (conlleval)"),  # 14,041 sentences
    "pos": ("energy/pos", ["dataset=twpos"], {}, 42, "valid/acc", "token accuracy"),  # 1,327 tweets
}
#: the arms, each forked from the base at the end of pretraining: label -> (row, the overrides of the method phase)
INFNET_ARMS = {
    "as_run": ("as run (E: Adam 1e-3, A and F: Adam 1e-3)", []),
    # Adam's step is about lr per coordinate: at 1e-12 the energy does not move (a learning rate of 0 is refused)
    "energy_frozen": ("energy frozen (its lr 1e-12)", ["optim.lr=1e-12"]),
    "infnet_lr": ("inference networks' lr 1e-4", ["task.inner_lr=1e-4"]),
    "infnet_ce": ("+ their token cross-entropy, weight 1 (InfNet+)", ["task.infnet_ce=1.0"]),
}


def infnet_steps(per_epoch: int) -> tuple[int, int]:
    """(the base's steps: the end of pretraining, the forks' steps: :data:`INFNET_METHOD_EPOCHS` epochs more)."""
    return INFNET_PRETRAIN_EPOCHS * per_epoch, (INFNET_PRETRAIN_EPOCHS + INFNET_METHOD_EPOCHS) * per_epoch


def infnet_runs(task: str, seeds: tuple[int, ...], epochs: tuple[int, ...] = (),
                arms: dict | None = None) -> tuple[dict, dict, dict]:
    """(``label: argv`` of the ablation's runs, ``fork: its source``, the plan they run under) for ``seeds``: per seed
    the base, a fork for each of ``arms`` (default :data:`INFNET_ARMS`), and the as-run arm stopped at each of
    ``epochs`` (``as_run_eE``: the same run, to an earlier step)."""
    table, extra, _, per_epoch, _, _ = INFNET_TABLES[task]
    pretrain, steps = infnet_steps(per_epoch)
    where = campaign.campaign_root() / "ablations" / f"{task}_infnet"
    runs, sources = {}, {}
    for seed in seeds:
        base = ["-m", "latentstruct.train", "+experiment=ner_infnet", *extra, f"trainer.seed={seed}"]
        runs[f"base-{seed}"] = [*base, f"trainer.max_steps={pretrain}"]
        forks = {label: (steps, arm) for label, (_, arm) in (arms or INFNET_ARMS).items()}
        forks |= {f"as_run_e{epoch}": (epoch * per_epoch, INFNET_ARMS["as_run"][1]) for epoch in epochs}
        for label, (length, arm) in forks.items():
            runs[f"{label}-{seed}"] = [*base, f"trainer.max_steps={length}", f"trainer.init_from={where}/base-{seed}",
                                       *arm]
            sources[f"{label}-{seed}"] = f"base-{seed}"
    plan = campaign.plan(table)
    # the table's protocol, but not its list of rows: the experiment is the base's
    return runs, sources, {**plan, "commit": FORK_COMMIT,
                           "args": " ".join(a for a in plan["args"].split() if not a.startswith("+experiment="))}


def infnet_curve(run_dir: str | Path, column: str) -> dict:
    """A run's evaluations from its ``history.csv``: ``epochs`` and the ``valid`` metric ``column`` at each."""
    import pandas as pd

    history = pd.read_csv(Path(run_dir) / "history.csv")
    return {"epochs": [int(e) for e in history["epoch"]], "valid": [float(v) for v in history[column]]}


def mean_sd(xs: list[float], digits: int = 2) -> str:
    """``mean ± sd`` (sample sd; 0 of one value)."""
    return f"{statistics.fmean(xs):.{digits}f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.{digits}f}"


def infnet_ablation(task: str, only_summary: bool, seeds: tuple[int, ...] = INFNET_SEEDS) -> None:
    """InfNet on ``task`` (:data:`INFNET_TABLES`), each of ``seeds`` (default: :data:`INFNET_SEEDS`; fewer: a page of
    those alone, its status line naming them): the table's run to the end of pretraining (the base), then forks of it
    that change one setting of the method phase (:data:`INFNET_ARMS`) for :data:`INFNET_METHOD_EPOCHS` epochs, all at
    :data:`FORK_COMMIT` on one host."""
    from latentstruct.report.tables import filter_runs

    table, _, match, _, column, _ = INFNET_TABLES[task]
    runs, sources, entry = infnet_runs(task, seeds)
    where, _ = ensure(f"{task}_infnet", table, runs, only_summary, "~1-25", entry=entry, sources=sources)

    found = filter_runs(table_runs(table), {"choices.experiment": "ner_infnet", **match})
    made = []
    for seed in seeds:
        arms = {}
        for label in ["base", *INFNET_ARMS]:
            record = json.loads((where / f"{label}-{seed}" / "metrics.json").read_text())
            arms[label] = {"fingerprint": record["fingerprint"], "cpu": record.get("cpu"),
                           "commit": record.get("git_commit"), "wall_seconds": round(record["wall_seconds"]),
                           "test_at_best": record["metrics"]["test/acc"],
                           **infnet_curve(where / f"{label}-{seed}", column)}
        mine = found[found["seed"] == seed]
        reference = {}
        if len(mine):
            run_dir = Path(mine["run_dir"].iloc[0])
            reference = {"fingerprint": json.loads((run_dir / "run.json").read_text())["fingerprint"],
                         "commit": str(mine["git_commit"].iloc[0]), **infnet_curve(run_dir, column)}
        made.append({"seed": seed, "arms": arms, "table_run": reference})
    write({"task": task, "commit": FORK_COMMIT, "table_commit": campaign.plan(table)["commit"], "args": entry["args"],
           "rows": [], "seeds": made}, ROOT / "results" / table.split("/")[0] / f"{task}_infnet_ablation", infnet_page)


def infnet_page(summary: dict) -> str:
    task, seeds = summary["task"], summary["seeds"]
    table, _, _, per_epoch, _, metric = INFNET_TABLES[task]
    pretrain, steps = infnet_steps(per_epoch)
    first = INFNET_PRETRAIN_EPOCHS + 1
    method, pre = range(first, first + INFNET_METHOD_EPOCHS), range(1, first)

    def values(curve: dict, wanted) -> list[float | None]:
        found = dict(zip(curve["epochs"], curve["valid"], strict=True))
        return [found.get(e) for e in wanted]

    def at(curve: dict, wanted) -> str:
        return ", ".join("–" if v is None else f"{v:.2f}" for v in values(curve, wanted))

    def best(curve: dict) -> tuple[float, int]:
        return max((v, e) for v, e in zip(curve["valid"], curve["epochs"], strict=True) if e >= first)

    hosts = sorted({a["cpu"] or "not recorded" for s in seeds for a in s["arms"].values()})
    shown = [s["seed"] for s in seeds]
    missing = [s for s in INFNET_SEEDS if s not in shown]
    seeds_arg = "" if tuple(shown) == INFNET_SEEDS else ",".join(map(str, shown))
    what = {"ner": "NER (seed 004 Table 3)", "pos": "Twitter POS (seed 004 Table 9)"}[task]
    lines = [
        f"# {what}: what makes InfNet fall in its method phase, by ablation", "",
        f"Status: **ablation** of `results/{table}.md`'s InfNet row ({task.upper()}, seeds "
        f"{', '.join(str(s['seed']) for s in seeds)}) at commit {summary['commit'][:12]}, not the table's "
        f"{summary['table_commit'][:12]}: forking a run (`trainer.init_from`) came after it. The table's protocol: "
        f"its full schedule and data (`{summary['args']}`); CPU, one thread a run, "
        f"{sum(len(s['arms']) for s in seeds)} runs on {'; '.join(hosts)}. Made by `make ablation-{task}-infnet"
        f"{seeds_arg and ' SEEDS=' + seeds_arg}` (`python -m scripts.ablation {task}-infnet"
        f"{seeds_arg and ' --seeds ' + seeds_arg}`)"
        + (f"; seed{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of the ablation not run yet "
           f"(`make ablation-{task}-infnet`)" if missing else "") + ".", "",
        f"Per seed, the base is the table's configuration trained to the end of pretraining (step {pretrain:,}, "
        f"epoch {first - 1}). Each arm forks the base's final checkpoint (weights, Adam moments, random state) and "
        f"trains {INFNET_METHOD_EPOCHS} method epochs (to step {steps:,}) with one setting changed from there on; the "
        "as-run arm changes nothing: the table's run continued on this host. E: the energy (its optimizer, "
        "`optim`); A and F: the test-time and cost-augmented inference networks (the task's own Adam, "
        "`task.inner_lr`). Valid: " + metric + "; test: at the best method epoch by valid, as the table reports.",
        "", "## The arms", "",
        f"| arm | changed from epoch {first} | valid, epochs {method.start}-{method.stop - 1} (mean over seeds) | "
        "best valid (epoch), per seed | test at it, mean ± sd (per seed) |", "|---|---|---|---|---|",
    ]
    pretrained = [s["arms"]["base"]["valid"][-1] for s in seeds]
    lines.append(f"| base: pretraining | – | epoch {first - 1}: {statistics.fmean(pretrained):.2f} | "
                 f"{' / '.join(f'{v:.2f}' for v in pretrained)} | – |")
    for label, (row, arm) in INFNET_ARMS.items():
        curves = [s["arms"][label] for s in seeds]
        per_epoch_mean = [statistics.fmean(col) for col in zip(*(values(c, method) for c in curves), strict=True)
                          if None not in col]
        tests = [c["test_at_best"] for c in curves]
        lines.append(f"| {row} | {', '.join(f'`{o}`' for o in arm) or 'nothing'} | "
                     f"{', '.join(f'{v:.2f}' for v in per_epoch_mean)} | "
                     f"{' / '.join('{:.2f} ({})'.format(*best(c)) for c in curves)} | {mean_sd(tests)} "
                     f"({' / '.join(f'{t:.2f}' for t in tests)}) |")
    lines += ["", "## Each seed, beside the table's run", "",
              "| seed | run | valid, epochs " f"{method.start}-{method.stop - 1} | test at best | run time (s) |",
              "|---|---|---|---|---|"]
    checks = []
    for s in seeds:
        ref, base = s["table_run"], s["arms"]["base"]
        for label in INFNET_ARMS:
            a = s["arms"][label]
            lines.append(f"| {s['seed']} | {INFNET_ARMS[label][0]} | {at(a, method)} | {a['test_at_best']:.2f} | "
                         f"{a['wall_seconds']} |")
        if ref:
            lines.append(f"| {s['seed']} | the table's run (commit {ref['commit'][:12]}) | {at(ref, method)} | – | – |")
        checks.append(
            f"- seed {s['seed']}: base fingerprint {base['fingerprint']}, "
            + (("the table's run's" if ref["fingerprint"] == base["fingerprint"] else
                f"**not** the table's run's ({ref['fingerprint']})")
               + f"; valid at epochs 1-{first - 1} "
               + ("equal to that run's" if at(ref, pre) == at(base, pre) else "**differ** from that run's")
               + f"; the as-run arm at epochs {method.start}-{method.stop - 1} "
               + ("equal to it" if at(s["arms"]["as_run"], method) == at(ref, method) else
                  "**differ** from it (another host: `results/" + table + ".md`'s notes)")
               if ref else "no table run here to compare"))
    lines += ["", "## Checks (two decimals)", "", *checks, "",
              "Run time: a fork's record counts its source's steps too (the base's pretraining)."]
    return "\n".join(lines) + "\n"


#: the method epochs at which infnet-energies also probes the as-run arm, by forks of the base stopped there (the as-run
#: arm itself is epoch 16): POS each, whose epoch takes ~6 s here; NER the first alone (~90 s an epoch: all five would
#: be ~25 CPU-min a seed), where the energy's minimum first moves and its steps would be largest
INFNET_PROBE_EPOCHS = {"pos": tuple(range(INFNET_PRETRAIN_EPOCHS + 1, INFNET_PRETRAIN_EPOCHS + INFNET_METHOD_EPOCHS)),
                       "ner": (INFNET_PRETRAIN_EPOCHS + 1,)}
#: arms that infnet-energies adds (forks of the base like :data:`INFNET_ARMS`): which part of eq. 5's energy loss, at
#: which step, moves its minimum. POS alone (a NER arm is ~9 CPU-min a seed)
INFNET_PROBE_ARMS = {
    "pos": {
        # eq. 5 without its λ term: the energy trained against F's cost-augmented outputs alone (A then has no ascent)
        "lam0": ("A's term dropped (λ = 0)", ["task.lam=0"]),
        "cost_per_token": ("Δ per token (the cost divided by the length)", ["task.normalize_cost=true"]),
        "energy_lr": ("the energy's lr 1e-4", ["optim.lr=1e-4"]),
        # the inference networks 10 times faster than the energy (the energy's own step as run): do its new minima
        # form where F's outputs do not go because F lags behind the energy, or at the energy's step whatever F does?
        "infnet_lr_up": ("inference networks' lr 1e-2", ["task.inner_lr=1e-2"]),
    },
    "ner": {},
}
#: the arms whose energy the page also takes apart, its parameters swapped with the base's (where the task has them)
INFNET_SWAP_ARMS = ("as_run_e11", "as_run", "lam0")
PROBE_KEYS = ("acc_A", "acc_E", "acc_E_unary", "transition_abs", "acc_F", "F_at_E_errors", "f1_A", "f1_E",
              "gold_below_A", "gap_gold", "gap_A", "gap_A_relaxed")


def infnet_energies(task: str, only_summary: bool) -> None:
    """Where the energy of :func:`infnet_ablation`'s runs puts its minimum (:mod:`scripts.energy_probe`, at
    :data:`FORK_COMMIT`): each seed's base, each arm (and those of :data:`INFNET_PROBE_ARMS`) at its last step and the
    as-run arm at :data:`INFNET_PROBE_EPOCHS` (forks of the base, run here if missing); then the arms of
    :data:`INFNET_SWAP_ARMS` with their energy's parameters swapped part by part with the base's."""
    table = INFNET_TABLES[task][0]
    epochs = INFNET_PROBE_EPOCHS[task]
    arms = INFNET_ARMS | INFNET_PROBE_ARMS[task]
    runs, sources, entry = infnet_runs(task, INFNET_SEEDS, epochs, arms)
    where, _ = ensure(f"{task}_infnet", table, runs, only_summary, "~1-25", entry=entry, sources=sources, weights=True)
    out = at_code(campaign.code_dir(entry["commit"]), [str(PROBE), *(str(where / label) for label in runs)],
                  capture_output=True, text=True)
    probed, swapped = {}, {}
    for line in out.stdout.splitlines():
        p = json.loads(line)
        probed.setdefault(Path(p["run_dir"]).name, {})[p["split"]] = {k: p[k] for k in (*PROBE_KEYS, "step")}
    for seed in INFNET_SEEDS:  # which of the energy's parameters moved its minimum: swapped with the base's
        moved = [where / f"{arm}-{seed}" for arm in INFNET_SWAP_ARMS if f"{arm}-{seed}" in runs]
        out = at_code(campaign.code_dir(entry["commit"]), [str(PROBE), "--swap", str(where / f"base-{seed}"),
                                                           *map(str, moved)], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            p = json.loads(line)
            swapped.setdefault(Path(p["run_dir"]).name, {})[p["split"]] = {
                k: v for k, v in p.items() if k not in ("run_dir", "base_dir", "split")}
    made = []
    for label in runs:
        record = json.loads((where / label / "metrics.json").read_text())
        curve = infnet_curve(where / label, INFNET_TABLES[task][4])
        arm, seed = label.rsplit("-", 1)
        made.append({"arm": arm, "seed": int(seed), "epoch": curve["epochs"][-1], "step": record["steps"],
                     "valid_reported": curve["valid"][-1], "cpu": record.get("cpu"), "valid_curve": curve["valid"],
                     "probe": probed[label], **({"swap": swapped[label]} if label in swapped else {})})
    write({"task": task, "commit": FORK_COMMIT, "args": entry["args"], "rows": [], "runs": made,
           "arms": {label: list(arm) for label, arm in arms.items()}},
          ROOT / "results" / table.split("/")[0] / f"{task}_infnet_energies", infnet_energies_page)


def infnet_energies_page(summary: dict) -> str:
    task, runs = summary["task"], summary["runs"]
    table, _, _, _, _, metric = INFNET_TABLES[task]
    f1 = task == "ner"  # the table's metric is span F1: the probe gives it beside token accuracy
    key_A, key_E = ("f1_A", "f1_E") if f1 else ("acc_A", "acc_E")  # A's and the minimum's, in the table's metric
    last = INFNET_PRETRAIN_EPOCHS + INFNET_METHOD_EPOCHS
    arms = {"base": f"base: pretraining (epoch {INFNET_PRETRAIN_EPOCHS})",
            **{label: f"{row} ({''.join(f'`{o}`, ' for o in arm)}epoch {last})"
               for label, (row, arm) in summary["arms"].items()}}
    what = {"ner": "NER (seed 004 Table 3)", "pos": "Twitter POS (seed 004 Table 9)"}[task]
    hosts = sorted({r["cpu"] or "not recorded" for r in runs})

    def mean(rs: list[dict], split: str, key: str, digits: int = 2) -> str:
        return mean_sd([r["probe"][split][key] for r in rs], digits)

    cols = [("A", "acc_A"), ("argmin E", "acc_E"), ("argmin E: unary part", "acc_E_unary")]
    if f1:
        cols = [("A: F1", "f1_A"), ("argmin E: F1", "f1_E"), ("A: token acc", "acc_A"),
                ("argmin E: token acc", "acc_E"), ("argmin E, unary part: token acc", "acc_E_unary")]
    cols += [("F: token acc" if f1 else "F", "acc_F"), ("F at E's errors (%)", "F_at_E_errors"),
             ("gold < A (%)", "gold_below_A"), ("E gap: gold", "gap_gold"), ("E gap: A", "gap_A"),
             ("E gap: A relaxed", "gap_A_relaxed"), ("mean abs W", "transition_abs")]
    lines = [
        f"# {what}: where InfNet's energy puts its minimum, by probe", "",
        f"Status: **ablation** (a probe) of `results/energy/{task}_infnet_ablation.md`'s runs at commit "
        f"{summary['commit'][:12]} (the table `results/{table}.md` is at another; that page says why and checks "
        f"the bases against the table's runs): its full schedule and data (`{summary['args']}`); CPU, one thread a "
        f"run, {len(runs)} runs on {'; '.join(hosts)}. Made by `make ablation-{task}-infnet-energies` "
        f"(`python -m scripts.ablation {task}-infnet-energies`: `scripts/energy_probe.py` on each run's model at its "
        "last step, at that commit).", "",
        "E_φ is a linear chain (unary and transition scores), so argmin_y E_φ(x, y) is exact (Viterbi). Mean ± sd over "
        f"seeds {', '.join(map(str, INFNET_SEEDS))}. Columns: **A**: the test-time inference network's argmax "
        f"({'span F1 and ' if f1 else ''}token accuracy; what the run reports at that step); **argmin E**: the "
        "energy's own minimum, the same; **unary part**: the same of the energy's unary scores alone (per token, its "
        "transitions dropped); **F**: token accuracy of the cost-augmented network's argmax (eq. 5 trains the energy "
        "against F(x)); **F at E's errors**: % of the tokens the energy's minimum tags wrong where F's argmax has that "
        "same wrong tag; **gold < A**: % of sentences whose gold tagging has a lower energy than A's argmax "
        "(ties, as where A is right, count as not lower); **E gap**: E_φ(x, y) − min_y E_φ(x, y) per token for the "
        "gold y, for A's argmax and for A(x) itself, the distributions over tags it outputs, at which eq. 5 evaluates "
        "the energy (0: the minimum; below 0: the relaxation goes below the minimum over taggings); **mean abs W**: "
        "the mean |W_ij| of the energy's transition scores (0 after pretraining, which trains the unary part alone)."
        + (f" The arms after the ablation's {len(INFNET_ARMS)} are this probe's own (`INFNET_PROBE_ARMS`), forks of "
           "the same bases." if len(summary["arms"]) > len(INFNET_ARMS) else ""), ""]
    for split, title in (("valid", "Valid"), ("train", "Train"), ("test", "Test")):
        lines += [f"## {title}: each arm at its last step", "",
                  "| arm | " + " | ".join(c for c, _ in cols) + " |", "|---|" + "---|" * len(cols)]
        for arm, row in arms.items():
            rs = [r for r in runs if r["arm"] == arm]
            lines.append(f"| {row} | " + " | ".join(mean(rs, split, key) for _, key in cols) + " |")
        lines.append("")
    if INFNET_PROBE_EPOCHS[task]:
        at = {INFNET_PRETRAIN_EPOCHS: "base", **{e: f"as_run_e{e}" for e in INFNET_PROBE_EPOCHS[task]},
              last: "as_run"}
        lines += ["## The as-run arm, epoch by epoch", "",
                  f"Epoch {INFNET_PRETRAIN_EPOCHS}: the base; epochs {', '.join(map(str, INFNET_PROBE_EPOCHS[task]))}"
                  f": forks of it stopped there (the same run as the as-run arm, to an earlier step: the checks say "
                  f"whether their curves are the arm's); {last}: the arm.", "",
                  f"| epoch | valid: A{' F1' if f1 else ''} | valid: argmin E{' F1' if f1 else ''} | train: A | "
                  "train: argmin E | train: argmin E, unary part | "
                  "train: F | train: F at E's errors (%) | train: gold < A (%) | train: E gap gold | train: E gap A | "
                  "train: E gap A relaxed | mean abs W |", "|---" * 13 + "|"]
        for epoch, arm in at.items():
            rs = [r for r in runs if r["arm"] == arm]
            lines.append(f"| {epoch} | {mean(rs, 'valid', key_A)} | {mean(rs, 'valid', key_E)} | "
                         f"{mean(rs, 'train', 'acc_A')} | {mean(rs, 'train', 'acc_E')} | "
                         f"{mean(rs, 'train', 'acc_E_unary')} | {mean(rs, 'train', 'acc_F')} | "
                         f"{mean(rs, 'train', 'F_at_E_errors')} | {mean(rs, 'train', 'gold_below_A')} | "
                         f"{mean(rs, 'train', 'gap_gold')} | {mean(rs, 'train', 'gap_A')} | "
                         f"{mean(rs, 'train', 'gap_A_relaxed')} | {mean(rs, 'train', 'transition_abs', 3)} |")
        lines.append("")
    swaps = [r for r in runs if "swap" in r]
    if swaps:
        groups = [k.removeprefix("back.") for k in swaps[0]["swap"]["train"] if k.startswith("back.")]
        names = ["run", "base", *(f"{w}.{g}" for g in groups for w in ("back", "only"))]
        lines += ["## Which of the energy's parameters moved its minimum", "",
                  "Token accuracy of the energy's minimum (Viterbi), the run's parameters swapped part by part with "
                  "its base's (the same seed at the end of pretraining): **back**: the run with that part put back to "
                  "the base's; **only**: the base with that part alone moved to the run's. Parts: the word vectors, "
                  "the BiLSTM, the unary scores' layer, the transition scores (`ENERGY_GROUPS` in "
                  "`scripts/energy_probe.py`). Mean ± sd over seeds.", "",
                  "| arm (epoch) | split | the run | the base | "
                  + " | ".join(f"{g} back | only {g}" for g in groups) + " |", "|---" * (2 + len(names)) + "|"]
        swapped = {arm: rs for arm in INFNET_SWAP_ARMS if (rs := [r for r in swaps if r["arm"] == arm])}
        for arm, rs in swapped.items():
            for split in ("train", "valid"):
                values = [[r["swap"][split][name] for r in rs] for name in names]
                lines.append(f"| {arm} ({rs[0]['epoch']}) | {split} | " + " | ".join(map(mean_sd, values)) + " |")
        lines += ["", "## How far each part moved, in steps of the learning rate", "",
                  "Per coordinate of each part, |φ_run − φ_base| / (lr × the method steps between the two states): "
                  "the mean and the largest. Adam's step is about lr a coordinate where the gradient keeps its sign "
                  "and size, so the largest is at most about 1 unless the steps were enlarged; the energy's one "
                  "optimizer goes on from pretraining into the method phase, and moments from pretraining that are "
                  "small beside the method's gradients would enlarge its first steps (up to ~1/√(1 − β₂) = 32 times "
                  "at β₂ = 0.999). The transition scores have no moments from pretraining (it trains the unary part "
                  "alone). Mean ± sd over seeds.", "",
                  "| arm (epoch) | method steps | " + " | ".join(f"{g}: mean | {g}: largest" for g in groups) + " |",
                  "|---" * (2 + 2 * len(groups)) + "|"]
        for arm, rs in swapped.items():
            values = [[r["swap"]["train"][f"step_{s}.{g}"] for r in rs] for g in groups for s in ("mean", "max")]
            lines.append(f"| {arm} ({rs[0]['epoch']}) | {rs[0]['swap']['train']['steps_between']:,} | "
                         + " | ".join(mean_sd(v, 3) for v in values) + " |")
        lines.append("")
    off = [f"{r['arm']}-{r['seed']}" for r in runs if abs(r["probe"]["valid"][key_A] - r["valid_reported"]) > 1e-6]
    full = {r["seed"]: r["valid_curve"] for r in runs if r["arm"] == "as_run"}
    stray = [f"{r['arm']}-{r['seed']}" for r in runs if r["arm"].startswith("as_run_e")
             and [round(v, 2) for v in r["valid_curve"]] != [round(v, 2) for v in full[r["seed"]][:r["epoch"]]]]
    lines += ["## Checks", "",
              f"- The probe's valid {metric} of A equals each run's last evaluation (its `history.csv`): "
              + (f"**not** for {', '.join(off)}" if off else f"all {len(runs)} runs") + "."]
    if INFNET_PROBE_EPOCHS[task]:
        lines.append("- Each stopped fork's valid curve equals the as-run arm's to its epoch (two decimals): "
                     + (f"**not** for {', '.join(stray)}" if stray else "all") + ".")
    return "\n".join(lines) + "\n"


ABLATIONS = {"citation-lambda": citation_lambda, "citation-energies": citation_energies,
             "vae-direct-anneal": vae_direct_anneal, "sorting-sigma-lr": sorting_sigma_lr,
             **{f"{task}-infnet": functools.partial(infnet_ablation, task) for task in INFNET_TABLES},
             **{f"{task}-infnet-energies": functools.partial(infnet_energies, task) for task in INFNET_TABLES}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(ABLATIONS))
    parser.add_argument("--only", choices=["summary"], help="run nothing: the page from the completed runs")
    parser.add_argument("--seeds", help="the InfNet ablations: these seeds alone (comma-separated; default "
                        f"{','.join(map(str, INFNET_SEEDS))})")
    args = parser.parse_args(argv)
    if args.seeds and not args.name.endswith("-infnet"):
        parser.error("--seeds: the InfNet ablations only")
    kw = {"seeds": tuple(int(s) for s in args.seeds.split(","))} if args.seeds else {}
    ABLATIONS[args.name](args.only == "summary", **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())

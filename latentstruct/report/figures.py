"""Run records -> the seed papers' figures (PNG), e.g. seed 001's Figures 2 and 3 on the synthetic clusters.

Runs are selected from their records with :func:`latentstruct.report.tables.load_runs` (never from file names);
only completed runs are drawn. Figures are built on the Agg canvas directly: no display, no pyplot state.

    python -m latentstruct.report.figures learning-curves --runs multirun/ --out results/spigot/learning_curves.png
    python -m latentstruct.report.figures inner-steps --runs multirun/ --out results/spigot/inner_steps.png
    python -m latentstruct.report.figures setting-curves --spec experiments/direct/sorting.yaml --metric test/acc \
        --runs multirun/direct_sorting --out results/direct/sorting.png
    python -m latentstruct.report.figures row-curves --spec experiments/energy/mlc.yaml --metric valid/acc \
        --runs multirun/energy_mlc --out results/energy/mlc_curves.png

(``python -m latentstruct.figures`` is the same command.)
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from latentstruct.report.tables import (
    CENTRE_LABELS,
    aggregate,
    build_table,
    filter_runs,
    load_runs,
    load_spec,
    provenance,
)

__all__ = ["SPEC_FIGURES", "learning_curves", "inner_steps", "setting_curves", "row_curves", "main"]

# The figures drawn from a table spec's rows and settings: they take --spec and --metric.
SPEC_FIGURES = ("setting-curves", "row-curves")

_LABELS = {
    "synthetic_marginals": "Softmax",
    "synthetic_sparsemap": "Sparsemax",
    "synthetic_ste_s": "STE-S",
    "synthetic_ste_i": "STE-I",
    "synthetic_spigot": "SPIGOT",
    "synthetic_spigot_ce": "SPIGOT-CE",
    "synthetic_spigot_eg": "SPIGOT-EG",
}
_PANELS = (("test/acc", "Test accuracy"), ("test/v_measure", "Test V-measure"))
_INNER = ("synthetic_ste_i", "synthetic_spigot", "synthetic_spigot_ce", "synthetic_spigot_eg")


def _completed(runs_root, num_clusters: int, where: dict | None) -> pd.DataFrame:
    runs = runs_root if isinstance(runs_root, pd.DataFrame) else load_runs(runs_root)
    if runs.empty:
        raise ValueError(f"no run records (metrics.json) under {runs_root}")
    return filter_runs(runs[runs["completed"]], {"dataset.num_clusters": num_clusters, **(where or {})})


def _save(fig: Figure, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(out))
    return out


def learning_curves(runs_root, out, experiments=("synthetic_marginals", "synthetic_ste_i", "synthetic_spigot",
                                                 "synthetic_spigot_ce"), num_clusters: int = 10,
                    where: dict | None = None) -> Path:
    """Test accuracy and V-measure against training step (seed 001, Figure 2).

    One line per experiment (``choices.experiment``): the median over seeds of each run's ``history.csv`` at
    every evaluation step, with a shaded min–max band. ``runs_root``: a directory or a run frame; ``where``:
    an extra flat-key match (e.g. ``{"estimator.steps": 1}``) when other sweeps share the directory.
    """
    runs = _completed(runs_root, num_clusters, where)
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    drawn = 0
    for exp in experiments:
        paths = [Path(d) / "history.csv" for d in filter_runs(runs, {"choices.experiment": exp})["run_dir"]]
        frames = [pd.read_csv(p) for p in paths if p.is_file()]
        if not frames:
            continue
        drawn += 1
        history = pd.concat(frames)
        for ax, (metric, _) in zip(axes, _PANELS, strict=True):
            stats = history.dropna(subset=[metric]).groupby("step")[metric].agg(["median", "min", "max"])
            label = f"{_LABELS.get(exp, exp)} (n={len(frames)})"
            (line,) = ax.plot(stats.index, stats["median"], label=label)
            ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.2)
    if not drawn:
        raise ValueError(f"no completed run with a history.csv for {list(experiments)} and K={num_clusters}")
    for ax, (_, title) in zip(axes, _PANELS, strict=True):
        ax.set(xlabel="training step", ylabel=title, title=f"{title} (K={num_clusters})")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(fig, out)


def inner_steps(runs_root, out, num_clusters: int = 10, experiments=_INNER,
                where: dict | None = None) -> pd.DataFrame:
    """Test accuracy and V-measure against the number of pull-back steps k (seed 001, Figure 3).

    For each (experiment, ``estimator.steps``) the ``estimator.eta`` with the best median ``valid/acc`` over
    seeds is chosen (ties: the smallest η); its test metrics are drawn as median ± standard error. Also writes
    a Markdown companion (``out`` with suffix ``.md``). Returns one line per (method, k): eta, acc, acc_err,
    v_measure, v_measure_err, n_runs. ``where``: an extra flat-key match, as in :func:`learning_curves`.
    """
    runs = _completed(runs_root, num_clusters, where)
    # A point is drawn only when every η of the sweep's grid completed: a partial search would flatter it.
    grid = sorted(float(e) for e in runs["estimator.eta"].dropna().unique()) if "estimator.eta" in runs else []
    all_k = sorted(runs["estimator.steps"].dropna().unique()) if "estimator.steps" in runs else []
    picked, missing = [], []
    for exp in experiments:
        sel = filter_runs(runs, {"choices.experiment": exp})
        if sel.empty or "estimator.steps" not in sel or "metric.valid/acc" not in sel:
            missing.append(f"{_LABELS.get(exp, exp)}: no completed run")
            continue
        missing += [f"{_LABELS.get(exp, exp)}, k={k}: no completed run"
                    for k in all_k if k not in set(sel["estimator.steps"])]
        for k, at_k in sel.groupby("estimator.steps"):
            valid = at_k.groupby("estimator.eta")["metric.valid/acc"].median().dropna()
            done = sorted(float(e) for e in valid.index)
            if done != grid:
                missing.append(f"{_LABELS.get(exp, exp)}, k={k}: η completed {done} of {grid}")
                continue
            best = valid.idxmax()
            chosen = filter_runs(at_k, {"estimator.eta": best})
            acc, acc_err = aggregate(chosen["metric.test/acc"])
            vm, vm_err = aggregate(chosen["metric.test/v_measure"])
            picked.append({"method": _LABELS.get(exp, exp), "k": k, "eta": best, "acc": acc,
                           "acc_err": acc_err, "v_measure": vm, "v_measure_err": vm_err,
                           "n_runs": len(chosen)})
    n_seeds = runs["seed"].nunique() if "seed" in runs else 0
    if not picked:
        raise ValueError(f"no completed run of {list(experiments)} with estimator.steps and estimator.eta "
                         f"for K={num_clusters}")
    table = pd.DataFrame(picked)
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    panels = (("acc", "Test accuracy"), ("v_measure", "Test V-measure"))
    for ax, (column, title) in zip(axes, panels, strict=True):
        for method, lines in table.groupby("method", sort=False):
            ax.errorbar(lines["k"], lines[column], yerr=lines[f"{column}_err"], marker="o", capsize=3,
                        label=method)
            for _, p in lines.iterrows():
                ax.annotate(f"η={p.eta:g}", (p.k, p[column]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
        ax.set(xlabel="pull-back steps k", ylabel=title,
               title=f"{title} (K={num_clusters}, best η per k, {n_seeds} seed{'s' * (n_seeds > 1)})")
        ax.set_xticks(sorted(table["k"].unique()))
        ax.grid(alpha=0.3)
    axes[0].legend()
    out = _save(fig, out)
    rows = [f"| {p.method} | {p.k} | {p.eta:g} | {p.acc:.2f} ± {p.acc_err:.2f} | "
            f"{p.v_measure:.2f} ± {p.v_measure_err:.2f} | {p.n_runs} |" for p in table.itertuples()]
    used = pd.concat([filter_runs(runs, {"choices.experiment": e}) for e in experiments])
    out.with_suffix(".md").write_text("\n".join([
        f"# Pull-back steps k (K={num_clusters}); η chosen by median valid/acc", "",
        *provenance(used, "make spigot-inner-steps"), "",
        "Test metrics of the chosen η: median ± standard error over n seeds.", "",
        "| method | k | η | test acc | V-measure | n |", "|---|---|---|---|---|---|", *rows,
        *(["", "Not drawn (η grid incomplete; rerun the target to finish them):", "",
           *[f"- {m}" for m in missing]] if missing else [])]) + "\n")
    return table


def setting_curves(spec_path, runs_root, metric: str, out) -> Path:
    """One line per row of a table spec: ``metric`` (centre ± error, the spec's ``aggregate``) against its settings
    in the spec's order (e.g. the sorting table's d; settings without a completed run are left out), with the
    paper's numbers dashed where the spec has them."""
    spec = spec_path if isinstance(spec_path, dict) else load_spec(spec_path)
    names = {m["name"]: m.get("label", m["name"]) for m in spec["metrics"]}
    if metric not in names:
        raise ValueError(f"{metric!r} is not a metric of the spec {spec['table']} ({', '.join(names)})")
    df = build_table(spec, runs_root)
    df = df[(df["metric"] == metric) & (df["n_runs"] > 0)]
    if df.empty:
        raise ValueError(f"no completed run for {metric} in any cell of {spec['table']}")
    order = [s["name"] for s in spec["settings"] if s["name"] in set(df["setting"])]  # settings with runs only
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for row in spec["rows"]:
        cells = df[df["row"] == row["name"]]
        if cells.empty:
            continue
        x = [order.index(s) for s in cells["setting"]]
        n = f"n={cells['n_runs'].min()}" + (f"-{cells['n_runs'].max()}" if cells["n_runs"].nunique() > 1 else "")
        line = ax.errorbar(x, cells["ours"], yerr=cells["ours_err"], marker="o", capsize=3,
                           label=f"{row.get('label', row['name'])} ({n})")
        if cells["paper"].notna().any():
            ax.plot(x, cells["paper"], linestyle="--", marker="x", color=line.lines[0].get_color())
    ax.set_xticks(range(len(order)), order, rotation=30 if len(order) > 6 else 0)
    if df["paper"].notna().any():
        ax.plot([], [], linestyle="--", marker="x", color="grey", label="paper (dashed)")
    ax.set(ylabel=f"{names[metric]} ({CENTRE_LABELS[spec.get('aggregate', 'median_se')]})",
           title="\n".join(textwrap.wrap(spec.get("title", ""), 90)))
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def row_curves(spec_path, runs_root, metric: str, out) -> pd.DataFrame:
    """Training curves of a table spec's runs: a panel per setting (those with completed runs), a line per row —
    ``metric`` (a column of the runs' ``history.csv``, e.g. ``valid/acc``) against the epoch, the median over the
    cell's runs with a shaded min–max band. Shows what a table's single number hides: where a method peaks,
    overfits or collapses, and where a pretraining phase ends. Returns the drawn curves (``setting``, ``row``,
    ``n_runs``, the epoch or step, ``median``, ``min``, ``max``)."""
    spec = spec_path if isinstance(spec_path, dict) else load_spec(spec_path)
    runs = runs_root if isinstance(runs_root, pd.DataFrame) else load_runs(runs_root)
    runs = runs[runs["completed"]] if "completed" in runs else runs
    panels = []
    for setting in spec["settings"]:
        lines = []
        for row in spec["rows"]:
            cell = filter_runs(filter_runs(runs, row.get("match")), setting.get("match"))
            frames = [pd.read_csv(p) for p in (Path(d) / "history.csv" for d in cell.get("run_dir", []))
                      if p.is_file()]
            frames = [f for f in frames if metric in f]
            if frames:
                history = pd.concat(frames)
                x = "epoch" if "epoch" in history else "step"
                stats = history.dropna(subset=[metric]).groupby(x)[metric].agg(["median", "min", "max"])
                lines.append((row, len(frames), x, stats))
        if lines:
            panels.append((setting["name"], lines))
    if not panels:
        raise ValueError(f"no completed run with {metric} in its history.csv in any cell of {spec['table']}")
    fig = Figure(figsize=(6.5 * len(panels), 4.8))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, lines) in zip(axes, panels, strict=True):
        for row, n, _, stats in lines:
            (line,) = ax.plot(stats.index, stats["median"], label=f"{row.get('label', row['name'])} (n={n})")
            ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.15)
        ax.set(xlabel=lines[0][2], ylabel=metric, title=name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(f"{metric} by epoch, the runs of: {spec.get('title', spec['table'])}", 110)),
                 fontsize=9)
    _save(fig, out)
    return pd.concat([stats.reset_index().assign(setting=name, row=row["name"], n_runs=n)
                      for name, lines in panels for row, n, _, stats in lines], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    """CLI: draw one figure from the run records under ``--runs``."""
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.figures",
                                     description="Draw a paper figure (PNG) from run records.")
    parser.add_argument("figure", choices=["learning-curves", "inner-steps", "setting-curves", "row-curves"],
                        help="learning-curves: seed 001 Figure 2; inner-steps: Figure 3 (+ a .md table); "
                             "setting-curves: a table spec's --metric against its settings, a line per row; "
                             "row-curves: a spec's runs' --metric (a history.csv column) against the epoch, a panel "
                             "per setting, a line per row")
    parser.add_argument("--runs", required=True, help="directory searched recursively for run records")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--num-clusters", type=int, default=10,
                        help="dataset.num_clusters of the runs to draw (default 10)")
    parser.add_argument("--spec", help="setting-curves, row-curves: the table spec (e.g. "
                                       "experiments/direct/sorting.yaml)")
    parser.add_argument("--metric", help="setting-curves: one of the spec's metrics (e.g. test/acc); row-curves: a "
                                         "history.csv column (e.g. valid/acc)")
    args = parser.parse_args(argv)
    if args.figure in SPEC_FIGURES and not (args.spec and args.metric):
        parser.error(f"{args.figure} needs --spec and --metric")
    try:
        if args.figure == "setting-curves":
            setting_curves(args.spec, args.runs, args.metric, args.out)
        elif args.figure == "row-curves":
            row_curves(args.spec, args.runs, args.metric, args.out)
        else:
            draw = learning_curves if args.figure == "learning-curves" else inner_steps
            draw(args.runs, args.out, num_clusters=args.num_clusters)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

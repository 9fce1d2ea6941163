"""Run records -> the seed papers' figures (PNG), e.g. seed 001's Figures 2 and 3 on the synthetic clusters.

Runs are selected from their records with :func:`latentstruct.report.tables.load_runs` (never from file names);
only completed runs are drawn. Figures are built on the Agg canvas directly: no display, no pyplot state.

    python -m latentstruct.report.figures learning-curves --runs multirun/ --out results/spigot/learning_curves.png
    python -m latentstruct.report.figures inner-steps --runs multirun/ --out results/spigot/inner_steps.png
    python -m latentstruct.report.figures setting-curves --spec experiments/direct/sorting.yaml --metric test/acc \
        --runs multirun/direct_sorting --out results/direct/sorting.png
    python -m latentstruct.report.figures row-curves --spec experiments/energy/mlc.yaml --metric valid/acc \
        --runs multirun/energy_mlc --out results/energy/mlc_curves.png
    python -m latentstruct.report.figures redraw results/energy/mlc_curves.data.json
    python -m latentstruct.report.figures from-table --spec experiments/direct/knn.yaml

Every figure is first described as data — its panels, each a list of series (the points drawn, with their band or error
bars), its axis labels and the phase boundaries of its runs — then drawn from that description by :func:`render`; the
description is written beside the PNG as ``<name>.data.json``, so ``redraw`` redraws a committed figure without its run
records (``from-table`` rebuilds the description of a figure drawn from a table's cells from the committed table
itself). Legends go below the axes (one for all panels), never over the data. Where the runs have ``trainer.phases``, a
dotted line marks each phase boundary (e.g. ``pretraining | method``), read from the runs' configurations.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from latentstruct.report import status
from latentstruct.report.tables import (
    CENTRE_LABELS,
    aggregate,
    build_table,
    filter_runs,
    load_runs,
    load_spec,
    output_path,
    parse_cells,
    parse_provenance,
    provenance,
)

__all__ = ["SPEC_FIGURES", "NothingToDraw", "ROW_CURVE_AXES", "learning_curves", "inner_steps", "setting_curves",
           "row_curves", "render",
           "redraw", "from_table", "main"]

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
_PANELS = (("test/acc", "test accuracy (%)"), ("test/v_measure", "test V-measure (%)"))
_X_LABELS = {"step": "training step", "epoch": "epoch",
             "seconds": "training time (s): epoch × the run's seconds per epoch, evaluations excluded"}
ROW_CURVE_AXES = ("auto", "epoch", "step", "seconds")
_INNER = ("synthetic_ste_i", "synthetic_spigot", "synthetic_spigot_ce", "synthetic_spigot_eg")


def _color(experiment: str, experiments) -> int:
    """A synthetic method's colour index, the same in every figure (others: after them, in the figure's order)."""
    known = list(_LABELS)
    return known.index(experiment) if experiment in known else len(known) + list(experiments).index(experiment)


def _completed(runs_root, num_clusters: int, where: dict | None) -> pd.DataFrame:
    runs = runs_root if isinstance(runs_root, pd.DataFrame) else load_runs(runs_root)
    if runs.empty:
        raise ValueError(f"no run records (metrics.json) under {runs_root}")
    return filter_runs(runs[runs["completed"]], {"dataset.num_clusters": num_clusters, **(where or {})})


# ----------------------------------------------------------------------------------------------- the drawn data


def _numbers(values) -> list[float | None]:
    """Plain floats for JSON, ``None`` for a missing value."""
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]


def _series(label: str | None, color: int, x, y, *, band=None, err=None, notes=None, dashed: bool = False) -> dict:
    """One drawn line: ``band`` = (low, high) is shaded, ``err`` drawn as error bars, ``notes`` written beside the
    points; a series without a label is left out of the legend (e.g. the paper's dashed line of a row)."""
    series = {"label": label, "color": color, "x": _numbers(x), "y": _numbers(y)}
    if band is not None:
        series["low"], series["high"] = _numbers(band[0]), _numbers(band[1])
    if err is not None:
        series["err"] = _numbers(err)
    if notes is not None:
        series["notes"] = list(notes)
    if dashed:
        series["dashed"] = True
    return series


def _runs_per_line(counts) -> str:
    low, high = min(counts), max(counts)
    return f"n = {low}{f'-{high}' if high > low else ''} run{'s' * (high > 1)} per line"


def _phase_label(before: dict, after: dict) -> str:
    """``pretraining | method`` for two phases over the same split (the energy tasks: phase 0 pretrains), else the
    splits the phases train on (the VAE: ``labelled | train``)."""
    return "pretraining | method" if before["split"] == after["split"] else f"{before['split']} | {after['split']}"


def _phase_marks(runs: pd.DataFrame, histories: list[pd.DataFrame], x: str) -> list[dict]:
    """The phase boundaries of ``runs`` (their ``trainer.phases``) on the x axis ``x``: in epochs, the phases' summed
    epochs; in steps, the step of that epoch in the run's ``history.csv``. One mark per distinct boundary."""
    marks = {}
    for phases, history in zip(runs.get("trainer.phases", [None] * len(runs)), histories, strict=True):
        if not isinstance(phases, list) or len(phases) < 2:
            continue
        for i, epoch in enumerate(np.cumsum([p["epochs"] for p in phases])[:-1]):
            if x == "epoch":
                at = float(epoch)
            elif "epoch" in history and "step" in history:
                at = float(np.interp(epoch, history["epoch"], history["step"]))
            else:
                continue
            marks.setdefault(round(at, 6), _phase_label(phases[i], phases[i + 1]))
    return [{"x": at, "label": label} for at, label in sorted(marks.items())]


def _histories(runs: pd.DataFrame, metric: str) -> list[tuple[pd.Series, pd.DataFrame]]:
    """(run, its ``history.csv``) for each of ``runs`` whose history has the column ``metric``."""
    found = [(run, pd.read_csv(Path(run["run_dir"]) / "history.csv")) for _, run in runs.iterrows()
             if (Path(run["run_dir"]) / "history.csv").is_file()]
    return [(run, history) for run, history in found if metric in history]


def _curve(found: list[tuple[pd.Series, pd.DataFrame]], metric: str, x: str) -> tuple[pd.DataFrame, list[dict]]:
    """The median, min and max of ``metric`` per ``x`` (``step`` or ``epoch``) over the histories ``found``, and the
    marks of their runs' phase boundaries. ``seconds``: per epoch, at the median over the runs of epoch × the run's
    ``seconds_per_epoch`` (its record: training steps only, so evaluations do not count)."""
    if x == "seconds":
        timed = [h.assign(seconds=h["epoch"] * float(run["seconds_per_epoch"])) for run, h in found]
        history = pd.concat(timed).dropna(subset=[metric])
        stats = history.groupby("epoch").agg(seconds=("seconds", "median"), median=(metric, "median"),
                                             min=(metric, "min"), max=(metric, "max")).set_index("seconds")
        return stats, []
    history = pd.concat([h for _, h in found])
    stats = history.dropna(subset=[metric]).groupby(x)[metric].agg(["median", "min", "max"])
    return stats, _phase_marks(pd.DataFrame([run for run, _ in found]), [h for _, h in found], x)


def _legend_columns(labels: list[str], width: float) -> int:
    """As many legend columns as fit the figure's width (inches) at font size 8 (~0.065 in per character)."""
    column = 0.065 * max(map(len, labels)) + 0.6
    return max(1, min(len(labels), int(width // column)))


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_OVERLAP = 0.01  # two lines within this share of the panel's height at every common x: one hides the other


def _overlapping(series: list[dict], span: float) -> list[list[int]]:
    """Groups (of two or more, by index) of the series that lie within :data:`_OVERLAP` of the panel's height of
    each other at every x they share: drawn one over the other, all but the last would be hidden."""
    def points(s: dict) -> tuple[np.ndarray, np.ndarray]:
        keep = [(x, y) for x, y in zip(s["x"], s["y"], strict=True) if x is not None and y is not None]
        xy = np.array(sorted(keep), dtype=float).reshape(-1, 2)
        return xy[:, 0], xy[:, 1]

    def close(a: dict, b: dict) -> bool:  # at a's points within b's x range, b interpolated
        (xa, ya), (xb, yb) = points(a), points(b)
        inside = (xa >= xb.min()) & (xa <= xb.max()) if len(xb) else np.zeros_like(xa, dtype=bool)
        if inside.sum() < 2:
            return False
        return bool(np.all(np.abs(ya[inside] - np.interp(xa[inside], xb, yb)) <= _OVERLAP * span))

    groups: list[list[int]] = []
    for i, s in enumerate(series):
        if "err" in s or s.get("dashed"):  # drawn with markers already
            continue
        group = next((g for g in groups if close(series[g[0]], s)), None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    return [g for g in groups if len(g) > 1]


def _short(label: str | None) -> str:
    return (label or "?").split(" (")[0].rstrip("*")


def render(data: dict) -> Figure:
    """Draw a figure description (the ``.data.json`` written beside each PNG): a panel per entry of ``panels``, each
    with its ``series``, axis labels, x ticks and phase marks; one legend below the panels, never over the data.

    ``data``: ``figure: curves``, ``title``, optional ``panel_width`` / ``height`` (inches, per panel),
    ``columns`` (panels per row of a grid; default all in one row) and ``paper_dashed`` (a legend entry for the
    paper's dashed lines); a panel: ``title``, ``xlabel``, ``ylabel``, optional ``xticks`` and
    ``xticklabels``, ``phases`` (``[{x, label}]``) and ``series`` (:func:`_series`: ``label``, ``color`` (the index
    of a matplotlib cycle colour), ``x``, ``y``, optional ``low`` / ``high``, ``err``, ``notes``, ``dashed``)."""
    if data.get("figure") != "curves":
        raise ValueError(f"not a curves figure description: figure={data.get('figure')!r}")
    panels = data["panels"]
    columns = min(data.get("columns") or len(panels), len(panels))
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(data.get("panel_width", 5.2) * columns, data.get("height", 4.6) * rows),
                 layout="constrained")
    grid = fig.subplots(rows, columns, squeeze=False).flatten()
    for unused in grid[len(panels):]:
        unused.set_axis_off()
    axes = grid[: len(panels)]
    handles: dict[str, object] = {}
    for ax, panel in zip(axes, panels, strict=True):
        ys = [v for s in panel["series"] for v in s["y"] if v is not None]
        span, noted = (max(ys) - min(ys) if ys else 0.0) or 1.0, []
        # lines that coincide get a marker each, at staggered points, and a note says so: none is hidden
        overlaps = _overlapping(panel["series"], span)
        marked = {i: (k, len(g)) for g in overlaps for k, i in enumerate(g)}
        for index, s in enumerate(panel["series"]):
            x, y, color = np.array(s["x"], dtype=float), np.array(s["y"], dtype=float), f"C{s['color']}"
            style = {"color": color, "linestyle": "--" if s.get("dashed") else "-",
                     "marker": ("x" if s.get("dashed") else "o") if "err" in s or s.get("dashed") else None}
            if index in marked and style["marker"] is None:
                k, n = marked[index]
                style.update(marker=_MARKERS[k % len(_MARKERS)], markevery=(k, n), markersize=6,
                             markerfacecolor="none", linewidth=1.2 + 1.2 * (n - 1 - k))
            if "err" in s:
                artist = ax.errorbar(x, y, yerr=np.array(s["err"], dtype=float), capsize=3, **style)
            else:
                (artist,) = ax.plot(x, y, **style)
            if "low" in s:
                ax.fill_between(x, np.array(s["low"], dtype=float), np.array(s["high"], dtype=float), color=color,
                                alpha=0.15, linewidth=0)
            for xi, yi, note in zip(x, y, s.get("notes", []), strict=False):
                # a note within 4% of the panel's height of one already written at this x goes below its point
                near = any(xj == xi and abs(yj - yi) < 0.04 * span for xj, yj in noted)
                noted.append((xi, yi))
                ax.annotate(note, (xi, yi), textcoords="offset points", xytext=(4, -11 if near else 4), fontsize=7,
                            color=color)
                ax.margins(x=0.08, y=0.08)  # room for the notes inside the axes
            if s.get("label"):
                handles.setdefault(s["label"], artist)
        for row, group in enumerate(overlaps):  # one note per group, stacked from the bottom
            names = " = ".join(_short(panel["series"][i].get("label")) for i in group)
            ax.text(0.01, 0.01 + 0.055 * row, f"overlapping (within {_OVERLAP * span:.2g}): {names}",
                    transform=ax.transAxes, fontsize=7, color="0.25", va="bottom", ha="left", wrap=True)
        for mark in panel.get("phases", []):
            ax.axvline(mark["x"], color="0.35", linestyle=":", linewidth=1.2)
            ax.annotate(mark["label"], (mark["x"], 1), xycoords=("data", "axes fraction"), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7, color="0.25")
        if "xticks" in panel:
            ax.set_xticks(panel["xticks"], panel.get("xticklabels"), rotation=30 if len(panel["xticks"]) > 6 else 0)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and epochs: whole numbers
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        ax.set_title(panel.get("title", ""), fontsize=9, pad=14 if panel.get("phases") else 6)
        ax.grid(alpha=0.3)
    if data.get("paper_dashed"):
        (handles["paper (dashed)"],) = axes[0].plot([], [], linestyle="--", marker="x", color="grey")
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=8, frameon=False,
                   ncol=_legend_columns(list(handles), fig.get_figwidth()))
    if data.get("title"):
        fig.suptitle("\n".join(textwrap.wrap(data["title"], int(12 * fig.get_figwidth()))), fontsize=9)
    return fig


class NothingToDraw(ValueError):
    """A figure whose every line would be invisible (e.g. one evaluation per run): it is not written."""


def _drawable(series: dict) -> bool:
    """Whether a series leaves a mark: a line of two finite points or more, or one marked point (error bars)."""
    finite = sum(1 for v in series["y"] if v is not None and math.isfinite(v))
    return finite >= 2 or (finite >= 1 and ("err" in series or series.get("dashed")))


def _write(data: dict, out: str | Path) -> Path:
    """Draw ``data`` into the PNG ``out`` and write it beside as ``<name>.data.json`` (what :func:`redraw` reads);
    :class:`NothingToDraw` (nothing written) when no series would leave a mark."""
    series = [s for panel in data.get("panels", []) for s in panel["series"]]
    if not any(_drawable(s) for s in series):
        points = max((len(s["y"]) for s in series), default=0)
        raise NothingToDraw(f"{out} not written: nothing to draw ({len(series)} line(s), at most {points} point(s) "
                            "each: one evaluation per run draws no line; evaluate more often or train longer)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(render(data)).print_png(str(out))
    out.with_suffix(".data.json").write_text(json.dumps(data, ensure_ascii=False) + "\n")
    return out


def redraw(data_file: str | Path, out: str | Path | None = None) -> Path:
    """Redraw a figure from its ``.data.json`` into ``out`` (default: the PNG beside it): the curves of this module,
    a dependency tree of :func:`latentstruct.report.drawing.draw_tree` or the ListOps trees figure."""
    data_file = Path(data_file)
    data = json.loads(data_file.read_text())
    out = Path(out) if out else data_file.with_name(data_file.name.removesuffix(".data.json") + ".png")
    if data.get("figure") == "dependency-tree":
        from latentstruct.report.drawing import draw_tree

        return draw_tree(data["tokens"], data["heads"], out, data.get("title", ""))
    if data.get("figure") == "listops-trees":
        from latentstruct.report.listops import draw_figure

        return draw_figure(data, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(render(data)).print_png(str(out))
    return out


# ---------------------------------------------------------------------------------------------------- figures


def learning_curves(runs_root, out, experiments=("synthetic_marginals", "synthetic_ste_i", "synthetic_spigot",
                                                 "synthetic_spigot_ce"), num_clusters: int = 10,
                    where: dict | None = None) -> Path:
    """Test accuracy and V-measure against training step (seed 001, Figure 2).

    One line per experiment (``choices.experiment``): the median over seeds of each run's ``history.csv`` at
    every evaluation step, with a shaded min–max band. ``runs_root``: a directory or a run frame; ``where``:
    an extra flat-key match (e.g. ``{"task.estimator.steps": 1}``) when other sweeps share the directory.
    """
    runs = _completed(runs_root, num_clusters, where)
    panels = [{"title": f"{title} (K={num_clusters})", "xlabel": _X_LABELS["step"], "ylabel": title, "series": [],
               "phases": []} for _, title in _PANELS]
    counts = []
    for exp in experiments:
        for panel, (metric, _) in zip(panels, _PANELS, strict=True):
            found = _histories(filter_runs(runs, {"choices.experiment": exp}), metric)
            if not found:
                continue
            (stats, marks), n = _curve(found, metric, "step"), len(found)
            label, color = _LABELS.get(exp, exp), _color(exp, experiments)
            band = (stats["min"], stats["max"])
            panel["series"].append(_series(label, color, stats.index, stats["median"], band=band))
            panel["phases"] = [*panel["phases"], *(m for m in marks if m not in panel["phases"])]
            counts.append(n)
    if not counts:
        raise ValueError(f"no completed run with a history.csv for {list(experiments)} and K={num_clusters}")
    return _write({"figure": "curves", "panels": panels,
                   "title": f"Median over seeds, shaded min-max ({_runs_per_line(counts)})"}, out)


def inner_steps(runs_root, out, num_clusters: int = 10, experiments=_INNER,
                where: dict | None = None, spec: str | Path | dict | None = None) -> pd.DataFrame:
    """Test accuracy and V-measure against the number of pull-back steps k (seed 001, Figure 3).

    For each (experiment, ``task.estimator.steps``) the ``task.estimator.eta`` with the best median ``valid/acc`` over
    seeds is chosen (ties: the smallest η); its test metrics are drawn as median ± standard error. Also writes
    a Markdown companion (``out`` with suffix ``.md``), opened by the status line of the figure's ``spec`` (e.g.
    ``experiments/spigot/figure3_inner_steps.yaml``) with its JSON sidecar beside it when ``spec`` is given. Returns
    one line per (method, k): eta, acc, acc_err, v_measure, v_measure_err, n_runs. ``where``: an extra flat-key
    match, as in :func:`learning_curves`.
    """
    runs = _completed(runs_root, num_clusters, where)
    # A point is drawn only when every η of the sweep's grid completed: a partial search would flatter it.
    eta = "task.estimator.eta"
    grid = sorted(float(e) for e in runs[eta].dropna().unique()) if eta in runs else []
    all_k = sorted(runs["task.estimator.steps"].dropna().unique()) if "task.estimator.steps" in runs else []
    picked, missing = [], []
    for exp in experiments:
        sel = filter_runs(runs, {"choices.experiment": exp})
        if sel.empty or "task.estimator.steps" not in sel or "metric.valid/acc" not in sel:
            missing.append(f"{_LABELS.get(exp, exp)}: no completed run")
            continue
        missing += [f"{_LABELS.get(exp, exp)}, k={k}: no completed run"
                    for k in all_k if k not in set(sel["task.estimator.steps"])]
        for k, at_k in sel.groupby("task.estimator.steps"):
            valid = at_k.groupby("task.estimator.eta")["metric.valid/acc"].median().dropna()
            done = sorted(float(e) for e in valid.index)
            if done != grid:
                missing.append(f"{_LABELS.get(exp, exp)}, k={k}: η completed {done} of {grid}")
                continue
            best = valid.idxmax()
            chosen = filter_runs(at_k, {"task.estimator.eta": best})
            acc, acc_err = aggregate(chosen["metric.test/acc"])
            vm, vm_err = aggregate(chosen["metric.test/v_measure"])
            picked.append({"method": _LABELS.get(exp, exp), "k": k, "eta": best, "acc": acc,
                           "acc_err": acc_err, "v_measure": vm, "v_measure_err": vm_err,
                           "n_runs": len(chosen)})
    n_seeds = runs["seed"].nunique() if "seed" in runs else 0
    if not picked:
        raise ValueError(f"no completed run of {list(experiments)} with task.estimator.steps and task.estimator.eta "
                         f"for K={num_clusters}")
    table = pd.DataFrame(picked)
    colors = {_LABELS.get(exp, exp): _color(exp, experiments) for exp in experiments}
    out = _write(_inner_data(table, num_clusters, n_seeds, colors), out)
    rows = [f"| {p.method} | {p.k} | {p.eta:g} | {p.acc:.2f} ± {p.acc_err:.2f} | "
            f"{p.v_measure:.2f} ± {p.v_measure_err:.2f} | {p.n_runs} |" for p in table.itertuples()]
    used = pd.concat([filter_runs(runs, {"choices.experiment": e}) for e in experiments])
    spec = load_spec(spec) if isinstance(spec, str | Path) else spec
    head = []
    if spec:
        gaps = [f"not drawn: {'; '.join(missing)}"] if missing else []
        found = status.facts(used, status.recorded_keys(spec))
        data = status.sidecar(spec, out.with_suffix(".md"), found, [], gaps=gaps)
        status.write_sidecar(out.with_suffix(".md"), data)
        head = [data["status_line"], ""]
    lines = provenance(used, (spec or {}).get("command", "make spigot-inner-steps"))
    lines = status.annotate(lines, status.protocol(spec)) if spec else lines
    out.with_suffix(".md").write_text("\n".join([
        f"# Pull-back steps k (K={num_clusters}); η chosen by median valid/acc", "", *head, *lines, "",
        "Test metrics of the chosen η: median ± standard error over n seeds.", "",
        *_INNER_HEADER, *rows,
        *(["", "Not drawn (η grid incomplete; rerun the target to finish them):", "",
           *[f"- {m}" for m in missing]] if missing else [])]) + "\n")
    return table


_INNER_HEADER = ("| method | k | η | test acc | V-measure | n |", "|---|---|---|---|---|---|")


def _inner_data(table: pd.DataFrame, num_clusters: int, n_seeds: int, colors: dict[str, int]) -> dict:
    """Figure 3's description: a panel per metric, a line per method of ``table`` (one line per (method, k): eta,
    acc, acc_err, v_measure, v_measure_err), the chosen η written beside each point."""
    panels = []
    for column, (_, title) in zip(("acc", "v_measure"), _PANELS, strict=True):
        series = [_series(method, colors[method], lines["k"], lines[column], err=lines[f"{column}_err"],
                          notes=[f"η={eta:g}" for eta in lines["eta"]])
                  for method, lines in table.groupby("method", sort=False)]
        ks = sorted(table["k"].unique())
        panels.append({"title": f"{title} (K={num_clusters})", "xlabel": "pull-back steps k", "ylabel": title,
                       "xticks": _numbers(ks), "xticklabels": [f"{k:g}" for k in ks], "series": series})
    return {"figure": "curves", "panels": panels,
            "title": f"Median ± s.e. over {n_seeds} seed{'s' * (n_seeds > 1)} at the η chosen per k by "
                     "median valid accuracy"}


def setting_curves(spec_path, runs_root, metric: str, out) -> Path:
    """One line per row of a table spec: ``metric`` (centre ± error, the spec's ``aggregate``) against its settings
    in the spec's order (e.g. the sorting table's d; settings without a completed run are left out), with the
    paper's numbers dashed where the spec has them; a panel per section of the spec where two or more have runs
    (the VAE's MNIST and Fashion-MNIST), so that no line joins two datasets."""
    spec = spec_path if isinstance(spec_path, dict) else load_spec(spec_path)
    return _write(_setting_data(spec, build_table(spec, runs_root), metric), out)


def _setting_data(spec: dict, df: pd.DataFrame, metric: str) -> dict:
    """The description :func:`setting_curves` draws from the long table ``df`` (:func:`tables.build_table`'s
    columns row, setting, metric, ours, ours_err, n_runs, paper)."""
    names = {m["name"]: m.get("label", m["name"]) for m in spec["metrics"]}
    if metric not in names:
        raise ValueError(f"{metric!r} is not a metric of the spec {spec['table']} ({', '.join(names)})")
    df = df[(df["metric"] == metric) & (df["n_runs"] > 0)]
    if df.empty:
        raise ValueError(f"no completed run for {metric} in any cell of {spec['table']}")
    order = [s["name"] for s in spec["settings"] if s["name"] in set(df["setting"])]  # settings with runs only
    # a panel per section of the spec with runs (one dataset each: no line joins two datasets), else one panel
    groups = [(section.get("title"), [name for name in order if name in section["settings"]])
              for section in spec.get("sections") or []]
    groups = [group for group in groups if group[1]]
    if len(groups) < 2:
        groups = [(None, order)]
    panels = []
    for title, names in groups:
        part = df[df["setting"].isin(names)]
        series = []
        for color, row in enumerate(spec["rows"]):
            cells = part[part["row"] == row["name"]]
            if cells.empty:
                continue
            x = [names.index(s) for s in cells["setting"]]
            series.append(_series(row.get("label", row["name"]), color, x, cells["ours"], err=cells["ours_err"]))
            if cells["paper"].notna().any():
                series.append(_series(None, color, x, cells["paper"], dashed=True))
        runs = _runs_per_line(part["n_runs"])
        heads = {name.split(" ", 1)[0] for name in names}  # 'mnist 50', 'mnist 100' under MNIST: '50', '100'
        ticks = [name.split(" ", 1)[1] for name in names] if title and len(heads) == 1 and all(
            " " in name for name in names) else names
        panels.append({"title": f"{title}: {runs}" if title else runs, "ylabel": f"{_axis_label(spec, metric)} "
                       f"({CENTRE_LABELS[spec.get('aggregate', 'median_se')]})", "xticks": list(range(len(names))),
                       "xticklabels": ticks, "series": series})
    return {"figure": "curves", "panels": panels, "title": spec.get("title", ""),
            "panel_width": 7.5 if len(panels) == 1 else 5.0, "paper_dashed": bool(df["paper"].notna().any())}


def _axis_label(spec: dict, metric: str) -> str:
    """``metric`` (``<split>/<name>``) as the spec labels it — its own label, else the label of that name on another
    split — with the split in front unless the label says it, e.g. ``valid/acc`` with the spec's ``{name: test/acc,
    label: example F1 (%)}`` -> ``valid example F1 (%)``."""
    split, _, name = metric.rpartition("/")
    labels = [m.get("label") for m in spec["metrics"] if m["name"] == metric] or [
        m.get("label") for m in spec["metrics"] if m["name"].rpartition("/")[2] == name]
    label = next((text for text in labels if text), None)
    if label is None:
        return metric
    return label if split.lower() in label.lower() else f"{split} {label}".strip()


def row_curves(spec_path, runs_root, metric: str, out, x: str = "auto") -> pd.DataFrame:
    """Training curves of a table spec's runs: a panel per setting (those with completed runs), a line per row —
    ``metric`` (a column of the runs' ``history.csv``, e.g. ``valid/acc``) against the epoch, the median over the
    cell's runs with a shaded min–max band. Shows what a table's single number hides: where a method peaks,
    overfits or collapses, and where a pretraining phase ends (a dotted line where the runs have
    ``trainer.phases``). The y axis names the metric by the spec's label. ``x``: ``epoch``, ``step``, ``seconds``
    (training time: epoch × the run's seconds per epoch, evaluations excluded; seed 003's curves against wall-clock)
    or ``auto`` (epoch where every history has it, else step); ``epoch+seconds``: both, the epoch panels above the
    seconds panels. Returns the drawn curves (``setting``, ``row``, ``n_runs``, the x axis, ``median``, ``min``,
    ``max``)."""
    spec = spec_path if isinstance(spec_path, dict) else load_spec(spec_path)
    runs = runs_root if isinstance(runs_root, pd.DataFrame) else load_runs(runs_root)
    runs = runs[runs["completed"]] if "completed" in runs else runs
    cells = [(setting, color, row, _histories(filter_runs(filter_runs(runs, row.get("match")), setting.get("match")),
                                              metric))
             for setting in spec["settings"] for color, row in enumerate(spec["rows"])]
    cells = [cell for cell in cells if cell[3]]
    axes = x.split("+")
    if any(a not in ROW_CURVE_AXES for a in axes):
        raise ValueError(f"x must be one of {', '.join(ROW_CURVE_AXES)} or two joined by +, got {x!r}")
    if "auto" in axes:  # one axis for all panels
        axes = ["epoch" if all("epoch" in h for *_, found in cells for _, h in found) else "step"]
    panels, curves, columns = [], [], 0
    for axis in axes:
        drawn = 0
        for setting in spec["settings"]:
            series, marks, counts = [], [], []
            for _, color, row, found in (cell for cell in cells if cell[0] is setting):
                stats, row_marks = _curve(found, metric, axis)
                series.append(_series(row.get("label", row["name"]), color, stats.index, stats["median"],
                                      band=(stats["min"], stats["max"])))
                marks += [m for m in row_marks if m not in marks]
                counts.append(len(found))
                curves.append(stats.reset_index().assign(setting=setting["name"], row=row["name"],
                                                         n_runs=len(found)))
            if series:
                panels.append({"title": f"{setting['name']} ({_runs_per_line(counts)})", "xlabel": _X_LABELS[axis],
                               "ylabel": _axis_label(spec, metric), "series": series, "phases": marks})
                drawn += 1
        columns = max(columns, drawn)
    if not panels:
        raise ValueError(f"no completed run with {metric} in its history.csv in any cell of {spec['table']}")
    by = " and by ".join(_X_LABELS[a].split(":")[0] for a in axes)
    title = f"{_axis_label(spec, metric)} by {by}, median and min-max over the runs of: " \
            f"{spec.get('title', spec['table'])}"
    _write({"figure": "curves", "panels": panels, "title": title, "panel_width": 6.5, "columns": columns}, out)
    return pd.concat(curves, ignore_index=True)


REBUILT = "rebuilt from the committed table {}; run records not kept"


def from_table(spec_path: str | Path) -> list[Path]:
    """Redraw the figures of a spec that are drawn from its table's cells — ``setting-curves`` (from the committed
    Markdown table) and ``inner-steps`` (from its ``.md`` companion) — when the run records are gone, e.g. a figure
    committed before :func:`render` existed. The description written beside each PNG says so (``source``). Figures
    drawn from the runs' histories (``learning-curves``, ``row-curves``) cannot be rebuilt this way."""
    spec = load_spec(spec_path)
    steps = [s for s in (spec.get("reproduce") or {}).get("steps") or []
             if s.get("figure") in ("setting-curves", "inner-steps")]
    if not steps:
        raise ValueError(f"{spec_path}: no setting-curves or inner-steps figure among its reproduce steps")
    written = []
    for step in steps:
        if step["figure"] == "setting-curves":
            markdown = Path(output_path(spec))
            cells = pd.DataFrame(parse_cells(markdown.read_text().splitlines(), spec))
            data = _setting_data(spec, cells, step["metric"])
        else:
            markdown = Path(step["out"]).with_suffix(".md")
            lines = markdown.read_text().splitlines()
            num_clusters = int(re.search(r"\(K=(\d+)\)", lines[0])[1])  # its heading, as inner_steps wrote it
            data = _inner_data(_parse_inner(lines), num_clusters, len(parse_provenance(lines)["seeds"]),
                               {label: _color(exp, _INNER) for exp, label in _LABELS.items()})
        data["source"] = REBUILT.format(markdown)
        written.append(_write(data, step["out"]))
    return written


def _parse_inner(lines: list[str]) -> pd.DataFrame:
    """The table of :func:`inner_steps`'s Markdown companion read back (method, k, eta, acc, acc_err, v_measure,
    v_measure_err, n_runs)."""
    start = lines.index(_INNER_HEADER[0]) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        method, k, eta, acc, vm, n = (c.strip() for c in line.strip().strip("|").split(" | "))
        (a, a_err), (v, v_err) = (map(float, c.split(" ± ")) for c in (acc, vm))
        rows.append({"method": method, "k": int(k), "eta": float(eta), "acc": a, "acc_err": a_err, "v_measure": v,
                     "v_measure_err": v_err, "n_runs": int(n)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI: draw one figure from the run records under ``--runs``, or redraw one from its ``.data.json``."""
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.figures",
                                     description="Draw a paper figure (PNG) from run records.")
    parser.add_argument("figure", choices=["learning-curves", "inner-steps", "setting-curves", "row-curves", "redraw",
                                           "from-table"],
                        help="learning-curves: seed 001 Figure 2; inner-steps: Figure 3 (+ a .md table); "
                             "setting-curves: a table spec's --metric against its settings, a line per row; "
                             "row-curves: a spec's runs' --metric (a history.csv column) against the epoch, a panel "
                             "per setting, a line per row; redraw: a figure from the DATA_FILE written beside it; "
                             "from-table: a spec's setting-curves / inner-steps figures from its committed table "
                             "(--spec), without run records")
    parser.add_argument("data_file", nargs="?", help="redraw: a figure's <name>.data.json")
    parser.add_argument("--runs", help="directory searched recursively for run records")
    parser.add_argument("--out", help="PNG file to write (redraw: default the PNG beside DATA_FILE)")
    parser.add_argument("--num-clusters", type=int, default=10,
                        help="dataset.num_clusters of the runs to draw (default 10)")
    parser.add_argument("--spec", help="setting-curves, row-curves, from-table: the table spec (e.g. "
                                       "experiments/direct/sorting.yaml); inner-steps: the figure's spec, whose "
                                       "status line opens its Markdown")
    parser.add_argument("--x", default="auto", help="row-curves: the x axis, " + ", ".join(ROW_CURVE_AXES)
                        + " (seconds: epoch × the run's seconds per epoch), or two joined by + (epoch+seconds: both, "
                          "a row of panels each)")
    parser.add_argument("--metric", help="setting-curves: one of the spec's metrics (e.g. test/acc); row-curves: a "
                                         "history.csv column (e.g. valid/acc)")
    args = parser.parse_args(argv)
    if args.figure == "redraw":
        if not args.data_file:
            parser.error("redraw needs DATA_FILE (a <name>.data.json)")
        print(f"wrote {redraw(args.data_file, args.out)}")
        return 0
    if args.figure == "from-table":
        if not args.spec:
            parser.error("from-table needs --spec")
        try:
            print("\n".join(f"wrote {path}" for path in from_table(args.spec)))
        except (OSError, ValueError) as exc:
            sys.exit(f"error: {exc}")
        return 0
    if not (args.runs and args.out):
        parser.error(f"{args.figure} needs --runs and --out")
    if args.figure in SPEC_FIGURES and not (args.spec and args.metric):
        parser.error(f"{args.figure} needs --spec and --metric")
    try:
        if args.figure == "setting-curves":
            setting_curves(args.spec, args.runs, args.metric, args.out)
        elif args.figure == "row-curves":
            row_curves(args.spec, args.runs, args.metric, args.out, args.x)
        elif args.figure == "inner-steps":
            inner_steps(args.runs, args.out, num_clusters=args.num_clusters, spec=args.spec)
        else:
            learning_curves(args.runs, args.out, num_clusters=args.num_clusters)
    except NothingToDraw as exc:
        print(exc)  # not an error: the reproduction goes on to its other tables
        return 0
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.data.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

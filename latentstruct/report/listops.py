"""ListOps analyses of the trained models' trees, not only their metrics (issue #7; `make table-listops` runs them).

    python -m latentstruct.report.listops self-f1 --runs multirun/listops
    python -m latentstruct.report.listops reference-trees --runs multirun/listops \
        --out results/listops/reference_trees.md
    python -m latentstruct.report.listops figure --runs multirun/listops --out results/listops/trees.png

* ``self-f1`` — the agreement of a method with itself across seeds (Williams et al., 2018; Nangia & Bowman, 2018):
  the runs of one configuration that differ only in ``trainer.seed`` parse the test split, and a run's self-F1 is
  the mean, over the other seeds' runs, of the per-example tree F1 between the two runs' trees (the bracket F1 of
  :func:`latentstruct.data.listops.tree_scores`, whole span excluded; between two binary trees it is symmetric).
  It is written to each run's ``derived.json`` (``self_f1``, ``self_f1_runs``), where ``latentstruct.report.tables``
  reads it as the metric ``derived.self_f1``; a configuration with one run gets no self-F1. Trees are the models'
  MAP / greedy trees of the test split, which each run recorded in its ``report.json`` when it completed
  (``ListOps.report_record``): its final model, so with ``trainer.select=best`` they may come from a later model
  than the reported accuracy (the reduced protocol, ``preset=listops_cpu``, reports the last evaluation, so there
  the two agree). Runs are grouped by their recorded identity (``run.json``).
* ``reference-trees`` — the trees that need no training, on the same test split as the runs: the true trees,
  left- and right-branching trees and random trees (uniformly random merges of adjacent nodes, two independent draws
  for their self-F1), each scored like the models (F1 against the true / left- / right-branching trees, depth),
  next to the numbers Nangia & Bowman (2018) report for their test set.
* ``figure`` — a few test expressions: the true tree above the recorded tree of each method's run (one seed), drawn
  as brackets over the tokens and titled with the method (its row label with ``--spec``); the drawn trees are written
  beside the PNG as ``<name>.data.json`` (``python -m latentstruct.report.figures redraw`` draws them again).

The models are never run here: the tokens and true trees come from the runs' dataset (rebuilt from the
configuration in ``run.json``), the predicted trees from ``report.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from latentstruct.data.listops import left_branching, right_branching, spans_to_trees, tree_scores
from latentstruct.records import REPORT_FILE, RUN_FILE, nested
from latentstruct.report.tables import filter_runs, load_runs, load_spec

__all__ = ["identity", "recorded_trees", "random_trees", "self_f1", "reference_trees", "draw_trees", "trees_figure",
           "draw_figure", "main"]

# The keys of a run's identity that do not make two runs different configurations for the self-F1.
_NOT_IDENTITY = ("trainer.threads", "trainer.seed")
# Nangia & Bowman (2018), test set (the seed's tutorial): F1 vs left / right / true trees, depth; self-F1.
PAPER_REFERENCE_TREES = {
    "true": (41.6, 8.8, 100.0, 9.6, None),
    "random": (24.0, 24.0, 24.2, 5.2, 30.1),
}

_datasets: dict[str, Any] = {}


def identity(run_dir: str | Path) -> dict[str, Any]:
    """What the run computes, as it recorded it (``run.json``: its configuration's flat keys, resolved; an old
    record's model parts read under the task, :func:`latentstruct.records.nested`), and where its data lay."""
    recorded = json.loads((Path(run_dir) / RUN_FILE).read_text())
    return nested({**recorded["identity"], **recorded.get("located", {})})  # with where its data lay


def _dataset(ident: dict[str, Any], data_dir: str | None = None) -> Any:
    """The run's dataset, rebuilt from its recorded configuration and data root (:func:`identity`; ``data_dir``:
    another data root), once per distinct dataset configuration (generation takes seconds)."""
    node: dict[str, Any] = {}
    for key, value in ident.items():
        if key.startswith("dataset."):
            *parents, leaf = key.removeprefix("dataset.").split(".")
            target = node
            for part in parents:
                target = target.setdefault(part, {})
            target[leaf] = value
    if data_dir is not None and "data_dir" in node:
        node["data_dir"] = data_dir
    key = json.dumps(node, sort_keys=True, default=str)
    if key not in _datasets:
        _datasets[key] = instantiate(OmegaConf.create(node))
    return _datasets[key]


def recorded_trees(run_dir: str | Path) -> tuple[list[list[list[int]]], torch.Tensor]:
    """The test trees the run recorded (``report.json``): each example's constituents ``[[i, j], ...]``, in the
    split's order, and the examples' lengths."""
    record = json.loads((Path(run_dir) / REPORT_FILE).read_text())
    if record.get("trees") != "binary":
        raise ValueError(f"{run_dir}: its record holds no binary trees (not a ListOps tree run)")
    return record["spans"], torch.tensor(record["lengths"])


def _tree_batches(spans: list[list[list[int]]], lengths: torch.Tensor) -> Iterator[torch.Tensor]:
    """The trees ``spans`` as 0/1 ``[B, n, n]`` tensors over the batches of :func:`_batches` (a fixed order)."""
    split = {"lengths": lengths, "x": torch.zeros(len(lengths), 1), "index": torch.arange(len(lengths))}
    for batch in _batches(split):
        n = int(batch["lengths"].max())
        z = torch.zeros(len(batch["index"]), n, n)
        for b, i in enumerate(batch["index"].tolist()):
            for s, e in spans[i]:
                z[b, s, e] = 1.0
        yield z


def _batches(split: dict[str, torch.Tensor], size: int = 256, cells: int = 1 << 22) -> Iterator[dict]:
    """The split sorted by length in batches of at most ``size`` examples and ``cells`` B·n² tree cells (the official
    test set reaches n = 939), each trimmed to its longest example: a fixed order, so that two runs' trees of the
    same split line up."""
    lengths = split["lengths"]
    order = lengths.argsort(stable=True)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and end - start < size and (end - start + 1) * int(lengths[order[end]]) ** 2 <= cells:
            end += 1
        idx = order[start:end]
        batch = {k: v[idx] for k, v in split.items()}
        batch["x"] = batch["x"][:, : int(lengths[idx].max())]
        yield batch
        start = end


def _group(ident: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in sorted(ident.items()) if not k.startswith(_NOT_IDENTITY)}, default=str)


def _completed_tree_runs(root: Path) -> dict[Path, str]:
    """The completed runs under ``root`` that recorded their trees (``report.json``), from their records
    (:func:`latentstruct.report.tables.load_runs`), each with its experiment: ``choices.experiment`` without its
    task (e.g. ``chart_spigot``), or the directory's name for a run without ``.hydra/``."""
    runs = load_runs(root)
    found = {}
    for _, run in (runs[runs["completed"]] if len(runs) else runs).iterrows():
        run_dir, experiment = Path(run["run_dir"]), run.get("choices.experiment")
        if (run_dir / REPORT_FILE).is_file():
            found[run_dir] = str(experiment if isinstance(experiment, str) else run_dir.name).removeprefix("listops_")
    return found


def _is_tree_run(ident: dict[str, Any]) -> bool:
    """A ListOps run whose model predicts trees (latent=predicted; the LSTM baseline is latent=none)."""
    return str(ident.get("task._target_")).endswith(".ListOps") and ident.get("latent", "predicted") == "predicted"


def self_f1(runs_root: str | Path, log=print) -> dict[str, float]:
    """Write ``derived.json`` (``self_f1``, ``self_f1_runs``) into every completed tree-predicting run under
    ``runs_root`` whose configuration has runs with other seeds (module docstring); return ``{run_dir: self_f1}``."""
    groups: dict[str, list[Path]] = defaultdict(list)
    for run in _completed_tree_runs(Path(runs_root)):
        ident = identity(run)
        if _is_tree_run(ident):
            groups[_group(ident)].append(run)
    result = {}
    for runs in groups.values():
        if len(runs) < 2:
            log(f"self-F1: {runs[0]} has no run of the same configuration with another seed; skipped")
            continue
        trees = {}
        for run in runs:  # one configuration: one dataset, the same test batches
            spans, split_lengths = recorded_trees(run)
            trees[run] = list(_tree_batches(spans, split_lengths))
        lengths = [b["lengths"] for b in _batches({"lengths": split_lengths, "x": torch.zeros(len(split_lengths), 1)})]
        for run in runs:
            scores = []
            for other in runs:
                if other == run:
                    continue
                f1 = torch.cat([tree_scores(a, b, n)["tree_f1"]
                                for a, b, n in zip(trees[run], trees[other], lengths, strict=True)])
                scores.append(float(f1.mean()))
            result[str(run)] = sum(scores) / len(scores)
            derived = run / "derived.json"
            old = json.loads(derived.read_text()) if derived.is_file() else {}
            derived.write_text(json.dumps({**old, "self_f1": result[str(run)], "self_f1_runs": len(runs)}, indent=2))
            log(f"self-F1 {result[str(run)]:6.2f}  ({len(runs)} seeds)  {run}")
    return result


# ------------------------------------------------------------------------------------------------ reference trees


def random_trees(lengths: torch.Tensor, n: int, rng: random.Random) -> torch.Tensor:
    """One random binary tree per example ``[B, n, n]``: starting from the leaves, merge a uniformly chosen pair of
    adjacent nodes until one is left (the tree a merge parser builds with random scores)."""
    index: list[tuple[int, int, int]] = []
    for b, length in enumerate(lengths.tolist()):
        nodes = [(i, i) for i in range(length)]
        while len(nodes) > 1:
            k = rng.randrange(len(nodes) - 1)
            (i, _), (_, j) = nodes[k], nodes[k + 1]
            index.append((b, i, j))
            nodes[k : k + 2] = [(i, j)]
    z = torch.zeros(len(lengths), n, n)
    if index:
        z[tuple(torch.tensor(index).t())] = 1
    return z


def _branching(lengths: torch.Tensor, n: int, build) -> torch.Tensor:
    z = torch.zeros(len(lengths), n, n)
    for b, length in enumerate(lengths.tolist()):
        z[b, :length, :length] = build(length)
    return z


def reference_trees(split: dict[str, torch.Tensor], seed: int = 0) -> dict[str, dict[str, float]]:
    """The tree metrics of the true, left-branching, right-branching and random trees of ``split`` (means over its
    examples, × 100 except depth), and the self-F1 of two independent random draws."""
    rng = random.Random(seed)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    count = 0
    for batch in _batches(split):
        lengths, n = batch["lengths"], batch["x"].shape[1]
        gold = spans_to_trees(batch["spans"], n)
        first, second = random_trees(lengths, n, rng), random_trees(lengths, n, rng)
        kinds = {"true": gold, "left": _branching(lengths, n, left_branching),
                 "right": _branching(lengths, n, right_branching), "random": first}
        for name, trees in kinds.items():
            for key, values in tree_scores(trees, gold, lengths).items():
                sums[name][key] += float(values.sum())
        sums["random"]["self_f1"] += float(tree_scores(first, second, lengths)["tree_f1"].sum())
        count += len(lengths)
    return {name: {key: value / count for key, value in metrics.items()} for name, metrics in sums.items()}


def _reference_markdown(stats: dict[str, dict[str, float]], source: str, n: int, seed: int) -> str:
    def fmt(x):
        return "—" if x is None else f"{x:.1f}"

    lines = ["# ListOps: trees that need no training", "",
             f"Test split of {source}: {n} expressions. Random trees: uniformly random merges of adjacent nodes "
             f"(`random.Random({seed})`); their self-F1 compares two independent draws. Tree F1 excludes the whole "
             "span; depth = the most constituents over a leaf. Paper: Nangia & Bowman (2018) on the full official "
             "test set (the seed's tutorial); ours in bold.", "",
             "| trees | F1 vs left-branching | F1 vs right-branching | F1 vs true | depth | self-F1 |",
             "|---|---|---|---|---|---|"]
    labels = {"true": "true (ground-truth) trees", "left": "left-branching", "right": "right-branching",
              "random": "random trees"}
    for name in ("true", "left", "right", "random"):
        ours = stats[name]
        paper = PAPER_REFERENCE_TREES.get(name, (None,) * 5)
        cells = [(ours["f1_left"], paper[0]), (ours["f1_right"], paper[1]), (ours["tree_f1"], paper[2]),
                 (ours["depth"], paper[3]), (ours.get("self_f1"), paper[4])]
        lines.append(f"| {labels[name]} | " + " | ".join(
            f"**{fmt(o)}**" + (f" · {fmt(p)}" if p is not None else "") for o, p in cells) + " |")
    lines += ["", "Each cell: **ours** · paper (where reported)."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------ figure


def _children(spans: set[tuple[int, int]], i: int, j: int) -> tuple[tuple[int, int], tuple[int, int]]:
    for k in range(i, j):
        left, right = (i, k), (k + 1, j)
        if (k == i or left in spans) and (k + 1 == j or right in spans):
            return left, right
    raise ValueError(f"({i}, {j}) has no split into constituents: not a binary tree")


def _spans(z: torch.Tensor, n: int) -> list[list[int]]:
    return sorted([int(i), int(j)] for i, j in torch.triu(z[:n, :n] != 0, diagonal=1).nonzero().tolist())


def _draw_spans(ax, tokens: list[str], spans, title: str, color: str, step: float) -> None:
    """Draw the constituents ``spans`` over ``tokens``, the leaves ``step`` x units apart (from their widths)."""
    spans = {tuple(s) for s in spans}
    n = len(tokens)
    height: dict[tuple[int, int], int] = {(i, i): 0 for i in range(n)}
    for i, j in sorted(spans, key=lambda s: s[1] - s[0]):
        left, right = _children(spans, i, j)
        height[(i, j)] = 1 + max(height[left], height[right])
        for child in (left, right):
            ax.plot([step * (i + j) / 2, step * (child[0] + child[1]) / 2], [height[(i, j)], height[child]],
                    color=color, lw=1)
    for i, token in enumerate(tokens):
        ax.text(step * i, -0.25, token, ha="center", va="top", fontsize=_LEAF_SIZE, gid="leaf")
    ax.set_xlim(-0.7 * step, step * (n - 0.3))
    ax.set_ylim(-1.6, max(height.values()) + 0.4)
    ax.axis("off")
    ax.set_title(title, fontsize=8, loc="left")


def draw_trees(ax, tokens: list[str], z: torch.Tensor, title: str = "", color: str = "C0") -> None:
    """Draw the binary tree ``z`` ``[n, n]`` over ``tokens`` on matplotlib axes: leaves on a line, each
    constituent a node above the middle of its span, at a height one more than its taller child."""
    _draw_spans(ax, tokens, _spans(z, len(tokens)), title, color, step=1.0)


# Leaf labels: this font size, and at least this many points between two leaves' centres beyond the widest label.
_LEAF_SIZE, _LEAF_GAP = 7.0, 5.0


def trees_figure(data: dict):
    """The figure description ``data`` (``figure: listops-trees``: ``title``, ``columns`` and ``panels``, each a
    ``title``, ``tokens``, ``spans`` and ``color``) drawn, a panel per entry; leaves are spaced by the rendered width
    of the widest token, so no two overlap."""
    from matplotlib.figure import Figure

    from latentstruct.report.drawing import _text_width

    panels, columns = data["panels"], data["columns"]
    rows = -(-len(panels) // columns)
    widest = max(_text_width(t, _LEAF_SIZE) for p in panels for t in p["tokens"])
    longest = max(len(p["tokens"]) for p in panels)
    step = widest + _LEAF_GAP  # points between leaves
    fig = Figure(figsize=(max(3.6, (longest + 0.6) * step / 72 + 0.3) * columns, 1.6 * rows), dpi=110,
                 layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw_spans(ax, panel["tokens"], panel["spans"], panel["title"], panel["color"], step)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle(data["title"], fontsize=9)
    return fig


def draw_figure(data: dict, out: str | Path) -> Path:
    """Draw :func:`trees_figure` into the PNG ``out`` (also the ``redraw`` of ``python -m
    latentstruct.report.figures``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(trees_figure(data)).print_png(str(out))
    return out


def _row_labels(spec: dict | None, runs_root: Path) -> dict[str, str]:
    """``{run directory: the label of the spec row it matches}`` (empty without a spec)."""
    if spec is None:
        return {}
    runs = load_runs(runs_root)
    return {run: row.get("label", row["name"]) for row in reversed(spec["rows"])
            for run in filter_runs(runs, row.get("match"))["run_dir"]} if len(runs) else {}


def _figure(runs_root: Path, out: Path, examples: int, seed: int, data_dir: str | None, log=print,
            spec: str | Path | None = None) -> Path:
    chosen: dict[str, Path] = {}
    for run, experiment in _completed_tree_runs(runs_root).items():
        ident = identity(run)
        if ident.get("trainer.seed") == seed and _is_tree_run(ident):
            chosen.setdefault(experiment, run)
    if not chosen:
        raise FileNotFoundError(f"no completed ListOps tree run with trainer.seed={seed} under {runs_root}")
    order = sorted(chosen, key=lambda name: (name.startswith("chart"), name))
    labels = _row_labels(load_spec(spec) if spec else None, runs_root)
    data = _dataset(identity(chosen[order[0]]), data_dir)
    test, itos = data.splits["test"], data.extras["itos"]
    pool = [int(i) for i in torch.nonzero((test["lengths"] >= 8) & (test["lengths"] <= 14)).flatten()]
    picks = sorted(random.Random(0).sample(pool, min(examples, len(pool))))
    batch = {k: v[picks] for k, v in test.items()}
    n = int(batch["lengths"].max())
    batch["x"] = batch["x"][:, :n]
    gold = spans_to_trees(batch["spans"], n)
    rows = [("true tree", gold, "k")]
    for name in order:
        spans = recorded_trees(chosen[name])[0]
        trees = torch.zeros(len(picks), n, n)
        for c, i in enumerate(picks):
            for s, e in spans[i]:
                trees[c, s, e] = 1.0
        rows.append((labels.get(str(chosen[name]), name), trees, "C0"))
    panels = []
    for name, trees, color in rows:
        for c, _ in enumerate(picks):
            length = int(batch["lengths"][c])
            f1 = float(tree_scores(trees[c : c + 1], gold[c : c + 1], batch["lengths"][c : c + 1])["tree_f1"])
            score = f"F1 {f1:.0f}, " if color != "k" else ""
            panels.append({"title": f"{name}  ({score}label {int(batch['y'][c])})", "color": color,
                           "tokens": [itos[t] for t in batch["x"][c, :length].tolist()],
                           "spans": _spans(trees[c], length)})
    figure = {"figure": "listops-trees", "columns": len(picks), "panels": panels,
              "title": f"ListOps test expressions: true trees (black) and each method's tree (seed {seed})"}
    out = draw_figure(figure, out)
    out.with_suffix(".data.json").write_text(json.dumps(figure, ensure_ascii=False) + "\n")
    log(f"wrote {out} and {out.with_suffix('.data.json')}")
    return out


# -------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.listops", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("self-f1", help="write each tree run's self-F1 across seeds into its derived.json")
    p.add_argument("--runs", required=True, type=Path)
    p = sub.add_parser("reference-trees", help="true / branching / random trees on the runs' test split -> Markdown")
    p.add_argument("--runs", required=True, type=Path, help="a run whose dataset configuration is used")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("figure", help="true and predicted trees of a few test expressions -> PNG")
    p.add_argument("--runs", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--examples", type=int, default=3)
    p.add_argument("--seed", type=int, default=301, help="draw the runs of this trainer.seed")
    p.add_argument("--spec", help="title each method's trees with the label of the row of this table spec it matches "
                                  "(default: its experiment)")
    for p in (sub.choices["reference-trees"], sub.choices["figure"]):
        p.add_argument("--data-dir", help="the data root, if not the one the runs recorded")
    args = parser.parse_args(argv)
    if args.command == "self-f1":
        self_f1(args.runs)
    elif args.command == "reference-trees":
        runs = list(_completed_tree_runs(args.runs))
        if not runs:
            raise SystemExit(f"no completed run under {args.runs}")
        ident = identity(runs[0])
        data = _dataset(ident, args.data_dir)
        stats = reference_trees(data.splits["test"], args.seed)
        limit = ident.get("dataset.max_eval_tokens")
        source = "the official test_d20s.tsv" + (f", expressions of at most {limit} leaves" if limit else "")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(_reference_markdown(stats, source, data.size("test"), args.seed))
        print(f"wrote {args.out}")
    else:
        _figure(args.runs, args.out, args.examples, args.seed, args.data_dir, spec=args.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())

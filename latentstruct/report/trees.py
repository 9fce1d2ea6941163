"""Print and draw the latent MAP tree a trained SST / SNLI model gave a sentence (seed 001, Figures 4-6).

    python -m latentstruct.report.trees RUN_DIR "A sentence of the test split ." [--out tree.png]
    python -m latentstruct.report.trees --runs multirun/spigot_sst --spec experiments/spigot/table3_sst.yaml \
        --seed 301 --rows marginals,spigot --out-dir results/spigot/trees "A sentence of the test split ."

The second form draws the sentence with one run per row of a table spec: the row's first completed run with
``trainer.seed`` = ``--seed``, chosen from the run records (:func:`latentstruct.report.tables.load_runs`), never from
directory names; it writes ``<row>.png`` and ``<row>.txt`` (the run and the printout) into ``--out-dir``, each picture
titled with the row's label and the seed (e.g. ``SPIGOT-CE — seed 301``).

``RUN_DIR`` is a completed run of ``python -m latentstruct.train`` with a latent tree (``task=sst`` or ``task=nli``;
not the baseline). The trees are read from its record, never from its model: the run wrote the MAP tree of every
test sentence of its final model into ``report.json`` (``Task.report_record``). The sentence, split by
:func:`latentstruct.data.text.tokenize` (PTB-style), is looked up among them (case aside; a word the run's vocabulary
lacks, recorded as ``<unk>``, matches any token and is listed). Prints the tree (indented) and its depth, and draws it
as arcs above the sentence into ``--out`` (default ``RUN_DIR/trees/<first words>.png``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from latentstruct.data.text import tokenize
from latentstruct.records import REPORT_FILE
from latentstruct.report.drawing import depth, draw_tree, format_tree
from latentstruct.report.tables import filter_runs, load_runs, load_spec

__all__ = ["load_trees", "find_sentence", "run_title", "tree_lines", "seed_runs", "main"]

UNK = "<unk>"


def load_trees(run_dir: str | Path) -> list[dict]:
    """The recorded MAP trees of ``run_dir``'s test sentences: ``[{"words": [...], "heads": [...]}, ...]``."""
    path = Path(run_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: RUN_DIR must be a completed latent-tree run of latentstruct.train")
    record = json.loads(path.read_text())
    if record.get("trees") != "dependency":
        raise ValueError(f"{run_dir}: its record holds no dependency trees (not a latent-tree SST / SNLI run)")
    return record["sentences"]


def find_sentence(sentences: list[dict], sentence: str) -> tuple[list[str], list[int], list[str]]:
    """(tokens, heads, unknown tokens) of the recorded tree of ``sentence``: the first recorded sentence whose words
    equal its tokens, case aside, a recorded ``<unk>`` matching any token."""
    tokens = tokenize(sentence)
    if not tokens:
        raise ValueError("the sentence has no tokens")
    wanted = [t.lower() for t in tokens]
    for entry in sentences:
        words = entry["words"]
        if len(words) == len(tokens) and all(w == UNK or w.lower() == t for w, t in zip(words, wanted, strict=True)):
            unknown = [t for t, w in zip(tokens, words, strict=True) if w == UNK]
            return tokens, list(entry["heads"]), unknown
    raise ValueError(f"{' '.join(tokens)!r} is not among the {len(sentences)} test sentences the run recorded")


def run_title(run_dir: str | Path) -> str:
    """A run's name for a picture: its experiment and seed from its records, e.g. ``sst_spigot_ce — seed 301``."""
    runs = load_runs(run_dir)
    run = runs[runs["run_dir"] == str(run_dir)] if len(runs) else runs
    if run.empty:
        return Path(run_dir).name
    experiment, seed = run.iloc[0].get("choices.experiment"), run.iloc[0].get("trainer.seed")
    name = experiment if isinstance(experiment, str) else Path(run_dir).name
    return name if pd.isna(seed) else f"{name} — seed {int(seed)}"


def tree_lines(run_dir: str | Path, sentence: str, out: str | Path | None = None, title: str | None = None):
    """Draw the recorded tree of ``sentence`` in ``run_dir`` into ``out`` (default ``RUN_DIR/trees/<first
    words>.png``), titled ``title`` (default :func:`run_title`) and its depth; return the printout: the indented tree,
    its depth and heads, the words outside the vocabulary, and the PNG written."""
    tokens, heads, unknown = find_sentence(load_trees(run_dir), sentence)
    lines = [format_tree(tokens, heads), f"depth {depth(heads)}; heads {heads}"]
    if unknown:
        lines.append(f"not in the training vocabulary (<unk>): {' '.join(unknown)}")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", " ".join(tokens[:6])).strip("_") or "tree"
    out = Path(out) if out else Path(run_dir) / "trees" / f"{slug}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"{title or run_title(run_dir)}: depth {depth(heads)}"
    lines.append(f"wrote {draw_tree(tokens, heads, out, title=title)}")
    return lines


def seed_runs(spec, runs, seed: int, rows: list[str] | None = None) -> dict[str, str]:
    """``{row name: run directory}``: for each row of the table ``spec`` (a file or :func:`load_spec`'s dict) named in
    ``rows`` (default: every row), in that order, its first completed run with ``trainer.seed == seed`` among ``runs``
    (a directory or :func:`load_runs`' frame), selected by the run records. Rows without such a run are left out."""
    spec = spec if isinstance(spec, dict) else load_spec(spec)
    runs = runs if isinstance(runs, pd.DataFrame) else load_runs(runs)
    by_name = {row["name"]: row for row in spec["rows"]}
    unknown = sorted(set(rows or ()) - set(by_name))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not rows of {spec['table']} ({', '.join(by_name)})")
    if runs.empty:
        return {}
    done = filter_runs(runs[runs["completed"]], {**(spec.get("where") or {}), "trainer.seed": seed})
    chosen = {}
    for name in rows or by_name:
        cell = filter_runs(done, by_name[name].get("match"))
        if len(cell):
            chosen[name] = cell["run_dir"].iloc[0]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.trees", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run_dir",
        nargs="?",
        help="a completed run of latentstruct.train (task sst or nli, latent model); leave out with --runs",
    )
    parser.add_argument("sentence", help="a sentence of the test split, raw text (tokenized PTB-style)")
    parser.add_argument("--out", help="PNG to write (default: RUN_DIR/trees/<first words>.png)")
    rows = parser.add_argument_group("one run per row of a table spec, chosen from the run records (not RUN_DIR)")
    rows.add_argument("--runs", help="directory searched recursively for run records")
    rows.add_argument("--spec", help="the table spec whose rows select the runs (experiments/<paper>/<table>.yaml)")
    rows.add_argument("--seed", type=int, default=301, help="the trainer.seed of the runs to draw (default 301)")
    rows.add_argument("--rows", help="comma-separated row names (default: every row)")
    rows.add_argument("--out-dir", help="where <row>.png and <row>.txt go")
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.runs is None):
        parser.error("give either RUN_DIR or --runs (with --spec and --out-dir)")
    if args.run_dir is not None:
        print("\n".join(tree_lines(args.run_dir, args.sentence, args.out)))
        return 0
    if not (args.spec and args.out_dir):
        parser.error("--runs needs --spec and --out-dir")
    wanted = args.rows.split(",") if args.rows else None
    spec = load_spec(args.spec)
    labels = {row["name"]: row.get("label", row["name"]) for row in spec["rows"]}
    chosen = seed_runs(spec, args.runs, args.seed, wanted)
    for name in wanted or chosen:
        if name not in chosen:
            print(f"{name}: no completed run with trainer.seed={args.seed} under {args.runs}; skipped")
            continue
        out = Path(args.out_dir) / f"{name}.png"
        title = f"{labels[name]} — seed {args.seed}"  # the method as the table names it
        text = "\n".join([f"run: {chosen[name]}", *tree_lines(chosen[name], args.sentence, out, title)])
        out.with_suffix(".txt").write_text(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

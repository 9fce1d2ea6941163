"""Whether a table reproduces its paper: the status line that opens it, and the JSON sidecar the report reads.

A table spec's ``paper_protocol`` block says what the paper ran (or, where the paper is silent, the full protocol of
``make table``, and says so in ``length``); a time table names the spec whose protocol it shares instead
(``paper_protocol: table3_sst``)::

    paper_protocol:
      length: 40 epochs (batch 32)   # the paper's training length in its own words
      steps: 8680                    # the same in our training steps (optional: without it lengths are not compared)
      runs: 3                        # runs behind each of the paper's numbers (optional)
      hardware: Tesla K80            # optional, shown beside ours
      data:                          # data the paper used that a run may lack: when the run's flat config `key` is
        - {key: embedding.pretrained, missing: null, paper: frozen GloVe 840B, instead: random embeddings,
           stand_ins: {glove/glove.6B.50d.txt: GloVe 6B 50d}}
                                     # `missing`, the run used `instead` (the runs' values of the key are
                                     # read whether or not it is a provenance_keys entry: recorded_keys);
                                     # a value among `stand_ins` is named as what stood in for the paper's data

:func:`facts` (what the runs were) + the protocol + the long table give :func:`summary`: the status (``full``,
``reduced``: fewer steps or runs, data substituted or cells without runs; ``blocked``: no completed run), its
reasons, the cell counts and a headline computed from the numbers. :func:`sidecar` is that summary as the JSON
written beside the table's Markdown, from which ``python -m latentstruct.report.report`` writes results/README.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml

from latentstruct.report import code

__all__ = [
    "SIDECAR_FORMAT",
    "protocol",
    "recorded_keys",
    "facts",
    "summary",
    "status_line",
    "annotate",
    "companions",
    "sidecar",
    "write_sidecar",
]

SIDECAR_FORMAT = "latentstruct.table/1"
_WORDS = {"full": "full protocol", "reduced": "reduced protocol", "blocked": "blocked"}
_STEPS_SLACK = 0.95  # a run within 5% of the paper's steps (a partial last batch, dropped examples) is full length


def protocol(spec: dict) -> dict:
    """The spec's ``paper_protocol`` block ({} if none); a name is the block of that spec in the same folder."""
    block = spec.get("paper_protocol") or {}
    if isinstance(block, str):
        other = Path(spec.get("spec_path", "spec.yaml")).parent / f"{block}.yaml"
        block = (yaml.safe_load(other.read_text()) or {}).get("paper_protocol") or {}
    return block


def recorded_keys(spec: dict) -> dict:
    """The flat config keys whose run values :func:`facts` reads for ``spec``: its ``provenance_keys`` and every data
    key of its protocol (a time table's shared one too), so that a substitution is never "not recorded" for want of
    a provenance line."""
    return {**{e["key"]: e["key"] for e in protocol(spec).get("data") or []}, **(spec.get("provenance_keys") or {})}


def _text(value) -> str:
    return "null" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _whole(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def facts(used: pd.DataFrame, keys: dict | None = None) -> dict:
    """What the runs ``used`` by a table were: commits (and those of runs with uncommitted changes), hardware, torch,
    seeds, run counts, steps per run, the values
    of the ``keys`` ({flat config key: label}) they used, and the distinct errors of the failed runs."""
    used = used.drop_duplicates("run_dir") if len(used) else used
    done = used[used["completed"]] if len(used) else used

    def distinct(col, runs=done):
        values = runs[col].dropna() if col in runs else []
        return sorted({_whole(v) for v in values}, key=lambda v: (isinstance(v, str), v))

    failed = used[~used["completed"]] if len(used) else used
    dirty = used[used["git_dirty"].astype(object).eq(True)] if "git_dirty" in used else used.iloc[0:0]
    errors = failed["error"].fillna("no error recorded").astype(str) if "error" in failed else pd.Series(dtype=str)
    return {
        "commits": distinct("git_commit", used),
        "dirty_commits": distinct("git_commit", dirty),  # runs with uncommitted changes: their code is unknown
        "hardware": distinct("hardware", used),
        "torch": distinct("torch", used),
        "seeds": distinct("seed"),
        "runs_completed": len(done),
        "runs_failed": len(used) - len(done),
        "steps": distinct("steps"),
        "data": {key: sorted({_text(v) for v in (done[key] if key in done else [])}) for key in keys or {}},
        "errors": [" ".join(e.split())[:300] for e in dict.fromkeys(errors)],
    }


def _has(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _counts(cells: list[dict]) -> dict:
    return {
        "total": len(cells),
        "with_runs": sum(1 for c in cells if c["n_runs"]),
        "with_paper": sum(1 for c in cells if _has(c["paper"])),
        "compared": sum(1 for c in cells if c["agrees"] is not None),
        "within_tolerance": sum(1 for c in cells if c["agrees"] is True),
    }


def _differs(found: dict, proto: dict, cells: list[dict], sections=None) -> tuple[list[str], list[str]]:
    """What the runs did differently from the paper, and what was not recorded to compare."""
    differs, unknown = [], []
    steps, paper_steps = found.get("steps") or [], proto.get("steps")
    if paper_steps and not steps:
        unknown.append("training steps per run")
    elif paper_steps and max(steps) < _STEPS_SLACK * paper_steps:
        ours = "–".join(f"{s:,}" for s in sorted({min(steps), max(steps)}))
        differs.append(f"{ours} of {paper_steps:,} training steps per run (paper: {proto.get('length', '')})")
    done = [c["n_runs"] for c in cells if c["n_runs"]] if cells else [len(found.get("seeds") or [])]
    if proto.get("runs") and done and min(done) < proto["runs"]:
        ours = "–".join(str(n) for n in sorted({min(done), max(done)}))
        differs.append(f"{ours} run(s) per cell instead of the paper's {proto['runs']}")
    for entry in proto.get("data") or []:
        values = found.get("data", {}).get(entry["key"])
        if values is None:
            unknown.append(f"`{entry['key']}` (paper: {entry['paper']})")
            continue
        if _text(entry.get("missing")) in values:
            differs.append(f"{entry['instead']} instead of {entry['paper']}")
        for value, name in (entry.get("stand_ins") or {}).items():  # data put in the place of the paper's
            if _text(value) in values:
                differs.append(f"{name} instead of {entry['paper']}")
    def without_runs(c: dict) -> bool:  # a value has runs; without one, n_done says (a backfilled cell has none)
        return not c["n_runs"] and not c.get("n_done")

    empty = [c for c in cells if without_runs(c)]
    if empty and len(empty) < len(cells):
        settings = list(dict.fromkeys(c["setting"] for c in cells))
        blank = [s for s in settings if all(without_runs(c) for c in cells if c["setting"] == s)]
        whole = {
            s: sec["title"] for sec in sections or [] if set(sec["settings"]) <= set(blank) for s in sec["settings"]
        }
        blank = list(dict.fromkeys(whole.get(s, s) for s in blank))  # a section without runs is named by its title
        where = f": no runs for {', '.join(blank)}" if blank else ""
        differs.append(f"{len(empty)} of {len(cells)} cells without runs{where}")
    # completed runs without a value: a metric the row does not have (SST's baseline has no trees) is no gap, unless
    # the paper has a number there
    unrecorded = [c for c in cells if not without_runs(c) and not c["n_runs"] and _has(c.get("paper"))]
    if unrecorded:
        differs.append(f"{len(unrecorded)} of {len(cells)} cells with a paper number that their runs do not record")
    return differs, unknown


def _headline(cells: list[dict], spec: dict) -> str:
    """One sentence from the numbers: the best row of ours on the headline column, the paper's best and ours among
    the rows the paper also has, and how the two orders agree (Kendall τ). The column is the spec's ``headline``
    ({setting, metric}) or the first with two rows of ours and the paper's (else two of ours); ``better: lower``
    (times, bounds) makes the lowest value the best."""
    from latentstruct.report.tables import metric_id  # here: tables imports this module

    if not cells:
        return "a figure without table cells: see its Markdown and image"
    frame, choice = pd.DataFrame(cells), spec.get("headline") or {}

    def column(key: tuple) -> pd.DataFrame:
        return frame[(frame.setting == key[0]) & (frame.metric == key[1])].set_index("row")

    keys = list(dict.fromkeys(zip(frame["setting"], frame["metric"], strict=True)))
    if "metric" in choice:
        keys = [(choice["setting"], choice["metric"])]
    keys = [k for k in keys if (column(k).ours.notna() & column(k).paper.notna()).sum() > 1] or [
        k for k in keys if column(k).ours.notna().sum() > 1
    ]
    if not keys:
        return "fewer than two rows with runs: no comparison between rows"
    col, lower = column(keys[0]), choice.get("better") == "lower"
    rows = {r["name"]: r.get("label", r["name"]) for r in spec.get("rows", [])}
    metrics = {metric_id(m): m.get("label", m["name"]) for m in spec.get("metrics", [])}
    best = "lowest" if lower else "best"

    def top(values: pd.Series) -> str:
        row = values.idxmin() if lower else values.idxmax()
        return (
            f"{rows.get(row, row)} ({values[row]:.2f})"
            if abs(values[row]) >= 1
            else f"{rows.get(row, row)} ({values[row]:.3g})"
        )

    sentence = f"{keys[0][0]} {metrics.get(keys[0][1], keys[0][1])}: {best} of ours {top(col.ours.dropna())}"
    both = col[col.ours.notna() & col.paper.notna()]
    if len(both) < 2:
        return sentence + "; no paper numbers to rank against"
    tau = both.ours.astype(float).corr(both.paper.astype(float), method="kendall")
    return (
        f"{sentence}; on the {len(both)} rows the paper also has, its {best} is {top(both.paper)} and ours "
        f"{top(both.ours)}, and the two orders agree by Kendall τ = {tau:+.2f}"
    )


def summary(found: dict, proto: dict, cells: list[dict], spec: dict, gaps: Sequence[str] = ()) -> dict:
    """Status (``full`` / ``reduced`` / ``blocked``), what differs, what was not recorded, cell counts, headline.
    ``gaps``: what a figure could not draw (its cells are not table cells), each a difference from the paper."""
    counts = _counts(cells)
    if not counts["with_runs"] and not (not cells and found.get("runs_completed")):
        why = [re.sub(r"/(?:[\w.-]+/)+([\w.-]+)", r"…/\1", e) for e in found.get("errors") or []]
        reason = f"; the failed runs' error: {why[0]}" if why else ""
        return {
            "status": "blocked",
            "differs": [f"no completed run{reason}"],
            "unknown": [],
            "cells": counts,
            "headline": "no completed run",
        }
    differs, unknown = _differs(found, proto, cells, spec.get("sections"))
    differs += list(gaps)
    return {
        "status": "reduced" if differs else "full",
        "differs": differs,
        "unknown": unknown,
        "cells": counts,
        "headline": _headline(cells, spec),
    }


def status_line(result: dict, verdict: bool = True) -> str:
    """The Markdown line that opens a table: status, what differs from the paper, the cells within tolerance."""
    c = result["cells"]
    if not c["total"]:
        cells = "A figure: no cells to compare with the paper's numbers"
    elif result["status"] == "blocked":
        cells = f"{c['with_paper']} of {c['total']} cells have a paper number, none a run"
    elif c["compared"]:
        cells = f"{c['within_tolerance']} of {c['compared']} cells with a paper number within tolerance"
    elif c["with_paper"] and not verdict:
        cells = "No verdict per cell (see the notes)"
    else:
        cells = "No paper numbers to compare (see the notes)"
    what = "; ".join(result["differs"]) or "the paper's training length, runs and data, as far as recorded"
    unknown = f" (not recorded: {'; '.join(result['unknown'])})" if result["unknown"] else ""
    said = code.sentence(result.get("code"))
    return f"**Status: {_WORDS[result['status']]}** — {what}{unknown}. {cells}.{' ' + said if said else ''}"


def _unsaid(proto: dict) -> bool:
    """Whether the protocol's steps are not already in its ``length`` (``10,000 full-batch steps``)."""
    return bool(proto.get("steps")) and f"{proto['steps']:,}" not in proto.get("length", "")


def annotate(lines: list[str], proto: dict) -> list[str]:
    """Provenance bullet lines with the paper's figure beside ours (steps, seeds, hardware, data keys)."""
    beside = {
        "- training steps per run:": proto.get("length")
        and (proto["length"] + (f" ≈ {proto['steps']:,} steps" if _unsaid(proto) else "")),
        "- seeds:": proto.get("runs") and f"{proto['runs']} run(s) per number",
        "- hardware:": proto.get("hardware"),
    }
    beside.update({f"(`{d['key']}`):": d["paper"] for d in proto.get("data") or []})
    out = []
    for line in lines:
        extra = next((v for k, v in beside.items() if v and line.startswith("- ") and k in line), None)
        out.append(f"{line} (paper: {extra})" if extra and "(paper:" not in line else line)
    return out


def companions(spec: dict) -> list[str]:
    """The figures (and other files) the spec's ``reproduce`` steps make beside its own table."""
    steps = (spec.get("reproduce") or {}).get("steps") or []
    if spec.get("rows") and not any(s.get("table") == spec.get("table") for s in steps):
        return []
    return [s["out"] for s in steps if s.get("out") and "table" not in s]


def _json(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def sidecar(spec: dict, markdown: str | Path, found: dict, cells: list[dict], source: str = "run records",
            gaps: Sequence[str] = ()) -> dict:
    """Everything results/README.md says about one table (a spec of :func:`latentstruct.report.tables.load_spec`),
    computed from what the runs were (:func:`facts`) and its cells (the long table's records), never hand-written.
    ``gaps``: the points a figure could not draw (:func:`summary`)."""
    proto = protocol(spec)
    result = summary(found, proto, cells, spec, gaps)
    result["code"] = code.verdict(found.get("commits") or [], found.get("dirty_commits") or [])
    keep = ("row", "setting", "metric", "ours", "ours_err", "n_runs", "n_done", "n_failed", "paper", "paper_err",
            "agrees")
    return {
        "format": SIDECAR_FORMAT,
        "spec": spec.get("spec_path"),
        "paper": spec.get("paper"),
        "table": spec.get("table"),
        "title": spec.get("title", spec.get("table")),
        "markdown": Path(markdown).name,
        "command": spec.get("command"),
        "companions": companions(spec),
        "source": source,
        "provenance": found,
        "paper_protocol": proto,
        **result,
        "status_line": status_line(result, spec.get("verdict", True)),
        "rows": {r["name"]: r.get("label", r["name"]) for r in spec.get("rows", [])},
        "long": [{k: _json(c.get(k)) for k in keep} for c in cells],
    }


def write_sidecar(markdown: str | Path, data: dict) -> Path:
    """Write ``data`` as the JSON beside ``markdown`` (same name, .json)."""
    path = Path(markdown).with_suffix(".json")
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n")
    return path

"""Run records -> paper tables, side by side with the paper's numbers (DESIGN.md §7).

A run record is a directory holding ``metrics.json`` and ``.hydra/{config,hydra}.yaml``. Runs are selected by
what they *are* (their composed config and Hydra choices), never by their file names. A table spec (YAML,
see ``experiments/spigot/table2.yaml``) says which runs make which row, setting and metric, how to aggregate
them, the tolerance, and where the paper's numbers are (``reference.csv``).

    python -m latentstruct.report.tables experiments/spigot/table2.yaml --runs multirun/ --out results/x/table2.md

``make table T=<paper>/<table>`` runs a spec's sweeps and then this module (:mod:`latentstruct.report.reproduce`).
Beside each table goes a JSON sidecar (``table2.json``): its status against the paper's protocol (the spec's
``paper_protocol``), cell counts and headline (:mod:`latentstruct.report.status`), from which ``make report`` writes
results/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import yaml

from latentstruct.records import RUN_FILE, flatten, nested
from latentstruct.report import status
from latentstruct.summary import read_yaml

__all__ = ["provenance", "load_runs", "load_spec", "output_path", "filter_runs", "aggregate", "metric_id",
           "build_table", "legend", "notes", "groups", "write_markdown", "parse_provenance", "parse_cells",
           "committed_tables", "main"]

_RECORD_FIELDS = ("status", "seed", "git_commit", "git_dirty", "hardware", "cpu", "torch", "threads", "fingerprint",
                  "wall_seconds", "cpu_seconds", "seconds_per_step", "seconds_per_epoch", "implicit_share", "steps",
                  "best_epoch", "best_step", "error")


def _read_yaml(path: Path) -> dict:
    # safe_load keeps `${...}` interpolations as plain strings; resolving them could call arbitrary resolvers.
    return read_yaml(path) or {}


def _threads(recorded: dict | None) -> str | None:
    """A record's threads as the provenance says them: ``1`` (intra-op), with the environment variables that were set
    (``1 (OMP_NUM_THREADS=1)``); None for a record of before they were recorded."""
    if not recorded:
        return None
    env = ", ".join(f"{k}={v}" for k, v in sorted((recorded.get("env") or {}).items()))
    return f"{recorded.get('intra_op')}" + (f" ({env})" if env else "")


def _check_record(run_dir: Path, record: dict, config: dict) -> None:
    """Refuse a run directory whose record and configuration disagree: metrics.json of another fingerprint than its
    run.json, or a .hydra/config.yaml (what the tables match on) whose settings differ from the identity run.json
    recorded (interpolations, unresolved there, are not compared). A directory without run.json is not checked."""
    try:
        recorded = json.loads((run_dir / RUN_FILE).read_text())
    except FileNotFoundError:
        return
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{run_dir}: unreadable {RUN_FILE} ({exc})") from None
    if record.get("fingerprint") not in (None, recorded.get("fingerprint")):
        raise ValueError(f"{run_dir}: metrics.json is the record of fingerprint {record['fingerprint']}, its "
                         f"{RUN_FILE} says {recorded.get('fingerprint')}: the record is another configuration's")
    ident = nested(recorded.get("identity", {}))
    differ = [f"{k}: {ident[k]} (run.json) ≠ {v} (.hydra/config.yaml)" for k, v in config.items()
              if k in ident and not (isinstance(v, str) and "${" in v) and not _equal(v, ident[k])
              and not (isinstance(v, list) and v == ident[k])]
    if differ:
        raise ValueError(f"{run_dir}: its configuration and its record disagree:\n  " + "\n  ".join(differ))


def load_runs(root: str | Path) -> pd.DataFrame:
    """One row per run directory under ``root`` (searched recursively for ``metrics.json``).

    Columns: every dotted key of ``.hydra/config.yaml`` (``dataset.num_clusters``, as
    :func:`latentstruct.records.flatten` gives them: an empty dict gives none; a record made before the task was one
    nested node read as the current layout, ``estimator.eta`` as ``task.estimator.eta``:
    :func:`latentstruct.records.nested`), ``choices.<group>`` from
    ``.hydra/hydra.yaml`` (``hydra.runtime.choices``; records made before the experiments' flat names:
    ``python -m scripts.migrate_experiment_names``), ``metric.<name>`` per entry of metrics.json's ``metrics``, the
    record fields ``status, seed, git_commit, git_dirty, hardware, torch, threads, fingerprint, wall_seconds,
    seconds_per_step, seconds_per_epoch, implicit_share, steps, best_epoch, best_step, error``, ``run_dir`` and
    ``completed`` (status == "completed").
    Record fields win over same-named config keys (``seed``). Failed runs are kept, flagged by ``completed``; an
    unreadable metrics.json counts as failed. A directory whose record and configuration disagree raises
    ValueError (:func:`_check_record`).
    """
    rows = []
    for metrics_path in sorted(Path(root).rglob("metrics.json")):
        run_dir = metrics_path.parent
        try:
            record = json.loads(metrics_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            record = {"status": "failed", "error": f"unreadable metrics.json: {exc}"}
        row = nested(flatten(_read_yaml(run_dir / ".hydra" / "config.yaml")))  # an old record's parts: task.*
        _check_record(run_dir, record, row)
        choices = (_read_yaml(run_dir / ".hydra" / "hydra.yaml").get("hydra") or {}).get("runtime", {})
        row.update({f"choices.{k}": v for k, v in (choices.get("choices") or {}).items()})
        row.update({f"metric.{k}": v for k, v in (record.get("metrics") or {}).items()})
        derived = run_dir / "derived.json"
        if derived.is_file():
            row.update({f"derived.{k}": v for k, v in json.loads(derived.read_text()).items()})
        row.update({field: record.get(field) for field in _RECORD_FIELDS})
        row["threads"] = _threads(record.get("threads"))
        row["run_dir"] = str(run_dir)
        row["completed"] = record.get("status") == "completed"
        rows.append(row)
    return pd.DataFrame(rows)


def load_spec(path: str | Path) -> dict:
    """Read a table spec; its ``reference`` is resolved relative to the spec file into ``reference_path``, and the
    file itself is ``spec_path``."""
    path = Path(path)
    spec = yaml.safe_load(path.read_text())
    spec["spec_path"] = str(path)
    if spec.get("reference"):
        spec["reference_path"] = str(path.parent / spec["reference"])
    return spec


def output_path(spec: dict) -> str:
    """Where a spec's table is written: its ``output``, by default ``results/<paper>/<table>.md``."""
    return spec.get("output") or f"results/{spec['paper']}/{spec['table']}.md"


def _equal(value, target) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return target is None
    if isinstance(value, numbers.Real) and isinstance(target, numbers.Real) and not isinstance(value, bool):
        return math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-12)
    return str(value) == str(target)


def filter_runs(runs: pd.DataFrame, match: dict | None) -> pd.DataFrame:
    """The runs whose flat keys equal every ``key: value`` of ``match`` (a missing key never matches)."""
    keep = pd.Series(True, index=runs.index)
    for key, target in (match or {}).items():
        if key not in runs:
            return runs.iloc[0:0]
        keep &= runs[key].map(lambda v, t=target: _equal(v, t)).astype(bool)
    return runs[keep]


def aggregate(values, how: str = "median_se") -> tuple[float, float]:
    """(centre, error) of ``values`` by ``median_se``, ``mean_se``, ``mean_std`` or ``max`` (the best run; error 0).

    The std is the sample std (ddof=1); the error is 0 for a single value and NaN for none.
    """
    s = pd.Series(values, dtype=float).dropna()
    if s.empty:
        return math.nan, math.nan
    std = float(s.std(ddof=1)) if len(s) > 1 else 0.0
    centres = {"median_se": s.median(), "mean_se": s.mean(), "mean_std": s.mean(), "max": s.max()}
    if how not in centres:
        raise ValueError(f"unknown aggregate {how!r}; choose one of {sorted(centres)}")
    error = {"mean_std": std, "max": 0.0}.get(how, std / math.sqrt(len(s)))
    return float(centres[how]), error


def _reference(spec: dict) -> dict:
    if not spec.get("reference_path"):
        return {}
    ref = pd.read_csv(spec["reference_path"], dtype={"row": str, "setting": str, "metric": str})
    ref = ref[ref["table"] == spec.get("reference_table", spec["table"])]
    return {(r.row, r.setting, r.metric): (float(r.value), float(r.error)) for r in ref.itertuples()}


def _cells(spec: dict, runs: pd.DataFrame):
    """Yield (row, setting, matching runs) for every row x setting of the spec."""
    runs = filter_runs(runs, spec.get("where"))
    for row in spec["rows"]:
        in_row = filter_runs(runs, row.get("match"))
        for setting in spec["settings"]:
            yield row, setting, filter_runs(in_row, setting.get("match"))


def build_table(spec_path, runs_root) -> pd.DataFrame:
    """Long-format table: one line per (row, setting, metric).

    ``spec_path`` is a spec file or a spec from :func:`load_spec`; ``runs_root`` a directory or the frame of
    :func:`load_runs`. Columns: row, setting, metric, ours, ours_err, n_runs (runs with a value), n_done (completed
    runs of the cell, with a value or not), n_failed (interrupted runs, which resume, are not), paper, paper_err,
    diff (ours − paper), tol, agrees (bool, or None when there is no paper number or no completed run), per_seed
    (the run values in seed order, formatted), steps (the distinct training lengths of the cell's runs).
    """
    spec = spec_path if isinstance(spec_path, dict) else load_spec(spec_path)
    runs = runs_root if isinstance(runs_root, pd.DataFrame) else load_runs(runs_root)
    ref, how = _reference(spec), spec.get("aggregate", "median_se")
    tol = spec.get("tolerance", {})
    out = []
    for row, setting, cell in _cells(spec, runs):
        done = cell[cell["completed"]] if len(cell) else cell
        failed = int(_failed(cell).sum())
        for metric in spec["metrics"]:
            column = _metric_column(metric["name"])
            values = done.sort_values("seed")[column] if column in done else pd.Series(dtype=float)
            ours, ours_err = aggregate(values, metric.get("aggregate", how))
            paper, paper_err = ref.get((row["name"], setting["name"], metric_id(metric)), (math.nan, math.nan))
            allowed = max(tol.get("abs", 0.0), tol.get("err_factor", 0.0) * math.hypot(ours_err, paper_err))
            known = spec.get("verdict", True) and not (math.isnan(ours) or math.isnan(paper))
            out.append({"row": row["name"], "setting": setting["name"], "metric": metric_id(metric),
                        "ours": ours, "ours_err": ours_err, "n_runs": int(pd.Series(values).notna().sum()),
                        "n_done": int(len(done)), "n_failed": failed,
                        "paper": paper, "paper_err": paper_err,
                        "diff": ours - paper, "tol": allowed if known else math.nan,
                        "agrees": bool(abs(ours - paper) <= allowed) if known else None,
                        "per_seed": ", ".join(_fmt(v) for v in values.dropna()),
                        "steps": _distinct(done.get("steps", pd.Series(dtype=float)))})
    return pd.DataFrame(out)


CENTRE_LABELS = {"median_se": "median ± s.e.", "mean_se": "mean ± s.e.", "mean_std": "mean ± std",
                 "max": "max over runs"}


def _distinct(values: pd.Series) -> str:
    """The distinct values of a column, as integers where they are whole, comma-separated ("" for none)."""
    found = {int(v) if isinstance(v, float) and v.is_integer() else v for v in values.dropna()}
    return ", ".join(str(v) for v in sorted(found, key=lambda v: (isinstance(v, str), v)))


def metric_id(metric: dict) -> str:
    """A spec metric's key in the long table and in reference.csv: its ``name``, or ``name:aggregate`` when it sets
    its own aggregate (so ``test/acc`` and ``test/acc:max`` are two metrics)."""
    return f"{metric['name']}:{metric['aggregate']}" if metric.get("aggregate") else metric["name"]


def _metric_column(name: str) -> str:
    """A spec's metric ``name`` is a key of metrics.json's ``metrics`` (``test/acc``), ``record.<field>`` for a
    record field (``record.seconds_per_step``), or ``derived.<name>`` for a key of the run's derived.json."""
    if name.startswith("record."):
        return name.removeprefix("record.")
    return name if name.startswith("derived.") else f"metric.{name}"


def _fmt(x: float, digits: int = 2) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _used(spec: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that fall in some cell of the table (a run may appear once per cell it is in)."""
    return pd.concat([cell for _, _, cell in _cells(spec, runs)]) if len(runs) else runs


def _provenance(spec: dict, used: pd.DataFrame) -> list[str]:
    """:func:`provenance` of the ``used`` runs, plus a line per ``provenance_keys`` entry (``{flat config key:
    label}``) giving the values they used (e.g. which word embeddings), ``null`` for an unset one; the paper's
    figures beside ours (its ``paper_protocol``, :func:`latentstruct.report.status.annotate`)."""
    lines = provenance(used, spec.get("command", "python -m latentstruct.report.tables"))
    done = used[used["completed"]] if len(used) else used
    for key, label in (spec.get("provenance_keys") or {}).items():
        column = done[key] if key in done else pd.Series(dtype=object)
        found = sorted({"null" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in column})
        lines.insert(-2, f"- {label} (`{key}`): {', '.join(found) or '—'}")
    return status.annotate(lines, status.protocol(spec))


def _failed(runs: pd.DataFrame) -> pd.Series:
    """Which of ``runs`` failed: ended without completing, and not interrupted (an interrupted run resumes)."""
    if not len(runs):
        return pd.Series(False, index=runs.index, dtype=bool)
    return ~runs["completed"] & (runs["status"] != "interrupted")


def _run_counts(used: pd.DataFrame, completed: int) -> str:
    """``12 completed, 1 failed`` (``, 2 interrupted (each resumes when run again)`` when some were stopped)."""
    interrupted = int((used["status"] == "interrupted").sum()) if len(used) else 0
    text = f"{completed} completed, {int(_failed(used).sum())} failed"
    return text + (f", {interrupted} interrupted (each resumes when run again)" if interrupted else "")


def _counts(values: pd.Series, missing: str) -> str:
    """``A (12), B (3)``: each distinct value with its count, most first; ``missing`` for the empty ones."""
    counts = values.fillna(missing).replace("", missing).value_counts()
    return ", ".join(f"{v} ({n})" for v, n in counts.items()) or "—"


def provenance(used: pd.DataFrame, command: str) -> list[str]:
    """Markdown bullet lines: commits, hardware, torch, seeds, run counts and wall time of the runs ``used``."""
    used = used.drop_duplicates("run_dir") if len(used) else used
    done = used[used["completed"]] if len(used) else used

    def values(col, runs=done):
        return _distinct(runs.get(col, pd.Series(dtype=object))) or "—"

    wall = done.get("wall_seconds", pd.Series(dtype=float)).astype(float)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"- git commit(s): {values('git_commit', used)}", f"- hardware: {values('hardware', used)}",
            f"- host CPU model(s), runs each: {_counts(used.get('cpu', pd.Series(dtype=object)), 'not recorded')}",
            f"- torch: {values('torch', used)}", f"- torch threads per run: {values('threads', used)}",
            f"- seeds: {values('seed')}",
            f"- runs: {_run_counts(used, len(done))}",
            f"- training steps per run: {values('steps')}",
            f"- wall seconds: {_fmt(wall.sum())} total, {_fmt(wall.median())} median per run{_cpu_share(done)}",
            f"- generated: {now}",
            f"- regenerate with: `{command}`"]


def legend(spec: dict) -> str:
    """The line under the provenance that says how to read a cell."""
    centre = CENTRE_LABELS[spec.get("aggregate", "median_se")]
    if not spec.get("reference"):
        return f"Each cell: **ours** {centre} (runs); no paper column (the notes say why)."
    return (f"Each cell: **ours** {centre} (runs) · paper (where it has a number) · Δ = ours − paper · "
            + ("✓ within tolerance." if spec.get("verdict", True) else "no verdict (see the notes)."))


def notes(spec: dict) -> list[str]:
    """The Notes section that ends a table (its spec's ``notes``), none without notes."""
    return ["", "## Notes", "", *[f"- {note}" for note in spec["notes"]]] if spec.get("notes") else []


def groups(spec: dict) -> list[tuple[str, list[tuple[str, dict]]]]:
    """The Markdown tables of a spec in order: (heading, its columns as (setting name, metric)); "" = no heading."""
    if spec.get("sections"):
        several = len(spec["metrics"]) > 1
        return [(f"## {sec['title']}" + (f": {m.get('label', m['name'])}" if several else ""),
                 [(s, m) for s in sec["settings"]]) for sec in spec["sections"] for m in spec["metrics"]]
    if spec.get("layout", "wide") == "per_metric":
        return [(f"## {m.get('label', m['name'])}", [(s["name"], m) for s in spec["settings"]])
                for m in spec["metrics"]]
    return [("", [(s["name"], m) for s in spec["settings"] for m in spec["metrics"]])]


def write_markdown(df: pd.DataFrame, spec: dict, out_path: str | Path, runs: pd.DataFrame) -> Path:
    """Write title, status line, provenance, the table, cells outside tolerance and notes to ``out_path``, and
    beside it the JSON sidecar that results/README.md is made from (:mod:`latentstruct.report.status`).

    ``layout: wide`` (default): one table, a line per row and a column per (setting, metric); ``per_metric``: one
    table per metric, a column per setting; ``sections`` (a list of ``{title, settings: [setting names]}``) splits
    the settings into titled tables (per metric). A metric's ``digits`` (default 2) sets the decimals of its cells,
    and its ``aggregate`` (e.g. ``max``: the best run, printed without ±) overrides the spec's for that metric.
    """
    paper = bool(spec.get("reference"))
    used = _used(spec, runs)
    found = status.facts(used, status.recorded_keys(spec))
    data = status.sidecar(spec, out_path, found, df.to_dict("records"))
    lines = [f"# {spec.get('title', spec['table'])}", "", data["status_line"], "", *_provenance(spec, used), "",
             legend(spec)]
    cell = df.set_index(["row", "setting", "metric"])

    def text(row: dict, setting: str, metric: dict) -> str:
        c, digits = cell.loc[(row["name"], setting, metric_id(metric))], metric.get("digits", 2)
        failed = f", {c.n_failed} failed" if c.n_failed else ""
        spread = "" if metric.get("aggregate") == "max" else f" ± {_fmt(c.ours_err, digits)}"
        ours = f"**{_fmt(c.ours, digits)}**{spread} ({c.n_runs}{failed})"
        ours = ours if c.n_runs else f"— (0{failed})"
        verdict = {True: " ✓", False: " ✗"}.get(c.agrees, "")
        if not paper or math.isnan(c.paper):
            return ours  # no paper number for this cell: ours alone
        theirs = _fmt(c.paper, digits) + ("" if math.isnan(c.paper_err) else f" ± {_fmt(c.paper_err, digits)}")
        return f"{ours} · {theirs} · {_fmt(c['diff'], digits)}{verdict}"

    for heading, cols in groups(spec):
        one = len(spec["settings"]) == 1  # a single setting: the metric names the column
        header = ["Model"] + [s if heading else m.get("label", m["name"]) if one else f"{s} {m.get('label', m['name'])}"
                              for s, m in cols]
        lines += ["", *([heading, ""] if heading else []), "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join([row.get("label", row["name"])] + [text(row, s, m) for s, m in cols]) + " |"
                  for row in spec["rows"]]
    names = {r["name"]: r.get("label", r["name"]) for r in spec["rows"]}
    bad = df[df["agrees"].astype(object).eq(False)]
    if paper and spec.get("verdict", True):
        lines += ["", "## Cells outside tolerance", ""]
        lines += [f"- {names[c.row]}, {c.setting}, {c.metric}: ours {_fmt(c.ours)} ± {_fmt(c.ours_err)}"
                  f" (n={c.n_runs}) vs paper {_fmt(c.paper)} ± {_fmt(c.paper_err)};"
                  f" Δ {_fmt(c['diff'])}, tolerance {_fmt(c.tol)}; per seed: {c.per_seed}"
                  for _, c in bad.iterrows()] or ["- none"]
    mixed = df[df["steps"].str.contains(",")] if "steps" in df else df.iloc[0:0]
    if len(mixed):
        lines += ["", "**Cells mixing runs of different lengths** (training steps; rerun or remove runs so that each "
                  "cell aggregates one protocol): "
                  + ", ".join(f"{names[c.row]} {c.setting} {c.metric} ({c.steps})" for _, c in mixed.iterrows())]
    for which, note in ((df["n_done"] == 0, "Cells without completed runs"),
                        ((df["n_done"] > 0) & (df["n_runs"] == 0), "Cells whose completed runs record no value (the "
                         "metric does not apply to the row, or was not recorded)")):
        if which.any():
            lines += ["", f"{note}: " + ", ".join(f"{names[c.row]} {c.setting} {c.metric}"
                                                  for _, c in df[which].iterrows())]
    failed = used[_failed(used)].drop_duplicates("run_dir") if len(used) else used
    if len(failed):
        errors = failed["error"].fillna("no error recorded").astype(str).value_counts()
        lines += ["", f"**Failed runs: {len(failed)}.** Their errors (metrics.json):", ""]
        lines += [f"- {count} × {' '.join(error.split())[:400]}" for error, count in errors.items()]
    lines += notes(spec)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(lines) + "\n")
    status.write_sidecar(out_path, data)
    return out_path


# ------------------------------------------------------------------------ a written table, read back

#: a cell as :func:`write_markdown` writes it: ``**ours** ± err (n[, f failed]) · paper ± err · Δ ✓``
_NUM = r"(-?\d+(?:\.\d+)?|—)"
_CELL = re.compile(
    rf"^(?:\*\*{_NUM}\*\*(?: ± {_NUM})? \((\d+)(?:, (\d+) failed)?\)|— \(0(?:, (\d+) failed)?\))"
    rf"(?: · {_NUM}(?: ± {_NUM})? · {_NUM}( [✓✗])?)?$"
)


def _float(text: str | None) -> float:
    return math.nan if text in (None, "—") else float(text)


def _values(text: str) -> list:
    items = [v.strip() for v in re.sub(r" \(paper: .*\)$", "", text).split(",")]
    return [int(v) if v.isdigit() else v for v in items if v and v != "—"]


def _cpu_share(done: pd.DataFrame) -> str:
    """'; CPU seconds: ... (x of the wall clock)' over the runs that recorded theirs ('' where none did): a share
    well below the threads per run says that other work on the machine slowed the runs."""
    both = done[["wall_seconds", "cpu_seconds"]].dropna().astype(float) if "cpu_seconds" in done else None
    if both is None or not len(both):
        return ""
    share = both["cpu_seconds"].sum() / both["wall_seconds"].sum()
    return (f"; CPU seconds {_fmt(both['cpu_seconds'].sum())} over the {len(both)} run(s) that recorded them "
            f"({share:.2f} of their wall clock)")


def parse_provenance(lines: list[str], keys: dict | None = None) -> dict:
    """:func:`latentstruct.report.status.facts` read back from a table's Markdown lines (its provenance bullets and
    its failed runs' errors); a ``keys`` entry without a line in the table is absent (not recorded)."""
    found = {
        "commits": [],
        "hardware": [],
        "torch": [],
        "seeds": [],
        "runs_completed": 0,
        "runs_failed": 0,
        "steps": [],
        "data": {},
        "errors": [],
    }
    fields = {
        "- git commit(s): ": "commits",
        "- hardware: ": "hardware",
        "- torch: ": "torch",
        "- seeds: ": "seeds",
        "- training steps per run: ": "steps",
    }
    in_errors = False
    for line in lines:
        field = next((f for f in fields if line.startswith(f)), None)
        runs = re.match(r"- runs: (\d+) completed, (\d+) failed", line)
        if field:
            found[fields[field]] = _values(line.removeprefix(field))
        elif runs:
            found["runs_completed"], found["runs_failed"] = int(runs[1]), int(runs[2])
        for key in keys or {}:
            if line.startswith("- ") and f"(`{key}`): " in line:
                found["data"][key] = [str(v) for v in _values(line.split(f"(`{key}`): ", 1)[1])]
        if line.startswith("**Failed runs:"):
            in_errors = True
        elif in_errors and line.startswith("- "):
            found["errors"].append(line.split(" × ", 1)[-1])
        elif in_errors and line.startswith("#"):
            in_errors = False
    return found


def parse_cells(lines: list[str], spec: dict) -> list[dict]:
    """The long table's cells (row, setting, metric, ours, ours_err, n_runs, n_failed, paper, paper_err, agrees) read
    back from the Markdown tables of ``spec`` (:func:`groups`, in their order)."""
    found, current = [], None
    for line in lines:
        if line.startswith("| Model |") or line.startswith("| model |"):
            current = []
            found.append(current)
        elif current is not None and line.startswith("| ") and not line.startswith("|---"):
            current.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif not line.startswith("|"):
            current = None
    cells = []
    for (_, columns), body in zip(groups(spec), found, strict=True):
        for row, texts in zip(spec["rows"], body, strict=True):
            for (setting, metric), text in zip(columns, texts[1:], strict=True):
                m = _CELL.match(text)
                if not m:
                    raise ValueError(f"cannot read the cell {text!r} ({row['name']}, {setting}, {metric['name']})")
                ours, err, n, failed, failed0, paper, perr, _, mark = m.groups()
                cells.append(
                    {
                        "row": row["name"],
                        "setting": setting,
                        "metric": metric_id(metric),
                        "ours": _float(ours),
                        "ours_err": _float(err),
                        "n_runs": int(n or 0),
                        "n_failed": int(failed or failed0 or 0),
                        "paper": _float(paper),
                        "paper_err": _float(perr),
                        "agrees": {" ✓": True, " ✗": False}.get(mark),
                    }
                )
    return cells


def committed_tables(root: Path = Path("experiments")) -> list[tuple[Path, Path]]:
    """(table Markdown, spec) of every spec whose table (or, for a figure spec, the figure's .md) is in results/."""
    pairs = []
    for spec_path in sorted(root.glob("*/*.yaml")):
        spec = load_spec(spec_path)
        outs = (
            [output_path(spec)]
            if spec.get("rows")
            else [str(Path(o).with_suffix(".md")) for o in status.companions(spec) if o.endswith(".png")]
        )
        pairs += [(Path(o), spec_path) for o in outs if Path(o).is_file()]
    return pairs


def main(argv: list[str] | None = None) -> int:
    """CLI: build one table from a spec and a runs directory, write Markdown, print the long table."""
    parser = argparse.ArgumentParser(
        prog="python -m latentstruct.report.tables",
        description="Aggregate run records (metrics.json + .hydra/) into a paper table with the paper's "
                    "numbers, the difference and a within-tolerance verdict per cell, written as Markdown.")
    parser.add_argument("spec", help="table spec YAML, e.g. experiments/spigot/table2.yaml")
    parser.add_argument("--runs", required=True, help="directory searched recursively for run records")
    parser.add_argument("--out", help="Markdown file to write (default: the spec's `output`)")
    parser.add_argument("--allow-empty", action="store_true",
                        help="write the table even when every matching run failed (it then lists their errors)")
    parser.add_argument("--command", help="the command that made the table, for its 'regenerate with' line and its "
                                          "sidecar (default: the spec's `command`; make table passes its own)")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    if args.command:
        spec["command"] = args.command
    if "rows" not in spec:
        sys.exit(f"error: {args.spec} has no rows: it makes figures only (python -m latentstruct.report.reproduce)")
    runs = load_runs(args.runs)
    df = build_table(spec, runs)
    if df["n_runs"].sum() == 0 and not (args.allow_empty and df["n_failed"].sum()):
        sys.exit(f"error: no completed run under {args.runs} matches any cell of {args.spec} "
                 f"({len(runs)} run record(s) found)")
    out = args.out or output_path(spec)
    print(f"wrote {write_markdown(df, spec, out, runs)}")
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

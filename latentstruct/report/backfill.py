"""One-off (issue #19): the sidecar and status line of committed tables whose run records were not kept.

    python -m latentstruct.report.backfill [results/spigot/table3_sst.md ...]   # default: every spec's table

The tables committed before :mod:`latentstruct.report.status` existed have no sidecar, and their run records
(``multirun/``) are gone. This reads each table's Markdown as :func:`latentstruct.report.tables.write_markdown` wrote
it — the provenance bullets and the cells ``**ours** ± err (n) · paper ± err · Δ ✓`` — with its spec, writes the
sidecar (``source`` says it was parsed) and rewrites the Markdown around the cells: the status line under the title,
the paper's figures beside the provenance, the legend and the Notes as the spec now renders them. The cells, the
cells outside tolerance and the failures are kept as written. Running it again changes nothing; a table regenerated
by ``make table`` needs none of it.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from latentstruct.report import status, tables

__all__ = ["SOURCE", "parse_provenance", "parse_cells", "backfill", "main"]

SOURCE = "parsed from the committed table; run records not kept"
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
    back from the Markdown tables of ``spec`` (:func:`latentstruct.report.tables.groups`, in their order)."""
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
    for (_, columns), body in zip(tables.groups(spec), found, strict=True):
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
                        "metric": tables.metric_id(metric),
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


def backfill(markdown: str | Path, spec_path: str | Path) -> dict:
    """Write the sidecar of a committed table and rewrite its head and Notes (module docstring); returns the
    sidecar."""
    markdown, spec = Path(markdown), tables.load_spec(spec_path)
    lines = markdown.read_text().splitlines()
    body = [line for line in lines if not line.startswith("**Status:")]
    cells = parse_cells(body, spec) if spec.get("rows") else []
    data = status.sidecar(spec, markdown, parse_provenance(body, spec.get("provenance_keys")), cells, SOURCE)
    if "## Notes" in body and spec.get("rows"):
        body = body[: body.index("## Notes") - 1]
    head = [i for i, line in enumerate(body) if line.startswith("- ")][:1]
    start = head[0] if head else 2
    end = next((i for i in range(start, len(body)) if not body[i].startswith("- ")), len(body))
    provenance = status.annotate(body[start:end], status.protocol(spec))
    rest = [tables.legend(spec) if line.startswith("Each cell: **ours**") else line for line in body[end:]]
    out = [body[0], "", data["status_line"], "", *provenance, *rest]
    out += tables.notes(spec) if spec.get("rows") else []
    markdown.write_text("\n".join(out) + "\n")
    status.write_sidecar(markdown, data)
    return data


def _committed(root: Path = Path("experiments")) -> list[tuple[Path, Path]]:
    """(table Markdown, spec) of every spec whose table (or, for a figure spec, the figure's .md) is in results/."""
    pairs = []
    for spec_path in sorted(root.glob("*/*.yaml")):
        spec = tables.load_spec(spec_path)
        outs = (
            [tables.output_path(spec)]
            if spec.get("rows")
            else [str(Path(o).with_suffix(".md")) for o in status.companions(spec) if o.endswith(".png")]
        )
        pairs += [(Path(o), spec_path) for o in outs if Path(o).is_file()]
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.report.backfill", description=__doc__.split("\n")[0])
    parser.add_argument("tables", nargs="*", help="table Markdown files (default: every spec's committed table)")
    args = parser.parse_args(argv)
    pairs = _committed()
    chosen = [(md, spec) for md, spec in pairs if not args.tables or str(md) in args.tables]
    for md, spec in chosen:
        print(f"{md}: {backfill(md, spec)['status_line']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

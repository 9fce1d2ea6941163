"""One-off (issue #19): the sidecar and status line of committed tables whose run records were not kept.

    python -m scripts.backfill [results/spigot/table3_sst.md ...]   # default: every spec's table

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
import sys
from pathlib import Path

from latentstruct.report import status, tables
from latentstruct.report.tables import committed_tables, parse_cells, parse_provenance

__all__ = ["SOURCE", "backfill", "main"]

SOURCE = "parsed from the committed table; run records not kept"


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.backfill", description=__doc__.split("\n")[0])
    parser.add_argument("tables", nargs="*", help="table Markdown files (default: every spec's committed table)")
    args = parser.parse_args(argv)
    pairs = committed_tables()
    chosen = [(md, spec) for md, spec in pairs if not args.tables or str(md) in args.tables]
    for md, spec in chosen:
        print(f"{md}: {backfill(md, spec)['status_line']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

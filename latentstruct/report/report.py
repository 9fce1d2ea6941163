"""results/README.md: one line per paper table, made from the sidecars beside the tables (``make report``).

    python -m latentstruct.report.report [--results results]

Every ``<table>.json`` under ``--results`` that :mod:`latentstruct.report.status` wrote becomes a line: the table
(linked), its status against the paper's protocol and what differs, the runs behind it, the cells within tolerance,
the headline computed from its numbers, and its figures. A benchmark's Markdown (results/bench/) gets a line with
its own status line, and so does each page of the lab (results/lab/). Nothing in the page is typed by hand: rerun
this after ``make table``.

Before writing the page, ``main`` computes each sidecar's code verdict again (:func:`refresh_code`, with
:mod:`latentstruct.report.code`): whether the table's runs ran one code, commits whose ``latentstruct/`` or
``configs/`` differ (mixed), or commits this git cannot check (unverifiable); where it changed, the sidecar's status
line and the table's Markdown get the new words. A verdict reached with the full history is kept when a shallow
clone cannot find the commits again.

**Before → now.** ``--before REV`` reads the sidecars committed at ``REV`` (git) and keeps what the page compares,
each table's status and cells within tolerance, in ``results/before.json`` (:func:`snapshot`); the page then opens
with the counts then and now and gives each table's cells then beside its cells now. The page reads the kept
snapshot, not git, so a shallow clone renders it the same.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from latentstruct.report import code
from latentstruct.report.status import SIDECAR_FORMAT, write_sidecar

__all__ = ["sidecars", "refresh_code", "snapshot", "render", "main"]

_STATUSES = ("full", "reduced", "blocked")
#: the snapshot of an earlier report that the page compares with (:func:`snapshot`), beside README.md
BEFORE = "before.json"


def sidecars(results: str | Path) -> list[dict]:
    """The table sidecars under ``results``, each with ``path`` (its Markdown, relative to ``results``)."""
    results, datas = Path(results), []
    for path in results.rglob("*.json"):
        try:
            datas.append((path.relative_to(results), json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return _tables_from(datas)


def _tables_from(datas: Iterable[tuple[str | Path, dict]]) -> list[dict]:
    """The sidecars among ``(path of the JSON relative to results, its data)`` pairs, each with ``path``."""
    found = []
    for path, data in datas:
        if isinstance(data, dict) and data.get("format") == SIDECAR_FORMAT:
            found.append({**data, "path": Path(path).with_name(data["markdown"]).as_posix()})
    return sorted(found, key=lambda t: t["path"])


def _committed(results: Path, rev: str) -> list[dict]:
    """The sidecars under ``results`` as committed at ``rev``."""
    prefix = code._git(results, "rev-parse", "--show-prefix")
    listed = code._git(results, "ls-tree", "-r", "--name-only", rev, "--", ".")
    if prefix.returncode or listed.returncode:
        raise SystemExit(f"--before {rev}: {(prefix.stderr or listed.stderr).strip()}")
    datas = []
    for name in listed.stdout.split("\n"):
        if name.endswith(".json"):
            shown = code._git(results, "show", f"{rev}:{prefix.stdout.strip()}{name}")
            try:
                datas.append((name, json.loads(shown.stdout)))
            except json.JSONDecodeError:
                continue
    return _tables_from(datas)


def _counts(tables: list[dict]) -> dict:
    counts = {s: sum(t["status"] == s for t in tables) for s in _STATUSES}
    cells = {k: sum(t["cells"][k] for t in tables) for k in ("within_tolerance", "compared")}
    return {"tables": len(tables), **counts, **cells}


def snapshot(results: str | Path, rev: str) -> dict:
    """What the page compares of the sidecars committed at ``rev``: per table its status and cells, and the totals."""
    results = Path(results)
    full = code._git(results, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if full.returncode:
        raise SystemExit(f"--before {rev}: not a commit of this git's history")
    tables = _committed(results, rev)
    return {
        "commit": full.stdout.strip(),
        "date": code._git(results, "log", "-1", "--format=%cd", "--date=short", rev).stdout.strip(),
        "counts": _counts(tables),
        "tables": {
            t["path"]: {"status": t["status"], "cells": {k: t["cells"][k] for k in ("within_tolerance", "compared")}}
            for t in tables
        },
    }


def _before(results: Path) -> dict | None:
    path = results / BEFORE
    return json.loads(path.read_text()) if path.is_file() else None


def _then_now(before: dict, now: dict) -> str:
    """The counts of the snapshot and of the page, one sentence."""
    was = before["counts"]
    parts = [f"{k} {was[k]} → {now[k]}" for k in ("tables", *_STATUSES)]
    cells = [f"{c['within_tolerance']} of {c['compared']} compared" for c in (was, now)]
    return (
        f"**Before → now** (the sidecars committed at {before['commit'][:7]}, {before['date']}, "
        f"`make report BEFORE=<rev>` → {BEFORE}): {'; '.join(parts)}; cells within tolerance "
        f"{cells[0]} → {cells[1]}."
    )


def _was(before: dict | None, table: dict) -> str:
    """What the snapshot said of ``table`` where it differs from now: its cells within tolerance and status."""
    if not before:
        return ""
    was = before["tables"].get(table["path"])
    if was is None:
        return " (new)"
    then, now = was["cells"], {k: table["cells"][k] for k in was["cells"]}
    if (was["status"], then) == (table["status"], now):
        return ""
    cells = f"{then['within_tolerance']} / {then['compared']}, " if then["compared"] or now["compared"] else ""
    return f" (before: {cells}{was['status']})"


def _settled_here(old: dict | None, new: dict) -> bool:
    """Whether ``old`` (one / mixed, with the same commits) was decided by a git that knew commits this one lacks."""
    lost = new["verdict"] == "unverifiable" and all(u["why"] == code.UNKNOWN for u in new["unverifiable"])
    return bool(old) and lost and old["verdict"] in ("one", "mixed") and old["commits"] == new["commits"]


def refresh_code(results: str | Path) -> list[Path]:
    """Each sidecar's code verdict computed again from its runs' commits; where it changed, the sidecar's
    ``status_line`` and the same line of its Markdown end with the new sentence. Returns the sidecars rewritten."""
    changed = []
    for data in sidecars(results):
        old, found = data.get("code"), data["provenance"]
        new = code.verdict(found.get("commits") or [], found.get("dirty_commits") or [])
        if new == old or _settled_here(old, new):
            continue
        line, said = data["status_line"], code.sentence(old)
        base = line[: -len(said) - 1] if said and line.endswith(" " + said) else line
        now = code.sentence(new)
        data["code"], data["status_line"] = new, base + (f" {now}" if now else "")
        markdown = Path(results) / data.pop("path")
        if markdown.is_file():
            text = markdown.read_text().split("\n")
            markdown.write_text("\n".join(data["status_line"] if t == line else t for t in text))
        changed.append(write_sidecar(markdown, data))
    return changed


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _protocol(data: dict) -> str:
    """Ours (runs, seeds, steps per run, hardware) beside the paper's (length, runs per number)."""
    found, paper = data["provenance"], data["paper_protocol"]
    steps = found.get("steps") or []
    length = "–".join(f"{s:,}" for s in sorted({min(steps), max(steps)})) + " steps" if steps else "steps not recorded"
    ours = (
        f"ours: {found.get('runs_completed', 0)} runs, {len(found.get('seeds') or [])} seed(s), {length}, "
        f"{', '.join(found.get('hardware') or ['—'])}"
    )
    theirs = [paper.get("length"), paper.get("runs") and f"{paper['runs']} run(s) per number"]
    theirs += [d["paper"] for d in paper.get("data") or []] + [paper.get("hardware")]
    return f"{ours} · paper: {', '.join(t for t in theirs if t) or 'not stated'}"


def _link(path: str) -> str:
    """A spec's output path (``results/spigot/x.png``) as a link from results/README.md."""
    rel = Path(path).relative_to("results") if path.startswith("results/") else Path(path)
    return f"[{rel.name}]({rel.as_posix()})"


def render(results: str | Path = "results") -> str:
    """The Markdown of results/README.md (links are relative to ``results``)."""
    results = Path(results)
    tables, before = sidecars(results), _before(results)
    counts = _counts(tables)
    codes = {s: sum((t.get("code") or {}).get("verdict") == s for t in tables) for s in ("mixed", "unverifiable")}
    lines = [
        "# Results: what is reproduced",
        "",
        "Generated by `make report` (`python -m latentstruct.report.report`) from the JSON sidecar beside each "
        "table, which `make table T=<paper>/<table>` writes (latentstruct/report/status.py); do not edit by hand. "
        f"{len(tables)} tables: {counts['full']} full protocol, {counts['reduced']} reduced, "
        f"{counts['blocked']} blocked; {codes['mixed']} mix code, {codes['unverifiable']} with code unverifiable.",
        "",
        "**One code**: a table whose runs ran commits that differ in `latentstruct/` or `configs/` (outside "
        "`latentstruct/report/` and Markdown; `git diff` between the commits) is marked *mixed code*, with the "
        "files that differ; *code unverifiable* when a run's commit is not in this git's history or the run had "
        "uncommitted changes (latentstruct/report/code.py).",
        "",
        "**Status**: *full protocol* = the paper's training length, runs per number and data (as far as the runs "
        "record them); *reduced* = fewer steps or runs, data substituted, or cells without runs (each named); "
        "*blocked* = no run completed (the runs' error says what is missing). The paper's protocol is the "
        "`paper_protocol` block of each spec in experiments/. † the sidecar was parsed from the committed table, "
        "whose run records were not kept (scripts/backfill.py).",
        *(["", _then_now(before, counts)] if before else []),
        "",
        "| Table | Status: what differs from the paper | Protocol | Cells within tolerance | Headline | Figures |",
        "|---|---|---|---|---|---|",
    ]
    for t in sorted(tables, key=lambda t: (t["paper"] or "", t["path"])):
        c = t["cells"]
        within = (
            f"{c['within_tolerance']} / {c['compared']}"
            if c["compared"]
            else ("— (no run)" if t["status"] == "blocked" else "no verdict" if c["with_paper"] else "no paper numbers")
        )
        within += _was(before, t)
        reason = "; ".join(t["differs"]) or "—"
        if t["unknown"]:
            reason += f" (not recorded: {'; '.join(t['unknown'])})"
        if (t.get("code") or {}).get("verdict") in ("mixed", "unverifiable"):
            reason = code.sentence(t["code"]) if reason == "—" else f"{reason}. {code.sentence(t['code'])}"
        source = " †" if t["source"] != "run records" else ""
        figures = ", ".join(_link(f) for f in t["companions"]) or "—"
        lines.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in [
                    f"[{t['title']}]({Path(t['path']).as_posix()}){source}",
                    f"**{t['status']}**: {reason}",
                    _protocol(t),
                    within,
                    t["headline"],
                    figures,
                ]
            )
            + " |"
        )
    lines += _ablations(results)
    lines += _pages(results, "bench", "Benchmarks")
    lines += _pages(results, "lab", "The lab: beyond the papers")
    return "\n".join(lines) + "\n"


def _ablations(results: Path) -> list[str]:
    """A section linking the ablation pages beside the tables (``make ablation-*``: a page whose status line starts
    ``Status: **ablation**``), each with what it ablates (its status line up to ``Made by``)."""
    lines = []
    for path in sorted(results.glob("*/*.md")):
        text = path.read_text()
        found = re.search(r"^Status: \*\*ablation\*\*[^\n]*", text, re.M)
        if found:
            title = next((line[2:] for line in text.splitlines() if line.startswith("# ")), path.stem)
            what = found[0].split(" Made by ")[0]
            lines.append(f"- [{title}]({path.relative_to(results).as_posix()}): {what}")
    return ["", "## Ablations: what explains a row", "", *lines] if lines else []


def _pages(results: Path, folder: str, heading: str) -> list[str]:
    """A section linking the Markdown pages of ``results/<folder>``, each with its title and status line."""
    pages = sorted((results / folder).glob("*.md")) if (results / folder).is_dir() else []
    lines = ["", f"## {heading}", ""] if pages else []
    for path in pages:
        text = path.read_text()
        title = next((line[2:] for line in text.splitlines() if line.startswith("# ")), path.stem)
        found = re.search(r"^\*\*Status:[^\n]*", text, re.M)
        lines.append(f"- [{title}]({folder}/{path.name}): {found[0] if found else 'no status line'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m latentstruct.report.report",
        description="Write results/README.md from the tables' JSON sidecars.",
    )
    parser.add_argument("--results", default="results", help="the results folder (default: results)")
    parser.add_argument(
        "--before", metavar="REV",
        help=f"compare with the sidecars committed at REV: kept in <results>/{BEFORE}, which later calls read",
    )
    args = parser.parse_args(argv)
    out = Path(args.results, "README.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.before:
        kept = Path(args.results, BEFORE)
        kept.write_text(json.dumps(snapshot(args.results, args.before), indent=1) + "\n")
        print(f"wrote {kept}")
    for path in refresh_code(args.results):
        print(f"code verdict changed: {path}")
    out.write_text(render(args.results))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

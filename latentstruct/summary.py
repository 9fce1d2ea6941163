"""The summary of a folder of runs: a row per run (its overrides, status, main metrics, minutes), and the runs that
differ only by their seed grouped (mean ± standard deviation).

    python -m latentstruct.summary multirun/2026-11-26/21-30-00      # any folder of runs, searched recursively

prints both tables and writes them beside the runs: ``summary.csv`` (a row per run), ``summary.md`` (both tables).
Every multirun does the same when it ends (:class:`SweepSummary`, the Hydra callback of ``configs/train.yaml``), so
that six runs need no grep through six ``metrics.json``.

A run's overrides are its ``.hydra/overrides.yaml`` less the keys that do not change what it computes (those its
directory name leaves out: ``hydra.job.config.override_dirname.exclude_keys``: threads, progress, resume...). Its
main metrics are the ``test/`` metrics of its record (else the ``valid/`` ones), losses last, at most
:data:`MAX_METRICS` columns in all.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

__all__ = ["MAX_METRICS", "read_yaml", "runs", "per_run", "per_setting", "markdown", "write", "summarize",
           "SweepSummary", "main"]

MAX_METRICS = 4
SEED = "trainer.seed"


# libyaml's parser where PyYAML was built with it (the wheels are): the same objects as yaml.safe_load, ~10x faster,
# which matters where a table or a sweep's summary reads the .hydra/ files of a thousand runs.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    """A run's YAML file as ``yaml.safe_load`` reads it (``${...}`` interpolations stay strings); None if missing."""
    return yaml.load(path.read_text(), Loader=_LOADER) if path.is_file() else None


def _yaml(path: Path) -> Any:
    try:
        return read_yaml(path)
    except (OSError, yaml.YAMLError):
        return None


def _overrides(run: Path) -> list[str]:
    given = _yaml(run / ".hydra" / "overrides.yaml") or []
    hydra = (_yaml(run / ".hydra" / "hydra.yaml") or {}).get("hydra") or {}
    skip = set(((hydra.get("job") or {}).get("config") or {}).get("override_dirname", {}).get("exclude_keys") or [])
    return [o for o in given if o.split("=", 1)[0].lstrip("+~") not in skip]


def runs(root: str | Path) -> list[dict]:
    """Every run under ``root`` (a folder holding a ``metrics.json``), in order of its path: ``run`` (the path from
    ``root``), ``overrides``, ``status``, ``metrics``, ``minutes``, ``error``."""
    root, found = Path(root), []
    for path in sorted(root.rglob("metrics.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            record = {"status": "failed", "error": f"unreadable metrics.json: {exc}"}
        wall = record.get("wall_seconds")
        found.append({"run": path.parent.relative_to(root).as_posix() or ".", "overrides": _overrides(path.parent),
                      "status": record.get("status", "?"), "metrics": record.get("metrics") or {},
                      "minutes": wall / 60 if isinstance(wall, (int, float)) else None, "error": record.get("error")})
    return found


def _main_metrics(found: list[dict]) -> list[str]:
    names = list(dict.fromkeys(k for r in found for k in r["metrics"]))
    for prefix in ("test/", "valid/", ""):
        chosen = [n for n in names if n.startswith(prefix)]
        if chosen:
            return sorted(chosen, key=lambda n: "loss" in n)[:MAX_METRICS]
    return []


def _number(x: Any) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def per_run(found: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the per-run table."""
    metrics = _main_metrics(found)
    rows = [[" ".join(r["overrides"]) or "(defaults)", r["status"], *(_number(r["metrics"].get(m)) for m in metrics),
             _number(r["minutes"])] for r in found]
    return ["overrides", "status", *metrics, "minutes"], rows


def per_setting(found: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the table grouping the runs that differ only by ``trainer.seed``: runs (completed of
    all), each main metric's mean ± standard deviation over the completed runs, and the mean minutes."""
    metrics, groups = _main_metrics(found), {}
    for r in found:
        key = " ".join(o for o in r["overrides"] if o.split("=", 1)[0] != SEED) or "(defaults)"
        groups.setdefault(key, []).append(r)
    rows = []
    for key, group in groups.items():
        done = [r for r in group if r["status"] == "completed"]
        cells = []
        for m in metrics:
            values = [r["metrics"][m] for r in done if isinstance(r["metrics"].get(m), (int, float))]
            spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
            cells.append(f"{statistics.mean(values):.2f}{spread}" if values else "—")
        minutes = [r["minutes"] for r in group if r["minutes"] is not None]
        rows.append([key, f"{len(done)}/{len(group)}", *cells, _number(statistics.mean(minutes) if minutes else None)])
    return ["setting (seeds grouped)", "completed runs", *(f"{m} (mean ± std)" for m in metrics), "minutes"], rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows)]


def markdown(found: list[dict], root: str | Path) -> str:
    """``summary.md``: the runs, then the settings with their seeds grouped, then the failed runs' errors."""
    lines = [f"# Summary of {len(found)} run(s) under {Path(root).name or root}", "",
             "Written by `python -m latentstruct.summary` (and at the end of every multirun).", "",
             "## Runs", "", *_table(*per_run(found)), "", "## Seeds grouped", "", *_table(*per_setting(found))]
    failed = [r for r in found if r["status"] not in ("completed", "interrupted")]
    if failed:
        lines += ["", "## Failed runs", "", *(f"- {r['run']}: {' '.join(str(r['error']).split())[:300]}"
                                              for r in failed)]
    return "\n".join(lines) + "\n"


def write(found: list[dict], root: str | Path) -> tuple[Path, Path]:
    """``summary.csv`` (a row per run) and ``summary.md`` in ``root``."""
    import csv

    root = Path(root)
    header, rows = per_run(found)
    with open(root / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", *header, "error"])
        writer.writerows([r["run"], *row, r["error"] or ""] for r, row in zip(found, rows, strict=True))
    (root / "summary.md").write_text(markdown(found, root))
    return root / "summary.csv", root / "summary.md"


def _plain(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def summarize(root: str | Path, out=print) -> list[dict]:
    """Print the summary of the runs under ``root`` and write it there (nothing when there is no run)."""
    found = runs(root)
    if not found:
        out(f"no run under {root} (no metrics.json)")
        return found
    csv_path, md_path = write(found, root)
    out(f"\n{len(found)} run(s) under {root}:\n{_plain(*per_run(found))}")
    if any(len(r["overrides"]) != len([o for o in r["overrides"] if not o.startswith(SEED + "=")]) for r in found):
        out(f"\nseeds grouped:\n{_plain(*per_setting(found))}")
    out(f"\nwrote {csv_path} and {md_path}")
    return found


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, :func:`summarize` its sweep directory, also when a failed job ends
    the sweep early (Hydra then skips ``on_multirun_end``: the summary is made when the process exits)."""

    def __init__(self) -> None:
        self.root: str | None = None

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        self.root = str(config.hydra.sweep.dir)
        atexit.register(self._at_exit)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        atexit.unregister(self._at_exit)
        summarize(self.root or config.hydra.sweep.dir)

    def _at_exit(self) -> None:
        if self.root and Path(self.root).is_dir():
            summarize(self.root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a folder of runs (searched recursively for metrics.json), e.g. a sweep's")
    args = parser.parse_args(argv)
    if not Path(args.root).is_dir():
        sys.exit(f"error: {args.root} is not a folder")
    return 0 if summarize(args.root) else 1


if __name__ == "__main__":
    sys.exit(main())

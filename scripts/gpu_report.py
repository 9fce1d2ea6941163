"""``make gpu-results FROM=<dir>``: the files scripts/gpu_check.sh left in $OUT, brought back by the device tool, into
``results/bench/gpu.md`` (with ``gpu.json``, the raw sheets together) and ``results/bench/structures_cuda.md``
(with its ``.json``, as bench/structures.py wrote them there).

    python scripts/gpu_report.py DIR [--out results/bench]

gpu.md opens with its status (every step of the check ok, or which were not), the machine and the commit; then the
steps, the CUDA tests (counts and every failure), the experiments trained on the device (per family; the repeats,
bit for bit or not; the joblib sweep), the host round trips per structure operation, the implicit gradient's two ways
of making Hessian-vector products (bench/implicit.py on the device), and the timing sheet
(bench/tables.py: seconds per step, epoch and evaluation of every table's configuration, device-hours per table).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.tables import render as render_timing  # noqa: E402
from bench.tables import resumed_note  # noqa: E402
from scripts.gpu_check import NOT_ASKED  # noqa: E402

NEEDED = ("env.json", "timing.json")  # experiments.json is absent where gpu_check.sh --only left that step out
# The device machine's own paths (its checkout, its Python, $OUT) say nothing here and are no paths of this machine:
# results name them by what they are.
MACHINE_PATHS = ((re.compile(r"/[^\s\"'`(]*/\.device/data"), "$LATENTSTRUCT_DATA"),
                 (re.compile(r"/[^\s\"'`(]*/site-packages/"), "<site-packages>/"),
                 (re.compile(r"/[^\s\"'`(]*/(?=(latentstruct|scripts|bench|tests)/)"), ""),
                 (re.compile(r"/root/out/"), "$OUT/"))


def scrub(text: str) -> str:
    """``text`` with the device machine's paths replaced by what they are (MACHINE_PATHS)."""
    for pattern, replacement in MACHINE_PATHS:
        text = pattern.sub(replacement, text)
    return text


def _load(source: Path, name: str):
    path = source / name
    return json.loads(path.read_text()) if path.is_file() else None


def tests_summary(path: Path) -> tuple[Counter, list[str]]:
    """Counts of passed / failed / skipped tests in a pytest junit file, and a line per failure."""
    counts, failures = Counter(), []
    if not path.is_file():
        return counts, ["no tests.xml: the tests step did not finish"]
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            failures.append(f"{name}: {(bad.get('message') or '').splitlines()[0][:300] if bad.get('message') else ''}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failures


def markdown(source: Path, implicit: dict | None = None) -> list[str]:
    """gpu.md's lines from the files in ``source`` (module docstring); ``implicit``: the sheet of a later
    ``bench/implicit.py --device cuda`` run alone, shown instead of the check's implicit step."""
    env = _load(source, "env.json")
    experiments = _load(source, "experiments.json") or {}
    syncs = _load(source, "syncs.json")
    timing = _load(source, "timing.json")
    steps = env.get("steps", {})
    log = (source / "check.log").read_text(errors="replace") if (source / "check.log").is_file() else ""
    bad = [f"{name} {s['status']}" for name, s in steps.items() if s["status"] not in ("ok", "skipped")]

    def asked(step: str) -> bool:  # a step gpu_check.sh --only left out: named in no title, no section of its own
        return (steps.get(step) or {}).get("note") != NOT_ASKED

    device = env.get("gpu") or "CPU (dry run)"
    lines = [
        "# The GPU check" + ("" if all(map(asked, steps)) else ": " + ", ".join(filter(asked, steps)) + " alone"),
        "",
        f"**Status: {'every step ok' if not bad else 'not every step ok: ' + ', '.join(bad)}** — "
        f"`scripts/gpu_check.sh` on {device}, its results as it wrote them (docs/gpu.md: how to run it, how to read "
        "this).",
        "",
        f"- machine: {env.get('nvidia_smi') or device}; {env.get('cpu_cores')} CPU cores",
        f"- torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, Python {env.get('python')}",
        f"- git commit: {env.get('git_commit')}{' (dirty)' if env.get('git_dirty') else ''} "
        f"(the bundle's stamp: {env.get('bundle_commit')})",
        f"- bundle as installed there: {', '.join(f'{k} {v}' for k, v in (env.get('bundle') or {}).items())}",
        "- regenerate with: `make device-bundle`, `scripts/gpu_check.sh` through the device tool, then "
        "`make gpu-results FROM=<the files it brought back>`",
        "",
        "## Steps",
        "",
        "| step | status | seconds | note |",
        "|---|---|---|---|",
        *[f"| {name} | {s['status']} | {s.get('seconds', '—')} | "
          f"{'; '.join(filter(None, [s.get('note', ''), _step_error(log, name) if s['status'] == 'failed' else '']))} |"
          for name, s in steps.items()],
    ]
    if asked("tests"):
        counts, failures = tests_summary(source / "tests.xml")
        lines += ["", "## CUDA tests (`pytest -m cuda`)", "",
                  f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped.", ""]
        lines += [f"- FAILED {f}" for f in failures]
    lines += _experiments(experiments) if asked("experiments") else []
    lines += _syncs(syncs) if asked("syncs") else []
    if asked("implicit"):
        lines += _implicit((steps.get("implicit") or {}).get("sheet"), implicit, steps.get("implicit"))
    lines += ["", "## Timing sheet (`bench/tables.py`)", ""]
    if timing:
        lines += [f"One run at a time on {timing.get('hardware')}, torch {timing.get('torch')}; a run's device-seconds "
                  "= its steps per phase × s/step + its evaluations × s/eval (checkpoints and data loading left out); "
                  "≈: estimated from the timed configurations of the same experiment. **sessions, at least**: the "
                  f"longest run over {timing.get('session_minutes')} minutes, or the device-hours over "
                  f"{timing.get('cpu_cores')} runs at once for {timing.get('session_minutes')} minutes, whichever is "
                  f"more (a lower bound: runs at once share the GPU). Timed in {timing.get('seconds', 0):.0f} s."
                  + resumed_note(timing), ""]
        lines += render_timing(timing)
    else:
        lines.append("No timing sheet: the timing step did not run.")
    lines += ["", "## Determinism settings in force", "",
              *[f"- {k}: {v}" for k, v in (env.get("determinism") or {}).items()],
              "", "docs/gpu.md says what is and is not bit-reproducible on a GPU."]
    return lines


def _experiments(sheet: dict) -> list[str]:
    runs = sheet.get("runs", [])
    lines = ["", "## Every experiment on the device", "",
             "Two steps, or one epoch of each phase, on subsets of the bundle's data (scripts/gpu_check.py TINY).", "",
             "| family | trained | not trained | seconds |", "|---|---|---|---|"]
    for family in dict.fromkeys(r["family"] for r in runs):
        mine = [r for r in runs if r["family"] == family]
        missed = ", ".join(f"{r['experiment']} ({r['status']})" for r in mine if r["status"] != "completed")
        lines.append(f"| {family} | {sum(r['status'] == 'completed' for r in mine)} of {len(mine)} | "
                     f"{missed or '—'} | {sum(r['seconds'] for r in mine if 'seconds' in r):.0f} |")
    failed = [r for r in runs if r["status"] != "completed"]
    lines += [""] + [f"- {r['experiment']}: {r.get('error', r['status'])}" for r in failed]
    repeats = sheet.get("repeats", [])
    if repeats:
        lines += ["", "Trained twice from the same seed, on the device: is the history the same bit for bit?", "",
                  "| experiment | identical | largest difference |", "|---|---|---|"]
        lines += [f"| {r['experiment']} | {'yes' if r['identical'] else 'no' if r['identical'] is False else '—'} | "
                  f"{r.get('max_abs_difference') if r.get('max_abs_difference') is not None else r.get('note', '—')} |"
                  for r in repeats]
    sweep = sheet.get("launcher_sweep") or {}
    lines += ["", f"Two runs through `python -m latentstruct.train -m` with the joblib launcher: {sweep.get('status')}"
              f" ({', '.join(map(str, sweep.get('runs', []))) or 'no runs'})."]
    return lines


def _step_error(log: str, step: str) -> str:
    """The last exception line that check.log shows between ``step``'s start and its failure ('' if none)."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if f"] {step}: starting" in line), 0)
    end = next((i for i, line in enumerate(lines) if f"] {step}: failed" in line), None)
    for line in reversed(lines[start:end] if end is not None else []):
        if re.match(r"[A-Za-z_.]*(Error|Exception)\b.*: ", line):
            return f"`{line.strip()[:300]}`"
    return ""


def _implicit(sheet, rerun=None, step=None) -> list[str]:
    """The implicit step's sheet (bench/implicit.py on the device): cost rows and the two ways of the products; or,
    given ``rerun``, that later run's sheet, said as such beside the step's status."""
    lines = ["", "## Implicit gradient: double backward vs forward-over-reverse (`bench/implicit.py`)", ""]
    if rerun:
        lines += [f"From a later call that ran `bench/implicit.py` alone on {rerun.get('gpu', rerun.get('device'))} "
                  f"at commit {rerun.get('commit')} ({rerun.get('generated')}), not from this check's step "
                  f"(status {(step or {}).get('status', '—')}: {(step or {}).get('note', '')}).", ""]
        sheet = rerun
    if not sheet:
        return lines + ["Not measured: the implicit step did not run or wrote no sheet."]
    from bench.implicit import cost_lines, product_lines

    lines += [f"`{scrub(sheet.get('command', ''))}` on {sheet.get('device')}; L_CD, MINRES at tol 0.2; each row "
              "of a table timed interleaved in one process (medians).", ""]
    for dataset, res in sheet.get("datasets", {}).items():
        lines += [f"**{dataset}**", "", *cost_lines(res, sheet["args"]["max_iter"]), *product_lines(res)]
    return lines


def _syncs(rows) -> list[str]:
    lines = ["", "## Host round trips per structure operation", ""]
    if not rows:
        return lines + ["Not counted (CUDA only)."]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    lines += ["Synchronising CUDA calls of one call (batch 8, n = 10), counted by torch's sync debug mode.", "",
              "| structure | " + " | ".join(ops) + " |", "|---" * (len(ops) + 1) + "|"]
    for name in dict.fromkeys(r["structure"] for r in rows):
        cells = {r["op"]: str(r["syncs"]) if "syncs" in r else "error" for r in rows if r["structure"] == name}
        lines.append(f"| {name} | " + " | ".join(cells.get(op, "—") for op in ops) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the folder of gpu_check.sh's files")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    parser.add_argument("--name", default="gpu", help="the files' name: NAME.md, NAME.json (default gpu; "
                        "gpu_timing for a call of gpu_check.sh --only timing, which must not replace the whole check)")
    parser.add_argument("--implicit", type=Path, help="the implicit.json of a later bench/implicit.py --device cuda "
                        "call, shown instead of the check's implicit step (where that step failed)")
    args = parser.parse_args(argv)
    missing = [name for name in NEEDED if not (args.source / name).is_file()]
    if missing:
        print(f"error: {', '.join(missing)} not in {args.source}: not the files of scripts/gpu_check.sh",
              file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    rerun = json.loads(args.implicit.read_text()) if args.implicit else None
    md, js = args.out / f"{args.name}.md", args.out / f"{args.name}.json"
    md.write_text(scrub("\n".join(markdown(args.source, rerun)) + "\n"))
    raw = {name: _load(args.source, name) for name in ("env.json", "experiments.json", "syncs.json", "timing.json")}
    raw["implicit_rerun"] = rerun
    js.write_text(scrub(json.dumps(raw, indent=1) + "\n"))
    written = [md, js]
    for path in sorted(args.source.glob("structures_*.md")) + sorted(args.source.glob("structures_*.json")):
        written.append(args.out / path.name)
        written[-1].write_text(scrub(path.read_text()))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

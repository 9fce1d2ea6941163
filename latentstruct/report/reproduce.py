"""Reproduce a paper table from its spec: its sweeps, then its tables, figures and extra steps (``make table``).

    python -m latentstruct.report.reproduce spigot/table3_sst --seeds 301,302 --args 'trainer.max_epochs=2' \
        --runs multirun [--results results] [--jobs 2] [--dry-run]

A table spec (``experiments/<paper>/<table>.yaml``, read by :mod:`latentstruct.report.tables`) says how it is made in
its ``reproduce`` block (the format is documented in ``experiments/spigot/table2.yaml``):

* ``sweeps``: the ``configs/sweep/<sweep>.yaml`` to run, in order, each as ``python -m latentstruct.train --multirun
  +sweep=<sweep>`` with the launcher settings of :data:`LAUNCHER`. A sweep's ``seeds`` (``trainer.seed``) and
  ``overrides`` are defaults: ``--seeds`` replaces the seeds, and an ``--args`` override replaces the default of the
  same key. An ``--args`` override written ``<sweep>:<override>`` applies to that sweep only (a table with two
  sweeps, e.g. ListOps' ``listops_chart:trainer.max_steps=500``) and wins over the others. ``jobs`` fixes the runs at
  a time (timing sweeps: 1); ``may_fail: true`` goes on to the tables when runs fail (the tables list the failures).
* ``steps``: then, in order, on the sweeps' runs (the directory their ``hydra.sweep.dir`` names under ``--runs``):
  ``table`` (a spec of the same folder, ``allow_empty``), ``figure`` (a :mod:`latentstruct.report.figures`
  subcommand, its ``metric`` and ``out``), ``listops`` (a :mod:`latentstruct.report.listops` subcommand, its ``out``)
  and ``trees`` (the sentence drawn with one run per ``rows`` entry of ``seed``, :mod:`latentstruct.report.trees`).

Every path under ``results/`` goes under ``--results`` instead, so a trial run can write elsewhere. Without
``--results``, the spec's own protocol (no ``--seeds``, no ``--args``) writes into ``results/``, anything else into
the git-ignored scratch folder :data:`SCRATCH` (``make table ... RESULTS=results`` writes a reduced protocol into
``results/`` on purpose), and the last line says where the tables went. Each table's "regenerate with" line (and its
JSON sidecar's ``command``) is the command that made it (``--made-by``; ``make table`` passes its own). Runs are found
by their records, never by directory names. ``--dry-run`` prints the commands without running them (``make -n``).
``--only sweeps`` runs the sweeps alone (what ``scripts/gpu_table.sh`` runs on a GPU machine), ``--only steps`` the
steps alone, on the runs already there (``make table ONLY=steps``: the tables of runs brought back from a GPU, with no
run launched here).
Paths are relative to the repository root, where ``make`` runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from latentstruct.report.figures import SPEC_FIGURES
from latentstruct.report.tables import load_spec, output_path

__all__ = ["LAUNCHER", "SCRATCH", "Command", "spec_path", "results_dir", "made_by", "commands", "sweep_root", "main"]

# How every sweep runs: local parallel jobs (one thread each: trainer.threads' default), no progress bars, resuming
# (and skipping) finished runs.
LAUNCHER = (
    "hydra/launcher=joblib",
    "hydra.launcher.n_jobs={jobs}",
    "trainer.progress=false",
    "trainer.resume=true",
    "paths.multirun_dir={runs}",
)
SWEEPS = Path(__file__).resolve().parents[2] / "configs" / "sweep"
# Where a reproduction other than the spec's own protocol writes its tables unless told (git-ignored).
SCRATCH = "scratch/results"


@dataclass(frozen=True)
class Command:
    """One command of a reproduction; ``may_fail``: a sweep whose failed runs do not stop the tables."""

    argv: list[str]
    may_fail: bool = False


def spec_path(name: str | Path) -> Path:
    """``spigot/table3_sst`` -> ``experiments/spigot/table3_sst.yaml`` (a path ending in .yaml is kept)."""
    return Path(name) if str(name).endswith(".yaml") else Path("experiments", f"{name}.yaml")


def results_dir(seeds: str = "", args: str = "", results: str | None = None) -> str:
    """Where the tables go: ``results`` when given, else ``results/`` for the spec's own protocol (no seeds, no
    args) and :data:`SCRATCH` for anything else, so that a trial never overwrites a committed table."""
    if results:
        return results
    return "results" if not (seeds.strip() or args.strip()) else SCRATCH


def made_by(spec: str, seeds: str = "", args: str = "", results: str | None = None, only: str | None = None,
            via: str = "make") -> str:
    """The command a user types to make the table again: ``make table T=... [SEEDS=...] [ARGS='...'] [RESULTS=...]``
    (``via="python"``: the ``python -m latentstruct.report.reproduce`` line)."""
    if via == "python":
        extra = [*(["--seeds", seeds] if seeds else []), *(["--args", args] if args else []),
                 *(["--results", results] if results else []), *(["--only", only] if only else [])]
        return shlex.join(["python", "-m", "latentstruct.report.reproduce", str(spec), *extra])
    given = {"T": str(spec), "SEEDS": seeds, "ARGS": args, "RESULTS": results, "ONLY": only}
    return "make table " + " ".join(f"{k}={shlex.quote(v)}" for k, v in given.items() if v)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _sweep_dir(sweep: str, runs: str) -> str:
    """Where ``sweep``'s runs go: its ``hydra.sweep.dir`` with ``paths.multirun_dir`` = ``runs``."""
    path = SWEEPS / f"{sweep}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no sweep {sweep!r}: {path.name} is not in configs/sweep/")
    where = str(yaml.safe_load(path.read_text())["hydra"]["sweep"]["dir"])
    if not where.startswith("${paths.multirun_dir}/"):
        raise ValueError(f"configs/sweep/{path.name}: hydra.sweep.dir is not under ${{paths.multirun_dir}}")
    return str(Path(runs, where.removeprefix("${paths.multirun_dir}/")))


def _scoped(args: list[str], sweeps: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split ``args`` into the overrides of every sweep and those written ``<sweep>:<override>``, per sweep."""
    common, scoped = [], {name: [] for name in sweeps}
    for arg in args:
        name, colon, override = arg.partition(":")
        if not colon or "=" in name:  # a colon inside a value (`key=a:b`) does not scope it
            common.append(arg)
        elif name in scoped:
            scoped[name].append(override)
        else:
            raise ValueError(f"{arg!r}: {name!r} is not a sweep of this table ({', '.join(sweeps)})")
    return common, scoped


def _sweep_overrides(sweep: dict, given: list[str]) -> list[str]:
    """The sweep's default overrides (its ``overrides``, then ``seeds``) less those ``given`` replaces, then
    ``given`` (a later override of a key replaces an earlier one)."""
    defaults = {**(sweep.get("overrides") or {})}
    if sweep.get("seeds") is not None:
        defaults["trainer.seed"] = sweep["seeds"]
    chosen = {_key(o): o for o in given}
    return [f"{k}={v}" for k, v in defaults.items() if k not in chosen] + list(chosen.values())


def _results(path: str, results: str) -> str:
    parts = Path(path).parts
    return str(Path(results, *parts[1:])) if parts[:1] == ("results",) else path


def _step(step: dict, spec: Path, runs: str, results: str, command: str | None = None) -> list[str]:
    """The module and arguments of one ``steps`` entry (module docstring)."""
    out = ["--out", _results(step["out"], results)] if step.get("out") else []
    if "table" in step:
        table = spec.parent / f"{step['table']}.yaml"
        out = ["--out", _results(output_path(load_spec(table)), results)]
        empty = ["--allow-empty"] if step.get("allow_empty") else []
        made = ["--command", command] if command else []
        return ["latentstruct.report.tables", str(table), "--runs", runs, *out, *empty, *made]
    if "figure" in step:
        by_spec = ["--spec", str(spec), "--metric", step["metric"]] if step["figure"] in SPEC_FIGURES else []
        by_spec += ["--x", str(step["x"])] if step.get("x") else []  # row-curves: its x axis
        by_spec = ["--spec", str(spec)] if step["figure"] == "inner-steps" else by_spec  # its status line
        return ["latentstruct.report.figures", step["figure"], *by_spec, "--runs", runs, *out]
    if "listops" in step:
        by_spec = ["--spec", str(spec)] if step["listops"] == "figure" else []  # its rows' labels title the trees
        return ["latentstruct.report.listops", step["listops"], *by_spec, "--runs", runs, *out]
    if "trees" in step:
        rows = ["--seed", str(step["seed"]), "--rows", ",".join(step["rows"])]
        where = ["--out-dir", _results(step["out"], results)]
        return ["latentstruct.report.trees", "--runs", runs, "--spec", str(spec), *rows, *where, step["trees"]]
    raise ValueError(f"{spec}: unknown step {step} (a step is a table, figure, listops or trees step)")


def _made_by(spec: Path) -> str:
    """The message for a spec without a ``reproduce`` block: which spec's steps build its table, if any."""
    for other in sorted(spec.parent.glob("*.yaml")):
        steps = ((yaml.safe_load(other.read_text()) or {}).get("reproduce") or {}).get("steps") or []
        if any(step.get("table") == spec.stem for step in steps):
            return f"{spec} is built with {other.stem}: make table T={spec.parent.name}/{other.stem}"
    return f"{spec} has no reproduce block"


def commands(
    spec: str | Path, seeds: str = "", args: str = "", runs: str = "multirun", results: str | None = None,
    jobs: int = 1, only: str | None = None, command: str | None = None,
) -> list[Command]:
    """The commands that reproduce the table ``spec`` (a name such as ``spigot/table3_sst`` or a spec file):
    its sweeps with ``seeds`` and the overrides ``args`` (a shell-quoted string), then its steps (module docstring);
    ``only="sweeps"`` or ``"steps"``: those alone (runs on a GPU machine; tables from the runs already there).
    ``results``: where the tables go (default :func:`results_dir`); ``command``: the tables' "regenerate with"."""
    results = results_dir(seeds, args, results)
    spec = spec_path(spec)
    plan = load_spec(spec).get("reproduce")
    if not plan:
        raise ValueError(_made_by(spec))
    sweeps = [s["sweep"] for s in plan["sweeps"]]
    common, scoped = _scoped(shlex.split(args), sweeps)
    run_dir = sweep_root(spec, runs)
    python = [sys.executable, "-m"]
    out = []
    for sweep in plan["sweeps"] if only != "steps" else []:
        given = ([f"trainer.seed={seeds}"] if seeds else []) + common + scoped[sweep["sweep"]]
        launcher = [s.format(jobs=sweep.get("jobs", jobs), runs=runs) for s in LAUNCHER]
        overrides = [f"+sweep={sweep['sweep']}", *_sweep_overrides(sweep, given), *launcher]
        out.append(Command([*python, "latentstruct.train", "--multirun", *overrides], bool(sweep.get("may_fail"))))
    steps = (plan.get("steps") or []) if only != "sweeps" else []
    return out + [Command([*python, *_step(step, spec, run_dir, results, command)]) for step in steps]


def sweep_root(spec: str | Path, runs: str = "multirun") -> str:
    """The directory under ``runs`` that holds every run of the table ``spec`` (its sweeps share one)."""
    spec = spec_path(spec)
    plan = load_spec(spec).get("reproduce")
    if not plan:
        raise ValueError(_made_by(spec))
    where = {_sweep_dir(s["sweep"], runs) for s in plan["sweeps"]}
    if len(where) != 1:
        raise ValueError(f"{spec}: its sweeps write to different directories ({', '.join(sorted(where))})")
    return where.pop()


def main(argv: list[str] | None = None) -> int:
    """CLI: print each command of the reproduction, then run it (``--dry-run``: print only)."""
    parser = argparse.ArgumentParser(
        prog="python -m latentstruct.report.reproduce", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("spec", help="<paper>/<table> of experiments/ (e.g. spigot/table3_sst) or a spec file")
    parser.add_argument("--seeds", default="", help="trainer.seed of every sweep, e.g. 301,302 (default: the spec's)")
    parser.add_argument(
        "--args",
        default="",
        help="more Hydra overrides of the sweeps, shell-quoted; <sweep>:<override> for one sweep only",
    )
    parser.add_argument("--runs", default="multirun", help="root of the sweeps' run directories (default multirun)")
    parser.add_argument("--results", default=None,
                        help=f"where the tables and figures go (default: results/ for the spec's own protocol, "
                             f"{SCRATCH}/ with --seeds or --args)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="runs at a time (default: the cores)")
    parser.add_argument("--only", choices=("sweeps", "steps"),
                        help="run only the sweeps (the runs), or only the steps (tables from the runs already there)")
    parser.add_argument("--made-by", choices=("make", "python"), default="python",
                        help="how the tables' 'regenerate with' line writes this command (make table passes make)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    results = results_dir(args.seeds, args.args, args.results)
    made = made_by(args.spec, args.seeds, args.args, args.results, args.only, args.made_by)
    try:
        todo = commands(args.spec, args.seeds, args.args, args.runs, results, args.jobs, args.only, made)
    except (OSError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    if args.only != "sweeps":  # then results/README.md (or the scratch folder's) from the tables' sidecars
        todo.append(Command([sys.executable, "-m", "latentstruct.report.report", "--results", results]))
    for command in todo:
        print(shlex.join(command.argv), flush=True)
        if args.dry_run:
            continue
        code = subprocess.run(command.argv).returncode
        if code and command.may_fail:
            print("*** some runs of this sweep failed: the tables list their errors", flush=True)
        elif code:
            return code
    if args.only != "sweeps":
        why = ("the spec's own protocol" if results == "results" and not args.results
               else "as asked (--results / RESULTS=)" if args.results
               else "not the spec's protocol (--seeds / --args): a scratch folder, git-ignored; RESULTS=results "
                    "writes into results/")
        print(f"{'would write' if args.dry_run else 'wrote'} the tables and figures under {results}/ ({why})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU machine's check: one command of under ten minutes (``scripts/gpu_check.sh`` runs it once the bundle is
installed; docs/gpu.md is the runbook).

    OUT=<dir> scripts/gpu_check.sh [--device cuda|cpu] [--minutes 8]
    python -m scripts.gpu_check --device cuda --out DIR --deadline UNIX_SECONDS [--bench-path DIR]   # what it runs

Its steps, in order, each given what is left of the time and recorded (status, seconds, note) in ``env.json``:

1. **env** — the machine (GPU, driver, torch, CUDA and cuDNN versions), the bundle's packages as installed, the
   determinism settings in force.
2. **tests** — the CUDA tests, ``pytest -m cuda``: every structure CPU against CUDA, every estimator on every
   structure on CUDA, the energy models' double backward, a run stopped and resumed on CUDA (``tests.xml``).
3. **experiments** — every experiment of ``configs/experiment`` trained on the device through train(): two steps, or
   one epoch of each phase of a phased schedule (so that the energy models and the VAE reach their method's phase),
   on small subsets of the bundle's data (:data:`TINY`); one experiment of each family trained twice to see whether
   its history repeats bit for bit; and one sweep through ``python -m latentstruct.train -m`` with the joblib launcher
   on the device (``experiments.json``).
4. **syncs** — CUDA only: the host round trips of every structure operation, counted with torch's sync debug mode
   (``syncs.json``).
5. **structures** — ``bench/structures.py --device <device>`` with the reference libraries from the bundle, stopped
   at its share of the time (``structures_<device>.md`` and ``.json``).
6. **implicit** — ``bench/implicit.py --device <device>``, shortened: the energy methods' Hessian-vector products by
   double backward and by forward-over-reverse (``task.hvp``; one H v, one mixed product, their difference) and
   L_CD's training step with each, interleaved, on bibtex and NER (on the CPU: bibtex); its sheet goes into
   ``env.json`` (the device tool brings back 8 files).
7. **timing** — ``bench/tables.py`` until the deadline: seconds per step, per epoch and per evaluation of every paper
   table's configuration, the device-hours of each table (``timing.json``).

With gpu_check.sh's ``check.log`` these are the 8 files the device tool brings back; ``make gpu-results FROM=<dir>``
turns them into ``results/bench/gpu.md`` and ``results/bench/structures_cuda.md`` (scripts/gpu_report.py).
``--device cpu`` is the dry run: every step on the CPU, in a venv that sees only the GPU image's packages and the
bundle, with tiny counts (one experiment per family, two timing configurations, two structures at one size); the
CUDA tests are collected and skipped and the syncs step is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: per family, the overrides that make a run small (subsets of the real data in the bundle); the schedule is cut to
#: two steps, or to one epoch of every phase (:func:`_schedule`)
TINY = {
    "synthetic": ["dataset.n_train=200", "dataset.n_valid=50", "dataset.n_test=50"],
    "planted": ["dataset.n_train=200", "dataset.n_valid=50", "dataset.n_test=50"],
    "sorting": [],
    "sst": ["dataset.subset=64", "dataset.eval_subset=32"],
    "snli": ["dataset.subset=64", "dataset.eval_subset=32"],
    "knn": ["dataset=mnist", "task.k=3", "dataset.subset=2000", "dataset.n_valid=500"],
    "vae": ["trainer.batch_size=10000"],  # one labelled step, then 5 of the unlabelled phase
    "listops": ["dataset.n_train=500", "dataset.n_valid=20", "dataset.max_train_tokens=20",  # the timing sheet
                "dataset.max_eval_tokens=4"],  # times the full lengths
    "mlc": ["trainer.batch_size=1024"],  # 5 steps an epoch of bibtex
    "ner": ["dataset.subset=64", "dataset.eval_subset=32"],
    "citation": ["task.encoder.hidden=50", "task.neumann_terms=5"],  # Cora is small: all of it, the preset's sizes
}
#: the step outputs in $OUT (with gpu_check.sh's check.log: the 8 files the device tool brings back)
FILES = ("env.json", "tests.xml", "experiments.json", "syncs.json", "timing.json")
#: the note of a step --only left out (scripts/gpu_report.py gives such a step no section)
NOT_ASKED = "not asked for (--only)"


class Clock:
    """The time left before the deadline, and a share of it for one step."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def left(self) -> float:
        return self.deadline - time.time()

    def share(self, fraction: float, at_least: float = 20.0) -> float:
        return max(at_least, fraction * self.left())


def _log(line: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {line}", flush=True)


# ----------------------------------------------------------------------------------------------------------- env


def environment(device: str, bundle: Path) -> dict:
    """The machine, the versions that matter, the bundle as installed, the determinism settings."""
    import torch

    from latentstruct.records import environment as run_environment

    info = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "cpu_cores": os.cpu_count(), **{k: v for k, v in run_environment(torch.device("cpu")).items()
                                           if k in ("git_commit", "git_dirty")}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "multiprocessors": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True) if _which("nvidia-smi") else None
    info["nvidia_smi"] = smi.stdout.strip() if smi and smi.returncode == 0 else None
    from importlib import metadata

    manifest = json.loads((bundle / "bundle.json").read_text()) if (bundle / "bundle.json").is_file() else {}
    info["bundle"] = {w["name"]: _installed(metadata, w["name"]) for w in manifest.get("wheels", [])}
    info["bundle_commit"] = manifest.get("commit")
    info["determinism"] = {
        "torch.are_deterministic_algorithms_enabled": torch.are_deterministic_algorithms_enabled(),
        "cudnn.deterministic": torch.backends.cudnn.deterministic, "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32 matmul": torch.backends.cuda.matmul.allow_tf32, "tf32 cudnn": torch.backends.cudnn.allow_tf32,
    }
    return info


def _which(name: str) -> bool:
    from shutil import which

    return which(name) is not None


def _installed(metadata, name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------- the tests


def cuda_tests(out: Path, seconds: float) -> dict:
    """``pytest -m cuda`` on tests/, its report in ``out/tests.xml``; the counts from pytest's last line."""
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-rs",  # -q: pyproject's
           f"--junitxml={out / 'tests.xml'}", "tests"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as err:
        return {"status": "timeout", "note": f"pytest -m cuda passed its {seconds:.0f} s", "tail": _tail(err.stdout)}
    print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", flush=True)
    counts = [line for line in proc.stdout.splitlines() if any(w in line for w in (
        " passed", " failed", " skipped", " deselected", "no tests ran", " error"))]
    return {"status": "ok" if proc.returncode in (0, 5) else "failed",  # 5: none selected (no CUDA test left)
            "note": counts[-1].strip("= ") if counts else f"pytest exit {proc.returncode}"}


def _tail(text) -> str:
    text = text.decode() if isinstance(text, bytes) else text or ""
    return text[-3000:]


# ------------------------------------------------------------------------------------------------ experiments


def _schedule(cfg) -> list[str]:
    """The overrides that cut a run short: one epoch of every phase of a phased schedule, else two steps."""
    if cfg.trainer.phases:
        return [f"trainer.phases.{i}.epochs=1" for i in range(len(cfg.trainer.phases))]
    return ["trainer.max_steps=2"]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


def run_experiment(name: str, device: str, out: Path) -> dict:
    """Train ``name`` briefly on ``device`` through train() (module docstring, step 3): its record, or the error."""
    from latentstruct.train import train

    family = name.split("_")[0]
    base = [f"+experiment={name}", *TINY.get(family, []), f"trainer.device={device}", "trainer.progress=false",
            "trainer.log_seconds=null"]
    started = time.perf_counter()
    try:
        overrides = [*base, *_schedule(_compose(base)), f"paths.output_dir='{out}'"]
        record = train(_compose(overrides))
        result = {"status": record["status"], "steps": record.get("steps"), "hardware": record.get("hardware"),
                  "valid_acc": record.get("metrics", {}).get("valid/acc")}
    except Exception as err:  # noqa: BLE001 — a failure is the result to report
        cause = err
        while cause.__cause__ is not None or cause.__context__ is not None:  # Hydra wraps the data's own error
            cause = cause.__cause__ or cause.__context__
        message = " ".join(str(cause).split())[:400]
        result = {"status": "blocked" if isinstance(cause, FileNotFoundError) else "failed",  # its data is absent
                  "error": f"{type(cause).__name__}: {message}", "traceback": traceback.format_exc()[-2500:]}
    return {"experiment": name, "family": family, "seconds": round(time.perf_counter() - started, 2), **result}


def _history(run_dir: Path):
    import pandas as pd

    from latentstruct.records import reads_the_machine

    path = run_dir / "history.csv"
    if not path.is_file():
        return None
    history = pd.read_csv(path)
    return history.drop(columns=[c for c in history.columns if reads_the_machine(c)])


def repeat(name: str, device: str, work: Path) -> dict:
    """Train ``name`` twice from the same seed: is the history the same, bit for bit? (else the largest difference)"""
    first, second = (run_experiment(name, device, work / f"{name}-{i}") for i in (1, 2))
    if first["status"] != "completed" or second["status"] != "completed":
        return {"experiment": name, "identical": None, "note": first.get("error") or second.get("error")}
    a, b = _history(work / f"{name}-1"), _history(work / f"{name}-2")
    identical = a.equals(b)
    diff = None if identical else float((a.select_dtypes("number") - b.select_dtypes("number")).abs().max().max())
    return {"experiment": name, "identical": identical, "max_abs_difference": diff}


def launcher_sweep(device: str, work: Path, seconds: float) -> dict:
    """Two runs through the command line and the joblib launcher, on ``device`` (what gpu_table.sh launches)."""
    cmd = [sys.executable, "-m", "latentstruct.train", "-m", "+experiment=synthetic_spigot,synthetic_ste_i",
           *TINY["synthetic"], "trainer.max_steps=20", f"trainer.device={device}", "trainer.progress=false",
           "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={work / 'sweep'}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    records = [json.loads(p.read_text()) for p in sorted((work / "sweep").rglob("metrics.json"))]
    ok = proc.returncode == 0 and len(records) == 2 and all(r["status"] == "completed" for r in records)
    return {"status": "ok" if ok else "failed", "runs": [r.get("hardware") for r in records],
            **({} if ok else {"stderr": proc.stderr[-2000:]})}


def family_worker(names: list[str], device: str, work: Path, out: Path) -> None:
    """Run ``names`` (one family) in this process, then the first of them twice more; the results into ``out``,
    rewritten after each run (a worker stopped at the time limit loses only the run it was in)."""
    import torch

    torch.set_num_threads(1)
    logging.getLogger("latentstruct").setLevel(logging.WARNING)
    results = []
    for name in names:
        results.append(run_experiment(name, device, work / name))
        out.write_text(json.dumps(results) + "\n")
        r = results[-1]
        _log(f"{name:36s} {r['status']:9s} {r['seconds']:6.1f} s  {r.get('error', '')}")
    if names:
        results.append({"repeat": repeat(names[0], device, work / "repeat")})
        out.write_text(json.dumps(results) + "\n")


def experiments(device: str, out: Path, seconds: float) -> dict:
    """Step 3 (module docstring): every experiment, a process per family, half the cores' worth at once; on the CPU
    the first experiment of each family, all in one process."""
    from latentstruct.config import experiments as families

    groups = sorted(families().items(), key=lambda item: item[0] != "synthetic")  # the cheapest first
    if device == "cpu":
        groups = [("every-family", [names[0] for _, names in groups])]
    work = Path(tempfile.mkdtemp(prefix="gpu-check-experiments-"))
    end = time.time() + seconds
    procs = {}
    parallel = max(1, min(len(groups), (os.cpu_count() or 2) // 2))
    results, pending = [], list(groups)
    while pending or procs:
        while pending and len(procs) < parallel:
            family, names = pending.pop(0)
            cmd = [sys.executable, "-m", "scripts.gpu_check", "family", "--device", device, "--work", str(work),
                   "--out", str(work / f"{family}.json"), *names]
            procs[family] = (subprocess.Popen(cmd, cwd=ROOT), names)
        for family, (proc, names) in list(procs.items()):
            if proc.poll() is not None or time.time() > end:
                killed = proc.poll() is None
                if killed:
                    proc.kill()
                procs.pop(family)
                proc.wait()
                path = work / f"{family}.json"
                done = json.loads(path.read_text()) if path.is_file() else []
                results += done
                if killed and len(done) < len(names):
                    results.append({"experiment": f"{family} (family)", "family": family, "status": "timeout"})
                elif killed and not any("repeat" in r for r in done):  # every run trained, the repeat was cut
                    results.append({"repeat": {"experiment": names[0], "identical": None,
                                               "note": "not finished by the step's deadline"}})
        time.sleep(0.5)
    runs = [r for r in results if "repeat" not in r]
    sweep = launcher_sweep(device, work, max(30.0, end - time.time() + 60))
    sheet = {"device": device, "runs": runs, "repeats": [r["repeat"] for r in results if "repeat" in r],
             "launcher_sweep": sweep}
    (out / "experiments.json").write_text(json.dumps(sheet, indent=1) + "\n")
    done, blocked = (sum(r["status"] == s for r in runs) for s in ("completed", "blocked"))
    return {"status": "ok" if done + blocked == len(runs) and sweep["status"] == "ok" else "failed",
            "note": f"{done} of {len(runs)} experiments trained on {device}, {blocked} blocked by absent data; "
                    f"joblib sweep {sweep['status']}"}


# --------------------------------------------------------------------------------------------------------- syncs


def syncs(out: Path) -> dict:
    """Step 4: the synchronising CUDA calls of each structure operation (batch 8, n = 10), after a warm-up call."""
    import torch

    from bench.structures import _inputs, our_ops, suite
    from bench.tables import count_syncs

    device, rows = torch.device("cuda"), []
    for name, structure, shape, _ in suite():
        scores = _inputs(shape, 10, 8, device)
        ops = our_ops(structure, scores)
        ops["sample"] = lambda s=structure, x=scores: s.sample(x, generator=torch.Generator(device).manual_seed(0))
        for op, fn in ops.items():
            try:
                fn()
                torch.cuda.synchronize()
                rows.append({"structure": name, "op": op, "syncs": count_syncs(fn)})
            except Exception as err:  # noqa: BLE001
                rows.append({"structure": name, "op": op, "error": f"{type(err).__name__}: {err}"})
    (out / "syncs.json").write_text(json.dumps(rows, indent=1) + "\n")
    return {"status": "ok", "note": f"{len(rows)} operations"}


# ---------------------------------------------------------------------------------------------- the benchmarks


def structures(device: str, out: Path, bench_path: Path | None, seconds: float) -> dict:
    """Step 5: bench/structures.py on the device (on the CPU: two structures at one size)."""
    small = [] if device == "cuda" else ["--sizes", "6", "--batch", "4", "--no-warm", "--no-scaling", "--only",
                                         "projective", "topk"]
    cmd = [sys.executable, "-W", "ignore::UserWarning", "bench/structures.py", "--device", device, "--max-seconds",
           f"{seconds * 0.8:.0f}", "--out", str(out / f"structures_{device}.md"), *small]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(bench_path or ""), os.environ.get(
        "PYTHONPATH", "")])))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "note": "bench/structures.py did not stop in time"}
    print(_tail(proc.stdout), _tail(proc.stderr), sep="\n", flush=True)
    return {"status": "ok" if proc.returncode == 0 else "failed", "note": (proc.stderr.strip().splitlines()
                                                                           or [""])[-1] if proc.returncode else ""}


def implicit(device: str, seconds: float) -> dict:
    """Step 6: bench/implicit.py on the device, shortened (module docstring); its sheet, less the accuracy block's
    residual lists, under ``sheet`` (written after each dataset: a run stopped at its time keeps the datasets done)."""
    cuda = device == "cuda"
    work = Path(tempfile.mkdtemp(prefix="gpu-check-implicit-"))
    cmd = [sys.executable, "-W", "ignore::UserWarning", "bench/implicit.py", "--device", device, "--threads", "1",
           "--datasets", *(["bibtex", "ner"] if cuda else ["bibtex"]), "--primaries", "cd",
           "--pretrain-steps", "10" if cuda else "2", "--method-steps", "1", "--series-terms", "5",
           "--ref-max-iter", "5", "--tols", "0.2", "--rounds", "3" if cuda else "1", "--solvers", "minres:0.2",
           "--product-repeats", "5" if cuda else "2", "--out", str(work / "implicit.md")]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
        status = "ok" if proc.returncode == 0 else "failed"
        print(_tail(proc.stdout), _tail(proc.stderr), sep="\n", flush=True)
    except subprocess.TimeoutExpired:
        status = "timeout"
    path = work / "implicit.json"
    sheet = json.loads(path.read_text()) if path.is_file() else None
    notes = []
    for dataset, res in (sheet or {}).get("datasets", {}).items():
        for acc in res.get("accuracy", {}).values():
            for key in ("series_residuals", "reference", "cg_reference", "solvers"):
                acc.pop(key, None)
            ways = acc.get("products") or {}
            fo, db = ways.get("forward_over_reverse", {}), ways.get("double_backward", {})
            if "product_seconds" in fo and db.get("product_seconds"):
                notes.append(f"{dataset}: forward-over-reverse H v {fo['product_seconds'] / db['product_seconds']:.2f}"
                             f"× the double backward's")
            elif "error" in fo:
                notes.append(f"{dataset}: forward-over-reverse failed")
    return {"status": status, "note": "; ".join(notes) or "no sheet", "sheet": sheet}


def timing(device: str, out: Path, clock: Clock, more: list[str] = ()) -> dict:
    """Step 7: bench/tables.py until the deadline (on the CPU: three configurations of the multi-label table, one of
    them in two phases, two steps each); ``more``: options of bench/tables.py added last (``--timing-args``)."""
    small = [] if device == "cuda" else ["--tables", "energy/mlc", "--max-configs", "3", "--max-steps", "2",
                                         "--min-seconds", "0", "--warmup", "1", "--threads", "1"]
    cmd = [sys.executable, "bench/tables.py", "--device", device, "--out", str(out / "timing.json"),
           "--deadline", f"{clock.deadline:.0f}", *small, *more]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=max(30.0, clock.left() + 45))  # its sheet is written as it goes
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    return {"status": "ok" if proc.returncode == 0 else "failed"}


# ----------------------------------------------------------------------------------------------------------- main


def check(device: str, out: Path, deadline: float, bench_path: Path | None, bundle: Path,
          only: set[str] | None = None, timing_args: list[str] = ()) -> int:
    """Every step in order (module docstring), or the steps named in ``only``; env.json at the end, with each step's
    status and seconds."""
    out.mkdir(parents=True, exist_ok=True)
    clock, steps = Clock(deadline), {}
    info = environment(device, bundle)
    _log(f"{info.get('gpu') or 'no GPU'}; torch {info['torch']} (CUDA {info['cuda']}); {clock.left():.0f} s left")
    plan = [
        ("tests", lambda: cuda_tests(out, clock.share(0.25, 60))),
        ("experiments", lambda: experiments(device, out, clock.share(0.3, 60))),
        ("syncs", (lambda: syncs(out)) if device == "cuda" else None),
        ("structures", lambda: structures(device, out, bench_path, clock.share(0.3, 30))),
        ("implicit", lambda: implicit(device, clock.share(0.25, 60))),
        ("timing", lambda: timing(device, out, clock, timing_args)),
    ]
    unknown = (only or set()) - {name for name, _ in plan}
    if unknown:
        raise SystemExit(f"error: --only names no step: {', '.join(sorted(unknown))}")
    for name, step in plan:
        started = time.time()
        if only and name not in only:
            steps[name] = {"status": "skipped", "note": NOT_ASKED}
        elif step is None:
            steps[name] = {"status": "skipped", "note": "needs CUDA"}
        else:
            _log(f"{name}: starting ({clock.left():.0f} s left)")
            try:
                steps[name] = step()
            except Exception as err:  # noqa: BLE001 — the next steps still run
                traceback.print_exc()
                steps[name] = {"status": "failed", "note": f"{type(err).__name__}: {err}"}
        steps[name]["seconds"] = round(time.time() - started, 1)
        _log(f"{name}: {steps[name]['status']} in {steps[name]['seconds']:.0f} s {steps[name].get('note', '')}")
        # after every step: if the command is killed at its limit, what is done is still described
        (out / "env.json").write_text(json.dumps({**info, "steps": steps}, indent=1) + "\n")
    for name in ("syncs.json", "timing.json"):  # every file exists, even for a skipped step
        if not (out / name).exists():
            (out / name).write_text("null\n")
    return 0 if all(s["status"] in ("ok", "skipped") for s in steps.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    f = sub.add_parser("family", help=argparse.SUPPRESS)  # one family's experiments, in a process of their own
    f.add_argument("names", nargs="+")
    f.add_argument("--device", required=True)
    f.add_argument("--work", type=Path, required=True)
    f.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, help="the folder of the results ($OUT)")
    parser.add_argument("--deadline", type=float, help="a Unix time to be done by (default: 8 minutes from now)")
    parser.add_argument("--bench-path", type=Path, help="where the bench references were installed")
    parser.add_argument("--bundle", type=Path, default=ROOT / ".device")
    parser.add_argument("--only", help="the steps to run, comma-separated (tests,experiments,syncs,structures,"
                        "implicit,timing); the others are reported skipped")
    parser.add_argument("--timing-args", default="", help="options added to the timing step's bench/tables.py "
                        "(e.g. '--tables energy/ner --max-per-experiment 1')")
    args = parser.parse_args(argv)
    if args.command == "family":
        with contextlib.redirect_stdout(sys.stderr):
            family_worker(args.names, args.device, args.work, args.out)
        return 0
    if args.out is None:
        parser.error("--out is required")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but torch sees no CUDA device (use --device cpu for the dry run)",
                  file=sys.stderr)
            return 2
    only = {name.strip() for name in args.only.split(",") if name.strip()} if args.only else None
    return check(args.device, args.out, args.deadline or time.time() + 480, args.bench_path, args.bundle, only,
                 shlex.split(args.timing_args))


if __name__ == "__main__":
    sys.exit(main())

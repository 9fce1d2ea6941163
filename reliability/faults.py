"""The run-level faults of the suite (issue #20), each on real ``python -m latentstruct.train`` processes:

- :func:`kill_and_resume`: a short run is stopped at random moments of its training — SIGKILL (nothing runs after
  it: the run resumes from its last checkpoint, ``trainer.checkpoint_every``) or a stop signal (SIGTERM, SIGINT,
  SIGUSR1: it checkpoints the step and exits 128 + the signal) — then launched again until it completes; its
  history and metrics must equal those of an uninterrupted run of the same configuration.
- :func:`kill_during_write`: the process dies (SIGKILL) in the middle of writing a record file (checkpoint.pt,
  history.csv, metrics.json; a child process whose writer stops half-way through the file): the file of before
  must still be whole, and the run resumed from it must equal the uninterrupted one.
- :func:`concurrent_launchers`: several launchers started together on one sweep: every run is trained exactly once
  (claims) and none is lost.
- :func:`non_finite`: runs whose values overflow or hold NaN fail with one line naming the value.

Every function returns :class:`Fault` records; ``python -m reliability`` tabulates them.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from latentstruct.records import reads_the_machine

__all__ = ["Fault", "TASKS", "REAL_TASKS", "available_tasks", "reference", "kill_and_resume", "kill_during_write",
           "concurrent_launchers", "non_finite"]

ROOT = Path(__file__).resolve().parents[1]
_QUIET = ["trainer.progress=false", "trainer.log_seconds=null"]

#: short runs of several tasks on generated data (no file needed): name -> overrides (see also REAL_TASKS)
TASKS: dict[str, list[str]] = {
    # stochastic estimator, mini-batches: resuming needs the RNG, the data order and the loss since the evaluation
    "synthetic_sfe": ["+experiment=synthetic_sfe", "dataset.n_train=400", "dataset.n_valid=100", "dataset.n_test=100",
                      "trainer.batch_size=32", "trainer.max_steps=300", "trainer.eval_every=50"],
    "synthetic_spigot": ["+experiment=synthetic_spigot", "dataset.n_train=400", "dataset.n_valid=100",
                         "dataset.n_test=100", "trainer.max_steps=300", "trainer.eval_every=100"],
    # learned noise scale (direct loss minimisation), permutations
    "sorting_direct_learned": ["+experiment=sorting_direct_learned", "dataset.num_items=5", "dataset.n_train=400",
                               "dataset.n_valid=40", "dataset.n_test=40", "trainer.batch_size=20",
                               "trainer.max_steps=200", "trainer.eval_every=50"],
}


#: tasks on real data (``$LATENTSTRUCT_DATA``), run when their files are there: name -> (data folder, overrides)
REAL_TASKS: dict[str, tuple[str, list[str]]] = {
    # two phases (pretraining, then L_DVN), and the task's own optimizer for the inference network
    "mlc_dvn_bibtex": ("bibtex", ["+experiment=mlc_dvn", "dataset=bibtex", "trainer.phases.0.epochs=1",
                                  "trainer.max_steps=300", "trainer.eval_every=50"]),
}


def available_tasks() -> list[str]:
    """The tasks of :data:`TASKS`, and those of :data:`REAL_TASKS` whose data folder is under
    ``$LATENTSTRUCT_DATA`` (they join :data:`TASKS`)."""
    root = Path(os.environ.get("LATENTSTRUCT_DATA", "data"))
    for name, (folder, overrides) in REAL_TASKS.items():
        if (root / folder).is_dir():
            TASKS[name] = overrides
    return list(TASKS)


@dataclass
class Fault:
    """One injected fault: what (``kind``: sigkill, sigterm, ..., write:<file>, launchers:<n>, non_finite), on
    which run, whether it was survived (the run ended as an uninterrupted one would, or the bad input was named in
    one line), runs lost and duplicated, and what was seen."""

    section: str
    kind: str
    task: str
    survived: bool
    lost: int = 0
    duplicated: int = 0
    detail: str = ""
    steps: list[int] = field(default_factory=list)
    injected: int = 1  # faults this record stands for: the stops of a killed run, the launchers of a sweep


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "HYDRA_FULL_ERROR": "0"}


def _command(overrides: list[str], run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "latentstruct.train", *overrides, *_QUIET, f"hydra.run.dir={run_dir}"]


def _launch(overrides: list[str], run_dir: Path, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        return subprocess.Popen(_command(overrides, run_dir), cwd=ROOT, env=_env(), stdout=out,
                                stderr=subprocess.STDOUT)


def _record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "metrics.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _history(run_dir: Path) -> pd.DataFrame:
    history = pd.read_csv(run_dir / "history.csv")
    return history.drop(columns=[c for c in history.columns if reads_the_machine(c)])


def _same(run_dir: Path, ref_dir: Path) -> tuple[bool, str]:
    """Whether a run ended as the uninterrupted one did: completed, the same metrics and the same history (clock
    readings aside)."""
    record, ref = _record(run_dir), _record(ref_dir)
    if record.get("status") != "completed":
        return False, f"not completed: {record.get('status')} {record.get('error', '')}".strip()
    metrics, expected = ({k: v for k, v in r["metrics"].items() if not reads_the_machine(k)} for r in (record, ref))
    if metrics != expected:
        return False, f"metrics differ: {metrics} vs {expected}"
    try:
        pd.testing.assert_frame_equal(_history(run_dir), _history(ref_dir))
    except AssertionError as err:
        return False, f"history differs: {' '.join(str(err).split())[:200]}"
    return True, "identical history and metrics"


def _plan_lines(run_dir: Path) -> int:
    """How many times a process began training this run (the plan line said before the loop)."""
    try:
        text = (run_dir / "train.log").read_text(errors="replace")
        return len(re.findall(r": training [\d,]+ (steps|of the)", text))  # also "training 300 of the 2,898 steps"
    except FileNotFoundError:
        return 0


def _resumed_steps(run_dir: Path) -> list[int]:
    text = (run_dir / "train.log").read_text(errors="replace") if (run_dir / "train.log").exists() else ""
    return [int(s) for s in re.findall(r"resumed .* at step (\d+)", text)]


def reference(task: str, workdir: Path) -> tuple[Path, float]:
    """The uninterrupted run of ``task`` and the seconds its training took."""
    run_dir = workdir / "reference" / task
    if _record(run_dir).get("status") != "completed":
        proc = _launch(TASKS[task], run_dir, workdir / "logs" / f"reference-{task}.txt")
        if proc.wait() != 0:
            raise RuntimeError(f"the reference run of {task} failed (see {workdir / 'logs'})")
    return run_dir, float(_record(run_dir)["wall_seconds"])


def kill_and_resume(task: str, kind: str, kills: int, rng: random.Random, workdir: Path,
                    checkpoint_every: int = 7) -> Fault:
    """Stop ``task`` ``kills`` times at random moments of its training with ``kind`` (sigkill, sigterm, sigint,
    sigusr1), launching it again after each, then once more to its end; compare with the uninterrupted run.

    The moment is uniform in the first 0.8 / ``kills`` of the reference run's training time after the launch says
    its plan. A run that ends before its first fault (the machine got faster) is started over in a new directory
    with half the window, up to four times."""
    ref_dir, seconds = reference(task, workdir)
    overrides = [*TASKS[task], f"trainer.checkpoint_every={checkpoint_every}"]
    signum = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT,
              "sigusr1": signal.SIGUSR1}[kind]
    window = 0.8 * seconds / kills
    for _ in range(4):
        run_dir = workdir / kind / f"{task}-{rng.randrange(10**6)}"
        log = workdir / "logs" / f"{run_dir.parent.name}-{run_dir.name}.txt"
        injected, problems = 0, []
        for attempt in range(kills):
            resume = ["trainer.resume=true"] if kind == "sigkill" else []  # a stopped run resumes by itself
            proc = _launch(overrides + resume, run_dir, log)
            end = time.monotonic() + 300
            while _plan_lines(run_dir) <= attempt and proc.poll() is None and time.monotonic() < end:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, window))
            if proc.poll() is not None:  # it finished first: no fault this time
                break
            proc.send_signal(signum)
            code = proc.wait()
            injected += 1
            if kind != "sigkill":
                # stopped: exit 128 + signal, status interrupted; or the signal came after the last step: the run
                # completed and the signal was handed on to its default action (exit -signal)
                status = _record(run_dir).get("status")
                if (status, code) not in (("interrupted", 128 + signum), ("completed", 128 + signum),
                                          ("completed", -signum), ("completed", 0)):
                    problems.append(f"exit {code}, status {status}")
        if injected:
            break
        window /= 2
    final = _launch(overrides + ["trainer.resume=true"], run_dir, log)
    final.wait()
    same, detail = _same(run_dir, ref_dir)
    if problems:
        same, detail = False, "; ".join(problems) + "; " + detail
    return Fault("kill", kind, task, same, lost=int(not same), detail=f"{injected} stops; {detail}",
                 steps=_resumed_steps(run_dir), injected=injected)


_WRITER = """
import os, signal, sys, tempfile
import latentstruct.records as records
target, nth, real, seen = sys.argv[1], int(sys.argv[2]), records._atomic, {"n": 0}
def dying(path, write):
    if os.path.basename(str(path)) == target:
        seen["n"] += 1
        if seen["n"] == nth:  # write the new file beside the old one, keep half of it, and die before the rename
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(str(path)), prefix="." + os.path.basename(str(path)) + ".")
            os.close(fd)
            write(tmp)
            with open(tmp, "r+b") as f:
                f.truncate(max(1, os.path.getsize(tmp) // 2))
            os.kill(os.getpid(), signal.SIGKILL)
    real(path, write)
records._atomic = dying
sys.argv = [sys.argv[0], *sys.argv[3:]]
import runpy
runpy.run_module("latentstruct.train", run_name="__main__", alter_sys=True)
"""


def kill_during_write(task: str, target: str, nth: int, workdir: Path) -> Fault:
    """Kill ``task`` in the middle of its ``nth`` write of ``target`` (checkpoint.pt, history.csv or metrics.json):
    the file before must be whole, and the run resumed from the checkpoint must equal the uninterrupted one."""
    ref_dir, _ = reference(task, workdir)
    run_dir = workdir / "write" / f"{task}-{target}-{nth}"
    overrides = [*TASKS[task], "trainer.checkpoint_every=7"]
    log = workdir / "logs" / f"write-{run_dir.name}.txt"
    with open(log, "a") as out:
        code = subprocess.run([sys.executable, "-c", _WRITER, target, str(nth),
                               *_command(overrides, run_dir)[3:]], cwd=ROOT, env=_env(), stdout=out,
                              stderr=subprocess.STDOUT).returncode
    if code != -signal.SIGKILL:
        return Fault("write", f"write:{target}", task, False, 1, detail=f"the writer did not die (exit {code})")
    before = run_dir / target
    whole = "absent before its first write"
    if before.exists():
        try:
            if target == "checkpoint.pt":
                import torch

                whole = f"whole (step {torch.load(before, weights_only=False)['step']})"
            elif target == "history.csv":
                whole = f"whole ({len(pd.read_csv(before))} rows)"
            else:
                whole = f"whole ({json.loads(before.read_text()).get('status')})"
        except Exception as err:  # noqa: BLE001 — a damaged file is the finding
            return Fault("write", f"write:{target}", task, False, 1, detail=f"{target} damaged: {err}")
    left = sorted(p.name for p in run_dir.glob(f".{target}.*"))
    final = _launch(overrides + ["trainer.resume=true"], run_dir, log)
    final.wait()
    same, detail = _same(run_dir, ref_dir)
    if list(run_dir.glob(f".{target}.*")):
        same, detail = False, f"the half-written {left} is still there; {detail}"
    return Fault("write", f"write:{target}", task, same, lost=int(not same),
                 detail=f"killed in write {nth} of {target} (left {len(left)} half-written file, removed by the "
                        f"resumed run); the one before: {whole}; {detail}",
                 steps=_resumed_steps(run_dir))


def concurrent_launchers(launchers: int, seeds: list[int], workdir: Path) -> Fault:
    """``launchers`` processes started together on one sweep of ``len(seeds)`` runs of the synthetic task: count
    the runs trained more than once (duplicated) and those left without a completed record (lost)."""
    sweep = workdir / f"launchers-{launchers}"
    overrides = [*TASKS["synthetic_spigot"], "trainer.max_steps=150", f"trainer.seed={','.join(map(str, seeds))}",
                 f"hydra.sweep.dir={sweep}", f"paths.multirun_dir={sweep}"]
    command = [sys.executable, "-m", "latentstruct.train", "-m", *overrides, *_QUIET]
    logs = [open(workdir / "logs" / f"launchers-{launchers}-{i}.txt", "w") for i in range(launchers)]
    try:
        procs = [subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT)
                 for out in logs]
        codes = [p.wait() for p in procs]
    finally:
        for out in logs:
            out.close()
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and "trainer.seed=" in p.name)
    trained = {r.name: _plan_lines(r) for r in runs}
    lost = len(seeds) - sum(_record(r).get("status") == "completed" for r in runs)
    duplicated = sum(n > 1 for n in trained.values())
    ok = lost == 0 and duplicated == 0 and all(c == 0 for c in codes)
    return Fault("launchers", f"launchers:{launchers}", "synthetic_spigot", ok, lost, duplicated,
                 detail=f"{len(seeds)} runs; trained {sorted(trained.values())} times; exit codes {codes}",
                 injected=launchers)


def non_finite(workdir: Path) -> list[Fault]:
    """Runs whose values are not finite: each must fail (exit 1) with one line naming the value, its step and the
    configuration, and a record ``reason: non_finite``."""
    cases = {"tau_underflow": ["estimator=gumbel_softmax", "task.estimator.tau=1e-45"],
             "inputs_overflow": ["dataset.noise=1e39"]}  # float32 data: inf
    faults = []
    for name, overrides in cases.items():
        run_dir = workdir / "non_finite" / name
        proc = subprocess.run(_command([*overrides, "trainer.max_steps=50"], run_dir), cwd=ROOT, env=_env(),
                              capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        lines = [line for line in output.splitlines() if "non-finite value at step" in line]
        record = _record(run_dir)
        ok = (proc.returncode == 1 and len(lines) == 1 and "Traceback" not in output
              and record.get("reason") == "non_finite")
        detail = lines[0].split("] ", 1)[-1] if lines else f"exit {proc.returncode}: {output.strip()[-300:]}"
        faults.append(Fault("non_finite", name, "synthetic_spigot", ok, detail=detail))
    return faults

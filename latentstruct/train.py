"""The single entry point: ``python -m latentstruct.train [overrides]``.

``train(cfg) -> metrics`` claims the run directory (a run another launcher is running is skipped), then reads top to
bottom: build → loop → evaluate under no_grad → write; a crashed run is recorded as ``status: failed``. ``main`` is
the ``@hydra.main`` wrapper; the command line is checked before it (:func:`latentstruct.config.check_command_line`).
A stop signal (SIGTERM, SIGINT, SIGUSR1/2) saves a checkpoint at the current step and records ``status: interrupted``
(the next run of it resumes there); a non-finite loss or gradient fails the run naming the value
(:mod:`latentstruct.guards`).

What a run says goes through the ``latentstruct`` logger, which Hydra (or, for ``train(cfg)`` called from Python,
:func:`train` itself) sends to the console and to the run directory's ``train.log``: the expected length before the
loop, a line per evaluation and the periodic progress lines (:mod:`latentstruct.progress`: a bar instead on a
terminal), resume and skip notices, the metrics table.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import latentstruct.optim
from latentstruct.config import (  # importing latentstruct.config registers the schemas
    ConfigError,
    check_command_line,
    help_page,
    option_name,
    validate,
)
from latentstruct.data.base import iterate_batches, num_batches
from latentstruct.data.files import DataMissing, data_missing
from latentstruct.guards import Interrupted, NonFinite, StopSignals, diagnose
from latentstruct.progress import Progress
from latentstruct.records import (
    FINAL_WEIGHTS,
    LENGTH,
    REPORT_FILE,
    RUN_FILE,
    RunMismatch,
    check_run_dir,
    claim,
    describe_claim,
    differences,
    environment,
    fingerprint,
    identity,
    load_checkpoint,
    load_model_weights,
    location,
    model_weights,
    read_record,
    remove_partial_writes,
    save_checkpoint,
    write_history,
    write_json,
    write_run_file,
)
from latentstruct.tasks import Task
from latentstruct.tasks.base import build_task

__all__ = ["train", "plan", "build_model", "main"]

log = logging.getLogger("latentstruct")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but no CUDA device is available (use trainer.device=auto or cpu)")
    return torch.device(name)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


@contextlib.contextmanager
def _rng_untouched():
    """Every generator's state as it was before the block: an evaluation draws nothing from the training's streams,
    so a run evaluated at other steps (one gone on to a longer length) trains exactly as one that was not."""
    state = _rng_state()
    try:
        yield
    finally:
        _set_rng_state(state)


@dataclass(frozen=True)
class _Phase:
    """A stretch of training over one split: from global step ``start``, ``steps`` steps of ``per_epoch`` batches
    per epoch, after ``epochs_before`` epochs of the earlier phases."""

    split: str
    per_epoch: int
    start: int
    steps: int
    epochs_before: int


def _plan(tc: DictConfig, sizes: dict[str, int]) -> tuple[list[_Phase], int]:
    """The phases of ``trainer.phases`` (default: one over ``train``) and the total number of steps."""
    if not tc.phases:
        per_epoch = num_batches(sizes["train"], tc.batch_size, tc.drop_last)
        if tc.max_steps is None and tc.max_epochs is None:
            raise ValueError("set trainer.max_steps or trainer.max_epochs")
        max_steps = tc.max_steps if tc.max_steps is not None else tc.max_epochs * per_epoch
        return [_Phase("train", per_epoch, 0, max_steps, 0)], max_steps
    if tc.max_epochs is not None:
        raise ValueError("trainer.max_epochs and trainer.phases exclude each other: give each phase its epochs")
    phases, start, epochs = [], 0, 0
    for p in tc.phases:
        if p.split not in sizes:
            raise ValueError(f"trainer.phases names split {p.split!r}; the dataset has {', '.join(sizes)}")
        if sizes[p.split] == 0:
            raise ValueError(f"trainer.phases trains on split {p.split!r}, which is empty")
        per_epoch = num_batches(sizes[p.split], tc.batch_size, tc.drop_last)
        phases.append(_Phase(p.split, per_epoch, start, p.epochs * per_epoch, epochs))
        start, epochs = start + p.epochs * per_epoch, epochs + p.epochs
    return phases, start if tc.max_steps is None else min(start, tc.max_steps)


def _evaluates(step: int, phase: _Phase, eval_every: int | None, max_steps: int) -> bool:
    """Whether the loop evaluates (and checkpoints) after global step ``step``, taken in ``phase``: every
    ``eval_every`` steps, else at the end of each epoch of the phase; and after the last step."""
    in_phase = step - phase.start
    return (step % eval_every == 0 if eval_every else in_phase % phase.per_epoch == 0) or step == max_steps


def _evaluation_steps(phases: list[_Phase], eval_every: int | None, max_steps: int) -> list[int]:
    """The steps after which the run evaluates (:func:`_evaluates`), all of them."""
    return [s for p in phases for s in range(p.start + 1, min(p.start + p.steps, max_steps) + 1)
            if _evaluates(s, p, eval_every, max_steps)]


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def plan(tc: DictConfig, sizes: dict[str, int]) -> tuple[list[_Phase], int, list[int]]:
    """How :func:`train` plans a run from its ``trainer`` node and the splits' sizes: its phases, its total steps and
    the steps it evaluates after (``bench/tables.py`` times a run by them)."""
    phases, max_steps = _plan(tc, sizes)
    return phases, max_steps, _evaluation_steps(phases, tc.eval_every, max_steps)


def _describe_plan(tc: DictConfig, phases: list[_Phase], max_steps: int, step: int = 0) -> str:
    """The run's expected length, said before it starts: steps = epochs × batches on a split (per phase),
    when it evaluates and how often, and where a resumed run starts."""
    parts = []
    for p in phases:
        if parts and p.start >= max_steps:
            break  # trainer.max_steps stops the run before this phase
        batches = (f"{p.per_epoch:,} batches of {tc.batch_size}{' (drop_last)' if tc.drop_last else ''}"
                   if tc.batch_size else f"1 batch (all of {p.split})")
        epochs = min(p.steps, max_steps - p.start) / p.per_epoch
        parts.append(f"{_count(epochs)} epoch{'s' * (epochs != 1)} × {batches} on {p.split}")
    planned = phases[-1].start + phases[-1].steps
    if len(phases) == 1:
        text = f"training {max_steps:,} steps = {parts[0]}"
    elif max_steps < planned:
        text = f"training {max_steps:,} of the {planned:,} steps of {len(phases)} phases (trainer.max_steps): "
        text += ", then ".join(parts)
    else:
        text = f"training {max_steps:,} steps in {len(phases)} phases: " + ", then ".join(parts)
    evaluations = _evaluation_steps(phases, tc.eval_every, max_steps)
    every = f"every {_plural(tc.eval_every, 'step')}" if tc.eval_every else "every epoch"
    text += f"; evaluating {every} ({_plural(len(evaluations), 'evaluation')})"
    if step:
        left = _plural(sum(s > step for s in evaluations), "evaluation")
        text += f"; resuming at step {step:,} ({_plural(max_steps - step, 'step')} and {left} to go)"
    return text


def _position(phases: list[_Phase], step: int) -> str:
    """Where the run is after ``step`` steps: ``epoch 1.4/2``, or with phases ``phase 2/2 (train) epoch 0.5/5``
    (epochs done in the phase of the last step, of that phase's epochs)."""
    index, p = next(((i, p) for i, p in reversed(list(enumerate(phases))) if p.start < step), (0, phases[0]))
    done = (step - p.start) / p.per_epoch
    epoch = f"epoch {done:,.{int(p.per_epoch > 1)}f}/{_count(p.steps / p.per_epoch)}"  # full batch: whole epochs
    return epoch if len(phases) == 1 else f"phase {index + 1}/{len(phases)} ({p.split}) {epoch}"


def _check_same_run(saved: dict, current: dict, where: Path) -> None:
    """Refuse to resume a checkpoint written under a different configuration (what it computes: records.identity)."""
    differ = differences(identity(saved), identity(current))
    if differ:
        raise RunMismatch(f"{where} was written with a different configuration:\n  " + "\n  ".join(differ)
                          + "\nuse another run directory, or trainer.force=true to start over")


def _fork_source(source: Path) -> tuple[str, int]:
    """(``<fingerprint>@<step>``, the step) of the completed run in ``source`` that ``trainer.init_from`` forks:
    what the fork's identity records of it (its path is where it lies, not what it computed)."""
    record = read_record(source) or {}
    if record.get("status") != "completed":
        raise ValueError(f"trainer.init_from={source}: not a completed run (status: {record.get('status', 'none')}); "
                         "a fork starts from a completed run's final checkpoint")
    recorded = _read_run_file(source) or {}
    if "fingerprint" not in recorded:
        raise ValueError(f"trainer.init_from={source}: no {RUN_FILE} says what that run computed")
    return f"{recorded['fingerprint']}@{record['steps']}", int(record["steps"])


def _fork_checkpoint(source: Path, device: torch.device, max_steps: int) -> dict[str, Any]:
    """The final checkpoint of the completed run in ``source`` (``trainer.init_from``), checked to be of its last
    step and before this run's ``max_steps``."""
    _, steps = _fork_source(source)
    path = source / "checkpoint.pt"
    ckpt = load_checkpoint(path, device) if path.exists() else None
    if ckpt is None or ckpt.get(FINAL_WEIGHTS) or ckpt.get("step") != steps:
        raise ValueError(f"trainer.init_from={source}: no checkpoint of its last step ({steps:,}) to start from "
                         "(run it with trainer.keep_checkpoint=true)")
    if steps >= max_steps:
        raise ValueError(f"trainer.init_from={source}: it ends at step {steps:,}, this run at {max_steps:,}: a fork "
                         "trains on past its source")
    return ckpt


@contextlib.contextmanager
def _own_hyperparameters(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """Keep the hyper-parameters (learning rate, betas, ...) of ``optimizer`` and of the task's own optimizers (the
    inference networks' of the energy tasks) over those of a loaded state: a fork's settings are its own, its
    moments its source's."""
    owned = [optimizer, *(v for m in model.modules() for v in vars(m).values()
                          if isinstance(v, torch.optim.Optimizer))]
    kept = [[{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups] for opt in owned]
    yield
    for opt, groups in zip(owned, kept, strict=True):
        for group, settings in zip(opt.param_groups, groups, strict=True):
            group.update(settings)


def _since(now: dict[str, float], before: dict[str, float], into: dict[str, float]) -> dict[str, float]:
    """Each running total of ``now`` (Task.timings, Task.counts) less its value ``before``, also added to ``into``
    (the phase's sums)."""
    added = {name: total - before.get(name, 0) for name, total in now.items()}
    for name, amount in added.items():
        into[name] = into.get(name, 0) + amount
    return added


def _length(tc: DictConfig) -> dict[str, int | None]:
    """The settings that say how long a run trains (records.LENGTH), as a record keeps them."""
    return {key.split(".")[-1]: tc.get(key.split(".")[-1]) for key in LENGTH}


def _replace(out: Path, recorded: dict | None, current: dict) -> None:
    """trainer.force=true: say what the run directory held, then remove its record so that nothing of it is read."""
    if recorded is not None:
        lines = differences(recorded.get("identity", {}), current) or ["(the same configuration)"]
        log.info("%s: trainer.force=true replaces the run of fingerprint %s:\n  %s", out,
                 recorded.get("fingerprint"), "\n  ".join(lines))
    elif (out / "metrics.json").exists():
        log.info("%s: trainer.force=true replaces a run record without %s", out, RUN_FILE)
    for name in ("metrics.json", "history.csv", "checkpoint.pt", RUN_FILE):
        (out / name).unlink(missing_ok=True)


def _write_hydra_files(out: Path, cfg: DictConfig) -> None:
    """The run's .hydra/ files (config.yaml, hydra.yaml, overrides.yaml), which the reports read: written here,
    once the directory's guard has passed (configs/train.yaml sets hydra.output_subdir to null, so that a launch
    refused by the guard leaves the directory's files as they were)."""
    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    folder = out / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": OmegaConf.to_container(hc)}), folder / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(list(hc.overrides.task)), folder / "overrides.yaml")


def build_model(cfg: DictConfig, dims: dict[str, int], extras: dict[str, Any] | None = None) -> Task:
    """The task of the nested node ``cfg.task`` (classification: its encoder → scorer → structure, estimator →
    decoder), instantiated once with its parts and called with the sizes the data dictates and its extras
    (:func:`latentstruct.tasks.base.build_task`; ``latentstruct/tasks/base.py``: the interface)."""
    return build_task(cfg, dims, extras or {})


def _log_metrics(metrics: dict[str, float], header: str) -> None:
    """The run's metrics as a table, a log line per row (each row keeps its columns behind the log's prefix)."""
    width = max(map(len, metrics), default=0)
    lines = [header, f"{'metric':<{width}}  value", f"{'-' * width}  -------"]
    lines += [f"{k:<{width}}  {v:7.2f}" for k, v in metrics.items()]
    for line in lines:
        log.info(line)


@contextlib.contextmanager
def _logging(out: Path, console: bool):
    """Outside Hydra (``train(cfg)`` from Python), what the CLI's logging gives: the run's lines in ``out/train.log``
    and, when ``console`` and nothing else logs them already (no root handler), on stdout, in the CLI's format."""
    if HydraConfig.initialized():  # the CLI: Hydra's job_logging already sends them to both
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.FileHandler(out / "train.log")]
    if console and not logging.getLogger().handlers:
        handlers.append(logging.StreamHandler(sys.stdout))
    level = log.level
    for handler in handlers:
        handler.setFormatter(fmt)
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.setLevel(level)
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()


def train(cfg: DictConfig, console: bool = True) -> dict[str, Any]:
    """Train one configuration; write its run record into ``cfg.paths.output_dir``; return metrics.json's dict.

    The run directory is claimed first (:func:`latentstruct.records.claim`): a run that another live process is
    running is skipped (``{"status": "in_progress", "claimed_by": ...}``, nothing written). Then the directory's
    guard: a directory holding the run of another configuration (its ``run.json``) is refused with
    :class:`~latentstruct.records.RunMismatch`, one line per differing key, nothing read or written
    (``trainer.force=true`` replaces it, saying what it replaces). In a directory of this configuration a completed
    run is skipped, or goes on to a longer ``trainer.max_steps`` / ``max_epochs`` from its checkpoint (exactly as a
    run of that length); an interrupted one resumes. A run that raises leaves ``status: failed`` with the error, then
    the error goes on.
    Called from Python, it logs as the CLI does: to the run's ``train.log`` and (``console=False``: not) the console.
    """
    out = Path(cfg.paths.output_dir)
    with _logging(out, console), claim(out) as held, StopSignals() as stop:
        if not held:
            log.info("%s is being run by %s; skipping it", out, describe_claim(held.holder))
            return {"status": "in_progress", "claimed_by": held.holder}
        if held.holder:
            log.info("%s: taking over the claim of %s, which is gone", out, describe_claim(held.holder))
        for partial in remove_partial_writes(out):  # the run is ours: no one else is writing them
            log.info("%s: removed %s, left by a write that was killed", out, partial.name)
        validate(cfg)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        ident, located = identity(resolved), location(resolved)
        if cfg.trainer.init_from:
            ident["trainer.forked_from"] = _fork_source(Path(cfg.trainer.init_from))[0]
        if cfg.trainer.force:
            try:
                recorded = check_run_dir(out, ident)
            except RunMismatch:
                recorded = _read_run_file(out)
            _replace(out, recorded, ident)
        else:
            check_run_dir(out, ident)  # raises RunMismatch: nothing of the directory is touched
        try:
            record = read_record(out) or {}
            length = _length(cfg.trainer)
            if record.get("status") == "completed" and record.get("length") == length:
                log.info("%s already completed; skipping (trainer.force=true re-runs it)", out)
                _log_metrics(record.get("metrics", {}), f"{out}  (its record, step {record.get('best_step')})")
                return record
            # an interrupted run goes on from the checkpoint it saved when it stopped; a completed one from its final
            # checkpoint, to a longer length
            resume = cfg.trainer.resume or record.get("status") in ("interrupted", "completed")
            return _run(cfg, out, resume, stop, record, ident, located)
        except Interrupted:
            raise  # its record (status: interrupted) and checkpoint are written
        except RunMismatch:
            raise  # a completed run that cannot go on: its record stands
        except BaseException as err:  # record the failure while the run is still ours, then let it go on
            failure = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
            if isinstance(err, NonFinite):
                failure = {"status": "failed", "reason": "non_finite", "step": err.step, "tensor": err.tensor,
                           "error": f"{err}; configuration: {_identity(cfg)}"}
                log.error("%s failed: %s", out, failure["error"])
            # the failure is this configuration's (its run.json says so: the next launch of it goes on here)
            write_json(out / "metrics.json", {**failure, "seed": cfg.trainer.seed, "fingerprint": write_run_file(
                out, ident, located), **environment(torch.device("cpu"))})
            raise


def _read_run_file(out: Path) -> dict | None:
    try:
        return json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


def _identity(cfg: DictConfig) -> str:
    """The run's configuration as its command line gave it (the overrides, under Hydra), else its directory."""
    if HydraConfig.initialized():
        return " ".join(HydraConfig.get().overrides.task) or "the defaults"
    return str(cfg.paths.output_dir)


def _run(cfg: DictConfig, out: Path, resume: bool, stop: StopSignals, record: dict,
         ident: dict[str, Any], located: dict[str, Any]) -> dict[str, Any]:
    """:func:`train` once the run is this process's to run and its configuration is valid; ``resume``: go on from
    the run directory's checkpoint, if it has one; ``stop``: the stop signals noted since the run was claimed;
    ``record``: the directory's metrics.json (empty if none); ``ident``: what the run computes; ``located``: where
    its inputs lie (:func:`latentstruct.records.location`)."""
    # ---- build
    tc = cfg.trainer
    if tc.threads:
        torch.set_num_threads(tc.threads)
    torch.set_flush_denormal(bool(tc.flush_denormal))  # per run: a sweep's worker process runs several
    _seed_everything(tc.seed)
    device = _device(option_name(tc.device))
    env = environment(device)  # at the start: the code that runs is the code of this commit
    try:
        data = instantiate(cfg.dataset)
    except Exception as err:  # a missing file: one line naming it, the data root and the rule that chose it
        raise (data_missing(err, cfg.paths.data_dir) or err) from err
    splits = {name: {k: v.to(device) for k, v in split.items()} for name, split in data.splits.items()}
    model = build_model(cfg, data.dims, data.extras).to(device)
    model.use_training_data(splits["train"])
    optimizer = latentstruct.optim.build(cfg.optim, cfg.optim_groups, model.param_groups())
    phases, max_steps = _plan(tc, {name: data.size(name) for name in data.splits})
    config = OmegaConf.to_container(cfg)  # the run's configuration: logged, checkpointed, compared on resume
    ckpt_path = out / "checkpoint.pt"
    ckpt = load_checkpoint(ckpt_path, device) if resume and ckpt_path.exists() else None
    forked = ckpt is None and bool(tc.init_from)  # a fork's first start: from its source's final checkpoint
    if forked:
        ckpt = _fork_checkpoint(Path(tc.init_from), device, max_steps)
    completed = record.get("status") == "completed"
    if completed:  # a completed run asked for again at another length: go on from its final checkpoint, or refuse
        done = record.get("steps", 0)
        if max_steps == done:
            log.info("%s already completed its %s steps; skipping (trainer.force=true re-runs it)", out, f"{done:,}")
            return record
        if max_steps < done:
            raise RunMismatch(f"{out} holds this configuration's completed run of {done:,} steps; a shorter one "
                              f"({max_steps:,} steps) cannot be read from it: use another run directory, or "
                              "trainer.force=true to start over")
        if ckpt is None or ckpt.get(FINAL_WEIGHTS) or ckpt.get("step") != done:
            raise RunMismatch(f"{out} holds this configuration's completed run of {done:,} steps, without the "
                              f"checkpoint of its last step that going on to {max_steps:,} needs: use another run "
                              "directory, or trainer.force=true to start over")
    if ckpt is not None and ckpt.get(FINAL_WEIGHTS):  # a finished run's weights, packed for the reports
        log.info("%s: its checkpoint holds only the final weights of a finished run; starting over", out)
        ckpt = None
    if ckpt is not None and ckpt["step"] > max_steps:
        raise RunMismatch(f"{out}: its checkpoint is at step {ckpt['step']:,}, past this run's {max_steps:,} steps: "
                          "use another run directory, or trainer.force=true to start over")
    write_run_file(out, ident, located)
    _write_hydra_files(out, cfg)
    logger = instantiate(cfg.logger)(output_dir=str(out), run_config=config)

    step, history, elapsed, cpu_elapsed = 0, [], 0.0, 0.0
    loss_sum, loss_count = 0.0, 0  # since the last evaluation, summed on the device: no host sync per step
    window = (0.0, 0)  # the same sums, of the steps up to the last evaluation
    evaluations = _evaluation_steps(phases, tc.eval_every, max_steps)
    if ckpt is not None:
        if not forked:
            _check_same_run(ckpt["config"], config, ckpt_path)
        with _own_hyperparameters(model, optimizer) if forked else contextlib.nullcontext():
            load_model_weights(model, ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
        step, history, elapsed = ckpt["step"], ckpt["history"], ckpt["wall_seconds"]
        cpu_elapsed = ckpt.get("cpu_seconds")  # None: a checkpoint from before runs counted it
        # a run gone on to a longer length keeps the evaluations that a run of that length makes, not its old end,
        # and the training loss of the steps before that end counts into the next evaluation's, as it would have;
        # else the loss since the last evaluation goes on (a checkpoint written between evaluations: a stop signal,
        # trainer.checkpoint_every / _seconds)
        if history and history[-1]["step"] == step and step not in evaluations:
            history = history[:-1]
            loss_sum, loss_count = ckpt["window"]
        else:
            loss_sum, loss_count = ckpt["loss_sum"], ckpt["loss_count"]
        _set_rng_state(ckpt["rng"])
        if forked:
            log.info("%s: forked from %s at its step %s (its fingerprint %s)", out, tc.init_from, f"{step:,}",
                     ident["trainer.forked_from"].split("@")[0])
        elif completed:
            log.info("%s: going on from its completed run of %s steps to %s", out, f"{step:,}", f"{max_steps:,}")
        else:
            log.info("resumed %s at step %d", out, step)

    # ---- loop
    log.info("%s: %s", out, _describe_plan(tc, phases, max_steps, step))
    start = time.perf_counter() - elapsed
    cpu_start = time.process_time()

    def cpu_seconds() -> float | None:  # this run's process CPU time, summed over the processes that resumed it
        return None if cpu_elapsed is None else cpu_elapsed + time.process_time() - cpu_start
    first_step, train_seconds = step, 0.0  # time in training steps (evaluations excluded), this process only
    phase_seconds, phase_steps, tick_step = [0.0] * len(phases), [0] * len(phases), step  # the same, per phase
    # the task's timed parts of its steps (Task.timings: e.g. the implicit term), per phase, this process only
    parts_seconds: list[dict[str, float]] = [{} for _ in phases]
    parts_before = dict(model.timings())
    counted: list[dict[str, int]] = [{} for _ in phases]  # the same for the task's counts (Task.counts)
    counts_before = dict(model.counts())

    def mean_loss() -> float | None:  # since the last evaluation; for the progress lines (a host sync)
        return float(loss_sum) / loss_count if loss_count else None

    model.train()
    progress = Progress(max_steps, step, partial(_position, phases), evaluations, elapsed=elapsed, desc=out.name,
                        bar=tc.progress and sys.stderr.isatty(), log_seconds=tc.log_seconds)

    def checkpoint() -> None:  # the whole state after `step` steps: resuming from it continues bit-exactly
        nonlocal saved
        save_checkpoint(ckpt_path, {"model": model_weights(model), "optimizer": optimizer.state_dict(), "step": step,
                                    "history": history, "loss_sum": loss_sum, "loss_count": loss_count,
                                    "window": window,
                                    "wall_seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds(),
                                    "rng": _rng_state(),
                                    "config": config})
        saved = time.perf_counter()

    # non-finite loss or gradients: checked every step on the CPU; on a GPU the first bad step is kept on the device
    # and read every log_every steps (no step waits for the host)
    check_every = 1 if device.type == "cpu" else tc.log_every
    bad_step = torch.zeros((), dtype=torch.long, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    tick = saved = time.perf_counter()
    with progress:
        while step < max_steps:
            index, phase = next((i, p) for i, p in reversed(list(enumerate(phases))) if p.start <= step)
            epoch, offset = divmod(step - phase.start, phase.per_epoch)
            shuffle = None if tc.batch_size is None else tc.seed * 100_003 + phase.epochs_before + epoch
            batches = iterate_batches(splits[phase.split], tc.batch_size, shuffle, start=offset,
                                      drop_last=tc.drop_last)
            for batch in batches:
                if stop.signum is not None:  # a stop signal came during the last step: save it, say so, go
                    progress.pause()
                    checkpoint()
                    write_json(out / "metrics.json", {
                        "status": "interrupted", "signal": signal.Signals(stop.signum).name, "step": step,
                        "seed": tc.seed, **env, "wall_seconds": time.perf_counter() - start,
                        "cpu_seconds": cpu_seconds()})
                    log.info("%s: stopped by %s at step %s; its checkpoint is saved and the next run of it resumes "
                             "there", out, signal.Signals(stop.signum).name, f"{step:,}")
                    raise stop.interrupted(step)
                model.begin_step(index, step - phase.start)
                try:
                    loss = model(batch).loss
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                except Exception as err:  # a NaN in the inputs or scores often fails deep inside: name it
                    found = diagnose(step + 1, model, batch, forward=lambda b=batch: model(b))
                    if found is None:
                        raise
                    raise found from err
                finite = torch.isfinite(loss.detach())
                if params:
                    finite = finite & torch.isfinite(torch.nn.utils.get_total_norm(
                        [p.grad for p in params if p.grad is not None]))
                if check_every == 1:
                    if not finite:
                        raise (diagnose(step + 1, model, batch, loss, forward=lambda b=batch: model(b))
                               or NonFinite(step + 1, "the loss or a gradient"))
                else:
                    bad_step = torch.where((bad_step == 0) & ~finite, step + 1, bad_step)
                    if (step + 1) % check_every == 0 and int(bad_step):
                        raise NonFinite(int(bad_step), "the loss or a gradient", f"seen at step {step + 1:,}")
                optimizer.step()
                step += 1
                loss_sum, loss_count = loss_sum + loss.detach(), loss_count + 1
                progress.step(step, mean_loss)
                if step % tc.log_every == 0:
                    logger.log(step, {"train/loss": loss.item()})
                in_phase = step - phase.start
                if _evaluates(step, phase, tc.eval_every, max_steps):
                    # ---- evaluate
                    # float() waits for the device, so the clock then includes every queued training step.
                    row = {"step": step, "epoch": phase.epochs_before + in_phase / phase.per_epoch,
                           "train/loss": float(loss_sum) / loss_count}
                    seconds = time.perf_counter() - tick
                    progress.pause()
                    train_seconds += seconds
                    phase_seconds[index] += seconds  # the steps since the last evaluation (one phase, unless
                    phase_steps[index] += step - tick_step  # eval_every straddles a phase boundary)
                    parts_now, counts_now = dict(model.timings()), dict(model.counts())
                    for name, spent in _since(parts_now, parts_before, parts_seconds[index]).items():
                        row[f"time/{name}_share"] = spent / seconds if seconds > 0 else None
                    for name, made in _since(counts_now, counts_before, counted[index]).items():
                        row[f"count/{name}_per_step"] = made / (step - tick_step) if step > tick_step else None
                    parts_before, counts_before = parts_now, counts_now
                    with _rng_untouched():
                        evaluated = model.evaluate_splits({split: splits[split] for split in ("valid", "test")},
                                                          tc.batch_size)
                    row.update({f"{split}/{k}": v for split, metrics in evaluated.items() for k, v in metrics.items()})
                    row.update(wall_seconds=time.perf_counter() - start, cpu_seconds=cpu_seconds(),
                               load_1min=os.getloadavg()[0])
                    history.append(row)
                    window, (loss_sum, loss_count) = (loss_sum, loss_count), (0.0, 0)
                    logger.log(step, row)
                    write_history(out / "history.csv", history)
                    checkpoint()
                    tick, tick_step = time.perf_counter(), step
                    progress.evaluated(row)
                elif ((tc.checkpoint_every and step % tc.checkpoint_every == 0)
                      or (tc.checkpoint_seconds is not None
                          and time.perf_counter() - saved >= tc.checkpoint_seconds)):
                    checkpoint()
                if step >= max_steps or step == phase.start + phase.steps:
                    break
    logger.finish()

    # ---- write
    select = option_name(tc.select)
    # best: among the evaluations of the last phase (earlier phases, e.g. pretraining, are not the model trained)
    last_phase = [r for r in history if r["step"] > phases[-1].start] or history
    chosen = max(last_phase, key=lambda r: r["valid/acc"]) if select == "best" else history[-1]
    metrics = {k: v for k, v in chosen.items() if k.startswith(("valid/", "test/"))}
    record = {
        "status": "completed",
        "metrics": metrics,
        "best_epoch": int(np.ceil(chosen["epoch"])),
        "best_step": chosen["step"],
        "seed": tc.seed,
        **env,
        "wall_seconds": time.perf_counter() - start,
        # the process's CPU time over the same span: about wall_seconds × threads for a run alone on its cores, well
        # below it for a run that other work starved
        "cpu_seconds": cpu_seconds(),
        "seconds_per_step": train_seconds / (step - first_step) if step > first_step else None,
        # per epoch of the last phase (the only one without trainer.phases), from that phase's steps
        "seconds_per_epoch": phase_seconds[-1] / phase_steps[-1] * phases[-1].per_epoch if phase_steps[-1] else None,
        # the share of the last phase's training time in each timed part of the task's steps (Task.timings)
        **{f"{name}_share": spent / phase_seconds[-1] if phase_seconds[-1] else None
           for name, spent in parts_seconds[-1].items()},
        # the same phase's counts per step (Task.counts), e.g. the implicit gradient's Hessian-vector products
        **{f"{name}_per_step": made / phase_steps[-1] if phase_steps[-1] else None
           for name, made in counted[-1].items()},
        "steps": step,
        "length": _length(tc),
        "fingerprint": fingerprint(ident),
        "selection": select,
    }
    with _rng_untouched(), torch.no_grad():  # what the reports draw of the final model (Task.report_record)
        drawn = model.report_record(splits["test"], data.extras)
    if drawn is not None:
        write_json(out / REPORT_FILE, drawn)
    write_json(out / "metrics.json", record)
    if not tc.keep_checkpoint:  # the run is complete: nothing will resume it
        ckpt_path.unlink(missing_ok=True)
    _log_metrics(metrics, f"{out}  ({select} evaluation, step {chosen['step']})")
    return record


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        record = train(cfg)  # a failure is recorded (status: failed) and goes on to Hydra and the shell
    except Interrupted as stop:  # recorded (status: interrupted) with its checkpoint
        stop.hand_on()  # submitit's handler, under its launcher: requeues the job and exits
        sys.exit(128 + stop.signum)
    except NonFinite:  # recorded and said in one line by train(); a sweep's job fails as any other would
        if HydraConfig.get().mode == RunMode.RUN:
            sys.exit(1)
        raise
    except (RunMismatch, DataMissing) as err:  # another configuration's run (nothing touched); data absent (recorded)
        if HydraConfig.get().mode == RunMode.RUN:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
    # The returned value lets Hydra sweepers optimise validation accuracy (none for a run skipped as in progress).
    return record.get("metrics", {}).get("valid/acc")


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # every setting with its help text (Hydra's shows values only)
        try:
            print(help_page(check_command_line(sys.argv[1:])), end="")
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        sys.exit(0)
    try:  # before Hydra: nested experiment names, unknown experiments and keys (latentstruct.config)
        sys.argv[1:] = check_command_line(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())

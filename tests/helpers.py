"""Plain helpers shared by the tests, importable at module level (``from tests.helpers import compose``).

Fixtures and hooks built on them (the data root, the ``real_data`` marker) live in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

import latentstruct.config  # noqa: F401  (registers the config schemas)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def compose(*overrides: str, hydra: bool = False) -> DictConfig:
    """``configs/train.yaml`` composed with ``overrides``, as ``python -m latentstruct.train`` would (without running
    it); ``hydra=True`` keeps the ``hydra`` node (sweeps, launchers)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra)


def train_run(folder: Path, *overrides: str, name: str = "run") -> dict:
    """Train in-process into ``folder / name`` (unless ``overrides`` name ``paths.output_dir``), as
    ``python -m latentstruct.train <overrides>`` would there, without a progress bar; returns the run's record
    (``metrics.json``). Every test that trains an in-process run goes through here."""
    from latentstruct.train import train

    return train(compose("trainer.progress=false", f"paths.output_dir={folder / name}", *overrides))


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None,
            script: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m latentstruct.train ARGS`` (or ``python SCRIPT ARGS``) run from ``cwd`` with the environment
    ``env`` (default: this one), in this process: its exit status, stdout and stderr, as ``subprocess.run`` would
    give them. A new interpreter costs ~5 CPU-s before the command does anything (importing torch and
    ``torch._dynamo``, which every optimizer step imports); here they are loaded already. For what the command line
    answers — refusals, exit statuses, records, directories; what needs a process of its own (signals, launchers,
    claims) starts one.

    What a run changes of the process is put back: the working directory, ``sys.argv``, the environment, Hydra's
    global state and the logging configuration Hydra installs (its handlers closed)."""
    from hydra.core.global_hydra import GlobalHydra

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    saved_logging = [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    saved = os.getcwd(), sys.argv[:], dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    try:
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.environ.setdefault("HYDRA_FULL_ERROR", "0")
        sys.argv = [str(script or ROOT / "latentstruct" / "train.py"), *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'latentstruct.train' found in sys.modules", RuntimeWarning)  # runpy's
            try:
                if script:
                    runpy.run_path(str(script), run_name="__main__")
                else:
                    runpy.run_module("latentstruct.train", run_name="__main__")
            except SystemExit as stop:
                code = stop.code
                if isinstance(code, str):  # sys.exit("message"): said on stderr, status 1
                    print(code, file=sys.stderr)
                    code = 1
    finally:
        GlobalHydra.instance().clear()
        for lg, handlers, level, propagate, disabled in saved_logging:
            for handler in set(lg.handlers) - set(handlers):
                handler.close()
            lg.handlers[:], lg.level, lg.propagate, lg.disabled = handlers, level, propagate, disabled
        for lg in logging.Logger.manager.loggerDict.values():  # loggers the run made: as if never configured
            if isinstance(lg, logging.Logger) and lg not in loggers:
                for handler in lg.handlers:
                    handler.close()
                lg.handlers.clear()
        os.chdir(saved[0])
        sys.argv = saved[1]
        os.environ.clear()
        os.environ.update(saved[2])
    return subprocess.CompletedProcess([str(script or "latentstruct.train"), *args], code or 0, out.getvalue(),
                                       err.getvalue())


def one_epoch_per_phase(cfg: DictConfig) -> DictConfig:
    """``cfg`` shortened in place to one epoch of each of its two phases (or one epoch without phases)."""
    if cfg.trainer.phases:
        cfg.trainer.phases[0].epochs = cfg.trainer.phases[1].epochs = 1
    else:
        cfg.trainer.max_epochs = 1
    return cfg


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    return process_state(pid) not in (None, "Z", "X")


def final_model(run_dir: Path):
    """The model of a run's checkpoint (its final state), rebuilt from the configuration the checkpoint holds and
    its data, in eval mode; and the data."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from latentstruct.records import load_checkpoint, load_model_weights
    from latentstruct.train import build_model

    ckpt = load_checkpoint(Path(run_dir) / "checkpoint.pt", torch.device("cpu"))
    cfg = OmegaConf.create(ckpt["config"])
    cfg.paths.output_dir = str(run_dir)
    data = instantiate(cfg.dataset)
    model = build_model(cfg, data.dims, data.extras)
    load_model_weights(model, ckpt["model"])
    return model.eval(), data


def methods(task: str) -> list[str]:
    """The methods of a task's experiments (``configs/experiment/<task>_<method>.yaml``), e.g. ``methods("sst")``."""
    return [name.removeprefix(f"{task}_") for name in latentstruct.config.experiments().get(task, [])]


def data_root() -> Path:
    """The root of the real datasets, resolved by the config itself (``paths.data_dir``: ``$LATENTSTRUCT_DATA``, else
    ``data`` relative to the working directory), so that the tests look where the package looks."""
    return Path(compose().paths.data_dir).resolve()


def write_data_file(folder: Path, name: str, text: str, gz: bool = False) -> Path:
    """``text`` as ``folder/name`` (UTF-8), or gzip-compressed as ``folder/name.gz``: a generated data file."""
    if gz:
        import gzip

        path = folder / f"{name}.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
        return path
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path

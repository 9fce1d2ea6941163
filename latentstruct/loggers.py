"""Loggers: where training curves go besides the run record (which is always written)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal

__all__ = ["NoLogger", "CsvLogger", "WandbLogger"]


class NoLogger:
    """Only the run record (metrics.json, history.csv).

    A logger option is a partial: ``train.py`` gives it the run's directory and configuration.
    """

    FROM_DATA = ("output_dir", "run_config")  # given by train.py

    def __init__(self, output_dir: str | None = None, run_config: dict | None = None):
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def finish(self) -> None:
        pass


class CsvLogger(NoLogger):
    """Appends every logged value to ``train_log.csv`` in the run directory, in long format
    (``step,metric,value``) so that rows with different metrics share one header."""

    def __init__(self, output_dir: str, run_config: dict | None = None):
        self.path = Path(output_dir) / "train_log.csv"

    def log(self, step, metrics):
        new = not self.path.exists()
        with self.path.open("a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "metric", "value"])
            writer.writerows([step, key, value] for key, value in metrics.items())


class WandbLogger(NoLogger):
    """Weights & Biases. ``mode="offline"`` (the default) writes under the run directory and never needs the
    network; ``wandb sync`` uploads later.

    Args:
        project: wandb project.
        mode: offline (the default: never touches the network), online or disabled.
    """

    def __init__(self, output_dir: str, run_config: dict | None = None, project: str = "latentstruct",
                 mode: Literal["offline", "online", "disabled"] = "offline"):
        try:
            import wandb  # imported here: heavy, and only this logger needs it
        except ImportError:
            raise ImportError("logger=wandb needs the wandb package: pip install 'latentstruct[wandb]' "
                              "(make install includes it)") from None

        self.run = wandb.init(project=project, mode=mode, dir=output_dir, config=run_config, reinit=True)

    def log(self, step, metrics):
        self.run.log(metrics, step=step)

    def finish(self):
        self.run.finish()

"""The task interface: everything ``train.py`` asks of a model, whatever the task.

A task is an ``nn.Module`` chosen by the ``task`` config group, whose ``_target_`` names its class. ``train.py``
builds it with ``<class>.from_config(cfg, dims, extras)`` — the task knows which config groups it reads (the classifier:
encoder, scorer, structure, estimator, decoder; sorting: structure and estimator) — and then only uses:

* ``forward(batch)`` → an output whose ``.loss`` is the scalar training loss (a batch mean);
* ``evaluate(data, batch_size)`` → ``{metric: value}`` under no_grad, restoring the train/eval mode; it must hold
  ``acc`` (×100, higher is better): the progress bar shows it and ``trainer.select=best`` maximises ``valid/acc``;
* ``evaluate_splits({name: data}, batch_size)`` → ``{name: {metric: value}}``: what ``train.py`` calls at every
  evaluation, with ``valid`` then ``test``; by default ``evaluate`` on each split independently. A task whose test
  metric depends on the validation split (the multi-label F1 at the threshold chosen on ``valid``) overrides it;
* ``use_training_data(train)``: called once after building with the training split (on the device); tasks that
  predict from the training examples themselves (the kNN classifier) keep it, the others ignore it;
* ``begin_step(phase, step)``: called before every training step with the index of the current phase of
  ``trainer.phases`` (0 without phases) and the number of steps already taken in it, for tasks whose training
  changes with time (the semi-supervised VAE anneals ε); ignored by default;
* ``param_groups()`` → ``{name: [parameters]}``: the ``default`` group is optimised by ``optim``, any other group by
  ``optim_groups.<name>`` when the config gives one, else by ``optim`` too (see :func:`latentstruct.optim.build`);
* ``train()`` / ``eval()`` / ``state_dict()`` / ``load_state_dict()`` / ``to()`` from ``nn.Module``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["Task"]


class Task(nn.Module):
    """Base class of the tasks (module docstring: the interface ``train.py`` relies on)."""

    @classmethod
    def from_config(cls, cfg: Any, dims: dict[str, int], extras: dict[str, Any] | None = None) -> Task:
        """Build the task from the composed config ``cfg``, the sizes the data dictates (``TensorSplits.dims``) and
        what else comes with the data (``TensorSplits.extras``: a vocabulary, pretrained embeddings)."""
        raise NotImplementedError

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Named parameter groups for the optimizers; by default one group, ``default``, in ``parameters()`` order."""
        return {"default": list(self.parameters())}

    def use_training_data(self, train: dict[str, torch.Tensor]) -> None:
        """Receive the training split (for tasks whose predictions use it, e.g. kNN); ignored by default."""

    def begin_step(self, phase: int, step: int) -> None:
        """Where training is, before each step: ``phase`` indexes ``trainer.phases``, ``step`` counts the steps
        already taken in it (see the module docstring); ignored by default."""

    def evaluate_splits(
        self, splits: dict[str, dict[str, torch.Tensor]], batch_size: int | None = None
    ) -> dict[str, dict[str, float]]:
        """The metrics of every split of ``splits`` (in its order: ``valid``, then ``test``); by default
        :meth:`evaluate` on each one alone."""
        return {name: self.evaluate(data, batch_size) for name, data in splits.items()}

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        raise NotImplementedError

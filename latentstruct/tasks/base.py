"""The task interface: everything ``train.py`` asks of a model, whatever the task.

A task is an ``nn.Module`` chosen by the ``task`` config group, whose ``_target_`` names its class. Its model parts
are config groups of their own, listed in ``PARTS`` (the classifier: encoder, scorer, structure, estimator, decoder;
sorting: scorer, structure, estimator, sigma_net), each an option with a ``_target_`` (a partial where the data gives
the sizes).
``train.py`` builds it with :meth:`Task.from_config`, which instantiates those groups and passes them, with the task's
own settings (the ``task`` node, whose schema is :meth:`build`'s signature), the sizes the data dictates and its
extras to :meth:`build`; a part group that the task does not list is refused, never silently ignored. ``train.py``
then only uses:

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
* ``report_record(test, extras)`` → what the reports draw of the final model (trees, parses), as JSON, or None
  (the default): ``train.py`` writes it beside ``metrics.json`` (``report.json``) when the run completes;
* ``timings()`` → ``{name: seconds}``: seconds spent so far, in this process, in named parts of the training steps
  (the energy tasks' ``implicit``: the implicit term of the gradient); ``train.py`` writes each part's share of the
  training time to the history (``time/<name>_share`` per evaluation window) and to the record (``<name>_share``,
  over the last phase); none by default;
* ``train()`` / ``eval()`` / ``state_dict()`` / ``load_state_dict()`` / ``to()`` from ``nn.Module``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

__all__ = ["Task", "PART_GROUPS", "SHARED"]

#: the top-level config groups that hold model parts; a task reads those of them its ``PARTS`` lists
PART_GROUPS = ("encoder", "scorer", "structure", "estimator", "decoder", "sigma_net", "energy", "infnet",
               "cost_net", "composer")
#: top-level settings shared by the tasks, passed to :meth:`Task.build` when its signature names them
SHARED = {"latent": "predicted", "embedding": None}


def _plain(value: Any) -> Any:
    """A config value as plain Python: containers as dicts / lists, enum members as their strings."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return getattr(value, "value", value)


class Task(nn.Module):
    """Base class of the tasks (module docstring: the interface ``train.py`` relies on)."""

    #: the config groups this task is built from (a subset of :data:`PART_GROUPS`), passed to :meth:`build`
    PARTS: tuple[str, ...] = ()

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict[str, Any], **kwargs: Any) -> Task:
        """The task from its parts (instantiated config groups: modules, or partials that take the sizes of
        ``dims``), its settings (the ``task`` node) and the data's sizes and extras."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, cfg: DictConfig, dims: dict[str, int], extras: dict[str, Any] | None = None) -> Task:
        """Build the task from the composed config ``cfg``, the sizes the data dictates (``TensorSplits.dims``) and
        what else comes with the data (``TensorSplits.extras``: a vocabulary, pretrained embeddings).

        Refuses a part group that is set (not null) but not in ``PARTS``: ``decoder=linear`` on a task without a
        decoder is an error, not a no-op; and a part group that holds settings but no option."""
        unread = [g for g in PART_GROUPS if g not in cls.PARTS and cfg.get(g) is not None]
        if unread:
            raise ValueError(
                f"task {cls.__name__} is built from {', '.join(cls.PARTS) or 'no parts'}; it does not read "
                + ", ".join(f"{g} (set to {cfg[g].get('_target_', '?')})" for g in unread)
                + ": remove those overrides"
            )
        takes = inspect.signature(cls.build).parameters
        if "latent" not in takes and cfg.get("latent", "predicted") != SHARED["latent"]:
            raise ValueError(f"task {cls.__name__} has no latent source to choose: remove latent={_plain(cfg.latent)}")
        for g in cls.PARTS:  # a node left with settings but no option: ``~energy`` over an experiment's ``energy.*``
            if cfg.get(g) is not None and "_target_" not in cfg[g]:
                raise ValueError(f"{g} holds settings ({', '.join(map(str, cfg[g]))}) but no option: choose one "
                                 f"({g}=<option>)")
        parts = {g: None if cfg.get(g) is None else instantiate(cfg[g]) for g in cls.PARTS}
        shared = {k: _plain(cfg[k]) for k in SHARED if k in takes}
        settings = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if not k.startswith("_")}
        return cls.build(dims, extras or {}, **parts, **shared, **settings)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Named parameter groups for the optimizers; by default one group, ``default``, in ``parameters()`` order."""
        return {"default": list(self.parameters())}

    def use_training_data(self, train: dict[str, torch.Tensor]) -> None:
        """Receive the training split (for tasks whose predictions use it, e.g. kNN); ignored by default."""

    def begin_step(self, phase: int, step: int) -> None:
        """Where training is, before each step: ``phase`` indexes ``trainer.phases``, ``step`` counts the steps
        already taken in it (see the module docstring); ignored by default."""

    def timings(self) -> dict[str, float]:
        """Seconds spent so far (this process) in named parts of the training steps (module docstring); none by
        default."""
        return {}

    def evaluate_splits(
        self, splits: dict[str, dict[str, torch.Tensor]], batch_size: int | None = None
    ) -> dict[str, dict[str, float]]:
        """The metrics of every split of ``splits`` (in its order: ``valid``, then ``test``); by default
        :meth:`evaluate` on each one alone."""
        return {name: self.evaluate(data, batch_size) for name, data in splits.items()}

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        raise NotImplementedError

    def report_record(self, test: dict[str, torch.Tensor], extras: dict[str, Any]) -> dict[str, Any] | None:
        """What the reports draw of this model, from the ``test`` split (and the data's ``extras``: a vocabulary),
        as JSON (``report.json``, :mod:`latentstruct.report` reads it); None: nothing (the default)."""
        return None

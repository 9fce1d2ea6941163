"""The task interface: everything ``train.py`` asks of a model, whatever the task.

A task is an ``nn.Module`` built by Hydra from one nested config node, ``task``: its ``_target_`` names its class, its
settings and its model parts are the parameters of the class's :meth:`Task.build` (the node's schema is that
signature, :func:`latentstruct.config.schema`). A part is a parameter annotated ``Annotated[Any, Part(kinds)]``
(:class:`latentstruct.ranges.Part`): a node under the task (``task.encoder``, ``task.estimator``...), chosen by the
config group of its name (``estimator=spigot``, whose options are ``# @package task.estimator``), an option with a
``_target_`` (a partial where the data gives the sizes); a task option lists its parts in its defaults
(``configs/task/classification.yaml``). A part the task does not take, one whose class is not of the kinds its
``Part`` names, or a part node that holds settings but no option, is refused when the configuration is validated.
``train.py`` builds it with :func:`build_task`: the node instantiated once (parts included) as a partial, called with
the sizes the data dictates and its extras. ``train.py`` then only uses:

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
* ``counts()`` → ``{name: count}``: how many named operations the training steps have made so far, in this process
  (the energy tasks' ``hvp``: the implicit gradient's Hessian-vector products); ``train.py`` writes each per step to
  the history (``count/<name>_per_step`` per evaluation window) and to the record (``<name>_per_step``, over the last
  phase); none by default;
* ``train()`` / ``eval()`` / ``state_dict()`` / ``load_state_dict()`` / ``to()`` from ``nn.Module``.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from latentstruct.ranges import Part, part_of

__all__ = ["Task", "SHARED", "build_task", "parts"]

#: top-level settings shared by the tasks, passed to :meth:`Task.build` when its signature names them
SHARED = {"latent": "predicted", "embedding": None}


def parts(cls: type) -> dict[str, Part]:
    """The model parts of a task class: ``{parameter of build: its Part}``, in signature order."""
    hints = typing.get_type_hints(cls.build, include_extras=True)
    return {name: found for name in inspect.signature(cls.build).parameters
            if (found := part_of(hints.get(name))) is not None}


def _plain(value: Any) -> Any:
    """A config value as plain Python: containers as dicts / lists, enum members as their strings."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return getattr(value, "value", value)


class Task(nn.Module):
    """Base class of the tasks (module docstring: the interface ``train.py`` relies on)."""

    @classmethod
    def build(cls, dims: dict[str, int], extras: dict[str, Any], **kwargs: Any) -> Task:
        """The task from its parts (modules, or partials that take the sizes of ``dims``), its settings and the
        data's sizes and extras; a subclass declares them in its signature (module docstring)."""
        raise NotImplementedError

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

    def counts(self) -> dict[str, int]:
        """How many named operations the training steps have made so far (this process; module docstring), e.g.
        an implicit gradient's Hessian-vector products; none by default."""
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


def build_task(cfg: DictConfig, dims: dict[str, int], extras: dict[str, Any] | None = None) -> Task:
    """The task of the composed configuration ``cfg``: its ``task`` node instantiated once, its parts with it (each
    a module, or a partial where the data gives the sizes), as a partial of the class's :meth:`Task.build`, which is
    called with the sizes the data dictates (``TensorSplits.dims``), what else comes with the data
    (``TensorSplits.extras``: a vocabulary, pretrained embeddings) and the shared top-level settings its signature
    names (:data:`SHARED`). The node is validated first (:func:`latentstruct.config.validate`: a part of a kind the
    task does not take, a part with settings but no option, an unknown key, a value out of range)."""
    from latentstruct.config import validate  # it imports the tasks (the schemas)

    validate(cfg.task, "task.")
    cls = get_class(cfg.task._target_)
    takes = inspect.signature(cls.build).parameters
    if "latent" not in takes and cfg.get("latent", "predicted") != SHARED["latent"]:
        raise ValueError(f"task {cls.__name__} has no latent source to choose: remove latent={_plain(cfg.latent)}")
    node = instantiate(cfg.task, _partial_=True)  # functools.partial(cls, parts..., settings...)
    shared = {k: _plain(cfg[k]) for k in SHARED if k in takes}
    return cls.build(dims, extras or {}, **shared, **node.keywords)

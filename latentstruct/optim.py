"""Optimizers for a task's named parameter groups (``optim`` and ``optim_groups`` in the config).

Most runs use one optimizer, ``optim``, for every parameter. Some protocols train parts of a model with different
optimizers — seed 002 App. C.1 trains the μ-network with Adam (lr 0.1) and the σ-network with SGD (lr 1e-6) — which
one torch optimizer cannot do (parameter groups may differ in hyper-parameters, not in algorithm). So a task names its
parameter groups (``Task.param_groups``) and the config may give a group its own optimizer:

    optim: {lr: 0.1}                                            # Adam (optim=adam) for everything else
    optim_groups:
      sigma: {_target_: torch.optim.SGD, lr: 1.0e-6}            # the task's `sigma` group

Without ``optim_groups`` the result is exactly the single torch optimizer ``optim`` over every parameter, so the
checkpoints of existing runs keep their format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

__all__ = ["Optimizers", "build"]


class Optimizers:
    """Several optimizers used as one: ``zero_grad``, ``step``, ``state_dict`` (keyed by group name) and
    ``load_state_dict``, which is all the training loop and the checkpoints need."""

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer]):
        self.optimizers = dict(optimizers)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state for groups {sorted(state)}, expected {sorted(self.optimizers)}")
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state[name])

    def __repr__(self) -> str:
        return f"Optimizers({', '.join(f'{k}={type(v).__name__}' for k, v in self.optimizers.items())})"


def build(
    optim: Any, optim_groups: Mapping[str, Any], groups: Mapping[str, list[nn.Parameter]]
) -> torch.optim.Optimizer | Optimizers:
    """The optimizer(s) for a task's parameter ``groups`` (``Task.param_groups()``).

    ``optim`` and each value of ``optim_groups`` are partial optimizer configs (``_partial_: true``). A group named
    in ``optim_groups`` gets its own optimizer; every other group's parameters share ``optim``'s. A name that is not
    one of the task's groups is an error (a typo would otherwise silently train with the wrong optimizer).
    """
    if "default" in optim_groups:
        raise ValueError("optim_groups.default: the default parameter group is optimised by `optim`; configure that")
    unknown = sorted(set(optim_groups) - set(groups))
    if unknown:
        raise ValueError(f"optim_groups names {unknown}, but this task's parameter groups are {sorted(groups)}")
    shared = [p for name, params in groups.items() if name not in optim_groups for p in params]
    if not optim_groups:
        return instantiate(optim)(shared)
    optimizers = {"default": instantiate(optim)(shared)} if shared else {}
    optimizers.update({name: instantiate(conf)(groups[name]) for name, conf in optim_groups.items()})
    return Optimizers(optimizers)

"""Gradient estimators (DESIGN.md §5): how gradients cross the argmax. Each is written once, against the
structure interface, so that it works unchanged on every structure."""

from latentstruct.estimators.base import Estimator, loss_gradient, surrogate
from latentstruct.estimators.direct import Direct
from latentstruct.estimators.exact import Exact, expected_loss
from latentstruct.estimators.perturbation import Blackbox, Imle, Perturbed, sum_of_gamma_like
from latentstruct.estimators.relaxed import GumbelSoftmax, Marginals, NeuralSort, Sparsemap
from latentstruct.estimators.stochastic import PerturbAndMap, Ppo, Sfe, StGumbel, ppo_loss, ppo_update, reinforce_loss
from latentstruct.estimators.surrogate import PulledBack, Spigot, SpigotCe, SpigotEg, SteI, SteS

__all__ = [
    "Estimator",
    "PulledBack",
    "loss_gradient",
    "surrogate",
    "Marginals",
    "Sparsemap",
    "GumbelSoftmax",
    "NeuralSort",
    "StGumbel",
    "PerturbAndMap",
    "Sfe",
    "Ppo",
    "reinforce_loss",
    "ppo_loss",
    "ppo_update",
    "SteI",
    "SteS",
    "Spigot",
    "SpigotCe",
    "SpigotEg",
    "Direct",
    "Exact",
    "expected_loss",
    "Blackbox",
    "Imle",
    "Perturbed",
    "sum_of_gamma_like",
]

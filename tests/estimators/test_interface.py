"""What a task may ask of an estimator (docs/architecture.md, "Estimators (contract)"): defaults on the base class,
overridden by the estimators concerned, and no task that asks for a class instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import latentstruct.estimators as E
from latentstruct.estimators.base import Estimator, Tempered

TASKS = Path(E.__file__).resolve().parents[1] / "tasks"
FLAGS = ("takes_sigma", "takes_target", "wants_loss_vector", "enumerates", "policy_gradient")


def _classes() -> list[type]:
    return [c for c in vars(E).values() if isinstance(c, type) and issubclass(c, Estimator)]


def test_the_base_class_gives_every_member_a_default():
    base = Estimator()
    assert base.temperature is None and base.behaviour_refresh is None
    assert not any(getattr(base, flag) for flag in FLAGS)
    with pytest.raises(ValueError, match="no temperature"):
        base.temperature = 1.0


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_estimator_answers_the_interface(cls):
    for flag in FLAGS:
        assert isinstance(getattr(cls, flag), bool), flag
    est = cls(baseline="none") if cls is E.Ppo else cls()
    assert est.behaviour_refresh is None or est.behaviour_refresh >= 1
    assert est.temperature is None or est.temperature > 0 or cls is E.Direct


def test_the_overrides():
    direct = E.Direct(epsilon=-2.0)
    assert (direct.takes_sigma, direct.takes_target, direct.wants_loss_vector) == (True, True, True)
    assert direct.temperature == 2.0
    direct.temperature = 0.5  # a schedule sets |ε|, towards best
    assert direct.epsilon == -0.5
    gsm = E.GumbelSoftmax(tau=3.0)
    assert isinstance(gsm, Tempered) and gsm.temperature == 3.0
    gsm.temperature = 0.25
    assert gsm.tau == 0.25
    assert E.Exact.enumerates and not E.Spigot.enumerates
    assert E.Sfe.policy_gradient and E.Ppo.policy_gradient and not E.StGumbel.policy_gradient
    assert E.Ppo(refresh=7).behaviour_refresh == 7 and E.Sfe().behaviour_refresh is None


def test_no_task_names_an_estimator_class():
    """No task names an estimator class; the base class ``Estimator`` only as the kind of its estimator part
    (``Annotated[Any, Part(Estimator)]``: what the configuration check refuses a non-estimator with)."""
    names = {c.__name__ for c in _classes()} - {"Estimator"}
    for path in sorted(TASKS.glob("*.py")):
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & names, f"{path.name} names {sorted(used & names)}: ask the estimator's interface instead"
        kinds = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Part"
                 for a in n.args}
        base = [n.lineno for n in ast.walk(tree)
                if isinstance(n, ast.Name) and n.id == "Estimator" and id(n) not in kinds]
        assert not base, f"{path.name} uses the base class Estimator outside a Part(...) kind, lines {base}"


def test_a_schedule_anneals_a_positive_temperature_only():
    from latentstruct.tasks.vae import anneal_start

    assert anneal_start(E.Direct(epsilon=-0.5)) == 0.5 and anneal_start(E.Spigot()) is None
    with pytest.raises(ValueError, match="epsilon must be negative"):
        anneal_start(E.Direct(epsilon=0.5))  # away from best: the VAE's step goes towards the best code

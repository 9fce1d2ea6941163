"""The allowed values of numeric settings, declared with the setting, in its signature::

    def __init__(self, eta: Annotated[float, Positive] = 1.0, steps: Annotated[int, AtLeast(1)] = 1): ...

``Annotated`` leaves the type a plain one (the config schema, :func:`latentstruct.config.schema`, gives OmegaConf
``float`` and ``int``) and carries the range, which the schema keeps in the field's metadata (``"range"``).
:func:`latentstruct.config.validate` refuses a composed value outside it, naming the key, the value and the range,
before any data is read; ``docs/configs.md`` shows it. None (an optional setting's null) is always allowed; a list
is checked item by item. The dataclass settings of ``latentstruct.config`` (``trainer``, ``optim``...) put a range in
their field's metadata directly.

A task's model parts are declared the same way, as parameters of its ``build`` annotated with :class:`Part`::

    def build(cls, dims, extras, encoder: Annotated[Any, Part(BiLSTMEncoder)], ...): ...

Such a parameter is a node under the task (``task.encoder``), chosen by the config group of its name
(``encoder=bilstm``, ``configs/encoder/``), whose ``_target_`` must build one of the classes the ``Part`` names.

This module imports nothing of latentstruct, so that any module may declare its ranges with it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Part", "part_of", "Constraint", "Range", "NonZero", "Above", "AtLeast", "Between", "Positive",
           "NonNegative", "Probability", "constraint_of"]


class Constraint:
    """What a numeric setting allows: ``value in constraint``; ``str(constraint)`` says it (``> 0``)."""

    def __contains__(self, value: object) -> bool:
        raise NotImplementedError


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Range(Constraint):
    """``lo < value`` (``lo_open``) or ``lo <= value``, and likewise below ``hi``; a bound of None: none. NaN is
    in no range."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, value: object) -> bool:
        if not _number(value):
            return False
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return above and below

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_show(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_show(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_show(self.lo)}, {_show(self.hi)}{')' if self.hi_open else ']'}"


@dataclass(frozen=True)
class NonZero(Constraint):
    """Any number but 0 (a signed step such as direct loss's ε)."""

    def __contains__(self, value: object) -> bool:
        return _number(value) and value == value and value != 0  # NaN: no

    def __str__(self) -> str:
        return "!= 0"


def Above(lo: float) -> Range:
    """``> lo``."""
    return Range(lo=lo, lo_open=True)


def AtLeast(lo: float) -> Range:
    """``>= lo``."""
    return Range(lo=lo)


def Between(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Range:
    """``in [lo, hi]``, an end excluded by ``lo_open`` / ``hi_open``."""
    return Range(lo, hi, lo_open, hi_open)


Positive = Above(0)
NonNegative = AtLeast(0)
Probability = Between(0, 1)


def constraint_of(annotation: object) -> Constraint | None:
    """The constraint an annotation carries (``Annotated[float, Positive]``, also inside ``Optional[...]``); None."""
    for extra in getattr(annotation, "__metadata__", ()):
        if isinstance(extra, Constraint):
            return extra
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and arg is type(None):
            continue
        found = constraint_of(arg)
        if found is not None:
            return found
    return None


class Part:
    """The annotation of a task's model part (module docstring): a node under the task built by an option of the
    config group of the parameter's name; ``kinds``, the classes its option may build (none: any)."""

    def __init__(self, *kinds: type):
        self.kinds = kinds

    def fits(self, cls: object) -> bool:
        """Whether an option that builds ``cls`` (a class, or a function) may fill this part."""
        return not self.kinds or (isinstance(cls, type) and issubclass(cls, self.kinds))

    def __str__(self) -> str:
        return " or ".join(k.__name__ for k in self.kinds) or "any"

    def __repr__(self) -> str:
        return f"Part({', '.join(k.__name__ for k in self.kinds)})"


def part_of(annotation: object) -> Part | None:
    """The :class:`Part` an annotation carries (``Annotated[Any, Part(...)]``); None for a setting."""
    for extra in getattr(annotation, "__metadata__", ()):
        if isinstance(extra, Part):
            return extra
    return None

"""What stops a training run early, cleanly: a stop signal (:class:`StopSignals`) and a non-finite value
(:class:`NonFinite`), both used by ``train.py``'s loop.

**Signals.** While the loop runs, SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 (SLURM's warning before a time limit or a
preemption, ``--signal``; submitit's preemption signal) do not kill the process: the handler only notes the signal,
and the loop, at its next step boundary, saves a checkpoint at that step, writes ``status: interrupted`` and raises
:class:`Interrupted`. ``python -m latentstruct.train`` then exits with 128 + the signal's number, after handing the
signal to the handler that was there before (submitit's, which requeues the job). A second signal while the first
is being handled stops at once (``KeyboardInterrupt``): the last checkpoint is what is left.

**Non-finite values.** The loop checks the loss and the gradients' total norm each step (on CUDA: a flag kept on
the device, read every ``trainer.log_every`` steps, so no step waits for the host). When it finds one, or when a
step raises, :func:`diagnose` names the first culprit — an input of the batch, a parameter, the output of a module
(re-running the batch's forward with hooks), the loss, a gradient — and the run fails with one line
(``status: failed``, ``reason: non_finite``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["STOP_SIGNALS", "StopSignals", "Interrupted", "NonFinite", "diagnose", "first_nonfinite"]

#: the signals that stop a run at its next step, with a checkpoint
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
                     if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """A run stopped by ``signum`` after ``step`` steps, its checkpoint saved; ``previous`` is the handler the signal
    had before the run (submitit's requeue, or None). A KeyboardInterrupt, so a sweep stops too."""

    def __init__(self, signum: int, step: int, previous: Any = None):
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step:,}")
        self.signum, self.step, self.previous = signum, step, previous

    def __reduce__(self):  # pickled (a sweep's worker process) without the handler, which is this process's
        return type(self), (self.signum, self.step)

    def hand_on(self) -> None:
        """Call the handler the signal had before the run, when it was a function of some program (submitit's
        checkpoint-and-requeue, which exits); the default handlers and Python's own SIGINT handler are skipped."""
        if callable(self.previous) and self.previous is not signal.default_int_handler:
            self.previous(self.signum, None)


class StopSignals(contextlib.AbstractContextManager):
    """Within the ``with`` block the stop signals are noted (``.signum``: the first one, else None) instead of
    killing the process; the handlers before are put back on leaving it, and a signal noted but not acted on (the
    run was skipped, or it had finished) is then raised again, for them. Outside the main thread, where Python cannot
    set handlers, it does nothing."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}
        self._acted = False

    def _note(self, signum: int, frame) -> None:
        if self.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt(f"a second signal ({signal.Signals(signum).name}) while stopping")
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._note) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if self.signum is not None and not self._acted and self.previous:
            signal.raise_signal(self.signum)

    def interrupted(self, step: int) -> Interrupted:
        """The exception the loop raises once it has saved its checkpoint after the signal."""
        self._acted = True
        return Interrupted(self.signum, step, self.previous.get(self.signum))


class NonFinite(FloatingPointError):
    """A NaN or infinity at ``step`` in ``tensor`` (what it is, e.g. ``the gradient of encoder.weight``)."""

    def __init__(self, step: int, tensor: str, where: str = ""):
        super().__init__(f"non-finite value at step {step:,}: {tensor}{f' ({where})' if where else ''}")
        self.step, self.tensor, self.where = step, tensor, where

    def __reduce__(self):  # a sweep's failed job comes back to the launcher pickled (joblib's worker processes)
        return type(self), (self.step, self.tensor, self.where)


def _describe(t: torch.Tensor) -> str:
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    kinds = [f"{nan:,} NaN" if nan else "", f"{inf:,} inf" if inf else ""]
    return f"{' and '.join(k for k in kinds if k)} of {t.numel():,} values"


def first_nonfinite(named: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]],
                    nan_only: bool = False) -> tuple[str, str] | None:
    """The first ``(name, description)`` of the floating-point tensors given whose values are not all finite (not
    all non-NaN with ``nan_only``), else None."""
    items = named.items() if isinstance(named, Mapping) else named
    for name, t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            bad = torch.isnan(t) if nan_only else ~torch.isfinite(t)
            if bool(bad.any()):
                return name, _describe(t)
    return None


def _first_nan_output(model: nn.Module, run) -> tuple[str, str] | None:
    """Run ``run()`` with forward hooks on every submodule of ``model``; the first module (in the order they
    finished) whose output holds a NaN. -inf and inf are legitimate outputs (masks), NaN never is."""
    found: list[tuple[str, str]] = []

    def hook(name):
        def check(module, args, output):
            if found:
                return
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            hit = first_nonfinite(((f"output of {name} ({type(module).__name__})", o) for o in outputs),
                                  nan_only=True)
            if hit:
                found.append(hit)
        return check

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules() if name]
    try:
        with torch.no_grad():
            run()
    except Exception:  # the forward may fail again (that is how we got here): what the hooks saw is the answer
        pass
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def diagnose(step: int, model: nn.Module, batch: Mapping[str, torch.Tensor], loss: torch.Tensor | None = None,
             forward=None) -> NonFinite | None:
    """The first non-finite value behind a failed step, as a :class:`NonFinite`, or None if none is found.

    Looked for in order: the batch's floating-point inputs, the parameters, the outputs of the modules during a
    re-run of ``forward()`` (NaN only), the loss, the gradients."""
    hit = first_nonfinite((f"input {k!r} of the batch", v) for k, v in batch.items())
    if hit is None:
        hit = first_nonfinite((f"parameter {n}", p.detach()) for n, p in model.named_parameters())
    if hit is None and forward is not None:
        hit = _first_nan_output(model, forward)
    if hit is None and loss is not None:
        hit = first_nonfinite({"the loss": loss.detach()})
    if hit is None:
        hit = first_nonfinite((f"the gradient of {n}", p.grad) for n, p in model.named_parameters()
                              if p.grad is not None)
    return NonFinite(step, *hit) if hit else None

"""What a person sees of a training run while it runs (``train.py``'s loop): a bar on a terminal, else log lines.

With ``trainer.progress`` and stderr a terminal, a tqdm bar shows the steps, the epoch (and phase), the loss since the
last evaluation, that evaluation's ``valid/acc`` and the recent speed, beside tqdm's own elapsed time and ETA.
Otherwise (output redirected to a file, a sweep's jobs, SLURM, or ``trainer.progress=false``) nothing is drawn, so
no bar frames end up in a log: a line goes to the ``latentstruct`` logger at most every ``trainer.log_seconds``. Every
evaluation is a line in both cases. Under ``python -m latentstruct.train`` Hydra's logging sends these lines to the
console and to the run directory's ``train.log``; a program that calls ``train()`` itself configures logging as it
likes (nothing shows without it). Quieter: ``trainer.log_seconds=null`` logs the evaluations only, and
``hydra/job_logging=disabled`` nothing at all (nor a ``train.log``).

The speed is seconds per 100 training steps over the last :data:`WINDOW_SECONDS` of training (evaluations excluded),
so a run that slows down shows it; the ETA of a line is the remaining steps at that speed plus the remaining
evaluations at the mean time of those done in this process.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from latentstruct.records import MACHINE_COLUMNS

__all__ = ["Progress", "status", "WINDOW_SECONDS"]

log = logging.getLogger("latentstruct")

#: the recent speed is measured over this many seconds of training
WINDOW_SECONDS = 60.0
# The bar's fields are refreshed at most this often: reading the loss waits for the device.
_BAR_SECONDS = 1.0


def _number(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def status(
    where: str | None,
    loss: float | None,
    last: tuple[int, float] | None,
    seconds_per_step: float | None,
    *,
    step: int | None = None,
    total: int | None = None,
    elapsed: float | None = None,
    eta: float | None = None,
) -> str:
    """The fields of a progress line, joined by `` · ``: ``step 150/300`` (when given), ``where`` (the epoch),
    ``loss`` (the mean training loss since the last evaluation), ``valid/acc`` of the ``last`` evaluation
    ``(step, value)`` with its step, the speed in seconds per 100 steps, then ``elapsed`` and ``ETA`` when given.
    An unknown field (no evaluation yet, no speed measured yet) is left out."""
    fields = [f"step {step:,}/{total:,}"] if step is not None else []
    if where is not None:
        fields.append(where)
    if loss is not None:
        fields.append(f"loss {loss:.4g}")
    if last is not None:
        fields.append(f"valid/acc {last[1]:.2f} (step {last[0]:,})")
    if seconds_per_step is not None:
        fields.append(f"{100 * seconds_per_step:.3g} s/100 steps")
    if elapsed is not None:
        fields.append(f"elapsed {tqdm.format_interval(elapsed)}")
    if eta is not None:
        fields.append(f"ETA {tqdm.format_interval(eta)}")
    return " · ".join(fields)


class Progress(contextlib.AbstractContextManager):
    """The progress of one run, told :meth:`step` after every training step and :meth:`pause` /
    :meth:`evaluated` around every evaluation; a context manager that closes the bar and, while the bar is drawn,
    prints log lines above it (``tqdm.contrib.logging``) rather than through it.

    Args:
        total: the run's last step.
        step: the step it starts from (resuming: the checkpoint's).
        where: ``where(step)`` → the epoch (and phase) after ``step`` steps, e.g. ``epoch 1.4/2``.
        evaluations: the steps after which the run evaluates, all of them (those done before a resumption too).
        bar: draw a bar (else log a line at most every ``log_seconds``).
        log_seconds: without a bar, the most seconds between two lines; None: a line at evaluations only.
        elapsed: seconds the run took before this process (resuming).
        desc: the bar's label.
    """

    def __init__(
        self,
        total: int,
        step: int,
        where: Callable[[int], str],
        evaluations: Sequence[int],
        bar: bool,
        log_seconds: float | None,
        elapsed: float = 0.0,
        desc: str | None = None,
    ):
        self.total, self.where, self.evaluations, self.log_seconds = total, where, list(evaluations), log_seconds
        self.bar = tqdm(total=total, initial=step, disable=not bar, desc=desc, dynamic_ncols=True)
        self._redirect = logging_redirect_tqdm(tqdm_class=tqdm) if bar else contextlib.nullcontext()
        self.start, self.before = time.perf_counter(), elapsed
        self.paused_since, self.paused = None, 0.0  # evaluation time, kept out of the speed
        self.eval_seconds, self.eval_count = 0.0, 0  # the evaluations of this process
        self.samples = collections.deque([(0.0, step)])  # (training seconds, step) over the recent window
        self.last: tuple[int, float] | None = None  # the last evaluation's (step, valid/acc)
        self.shown = self.start  # when a line was last logged or the bar's fields last set

    def __enter__(self) -> Progress:
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
        self._redirect.__exit__(*exc)

    # ------------------------------------------------------------------------------------------------- measures
    def seconds_per_step(self) -> float | None:
        """Training seconds per step over the recent window (None before a step is timed)."""
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def elapsed(self) -> float:
        """Seconds since the run started, evaluations included (and the time before a resumption)."""
        return self.before + time.perf_counter() - self.start

    def eta(self, step: int) -> float | None:
        """The remaining steps at the recent speed, plus the remaining evaluations at their mean time so far."""
        rate = self.seconds_per_step()
        if rate is None:
            return None
        left = len(self.evaluations) - bisect.bisect_right(self.evaluations, step)
        return (self.total - step) * rate + (left * self.eval_seconds / self.eval_count if self.eval_count else 0.0)

    def line(self, step: int, loss: float | None) -> str:
        """The periodic line: :func:`status` with the step, elapsed time and ETA."""
        return status(
            self.where(step),
            loss,
            self.last,
            self.seconds_per_step(),
            step=step,
            total=self.total,
            elapsed=self.elapsed(),
            eta=self.eta(step),
        )

    # --------------------------------------------------------------------------------------------- the loop's calls
    def step(self, step: int, loss: Callable[[], float | None]) -> None:
        """After training step ``step``; ``loss()`` reads the mean loss since the last evaluation (a device sync,
        so it is called only when a line or the bar's fields are due)."""
        self.bar.update(1)
        now = time.perf_counter()
        self.samples.append((now - self.start - self.paused, step))
        while len(self.samples) > 2 and self.samples[-1][0] - self.samples[1][0] >= WINDOW_SECONDS:
            self.samples.popleft()
        if self.bar.disable:
            if self.log_seconds is not None and now - self.shown >= self.log_seconds:
                log.info(self.line(step, loss()))
                self.shown = now
        elif now - self.shown >= _BAR_SECONDS:
            self.bar.set_postfix_str(
                status(self.where(step), loss(), self.last, self.seconds_per_step()), refresh=False
            )
            self.shown = now

    def pause(self) -> None:
        """An evaluation starts: its time is not training time."""
        self.paused_since = time.perf_counter()

    def evaluated(self, row: dict[str, Any]) -> None:
        """The evaluation since :meth:`pause` gave ``row`` (a history row: step, epoch, train/loss, the split
        metrics, the machine's columns): log its line and show its ``valid/acc``."""
        now = time.perf_counter()
        seconds = now - self.paused_since
        self.paused += seconds
        self.eval_seconds += seconds
        self.eval_count += 1
        step = row["step"]
        if "valid/acc" in row:
            self.last = (step, row["valid/acc"])
        index = bisect.bisect_left(self.evaluations, step) + 1
        shown = (k for k in row if k not in ("step", "epoch", *MACHINE_COLUMNS))
        metrics = " · ".join(f"{k} {_number(row[k])}" for k in shown)
        log.info(
            "evaluation %d/%d at step %s/%s · %s · %s · %s",
            index,
            len(self.evaluations),
            f"{step:,}",
            f"{self.total:,}",
            self.where(step),
            metrics,
            status(None, None, None, self.seconds_per_step(), elapsed=self.elapsed(), eta=self.eta(step)),
        )
        if not self.bar.disable:
            self.bar.set_postfix_str(
                status(self.where(step), row.get("train/loss"), self.last, self.seconds_per_step())
            )
        self.shown = now

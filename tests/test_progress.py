"""The progress a person sees (latentstruct/progress.py): the fields of the lines, when lines are logged, the recent
speed and the ETA, all on a fake clock (no timed assertions)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import latentstruct.progress as progress_module
from latentstruct.progress import WINDOW_SECONDS, Progress, status


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves only when told: ``clock.now += seconds``."""
    fake = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(perf_counter=lambda: fake.now))
    return fake


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger="latentstruct")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "latentstruct"]


def _where(step: int) -> str:
    return f"epoch {step / 100:.1f}/3"


def _train(progress: Progress, clock, steps: range, seconds: float, loss: float = 0.5) -> None:
    for step in steps:
        clock.now += seconds
        progress.step(step, lambda: loss)


def test_status_fields_and_unknown_fields_left_out():
    assert status("epoch 1.4/2", 0.71234, (100, 52.0), 0.137, step=140, total=200, elapsed=65.0, eta=3725.0) == (
        "step 140/200 · epoch 1.4/2 · loss 0.7123 · valid/acc 52.00 (step 100) · 13.7 s/100 steps · elapsed 01:05 · "
        "ETA 1:02:05"
    )
    assert status("epoch 0.0/2", None, None, None, step=0, total=1_200) == "step 0/1,200 · epoch 0.0/2"


def test_a_line_at_most_every_log_seconds_and_at_every_evaluation(clock, lines):
    with Progress(300, 0, _where, [100, 200, 300], bar=False, log_seconds=30) as progress:
        _train(progress, clock, range(1, 101), 0.25)  # 25 s: no line yet
        assert lines() == []
        progress.pause()
        clock.now += 5.0  # the evaluation takes 5 s
        progress.evaluated(
            {"step": 100, "epoch": 1.0, "train/loss": 0.5, "valid/acc": 52.0, "test/acc": 51.0, "wall_seconds": 30.0}
        )
        # ETA: 200 steps × 0.25 s + 2 evaluations × 5 s
        assert lines() == [
            "evaluation 1/3 at step 100/300 · epoch 1.0/3 · train/loss 0.5 · valid/acc 52 · "
            "test/acc 51 · 25 s/100 steps · elapsed 00:30 · ETA 01:00"
        ]
        _train(progress, clock, range(101, 251), 0.25)  # a line 30 s after the evaluation, at step 220
    # ETA: 80 steps × 0.25 s + 1 evaluation × 5 s
    assert lines()[1:] == [
        "step 220/300 · epoch 2.2/3 · loss 0.5 · valid/acc 52.00 (step 100) · 25 s/100 steps · "
        "elapsed 01:00 · ETA 00:25"
    ]


def test_without_log_seconds_only_evaluations_are_logged(clock, lines):
    with Progress(300, 0, _where, [300], bar=False, log_seconds=None) as progress:
        _train(progress, clock, range(1, 300), 10.0)
        assert lines() == []
        _train(progress, clock, range(300, 301), 10.0)
        progress.pause()
        progress.evaluated({"step": 300, "epoch": 3.0, "train/loss": 0.5, "valid/acc": 60.0})
    assert [line.split(" · ")[0] for line in lines()] == ["evaluation 1/1 at step 300/300"]


def test_the_speed_is_recent_so_a_slowdown_shows(clock, lines):
    """Steps slow from 0.125 s to 0.375 s: once a window of slow steps has passed, the speed and the ETA are
    theirs."""
    total = 2_000
    with Progress(total, 0, _where, [total], bar=False, log_seconds=None) as progress:
        _train(progress, clock, range(1, 1001), 0.125)
        assert progress.seconds_per_step() == 0.125
        slow = int(WINDOW_SECONDS / 0.375) + 2
        _train(progress, clock, range(1001, 1001 + slow), 0.375)
        assert progress.seconds_per_step() == 0.375
        assert progress.eta(1000 + slow) == (total - 1000 - slow) * 0.375


def test_resuming_counts_the_earlier_time_and_evaluations(clock, lines):
    with Progress(300, 200, _where, [100, 200, 300], bar=False, log_seconds=None, elapsed=100.0) as progress:
        _train(progress, clock, range(201, 301), 0.125)
        progress.pause()
        progress.evaluated({"step": 300, "epoch": 3.0, "train/loss": 0.5, "valid/acc": 60.0})
    assert lines()[0].startswith("evaluation 3/3 at step 300/300 · epoch 3.0/3")
    assert lines()[0].endswith("12.5 s/100 steps · elapsed 01:52 · ETA 00:00")


def test_the_bar_shows_the_epoch_and_the_last_evaluation(clock, capsys):
    with Progress(200, 0, _where, [100, 200], bar=True, log_seconds=30, desc="run") as progress:
        _train(progress, clock, range(1, 101), 0.125)
        progress.pause()
        progress.evaluated({"step": 100, "epoch": 1.0, "train/loss": 0.25, "valid/acc": 52.0})
    bar = capsys.readouterr().err.split("\r")[-1]
    assert bar.startswith("run:  50%")
    assert "epoch 1.0/3 · loss 0.25 · valid/acc 52.00 (step 100) · 12.5 s/100 steps" in bar

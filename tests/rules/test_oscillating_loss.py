"""Golden tests for OscillatingLoss."""

from __future__ import annotations

from rulejobs import LONG, config_error, long_run, losses, make, run, state_bytes
from trainguard.rules.base import StepData


def test_zigzag_fires_once_share_reached() -> None:
    # decreasing smoothly for 10 evaluations, then zig-zagging by 0.1: every change a swing
    vals = [2.0 - 0.05 * i for i in range(11)] + [1.5 + (0.1 if i % 2 == 0 else 0.0) for i in range(10)]
    out = run(make("OscillatingLoss"), losses(enumerate(vals)))
    # evaluations 1..10 are smooth; every change from index 11 on reverses the previous one
    # (11 goes up after the descent): 3 swings of 13 evaluations = 23% at index 13
    assert out.fired_at == 13
    assert out.finding.value >= 20.0 and out.finding.threshold == 20.0


def test_fast_steady_decrease_is_not_a_swing() -> None:
    vals = [10.0 - 0.5 * i for i in range(30)]
    assert run(make("OscillatingLoss"), losses(enumerate(vals))).fired_at is None


def test_small_noise_below_swing() -> None:
    vals = [1.0 + (0.01 if i % 2 else 0.0) for i in range(40)]
    assert run(make("OscillatingLoss"), losses(enumerate(vals))).fired_at is None
    assert run(make("OscillatingLoss", swing="0.005"), losses(enumerate(vals))).fired_at == 10


def test_mode_and_window() -> None:
    vals = [1.0 + (0.1 if i % 2 else 0.0) for i in range(20)]
    assert run(make("OscillatingLoss"), losses(enumerate(vals), mode="EVAL")).fired_at is None
    assert run(make("OscillatingLoss", mode="EVAL"), losses(enumerate(vals), mode="EVAL")).fired_at == 10


def test_parameters() -> None:
    c = make("OscillatingLoss", swing="0.1", swing_percent="30", window="20", min_evaluations="5").config
    assert (c.swing, c.swing_percent, c.window, c.min_evaluations) == (0.1, 30.0, 20, 5)
    assert "window" in config_error("OscillatingLoss", window="1")
    assert "swing_percent" in config_error("OscillatingLoss", swing_percent="200")


def test_state_bounded() -> None:
    rule = make("OscillatingLoss", swing_percent="100")
    up, down = losses([(0, 1.0), (1, 0.0)])
    state, _ = long_run(rule, (StepData(s, (up if s % 2 else down).workers) for s in range(LONG)))
    assert len(state.recent) == 50 and state_bytes(rule, state) < 300

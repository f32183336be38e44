"""Golden tests for OscillatingLoss: a smoothed loss, swings from extreme to extreme."""

from __future__ import annotations

import numpy as np
from lossfixtures import HEALTHY, fault_job, healthy_job
from rulejobs import LONG, M, config_error, header, long_run, losses, make, run, state_bytes
from trainguard.rules.base import StepData


def square_wave(steps: int, period: int, amplitude: float, noise: float = 0.0, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    vals = [
        1.0 + (amplitude if (t // (period // 2)) % 2 else 0.0) + rng.normal(0, noise) for t in range(steps)
    ]
    return losses(list(enumerate(vals)))


def test_slow_oscillation_fires() -> None:
    # up and down by 0.3 every 20 training steps: blocks of 10 turn every 2 evaluations (50%)
    out = run(make("OscillatingLoss"), square_wave(300, 40, 0.3, noise=0.02))
    assert out.fired_at is not None and out.finding.value >= 20.0 and out.finding.threshold == 20.0
    assert "10 training steps" in out.finding.message


def test_mini_batch_zigzag_is_smoothed_away() -> None:
    # the loss alternates by 0.1 every step (mini-batch noise): block means are flat
    zigzag = square_wave(300, 2, 0.1)
    assert run(make("OscillatingLoss"), zigzag).fired_at is None
    # judged on every step with AUTOTRAINER's absolute swing, it fires; scale-free, the zigzag
    # is the loss's own noise and makes no swing
    assert run(make("OscillatingLoss", smoothing_steps="1", swing="0.03"), zigzag).fired_at is not None
    assert run(make("OscillatingLoss", smoothing_steps="1"), zigzag).fired_at is None


def test_noisy_healthy_decrease_never_fires() -> None:
    for seed in range(5):
        rng = np.random.default_rng(seed)
        vals = [(2.0 / (1 + 0.03 * t)) * (1 + rng.normal(0, 0.05)) for t in range(400)]
        assert run(make("OscillatingLoss"), losses(list(enumerate(vals)))).fired_at is None, seed


def test_fast_steady_decrease_is_not_a_swing() -> None:
    vals = [10.0 - 0.02 * i for i in range(300)]
    assert run(make("OscillatingLoss"), losses(list(enumerate(vals)))).fired_at is None


def test_small_swings_below_swing() -> None:
    small = square_wave(300, 40, 0.02)
    assert run(make("OscillatingLoss"), small).fired_at is None
    assert run(make("OscillatingLoss", swing="0.01"), small).fired_at is not None


def test_eval_mode_judges_validation_passes() -> None:
    # 20 evaluations of 3 EVAL batches each, alternating 1.0 / 1.2 per pass
    steps, g = [], 0
    for i in range(20):
        for t in range(10):
            steps.append(StepData.from_headers([header(g, {"TRAIN": M(10 * i + t, {"loss": 1.0})})]))
            g += 1
        for _ in range(3):
            steps.append(StepData.from_headers([header(g, {"EVAL": M(g, {"loss": 1.0 + 0.2 * (i % 2)})})]))
            g += 1
    out = run(make("OscillatingLoss", mode="EVAL"), steps)
    assert out.fired_at is not None and "one validation pass" in out.finding.message
    assert run(make("OscillatingLoss"), steps).fired_at is None  # TRAIN is flat


def test_parameters() -> None:
    c = make("OscillatingLoss", swing="0.1", swing_percent="30", window="20", min_evaluations="5").config
    assert (c.swing, c.swing_percent, c.window, c.min_evaluations, c.smoothing_steps) == (
        0.1,
        30.0,
        20,
        5,
        10,
    )
    assert "window" in config_error("OscillatingLoss", window="1")
    assert "swing_percent" in config_error("OscillatingLoss", swing_percent="200")
    assert "smoothing_steps" in config_error("OscillatingLoss", smoothing_steps="0")


def test_state_bounded() -> None:
    rule = make("OscillatingLoss", swing_percent="100", smoothing_steps="1")
    up, down = losses([(0, 1.0), (1, 0.0)])
    state, _ = long_run(rule, (StepData(s, (up if s % 2 else down).workers) for s in range(LONG)))
    # the recent swings and the 32 losses of the noise estimate
    assert len(state.recent) == 50 and state_bytes(rule, state) < 1200


def test_healthy_loss_shapes_do_not_fire() -> None:
    for shape in HEALTHY:
        for seed in range(3):
            for mode in ("TRAIN", "EVAL"):
                out = run(make("OscillatingLoss", mode=mode), healthy_job(shape, seed))
                assert out.fired_at is None, (shape, seed, mode, out.findings)


def test_a_bouncing_loss_is_caught_scale_free() -> None:
    for seed in range(3):
        job = fault_job("oscillating", seed)
        out = run(make("OscillatingLoss"), job)
        assert out.fired_at is not None and "swing_relative" in out.finding.message
        assert out.state.clock.last is not None and out.state.clock.last < 300 + 300  # within 30 evaluations
    # the same job with its loss x1000 fires at the same step: the swing is relative
    scaled = [
        s.__class__.from_headers(
            [
                h.model_copy(
                    update={
                        "modes": {
                            m: r.model_copy(
                                update={
                                    "scalars": {
                                        n: v.model_copy(update={"value": v.value * 1000})
                                        for n, v in r.scalars.items()
                                    }
                                }
                            )
                            for m, r in h.modes.items()
                        }
                    }
                )
                for h in s.workers
            ]
        )
        for s in fault_job("oscillating", 0)
    ]
    assert (
        run(make("OscillatingLoss"), scaled).fired_at
        == run(make("OscillatingLoss"), fault_job("oscillating", 0)).fired_at
    )

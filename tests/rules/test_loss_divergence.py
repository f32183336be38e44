"""LossDivergence: a finite loss that grows by orders of magnitude against its own scale."""

from __future__ import annotations

import math

import numpy as np
from lossfixtures import HEALTHY, healthy_job
from rulejobs import LONG, M, config_error, fast_step, long_run, losses, make, run, state_bytes, step_data
from trainguard.rules.loss_divergence import LossDivergence


def gru_lr_times_1e4() -> list[float]:
    """The character-level GRU of issue 22: 2.9 and falling, then the learning rate x1e4."""
    rng = np.random.default_rng(7)
    healthy = [2.9 * math.exp(-s / 400) * (1 + rng.normal(0, 0.03)) for s in range(120)]
    return [*healthy, 1.4e5, 3.2e9, 8e17, 6e33, math.nan]


def test_the_gru_divergence_is_caught_at_the_jump() -> None:
    out = run(make("LossDivergence"), losses(list(enumerate(gru_lr_times_1e4()))))
    assert out.fired_at == 120 and out.finding.tensor == "TRAIN loss"  # 1.4e5 is 5e4 x its level
    assert "rose to 140000" in out.finding.message and "immediate_factor" in out.finding.message


def test_ten_times_sustained_is_caught_one_step_later() -> None:
    vals = [1.0 + 0.01 * (s % 3) for s in range(50)] + [15.0, 30.0, 60.0]
    out = run(make("LossDivergence"), losses(list(enumerate(vals))))
    assert out.fired_at == 51 and "confirmed" in out.finding.message
    # a NaN after the jump confirms it too
    vals = [1.0 + 0.01 * (s % 3) for s in range(50)] + [15.0, math.nan]
    assert run(make("LossDivergence"), losses(list(enumerate(vals)))).fired_at == 51


def test_one_hard_batch_and_a_restart_are_not_a_divergence() -> None:
    rng = np.random.default_rng(3)
    vals = [1.0 + rng.normal(0, 0.02) for _ in range(200)]
    vals[100] = 40.0  # one batch 40x, not confirmed by the next
    vals[150:] = [3.0 * v for v in vals[150:]]  # a schedule restart: back up 3x
    out = run(make("LossDivergence"), losses(list(enumerate(vals))))
    assert out.fired_at is None and out.state.judged > 150


def test_eval_and_train_are_judged_apart() -> None:
    # EVAL loss 50x the TRAIN loss (a different loss scale): not a jump of either
    steps = [
        step_data(s, train=0.02 + 0.001 * (s % 2), eval=(1.0 if s % 10 == 0 else None)) for s in range(300)
    ]
    out = run(make("LossDivergence"), steps)
    assert out.fired_at is None and set(out.state.tracks) == {"TRAIN", "EVAL"}


def test_healthy_loss_shapes_do_not_fire() -> None:
    for shape in HEALTHY:
        for seed in range(3):
            out = run(make("LossDivergence"), healthy_job(shape, seed))
            assert out.fired_at is None, (shape, seed, out.findings)


def test_a_near_zero_loss_with_spikes_is_judged_on_its_own_scale() -> None:
    # a memorised training set: batch losses log-normal around 1e-4 (a hard batch is 10-50x)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        vals = [2.0 * math.exp(-s / 5) + 1e-4 * math.exp(rng.normal(0, 1)) for s in range(3000)]
        assert run(make("LossDivergence"), losses(list(enumerate(vals)))).fired_at is None, seed


def test_parameters_and_state() -> None:
    assert "factor" in config_error("LossDivergence", factor="1")
    assert "window" in config_error("LossDivergence", window="4")
    d = LossDivergence.Config()
    assert (d.factor, d.immediate_factor, d.window, d.mode) == (10.0, 1000.0, 32, None)
    rule = make("LossDivergence")
    steps = (fast_step(s, {"TRAIN": M(s, {"loss": 1.0 + (s % 7) * 0.01})}) for s in range(LONG))
    state, fired = long_run(rule, steps)
    assert fired is None and state_bytes(rule, state) < 2048


def test_the_divergence_fixture_is_caught_within_a_step() -> None:
    from lossfixtures import FAULTS, fault_job

    for seed in range(3):
        out = run(make("LossDivergence"), fault_job("diverging", seed))
        assert out.fired_at is not None and out.finding.tensor == "TRAIN loss"
        # global steps count EVAL batches too: the jump's training step is FAULTS["diverging"]
        step = out.state.tracks["TRAIN"].noise.seen
        assert step == FAULTS["diverging"], (seed, step)

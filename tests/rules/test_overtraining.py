"""Golden tests for Overtraining: validation evaluations by default, relative delta."""

from __future__ import annotations

import math

import numpy as np
from lossfixtures import fault_job, healthy_job
from rulejobs import LONG, SHORT, M, config_error, header, long_run, make, repeat, run, state_bytes, step_data
from trainguard.rules.base import StepData


def evaluations(vals: list[float], train_steps: int = 20, batches: int = 3) -> list[StepData]:
    """Each evaluation: ``train_steps`` TRAIN steps, then ``batches`` EVAL steps at loss ``val``."""
    steps, g, t, e = [], 0, 0, 0
    for val in vals:
        for _ in range(train_steps):
            steps.append(StepData.from_headers([header(g, {"TRAIN": M(t, {"loss": 1.0 / (1 + t)})})]))
            g, t = g + 1, t + 1
        for _ in range(batches):
            steps.append(StepData.from_headers([header(g, {"EVAL": M(e, {"loss": val})})]))
            g, e = g + 1, e + 1
    steps.append(StepData.from_headers([header(g, {"TRAIN": M(t, {"loss": 0.01})})]))
    return steps


def test_validation_plateau_fires_after_patience_validation_evaluations() -> None:
    vals = [1.0, 0.8, 0.7] + [0.699] * 10  # 0.1% better than the best: not 1%
    relative = make("Overtraining", delta_percent="1")
    out = run(relative, evaluations(vals))
    assert out.fired_at is not None and out.state.stale_validation == 10
    assert "patience_validation=10" in out.finding.message and "delta_percent=1%" in out.finding.message
    assert run(relative, evaluations([1.0, 0.8, 0.7] + [0.699] * 9)).fired_at is None


def test_evaluations_not_eval_batches_are_counted() -> None:
    # 12 evaluations of 10 batches each: 120 EVAL steps, only 11 evaluations after the best
    vals = [1.0] + [1.0] * 9
    assert run(make("Overtraining"), evaluations(vals, batches=10)).fired_at is None


def test_steadily_improving_validation_never_fires() -> None:
    vals = [1.0 * 0.97**i for i in range(40)]
    assert run(make("Overtraining"), evaluations(vals)).fired_at is None


def test_sagemaker_delta_is_absolute_when_given() -> None:
    vals = [10.0 - 0.04 * i for i in range(15)]  # 0.4% better each evaluation: stale in percent
    assert (
        run(make("Overtraining", patience_validation="2", delta_percent="1"), evaluations(vals)).fired_at
        is not None
    )
    # absolute: 0.04 per evaluation beats delta 0.01; delta 0.1 needs 3 evaluations: stale twice
    lenient, strict = (
        make("Overtraining", delta="0.01", patience_validation="2"),
        make("Overtraining", delta="0.1", patience_validation="2"),
    )
    assert run(lenient, evaluations(vals)).fired_at is None
    assert run(strict, evaluations(vals)).fired_at is not None
    assert "not both" in config_error("Overtraining", delta="0.1", delta_percent="1")


def test_training_loss_is_judged_only_when_patience_train_is_given() -> None:
    # a TRAIN loss flat from step 100, no validation at all
    steps = [step_data(s, train=max(1.0 - 0.01 * s, 0.0) + 0.5) for s in range(300)]
    assert run(make("Overtraining"), steps).fired_at is None  # not judged (and no EVAL: Error at the end)
    out = run(make("Overtraining", patience_train="50"), steps)
    assert out.fired_at is not None and 140 <= out.fired_at <= 200
    assert "training steps" in out.finding.message


def test_noisy_training_loss_with_explicit_patience_is_smoothed() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    steps = [step_data(s, train=(2.0 / (1 + 0.05 * s)) * (1 + rng.normal(0, 0.05))) for s in range(300)]
    assert run(make("Overtraining", patience_train="25"), steps).fired_at is None


def test_nan_never_improves() -> None:
    vals = [1.0, math.nan, math.nan, math.nan]
    out = run(make("Overtraining", patience_validation="3"), evaluations(vals))
    assert out.fired_at is not None


def test_parameters() -> None:
    c = make("Overtraining", patience_train="3", patience_validation="4", delta="0.5").config
    assert (c.patience_train, c.patience_validation, c.delta) == (3, 4, 0.5)
    d = make("Overtraining").config
    assert (d.patience_train, d.patience_validation, d.delta, d.delta_percent) == (None, 10, None, None)
    assert "patience_train" in config_error("Overtraining", patience_train="0")
    assert "delta" in config_error("Overtraining", delta="-1")


def test_state_bounded() -> None:
    rule = make("Overtraining", patience_train="1000000", patience_validation="1000000")
    state, fired = long_run(rule, repeat(step_data(0, train=1.0, eval=2.0), SHORT))
    assert fired is None and state_bytes(rule, state) < 600


def test_noise_aware_improvement() -> None:
    rng = np.random.default_rng(0)
    # a noisy plateau (2% noise): one lucky evaluation is not a new best, and it fires
    plateau = [0.5 * (1 + 0.02 * rng.normal()) for _ in range(40)]
    out = run(make("Overtraining"), evaluations([1.0, 0.8, 0.6, *plateau]))
    assert out.fired_at is not None and "by its noise" in out.finding.message
    # a noisy decline that improves by more than its noise over 10 evaluations never fires
    decline = [1.0 * 0.99**i * (1 + 0.01 * rng.normal()) for i in range(60)]
    assert run(make("Overtraining"), evaluations(decline)).fired_at is None
    # the fixtures: a validation loss still falling is improving; a converged one is overtraining
    assert run(make("Overtraining"), healthy_job("slow_noisy", 0)).fired_at is None
    assert run(make("Overtraining"), healthy_job("converged_plateau", 0)).fired_at is not None
    assert run(make("Overtraining"), fault_job("overfit", 0)).fired_at is not None


def test_noise_aware_state_is_bounded() -> None:
    rule = make("Overtraining", patience_validation="1000000")
    steps = (
        StepData.from_headers(
            [header(s, {"EVAL" if s % 10 == 9 else "TRAIN": M(s, {"loss": 1.0 + 0.01 * (s % 7)})})]
        )
        for s in range(LONG // 10)
    )
    state, fired = long_run(rule, steps)
    assert fired is None and state_bytes(rule, state) < 1200

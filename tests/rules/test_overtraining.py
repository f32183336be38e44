"""Golden tests for Overtraining."""

from __future__ import annotations

from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data


def test_training_loss_plateau_fires_after_patience_train() -> None:
    # improves by >= 0.1 until step 3 (best 0.7), then only by 0.01 per step: stale 1..5
    vals = [1.0, 0.9, 0.8, 0.7, 0.69, 0.68, 0.67, 0.66, 0.65, 0.64]
    out = run(make("Overtraining"), [step_data(s, train=v) for s, v in enumerate(vals)])
    assert out.fired_at == 8
    assert "patience_train=5" in out.finding.message and out.finding.value == 5.0


def test_validation_plateau_needs_patience_validation() -> None:
    steps = [step_data(s, train=10.0 - s, eval=0.5) for s in range(12)]  # train keeps improving by 1
    out = run(make("Overtraining"), steps)
    assert out.fired_at == 10  # 10 EVAL steps without improvement after the first
    assert "validation" in out.finding.message
    assert run(make("Overtraining", patience_validation="20"), steps).fired_at is None


def test_steady_improvement_never_fires() -> None:
    steps = [step_data(s, train=100.0 - s, eval=100.0 - s) for s in range(50)]
    assert run(make("Overtraining"), steps).fired_at is None


def test_delta_and_nan() -> None:
    vals = [1.0, 0.95, 0.92, 0.91]
    steps = [step_data(s, train=v) for s, v in enumerate(vals)]
    assert run(make("Overtraining", patience_train="3", delta="0.01"), steps).fired_at is None
    assert run(make("Overtraining", patience_train="3"), steps).fired_at == 3  # never 0.1 below the best 1.0
    nan = [step_data(0, train=1.0), step_data(1, train=float("nan")), step_data(2, train=0.5)]
    assert run(make("Overtraining", patience_train="2"), nan).fired_at is None  # NaN is stale, 0.5 resets


def test_parameters() -> None:
    c = make("Overtraining", patience_train="3", patience_validation="4", delta="0.5").config
    assert (c.patience_train, c.patience_validation, c.delta) == (3, 4, 0.5)
    assert "patience_train" in config_error("Overtraining", patience_train="0")
    assert "delta" in config_error("Overtraining", delta="-1")


def test_state_bounded() -> None:
    rule = make("Overtraining", patience_train="1000000", patience_validation="1000000")
    state, fired = long_run(rule, repeat(step_data(0, train=1.0, eval=2.0), SHORT))
    assert fired is None and state.stale_train == SHORT - 1 and state_bytes(rule, state) < 300

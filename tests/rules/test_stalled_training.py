"""Golden tests for StalledTrainingRule (pure logic: a timer calls ``check``)."""

from __future__ import annotations

from rulejobs import SHORT, M, config_error, header, make, state_bytes
from trainguard.rules.base import StepData


def at(step: int, wall_time: float) -> StepData:
    return StepData.from_headers([header(step, {"TRAIN": M(None, {"loss": 1.0})}, wall_time=wall_time)])


def test_fires_when_no_data_for_threshold_seconds() -> None:
    rule = make("StalledTrainingRule")
    state = rule.initial_state()
    for s, t in [(0, 1000.0), (10, 1060.0), (20, 1120.0)]:
        state, found = rule.update(state, at(s, t))
        assert not found
    state, found = rule.check(state, 1120.0 + 1800)
    assert not found  # exactly the threshold is not "more than"
    state, found = rule.check(state, 1120.0 + 1801)
    assert found and found[0].step == 20 and found[0].value == 1801.0 and found[0].threshold == 1800.0
    assert "since step 20" in found[0].message


def test_new_data_resets_the_clock_and_out_of_order_is_ignored() -> None:
    rule = make("StalledTrainingRule", threshold="60")
    state = rule.initial_state()
    state, _ = rule.update(state, at(5, 100.0))
    state, _ = rule.update(state, at(3, 50.0))  # an older step arriving late
    assert (state.last_step, state.last_time) == (5, 100.0)
    assert rule.check(state, 150.0)[1] == []
    assert rule.check(state, 161.0)[1]


def test_before_any_step_uses_the_job_start() -> None:
    rule = make("StalledTrainingRule", threshold="600")
    state = rule.initial_state()
    assert rule.check(state, 10_000.0)[1] == []
    _, found = rule.check(state, 10_000.0, started=9_000.0)
    assert found and "since the job started" in found[0].message


def test_parameters() -> None:
    c = make(
        "StalledTrainingRule",
        threshold="120",
        stop_training_on_fire="True",
        training_job_name_prefix="my-job",
    ).config
    assert (c.threshold, c.stop_training_on_fire, c.training_job_name_prefix) == (120, True, "my-job")
    assert make("StalledTrainingRule").kind == "clock"
    assert "threshold" in config_error("StalledTrainingRule", threshold="0")


def test_state_bounded() -> None:
    rule = make("StalledTrainingRule")
    state = rule.initial_state()
    step = at(0, 0.0)
    for s in range(SHORT):
        state, _ = rule.update(state, StepData(s, step.workers, float(s)))
    assert state.last_step == SHORT - 1 and state_bytes(rule, state) < 100

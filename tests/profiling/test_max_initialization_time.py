"""Golden tests: MaxInitializationTime (no step started 20 minutes after the hook started)."""

from __future__ import annotations

from sysbatches import T0, run, series
from trainguard.format.system import InitInfo, SystemBatch
from trainguard.rules.profiler import MaxInitializationTime


def make(**params: str) -> MaxInitializationTime:
    return MaxInitializationTime(MaxInitializationTime.Config.model_validate(params))


def idle_batch(seq: int, end: float, hook_start: float = T0) -> SystemBatch:
    return SystemBatch(
        job="prof-job",
        worker=0,
        world_size=1,
        seq=seq,
        start_time=end - 10,
        end_time=end,
        interval_s=0.5,
        init=InitInfo(hook_start=hook_start),
    )


def test_default_threshold_is_20_minutes() -> None:
    assert MaxInitializationTime.Config().threshold == 20


def test_slow_first_step_fires_when_its_data_arrives() -> None:
    start = T0 + 21 * 60
    batches = [
        idle_batch(0, T0 + 600),
        *series(40, t0=start, init=InitInfo(hook_start=T0, first_step_start=start)),
    ]
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [1]
    assert found[0][1].value is not None and 20.9 < found[0][1].value < 21.01
    assert "first training step started" in found[0][1].message


def test_first_step_within_threshold_does_not_fire() -> None:
    start = T0 + 19 * 60
    batches = [
        idle_batch(0, T0 + 600),
        *series(40, t0=start, init=InitInfo(hook_start=T0, first_step_start=start)),
    ]
    state, found = run(make(), batches)
    assert found == [] and abs(make().notes(state)["initialization_s"] - 19 * 60) < 1.0


def test_batches_without_a_step_fire_past_the_threshold() -> None:
    batches = [idle_batch(i, T0 + 300 * (i + 1)) for i in range(6)]  # ends at 5, 10, ... 30 min
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [4]  # the batch ending at 25 min (20 min is not > 20)
    assert "No training step has started 25 minutes" in found[0][1].message


def test_check_clock_fires_without_new_data() -> None:
    rule = make(threshold="10")
    state, found = rule.update(rule.initial_state(), idle_batch(0, T0 + 60))
    assert found == []
    state2, found = rule.check_clock(state, T0 + 9 * 60)
    assert found == []
    _, found = rule.check_clock(state2, T0 + 11 * 60)
    assert len(found) == 1 and found[0].rule == "MaxInitializationTime"
    assert state.fired is False  # pure: the caller's state is untouched


def test_check_clock_uses_the_job_start_when_no_batch_arrived() -> None:
    rule = make()
    _, found = rule.check_clock(rule.initial_state(), T0 + 30 * 60)
    assert found == []  # nothing known: cannot judge
    _, found = rule.check_clock(rule.initial_state(), T0 + 30 * 60, job_start=T0)
    assert len(found) == 1


def test_earliest_worker_sets_the_start() -> None:
    rule = make()
    late = series(
        10, t0=T0 + 25 * 60, worker=1, init=InitInfo(hook_start=T0 + 24 * 60, first_step_start=T0 + 25 * 60)
    )
    _, found = run(rule, [idle_batch(0, T0 + 60), *late])
    assert found and found[0][1].value is not None and abs(found[0][1].value - 25.0) < 0.01

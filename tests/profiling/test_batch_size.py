"""Golden tests: BatchSize (CPU, GPU and GPU-memory p95 all below 70 %)."""

from __future__ import annotations

from sysbatches import const, run, series
from trainguard.rules.profiler import BatchSize


def make(**params: str) -> BatchSize:
    return BatchSize(BatchSize.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = BatchSize.Config()
    assert (cfg.cpu_threshold_p95, cfg.gpu_threshold_p95, cfg.gpu_memory_threshold_p95) == (70, 70, 70)
    assert (cfg.patience, cfg.window) == (1000, 500)


def test_everything_lightly_used_fires_when_the_first_window_fills() -> None:
    batches = series(2000, cpu=const(20.0), gpu=lambda i: ((30.0, 20.0),))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [74]
    assert found[0][1].step == 1499 and "batch size is probably too small" in found[0][1].message


def test_any_resource_busy_does_not_fire() -> None:
    assert run(make(), series(2000, cpu=const(90.0), gpu=lambda i: ((30.0, 20.0),)))[1] == []
    assert run(make(), series(2000, cpu=const(20.0), gpu=lambda i: ((90.0, 20.0),)))[1] == []
    assert run(make(), series(2000, cpu=const(20.0), gpu=lambda i: ((30.0, 85.0),)))[1] == []


def test_p95_not_mean_is_judged() -> None:
    # GPU mostly at 30 % but > 5 % of the samples at 95 %: p95 above 70, no finding
    batches = series(2000, cpu=const(20.0), gpu=lambda i: ((95.0 if i % 10 == 0 else 30.0, 20.0),))
    assert run(make(), batches)[1] == []


def test_absent_gpus_never_fire() -> None:
    rule = make(patience="0", window="10")
    state, found = run(rule, series(300, cpu=const(5.0), gpu=lambda i: None))
    assert found == [] and "not applicable" in rule.notes(state)["note"]

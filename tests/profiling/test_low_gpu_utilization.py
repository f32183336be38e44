"""Golden tests: LowGPUUtilization (p95 < 70: under-used; p95 > 70 and p5 < 10: fluctuating)."""

from __future__ import annotations

from sysbatches import run, series
from trainguard.rules.profiler import LowGPUUtilization


def make(**params: str) -> LowGPUUtilization:
    return LowGPUUtilization(LowGPUUtilization.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = LowGPUUtilization.Config()
    assert (cfg.threshold_p95, cfg.threshold_p5, cfg.window, cfg.patience) == (70, 10, 500, 1000)


def test_under_used_gpu_fires_when_the_first_window_fills() -> None:
    # patience skips 0..999; the first window is samples 1000..1499 (batch 74)
    batches = series(2000, gpu=lambda i: ((30.0 + i % 10, 40.0),))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [74]
    f = found[0][1]
    assert f.step == 1499 and f.tensor == "w0:gpu0" and "under-utilised" in f.message
    assert 38.0 <= (f.value or 0) <= 41.0


def test_fluctuating_gpu_fires() -> None:
    batches = series(2000, gpu=lambda i: ((95.0 if i % 2 else 0.0, 40.0),))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [74] and "fluctuates" in found[0][1].message


def test_busy_gpu_does_not_fire() -> None:
    _, found = run(make(), series(3000, gpu=lambda i: ((85.0 + i % 10, 40.0),)))
    assert found == []


def test_one_idle_gpu_of_two_is_named() -> None:
    batches = series(700, gpu=lambda i: ((90.0, 40.0), (3.0, 5.0)))
    _, found = run(make(window="100", patience="0"), batches)
    assert found and found[0][1].tensor == "w0:gpu1" and found[0][1].step == 99


def test_absent_gpus_never_fire() -> None:
    rule = make(patience="0", window="10")
    state, found = run(rule, series(500, gpu=lambda i: None))
    assert found == [] and "not applicable" in rule.notes(state)["note"]

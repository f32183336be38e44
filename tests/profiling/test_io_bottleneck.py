"""Golden tests: IOBottleneck (GPU < 10 % while I/O wait > 50 % in > 50 % of samples)."""

from __future__ import annotations

from sysbatches import const, run, series
from trainguard.rules.profiler import IOBottleneck


def make(**params: str) -> IOBottleneck:
    return IOBottleneck(IOBottleneck.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = IOBottleneck.Config()
    assert (cfg.threshold, cfg.gpu_threshold, cfg.io_threshold, cfg.patience) == (50, 10, 50, 1000)


def test_fires_when_the_gpu_waits_for_io() -> None:
    batches = series(1400, iowait=const(70.0), gpu=lambda i: ((2.0, 40.0),))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [54]
    assert found[0][1].step == 1099 and "I/O bottleneck in 100%" in found[0][1].message


def test_high_cpu_without_iowait_is_not_an_io_bottleneck() -> None:
    _, found = run(make(patience="0"), series(600, cpu=const(99.0), gpu=lambda i: ((2.0, 40.0),)))
    assert found == []


def test_iowait_during_warmup_is_skipped() -> None:
    # heavy I/O wait only while the cache warms (first 1000 samples): never judged
    batches = series(2000, iowait=lambda i: 80.0 if i < 1000 else 1.0, gpu=lambda i: ((2.0, 40.0),))
    _, found = run(make(), batches)
    assert found == []


def test_absent_gpus_never_fire() -> None:
    rule = make(patience="0")
    state, found = run(rule, series(500, iowait=const(90.0), gpu=lambda i: None))
    assert found == [] and "not applicable" in rule.notes(state)["note"]

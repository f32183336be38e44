"""Golden tests: CPUBottleneck (GPU < 10 % while CPU > 90 % in > 50 % of samples, after patience)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sysbatches import const, run, series
from trainguard.rules.profiler import CPUBottleneck


def make(**params: str) -> CPUBottleneck:
    return CPUBottleneck(CPUBottleneck.Config.model_validate(params))


def starving(i: int):
    return ((5.0, 40.0),)


def test_defaults_are_sagemakers() -> None:
    cfg = CPUBottleneck.Config()
    assert (cfg.threshold, cfg.gpu_threshold, cfg.cpu_threshold, cfg.patience) == (50, 10, 90, 1000)
    assert CPUBottleneck.kind == "profiler"


def test_fires_after_patience_once_enough_samples_are_judged() -> None:
    # samples 0..999 are skipped (patience 1000 at 0.5 s); from 1000 on every sample is a bottleneck;
    # the 100th judged sample is #1099, in batch 54 (20 samples a batch)
    batches = series(1400, cpu=const(95.0), gpu=starving)
    _state, found = run(make(), batches)
    assert [i for i, _ in found] == [54]
    finding = found[0][1]
    assert finding.rule == "CPUBottleneck" and finding.step == 1099
    assert finding.value == 100.0 and finding.threshold == 50.0
    assert "CPU bottleneck in 100% of 100 samples" in finding.details()


def test_share_at_or_below_threshold_does_not_fire() -> None:
    # exactly half the samples are bottlenecked: 50 % is not > 50 %
    batches = series(3000, cpu=lambda i: 95.0 if i % 2 else 50.0, gpu=starving)
    _, found = run(make(), batches)
    assert found == []


def test_busy_gpu_is_not_a_bottleneck() -> None:
    _, found = run(make(patience="0"), series(500, cpu=const(99.0), gpu=lambda i: ((60.0, 40.0),)))
    assert found == []


def test_string_parameters_and_patience_zero() -> None:
    # 30 % threshold: a 40 % bottleneck share fires as soon as 100 samples are judged (sample 99)
    batches = series(400, cpu=lambda i: 95.0 if i % 5 < 2 else 20.0, gpu=starving)
    _, found = run(make(threshold="30", patience="0"), batches)
    assert [i for i, _ in found] == [4]
    assert found[0][1].value == pytest.approx(40.0)


def test_absent_gpus_never_fire_and_say_why() -> None:
    rule = make(patience="0")
    state, found = run(rule, series(500, cpu=const(99.0), gpu=lambda i: None))
    assert found == []
    assert "no GPU data" in rule.notes(state)["note"]


def test_bad_parameter_is_an_error() -> None:
    with pytest.raises(ValidationError):
        make(threshold="150")
    with pytest.raises(ValidationError):
        make(treshold="10")

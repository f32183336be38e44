"""Golden tests: LoadBalancing (Jensen-Shannon distance between GPUs' utilisation > 0.5)."""

from __future__ import annotations

import pytest
from sysbatches import run, series
from trainguard.rules.profiler import LoadBalancing
from trainguard.rules.profiler.base import js_distance


def make(**params: str) -> LoadBalancing:
    return LoadBalancing(LoadBalancing.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = LoadBalancing.Config()
    assert (cfg.threshold, cfg.patience) == (0.5, 1000)


def test_js_distance() -> None:
    assert js_distance([10, 0], [0, 10]) == pytest.approx(1.0)
    assert js_distance([5, 5], [5, 5]) == pytest.approx(0.0)
    assert 0 < js_distance([6, 4], [4, 6]) < 0.2


def test_unequal_gpus_fire_after_patience_and_100_samples() -> None:
    batches = series(1400, gpu=lambda i: ((90.0, 50.0), (10.0, 50.0)))
    _, found = run(make(), batches)
    assert [i for i, _ in found] == [54]
    f = found[0][1]
    assert f.step == 1099 and f.tensor == "w0:gpu0,w0:gpu1" and f.value == pytest.approx(1.0)


def test_equal_gpus_with_noise_do_not_fire() -> None:
    batches = series(3000, gpu=lambda i: ((80.0 + (i * 7) % 15, 50.0), (80.0 + (i * 11) % 15, 50.0)))
    state, found = run(make(), batches)
    assert found == [] and state.max_distance is not None and state.max_distance < 0.2


def test_gpus_on_different_workers_are_compared() -> None:
    a = series(400, gpu=lambda i: ((90.0, 50.0),), worker=0)
    b = series(400, gpu=lambda i: ((20.0, 50.0),), worker=1, host="node-b")
    interleaved = [x for pair in zip(a, b, strict=True) for x in pair]
    _, found = run(make(patience="0"), interleaved)
    assert found and found[0][1].tensor == "w0:gpu0,w1:gpu0"


def test_single_gpu_or_absent_cannot_fire() -> None:
    rule = make(patience="0")
    state, found = run(rule, series(500, gpu=lambda i: ((90.0 if i % 2 else 5.0, 50.0),)))
    assert found == [] and "fewer than two GPUs" in rule.notes(state)["note"]
    state, found = run(rule, series(500, gpu=lambda i: None))
    assert found == [] and "no GPU data" in rule.notes(state)["note"]

"""Golden tests for VanishingGradient."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, M, config_error, fast_step, long_run, make, run, state_bytes, step_data, tensor


def grads(step: int, scale: float, *, workers: int = 1) -> object:
    g = {
        "gradients/layer1.weight": tensor(np.full((4, 4), scale), ["gradients"]),
        "gradients/layer2.weight": tensor(np.full((4,), 0.01), ["gradients"]),
        "weights/layer1.weight": tensor(np.full((4, 4), 1e-12), ["weights"]),
    }  # not a gradient
    return step_data(step, tensors=g, workers=[g] * workers)


def test_fires_at_first_step_below_threshold() -> None:
    scales = [1e-3, 1e-5, 5e-8, 1e-9]
    out = run(make("VanishingGradient"), [grads(10 * i, s) for i, s in enumerate(scales)])
    assert out.fired_at == 20
    f = out.finding
    assert f.tensor == "gradients/layer1.weight" and f.threshold == 1e-7
    assert abs(f.value - 5e-8) < 1e-20
    assert "gradients/layer1.weight" in f.details() and "1e-07" in f.details()


def test_healthy_gradients_and_weights_do_not_fire() -> None:
    out = run(make("VanishingGradient"), [grads(s, 1e-3) for s in range(5)])
    assert out.fired_at is None
    assert out.state.tensors_checked == 10


def test_zero_gradient_fires_nan_does_not() -> None:
    assert run(make("VanishingGradient"), [grads(0, 0.0)]).fired_at == 0
    assert run(make("VanishingGradient"), [grads(0, float("nan"))]).fired_at is None


def test_threshold_parameter() -> None:
    rule = make("VanishingGradient", threshold="1e-2")
    assert rule.config.threshold == 1e-2
    assert run(rule, [grads(0, 1e-3)]).fired_at == 0
    assert "threshold" in config_error("VanishingGradient", threshold="-1")
    assert "threshold" in config_error("VanishingGradient", threshold="small")


def test_state_bounded() -> None:
    rule = make("VanishingGradient")
    t = {"g": tensor(np.ones(3), ["gradients"])}
    state, fired = long_run(rule, (fast_step(s, {"TRAIN": M(None, None, t)}) for s in range(SHORT)))
    assert fired is None and state_bytes(rule, state) < 200

"""Golden tests for GradientNormRatio."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor


def grads(step: int, first: float, last: float, middle: float = 1.0) -> object:
    # insertion order = the model's parameter order
    t = {
        "gradients/layer0.weight": tensor(np.full(4, first / 2), ["gradients"]),  # l2 = first
        "gradients/layer0.bias": tensor(np.full(4, 1e-9), ["gradients"]),
        "gradients/layer1.weight": tensor(np.full(4, middle / 2), ["gradients"]),
        "gradients/layer2.weight": tensor(np.full(4, last / 2), ["gradients"]),
        "gradients/layer2.bias": tensor(np.full(4, 100.0), ["gradients"]),
    }
    return step_data(step, tensors=t)


def test_vanishing_first_layer_fires() -> None:
    out = run(make("GradientNormRatio"), [grads(0, 1.0, 1.0), grads(1, 1e-5, 1.0)])
    assert out.fired_at == 1 and out.finding.tensor == "gradients/layer0.weight"
    assert abs(out.finding.value - 1e-5) < 1e-12 and "vanishing" in out.finding.message
    # the ratio alone is not enough: the first norm must also be < vanishing_norm
    assert run(make("GradientNormRatio"), [grads(0, 1e-3, 10.0)]).fired_at is None


def test_exploding_first_layer_fires() -> None:
    out = run(make("GradientNormRatio"), [grads(0, 100.0, 1.0)])
    assert out.fired_at == 0 and "exploding" in out.finding.message and out.finding.threshold == 70.0
    assert run(make("GradientNormRatio", exploding_ratio="200"), [grads(0, 100.0, 1.0)]).fired_at is None


def test_biases_are_left_out_and_one_layer_is_not_judged() -> None:
    assert run(make("GradientNormRatio"), [grads(0, 1.0, 1.0)]).fired_at is None
    single = step_data(0, tensors={"gradients/w.weight": tensor(np.ones(3), ["gradients"])})
    assert run(make("GradientNormRatio"), [single]).state.steps_judged == 0


def test_parameters() -> None:
    c = make(
        "GradientNormRatio",
        vanishing_ratio="1e-4",
        vanishing_norm="1e-5",
        exploding_ratio="100",
        tensor_regex="grad/.*",
    ).config
    assert (c.vanishing_ratio, c.vanishing_norm, c.exploding_ratio, c.tensor_regex) == (
        1e-4,
        1e-5,
        100.0,
        ("grad/.*",),
    )
    assert "vanishing_ratio" in config_error("GradientNormRatio", vanishing_ratio="100", exploding_ratio="10")


def test_state_bounded() -> None:
    rule = make("GradientNormRatio")
    state, fired = long_run(rule, repeat(grads(0, 1.0, 1.0), SHORT))
    assert fired is None and state_bytes(rule, state) < 200

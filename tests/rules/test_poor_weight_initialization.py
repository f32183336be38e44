"""Golden tests for PoorWeightInitialization."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, run, state_bytes, step_data, tensor

RNG = np.random.default_rng(0)


def init_step(step: int, scales: list[float], loss: float, grad_scale: float = 1.0) -> object:
    t = {f"layer{i}_relu_input": tensor(RNG.normal(0, s, size=(64, 8))) for i, s in enumerate(scales)}
    t["gradients/layer0.weight"] = tensor(RNG.normal(0, grad_scale, size=(8, 8)), ["gradients"])
    return step_data(step, train=loss, tensors=t)


def test_variance_ratio_across_layers_fires() -> None:
    # std 1 vs std 5: variance ratio ~25 > 10
    out = run(make("PoorWeightInitialization"), [init_step(0, [1.0, 5.0], 1.0)])
    assert out.fired_at == 0
    assert out.finding.tensor == "layer1_relu_input" and out.finding.value > 10
    assert run(make("PoorWeightInitialization"), [init_step(0, [1.0, 2.0], 1.0)]).fired_at is None


def test_narrow_gradient_distribution_fires() -> None:
    out = run(make("PoorWeightInitialization"), [init_step(0, [1.0, 1.0], 1.0, grad_scale=1e-5)])
    assert out.fired_at == 0 and out.finding.tensor == "gradients/layer0.weight"
    assert out.finding.value < 0.001


def test_loss_not_decreasing_within_patience() -> None:
    losses = [1.0, 0.9, 0.95, 0.92, 0.91, 0.93, 0.94]  # best 0.9 at step 1, then 5 stale steps
    out = run(make("PoorWeightInitialization"), [init_step(s, [1.0, 1.0], v) for s, v in enumerate(losses)])
    assert out.fired_at == 6
    assert (
        run(
            make("PoorWeightInitialization", patience="6"),
            [init_step(s, [1, 1], v) for s, v in enumerate(losses)],
        ).fired_at
        is None
    )


def test_only_the_first_steps_are_analysed() -> None:
    steps = [init_step(s, [1.0, 1.0], 1.0 - 0.01 * s) for s in range(3)] + [init_step(3, [1.0, 50.0], 0.5)]
    assert run(make("PoorWeightInitialization", steps="3"), steps).fired_at is None
    assert run(make("PoorWeightInitialization", steps="4"), steps).fired_at == 3


def test_parameters() -> None:
    c = make(
        "PoorWeightInitialization",
        activation_inputs_regex=".*tanh_input",
        threshold="5",
        distribution_range="0.01",
        patience="2",
        steps="20",
    ).config
    assert (c.activation_inputs_regex, c.threshold, c.distribution_range, c.patience, c.steps) == (
        ".*tanh_input",
        5.0,
        0.01,
        2,
        20,
    )
    assert "steps" in config_error("PoorWeightInitialization", steps="0")
    assert "activation_inputs_regex" in config_error("PoorWeightInitialization", activation_inputs_regex="(")


def test_state_bounded() -> None:
    rule = make("PoorWeightInitialization", patience="1000000")
    state, fired = long_run(rule, (init_step(s, [1.0, 1.0], 1.0) for s in range(SHORT)))
    assert fired is None and state.steps_seen == 10 and state_bytes(rule, state) < 400


def test_steps_count_training_steps_not_saves() -> None:
    # saved every 5 training steps: the first 10 training steps hold 2 saves (0 and 5)
    out = run(make("PoorWeightInitialization"), [init_step(s, [1.0, 1.0], 1.0) for s in range(0, 100, 5)])
    assert out.state.steps_seen == 2

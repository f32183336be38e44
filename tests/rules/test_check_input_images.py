"""Golden tests for CheckInputImages."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor

NAME = "hybridsequential0_input_0"


def images(step: int, mean: float, n: int = 128) -> object:
    x = np.random.default_rng(step).normal(mean, 1.0, size=(n, 3, 4, 4))
    return step_data(step, tensors={NAME: tensor(x, ["inputs"])})


def test_unnormalised_images_fire_after_threshold_samples() -> None:
    out = run(make("CheckInputImages"), [images(s, 120.0) for s in range(6)])
    assert out.fired_at == 3  # 4 x 128 = 512 >= 500 images
    assert out.finding.value > 100 and out.finding.threshold == 0.2


def test_normalised_images_pass() -> None:
    assert run(make("CheckInputImages"), [images(s, 0.0) for s in range(10)]).fired_at is None


def test_parameters_and_regex() -> None:
    rule = make(
        "CheckInputImages", threshold_mean="200", threshold_samples="10", regex=".*input_0", channel="3"
    )
    assert (rule.config.threshold_mean, rule.config.threshold_samples, rule.config.channel) == (200.0, 10, 3)
    assert run(rule, [images(0, 120.0)]).fired_at is None
    assert (
        run(make("CheckInputImages", threshold_samples="10", regex="other"), [images(0, 120.0)]).fired_at
        is None
    )
    assert run(make("CheckInputImages", threshold_samples="10"), [images(0, 0.5)]).fired_at == 0
    assert "channel" in config_error("CheckInputImages", channel="-1")
    assert "threshold_samples" in config_error("CheckInputImages", threshold_samples="0")


def test_state_bounded() -> None:
    rule = make("CheckInputImages")
    state, fired = long_run(rule, repeat(images(0, 0.0), SHORT))
    assert fired is None and state.images == SHORT * 128 and state_bytes(rule, state) < 200

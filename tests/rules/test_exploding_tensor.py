"""Golden tests for ExplodingTensor."""

from __future__ import annotations

import math

import numpy as np
from rulejobs import (
    SHORT,
    M,
    config_error,
    fast_step,
    header,
    long_run,
    make,
    run,
    scalar,
    state_bytes,
    step_data,
    tensor,
)
from trainguard.rules.base import StepData


def job(bad_step: int, bad_value: float, name: str = "weights/fc.weight", cols: tuple = ("weights",)) -> list:
    steps = []
    for s in range(0, 50, 5):
        a = np.ones(8)
        if s >= bad_step:
            a[3] = bad_value
        steps.append(step_data(s, train=0.5, tensors={name: tensor(a, cols), "ok": tensor(np.ones(2))}))
    return steps


def test_nan_fires_at_first_nan_step() -> None:
    out = run(make("ExplodingTensor"), job(25, math.nan))
    assert out.fired_at == 25
    assert out.finding.tensor == "weights/fc.weight"
    assert "1 NaN" in out.finding.message


def test_inf_fires_unless_only_nan() -> None:
    assert run(make("ExplodingTensor"), job(10, math.inf)).fired_at == 10
    assert run(make("ExplodingTensor", only_nan="True"), job(10, -math.inf)).fired_at is None
    assert run(make("ExplodingTensor", only_nan="True"), job(10, math.nan)).fired_at == 10


def test_selection_by_collection_and_regex() -> None:
    steps = job(5, math.nan, name="gradients/fc.weight", cols=("gradients",))
    assert run(make("ExplodingTensor", collection_names="weights"), steps).fired_at is None
    assert run(make("ExplodingTensor", collection_names="weights,gradients"), steps).fired_at == 5
    assert run(make("ExplodingTensor", tensor_regex="gradients/.*"), steps).fired_at == 5
    assert run(make("ExplodingTensor", tensor_regex="biases/.*"), steps).fired_at is None


def test_nan_loss_scalar_fires() -> None:
    steps = [step_data(s, train=v) for s, v in [(0, 1.0), (1, 0.9), (2, math.nan)]]
    out = run(make("ExplodingTensor"), steps)
    assert out.fired_at == 2 and out.finding.tensor == "loss"
    assert run(make("ExplodingTensor", collection_names="losses"), steps).fired_at == 2
    assert run(make("ExplodingTensor", collection_names="weights"), steps).fired_at is None
    inf_metric = [
        StepData.from_headers([header(0, {"EVAL": M(None, {"acc": scalar(math.inf, ["metrics"])})})])
    ]
    assert run(make("ExplodingTensor"), inf_metric).fired_at == 0


def test_healthy_job_does_not_fire() -> None:
    assert run(make("ExplodingTensor"), job(10**9, math.nan)).fired_at is None


def test_parameters() -> None:
    rule = make(
        "ExplodingTensor", collection_names="weights, gradients", tensor_regex="None", only_nan="false"
    )
    assert rule.config.collection_names == ("weights", "gradients")
    assert rule.config.tensor_regex is None and rule.config.only_nan is False
    assert "only_nan" in config_error("ExplodingTensor", only_nan="maybe")
    assert "invalid regular expression" in config_error("ExplodingTensor", tensor_regex="[a")


def test_state_bounded() -> None:
    rule = make("ExplodingTensor")
    t = {"w": tensor(np.ones(3), ["weights"])}
    state, fired = long_run(rule, (fast_step(s, {"TRAIN": M(None, {"loss": 1.0}, t)}) for s in range(SHORT)))
    assert fired is None and state_bytes(rule, state) < 200

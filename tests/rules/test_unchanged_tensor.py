"""Golden tests for UnchangedTensor."""

from __future__ import annotations

import math

import numpy as np
from rulejobs import LONG, config_error, long_run, make, run, state_bytes, step_data, tensor
from trainguard.rules.base import StepData
from trainguard.rules.unchanged_tensor import MAX_TRACKED, allclose


def weights(step: int, w: np.ndarray, mode: str = "TRAIN") -> object:
    return step_data(step, mode=mode, tensors={"weights/fc.weight": tensor(w, ["weights"])})


def test_fires_after_num_steps_identical_saves() -> None:
    w = np.arange(6.0)
    steps = [weights(0, w), weights(10, w + 1), weights(20, w + 1), weights(30, w + 1), weights(40, w + 2)]
    out = run(make("UnchangedTensor"), steps)
    assert out.fired_at == 30  # steps 10, 20, 30 are allclose: 3 saves
    assert "since step 10" in out.finding.message and out.finding.tensor == "weights/fc.weight"


def test_changing_tensor_and_tolerances() -> None:
    w = np.arange(1.0, 7.0)
    drifting = [weights(s, w * (1 + 1e-4 * s)) for s in range(5)]
    assert run(make("UnchangedTensor"), drifting).fired_at is None
    assert run(make("UnchangedTensor", rtol="1e-2"), drifting).fired_at == 2
    assert run(make("UnchangedTensor", num_steps="5", rtol="1e-2"), drifting).fired_at == 4


def test_eval_steps_are_ignored() -> None:
    w = np.arange(6.0)
    steps = [weights(s, w, mode="EVAL") for s in range(5)]
    assert run(make("UnchangedTensor"), steps).fired_at is None


def test_allclose_and_nan() -> None:
    assert allclose([1.0, 2.0], [1.0 + 1e-9, 2.0], 1e-5, 1e-8, False)
    assert not allclose([math.nan], [math.nan], 1e-5, 1e-8, False)
    assert allclose([math.nan], [math.nan], 1e-5, 1e-8, True)
    assert allclose([math.inf], [math.inf], 1e-5, 1e-8, False)
    nan_w = np.array([1.0, math.nan])
    steps = [weights(s, nan_w) for s in range(3)]
    assert run(make("UnchangedTensor"), steps).fired_at is None
    assert run(make("UnchangedTensor", equal_nan="True"), steps).fired_at == 2


def test_parameters() -> None:
    c = make(
        "UnchangedTensor", tensor_regex="weights/.*", num_steps="4", rtol="0", atol="0.1", equal_nan="true"
    ).config
    assert (c.tensor_regex, c.num_steps, c.rtol, c.atol, c.equal_nan) == (("weights/.*",), 4, 0.0, 0.1, True)
    assert "num_steps" in config_error("UnchangedTensor", num_steps="0")
    assert "atol" in config_error("UnchangedTensor", atol="-1")


def test_state_bounded() -> None:
    rule = make("UnchangedTensor", num_steps="1000000")
    many = {f"t{i}": tensor(np.ones(2) * i, ["weights"]) for i in range(200)}
    state, _ = long_run(rule, (step_data(s, tensors=many) for s in range(3)))
    assert len(state.streaks) == MAX_TRACKED and state_bytes(rule, state) < 8192
    rule = make("UnchangedTensor")
    a, b = (step_data(0, tensors={"w": tensor(np.ones(3) * v, ["weights"])}) for v in (1.0, 2.0))
    state, fired = long_run(rule, (StepData(s, (a if s % 2 else b).workers) for s in range(LONG)))
    assert fired is None and state_bytes(rule, state) < 300

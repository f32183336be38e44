"""Golden tests for AllZero."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor


def job(zero_from: int) -> list:
    steps = []
    for s in range(0, 40, 10):
        w = np.zeros((3, 3)) if s >= zero_from else np.eye(3)  # eye: 6 of 9 zero (66.7%)
        steps.append(
            step_data(
                s,
                tensors={
                    "weights/fc.weight": tensor(w, ["weights"]),
                    "gradients/fc.weight": tensor(np.ones(3), ["gradients"]),
                },
            )
        )
    return steps


def test_all_zero_tensor_fires() -> None:
    out = run(make("AllZero"), job(20))
    assert out.fired_at == 20 and out.finding.tensor == "weights/fc.weight"
    assert out.finding.value == 100.0 and out.finding.threshold == 100.0


def test_threshold_percent() -> None:
    assert run(make("AllZero"), job(10**9)).fired_at is None
    assert run(make("AllZero", threshold="60"), job(10**9)).fired_at == 0
    assert run(make("AllZero", threshold="70"), job(10**9)).fired_at is None


def test_selection() -> None:
    assert run(make("AllZero", collection_names="gradients"), job(0)).fired_at is None
    assert run(make("AllZero", tensor_regex="weights/.*"), job(0)).fired_at == 0
    empty = [step_data(0, tensors={"e": tensor(np.zeros((0,)))})]
    assert run(make("AllZero"), empty).fired_at is None


def test_parameters() -> None:
    c = make("AllZero", collection_names="weights,biases", threshold="99.5").config
    assert c.collection_names == ("weights", "biases") and c.threshold == 99.5
    assert "threshold" in config_error("AllZero", threshold="120")


def test_state_bounded() -> None:
    rule = make("AllZero")
    state, fired = long_run(rule, repeat(job(10**9)[0], SHORT))
    assert fired is None and state_bytes(rule, state) < 200

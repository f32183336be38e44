"""Golden tests for TensorVariance."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor


def job(stds: list[float]) -> list:
    rng = np.random.default_rng(1)
    return [
        step_data(
            10 * i, tensors={"weights/fc.weight": tensor(rng.normal(0, s, size=(10, 100)), ["weights"])}
        )
        for i, s in enumerate(stds)
    ]


def test_variance_above_max_fires() -> None:
    out = run(make("TensorVariance", max_threshold="4"), job([1.0, 1.5, 3.0]))
    assert out.fired_at == 20 and out.finding.value > 4 and out.finding.threshold == 4.0


def test_variance_below_min_fires() -> None:
    out = run(make("TensorVariance", min_threshold="0.01"), job([1.0, 0.5, 0.01]))
    assert out.fired_at == 20 and "min_threshold" in out.finding.message


def test_within_bounds() -> None:
    assert (
        run(make("TensorVariance", min_threshold="0.1", max_threshold="10"), job([1, 2, 0.5])).fired_at
        is None
    )


def test_parameters() -> None:
    c = make("TensorVariance", collection_names="weights", max_threshold="10", min_threshold="0.1").config
    assert (c.collection_names, c.max_threshold, c.min_threshold) == (("weights",), 10.0, 0.1)
    assert "must not exceed" in config_error("TensorVariance", min_threshold="5", max_threshold="1")
    # SageMaker: a threshold given as None is not checked; trainguard's defaults apply only when
    # neither is given
    assert make("TensorVariance").config.bounds == (1e-5, 10.0)
    assert make("TensorVariance", max_threshold="4").config.bounds == (None, 4.0)


def test_trainguard_defaults_on_weights() -> None:
    rng = np.random.default_rng(2)
    zero = {"fc.weight": tensor(np.zeros((8, 8)), ["weights"])}
    huge = {"fc.weight": tensor(rng.normal(0, 5, size=(8, 8)), ["weights"])}
    healthy = {"fc.weight": tensor(rng.normal(0, 0.1, size=(8, 8)), ["weights"])}
    assert run(make("TensorVariance"), [step_data(0, tensors=zero)]).finding.threshold == 1e-5
    assert run(make("TensorVariance"), [step_data(0, tensors=huge)]).finding.threshold == 10.0
    assert run(make("TensorVariance"), [step_data(0, tensors=healthy)]).fired_at is None
    # a normalisation layer's scale (1-d, constant at init) and non-weights are not judged by default
    norm = {"bn.weight": tensor(np.ones(8), ["weights"]), "x": tensor(np.zeros((4, 4)), ["inputs"])}
    out = run(make("TensorVariance"), [step_data(0, tensors=norm)])
    assert out.fired_at is None and out.state.tensors_checked == 0
    # an explicit selection judges every selected tensor
    assert run(make("TensorVariance", collection_names="weights"), [step_data(0, tensors=norm)]).fired_at == 0


def test_state_bounded() -> None:
    rule = make("TensorVariance", max_threshold="100")
    state, fired = long_run(rule, repeat(job([1.0])[0], SHORT))
    assert fired is None and state_bytes(rule, state) < 200

"""Golden tests for DataNotNormalized."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor


def inputs(step: int, x: np.ndarray, name: str = "inputs/x", cols=("inputs",), dtype="float32") -> object:
    return step_data(step, tensors={name: tensor(x, cols, dtype=dtype)})


RNG = np.random.default_rng(3)


def test_raw_pixels_fire_scaled_pass() -> None:
    raw = RNG.integers(0, 256, size=(8, 3, 4, 4)).astype(float)
    out = run(make("DataNotNormalized"), [inputs(0, raw / 255.0), inputs(1, raw)])
    assert out.fired_at == 1 and out.finding.value > 100 and out.finding.threshold == 1.0
    standardised = (raw - raw.mean()) / raw.std()
    assert run(make("DataNotNormalized"), [inputs(0, standardised)]).fired_at is None


def test_large_spread_fires() -> None:
    x = RNG.normal(0, 50, size=1000)
    x -= x.mean()
    out = run(make("DataNotNormalized"), [inputs(0, x)])
    assert out.fired_at == 0 and "std" in out.finding.message


def test_integer_inputs_and_other_collections_are_skipped() -> None:
    ids = RNG.integers(0, 30000, size=(4, 16))
    assert run(make("DataNotNormalized"), [inputs(0, ids, dtype="int64")]).fired_at is None
    assert (
        run(make("DataNotNormalized"), [inputs(0, ids * 1.0, name="w", cols=("weights",))]).fired_at is None
    )
    assert (
        run(make("DataNotNormalized", tensor_regex="w"), [inputs(0, ids * 1.0, name="w", cols=())]).fired_at
        == 0
    )


def test_parameters() -> None:
    c = make("DataNotNormalized", mean_threshold="5", std_threshold="100", collection_names="features").config
    assert (c.mean_threshold, c.std_threshold, c.collection_names) == (5.0, 100.0, ("features",))
    assert "mean_threshold" in config_error("DataNotNormalized", mean_threshold="-1")


def test_state_bounded() -> None:
    rule = make("DataNotNormalized")
    state, fired = long_run(rule, repeat(inputs(0, RNG.normal(size=10)), SHORT))
    assert fired is None and state_bytes(rule, state) < 200

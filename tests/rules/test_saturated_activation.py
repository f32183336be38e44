"""Golden tests for SaturatedActivation."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor

TANH = (-9.4999, 9.4999)
SIGMOID = (-23.0, 16.99999)


def act(step: int, saturated: int, name: str = "layer1_tanh_input", band=TANH, units: int = 10) -> object:
    in_band = [0.0] * saturated + [0.9] * (units - saturated)
    x = np.random.default_rng(step).normal(size=(100, units))
    return step_data(step, tensors={name: tensor(x, ["activations"], unit_in_band=in_band, band=band)})


def test_fires_when_most_tanh_units_saturate() -> None:
    out = run(make("SaturatedActivation"), [act(0, 2), act(5, 5), act(10, 7)])
    assert out.fired_at == 10
    assert out.finding.value == 70.0 and out.finding.tensor == "layer1_tanh_input"
    assert "[-9.4999, 9.4999]" in out.finding.message


def test_sigmoid_uses_its_own_band() -> None:
    assert run(make("SaturatedActivation"), [act(0, 8, "fc_sigmoid_input", SIGMOID)]).fired_at == 0
    # a tensor measured with a band other than the configured one is not judged
    out = run(make("SaturatedActivation"), [act(0, 8, "fc_sigmoid_input", TANH)])
    assert out.fired_at is None and out.state.band_mismatches == 1
    rule = make("SaturatedActivation", threshold_tanh_min="-5", threshold_tanh_max="5")
    assert run(rule, [act(0, 8, band=(-5.0, 5.0))]).fired_at == 0


def test_other_names_not_selected() -> None:
    assert run(make("SaturatedActivation"), [act(0, 10, "relu_input")]).fired_at is None


def test_thresholds() -> None:
    assert run(make("SaturatedActivation", threshold_layer="10"), [act(0, 2)]).fired_at == 0
    c = make("SaturatedActivation", threshold_inactivity="5", collection_names="activations").config
    assert c.threshold_inactivity == 5.0 and c.collection_names == ("activations",)
    assert c.tensor_regex == (".*tanh_input|.*sigmoid_input",)
    assert "below" in config_error("SaturatedActivation", threshold_tanh_min="10")
    assert "threshold_layer" in config_error("SaturatedActivation", threshold_layer="101")


def test_state_bounded() -> None:
    rule = make("SaturatedActivation")
    state, fired = long_run(rule, repeat(act(0, 1), SHORT))
    assert fired is None and state_bytes(rule, state) < 200

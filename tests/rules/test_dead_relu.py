"""Golden tests for DeadRelu."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, M, config_error, fast_step, long_run, make, run, state_bytes, step_data, tensor
from trainguard.rules.dead_relu import inactive_share


def relu_step(step: int, dead_units: int, units: int = 10, name: str = "layer1_relu_output") -> object:
    # batch of 200 samples; dead units are active in 1 sample (0.5% < 1%), others in 100
    active = [0.005] * dead_units + [0.5] * (units - dead_units)
    out = np.maximum(np.random.default_rng(step).normal(size=(200, units)), 0)
    return step_data(step, tensors={name: tensor(out, ["relu"], unit_active=active)})


def test_fires_when_more_than_threshold_layer_of_the_units_are_dead() -> None:
    steps = [relu_step(s, d) for s, d in [(0, 0), (10, 3), (20, 5), (30, 7), (40, 8)]]
    out = run(make("DeadRelu"), steps)
    assert out.fired_at == 40  # 80% > trainguard's 70%; exactly 70% at step 30 is not "more than"
    assert out.finding.value == 80.0 and out.finding.threshold == 70.0
    # SageMaker's documented default, given explicitly, keeps its meaning
    sagemaker = run(make("DeadRelu", threshold_layer="50"), steps)
    assert sagemaker.fired_at == 30 and sagemaker.finding.threshold == 50.0
    assert "layer1_relu_output" in out.finding.details()


def test_regex_selects_layers() -> None:
    steps = [relu_step(0, 8, name="conv_act")]
    assert run(make("DeadRelu"), steps).fired_at is None
    assert run(make("DeadRelu", tensor_regex="conv_.*"), steps).fired_at == 0


def test_thresholds() -> None:
    steps = [relu_step(0, 3)]
    assert run(make("DeadRelu", threshold_layer="20"), steps).fired_at == 0
    # with threshold_inactivity 0.1%, a unit active in 0.5% of samples is alive
    assert run(make("DeadRelu", threshold_layer="20", threshold_inactivity="0.1"), steps).fired_at is None
    assert inactive_share([0.0, 0.009, 0.011, 1.0], 1.0) == 50.0
    assert inactive_share([], 1.0) == 0.0


def test_without_unit_statistics_nothing_is_judged() -> None:
    s = step_data(0, tensors={"a_relu_output": tensor(np.zeros((4, 4)), ["relu"])})
    out = run(make("DeadRelu"), [s])
    assert out.fired_at is None and out.state.layers_checked == 0


def test_parameters() -> None:
    rule = make("DeadRelu", threshold_inactivity="2.5", threshold_layer="75")
    assert (rule.config.threshold_inactivity, rule.config.threshold_layer) == (2.5, 75.0)
    assert rule.config.tensor_regex == ".*relu_output"
    assert "threshold_layer" in config_error("DeadRelu", threshold_layer="150")
    assert "tensor_regex" in config_error("DeadRelu", tensor_regex="*bad")


def test_state_bounded() -> None:
    rule = make("DeadRelu")
    t = {"x_relu_output": tensor(np.ones((2, 3)), unit_active=[1.0, 1.0, 1.0])}
    state, fired = long_run(rule, (fast_step(s, {"TRAIN": M(None, None, t)}) for s in range(SHORT)))
    assert fired is None and state_bytes(rule, state) < 200

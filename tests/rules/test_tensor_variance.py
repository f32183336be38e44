"""Golden tests for TensorVariance."""

from __future__ import annotations

import numpy as np
from rulejobs import SHORT, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.rules.config import parse_rule_configurations


def job(stds: list[float]) -> list:
    rng = np.random.default_rng(1)
    return [
        step_data(10 * i, tensors={"weights/fc.weight": tensor(rng.normal(0, s, size=1000), ["weights"])})
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
    # SageMaker's defaults (no threshold) are accepted: the rule cannot fire, and says so
    [configured] = parse_rule_configurations(
        [{"RuleConfigurationName": "TensorVariance", "RuleParameters": {"rule_to_invoke": "TensorVariance"}}]
    )
    assert configured.error is None and "cannot fire" in " ".join(configured.notes)
    assert "must not exceed" in config_error("TensorVariance", min_threshold="5", max_threshold="1")


def test_state_bounded() -> None:
    rule = make("TensorVariance", max_threshold="100")
    state, fired = long_run(rule, repeat(job([1.0])[0], SHORT))
    assert fired is None and state_bytes(rule, state) < 200

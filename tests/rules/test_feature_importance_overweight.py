"""Golden tests for FeatureImportanceOverweight."""

from __future__ import annotations

from rulejobs import (
    SHORT,
    M,
    config_error,
    header,
    long_run,
    make,
    repeat,
    run,
    scalar,
    state_bytes,
    step_data,
    tensor,
)
from trainguard.rules.base import StepData


def importances(step: int, weights: list[float]) -> StepData:
    scalars = {
        f"feature_importance/weight/f{i}": scalar(w, ["feature_importance"]) for i, w in enumerate(weights)
    }
    return StepData.from_headers([header(step, {"TRAIN": M(None, scalars)})])


def test_top_three_overweight_fires() -> None:
    out = run(
        make("FeatureImportanceOverweight"),
        [importances(0, [1, 1, 1, 1, 1]), importances(1, [10, 10, 5, 1, 1, 1])],
    )
    assert out.fired_at == 1
    assert abs(out.finding.value - 25 / 28) < 1e-9 and out.finding.threshold == 0.8
    assert "feature_importance/weight/f0" in out.finding.message


def test_not_judged_with_nfeatures_or_fewer() -> None:
    assert run(make("FeatureImportanceOverweight"), [importances(0, [5, 1, 1])]).fired_at is None
    assert (
        run(make("FeatureImportanceOverweight", nfeatures="1"), [importances(0, [5, 1, 1])]).fired_at is None
    )
    assert (
        run(
            make("FeatureImportanceOverweight", nfeatures="1", threshold="0.5"), [importances(0, [5, 1, 1])]
        ).fired_at
        == 0
    )


def test_values_in_one_tensor() -> None:
    s = step_data(0, tensors={"feature_importance/weight": tensor([9, 9, 9, 1, 1], values=[9, 9, 9, 1, 1])})
    assert run(make("FeatureImportanceOverweight"), [s]).fired_at == 0  # 27/29


def test_parameters() -> None:
    c = make(
        "FeatureImportanceOverweight",
        threshold="0.5",
        nfeatures="2",
        tensor_regex=".*feature_importance/gain",
    ).config
    assert (c.threshold, c.nfeatures, c.tensor_regex) == (0.5, 2, (".*feature_importance/gain",))
    assert "threshold" in config_error("FeatureImportanceOverweight", threshold="2")
    assert "nfeatures" in config_error("FeatureImportanceOverweight", nfeatures="0")


def test_state_bounded() -> None:
    rule = make("FeatureImportanceOverweight")
    state, fired = long_run(rule, repeat(importances(0, [1] * 10), SHORT))
    assert fired is None and state_bytes(rule, state) < 200

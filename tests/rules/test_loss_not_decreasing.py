"""Golden tests for LossNotDecreasing."""

from __future__ import annotations

import math

from rulejobs import (
    LONG,
    SHORT,
    M,
    config_error,
    fast_step,
    long_run,
    losses,
    make,
    run,
    state_bytes,
    step_data,
)
from trainguard.rules.loss_not_decreasing import MAX_WINDOW, LossNotDecreasing


def test_golden_example_fires_at_step_12() -> None:
    # step 12 vs the newest saved loss at a step <= 2 (step 0): 0.30 is not lower than 0.30
    out = run(make("LossNotDecreasing"), losses([(0, 0.30), (4, 0.33), (8, 0.31), (12, 0.30), (16, 0.28)]))
    assert out.fired_at == 12
    f = out.finding
    assert (f.value, f.threshold) == (0.30, 0.30)
    text = f.details()
    assert text.startswith("RuleEvaluationConditionMet: Evaluation of the rule LossNotDecreasing at step 12")
    assert "0.3" in text and "step 0" in text and "num_steps=10" in text


def test_decreasing_loss_never_fires() -> None:
    out = run(make("LossNotDecreasing"), losses([(s, 1.0 / (1 + s)) for s in range(0, 300, 3)]))
    assert out.fired_at is None


def _every_3_from_9(overrides: dict[int, float]) -> list:
    return losses([(s, overrides.get(s, 10.0 - 0.1 * s)) for s in range(9, 60, 3)])


def test_documented_schedule_step_21_vs_9_then_33() -> None:
    # saved every 3 steps, num_steps 10: step 21 is compared with step 9...
    out = run(make("LossNotDecreasing"), _every_3_from_9({21: 10.0 - 0.9}))
    assert out.fired_at == 21
    assert out.finding.threshold == 10.0 - 0.9
    # ...steps 24-30 are not checks (a bad loss there goes unnoticed), the next check is 33 vs 21
    out = run(make("LossNotDecreasing"), _every_3_from_9({24: 99.0, 27: 99.0, 30: 99.0, 33: 10.0 - 2.1}))
    assert out.fired_at == 33
    assert "step 21" in out.finding.message


def test_diff_percent() -> None:
    steps = losses([(0, 1.0), (10, 0.95)])
    assert run(make("LossNotDecreasing", diff_percent="10"), steps).fired_at == 10
    assert run(make("LossNotDecreasing", diff_percent="1"), steps).fired_at is None


def test_increase_threshold_percent() -> None:
    steps = losses([(0, 1.0), (5, 0.5), (10, 0.9)])  # lower than step 0, but 80% above the best
    assert run(make("LossNotDecreasing"), steps).fired_at == 10
    assert run(make("LossNotDecreasing", increase_threshold_percent="None"), steps).fired_at is None


def test_nan_loss_at_a_check_fires() -> None:
    out = run(make("LossNotDecreasing"), losses([(0, 1.0), (10, math.nan)]))
    assert out.fired_at == 10


def test_mode_none_prefers_eval_once_present() -> None:
    # TRAIN flat (would fire), EVAL decreasing from the start: EVAL is the chosen mode
    steps = [step_data(s, train=1.0, eval=1.0 / (1 + s)) for s in range(0, 40)]
    assert run(make("LossNotDecreasing"), steps).fired_at is None
    assert run(make("LossNotDecreasing", mode="TRAIN"), steps).fired_at == 10
    # before any EVAL loss, TRAIN is the chosen mode
    train_only = [step_data(s, train=1.0) for s in range(0, 40)]
    assert run(make("LossNotDecreasing"), train_only).fired_at == 10


def test_eval_counts_its_own_mode_steps() -> None:
    # EVAL saved at global steps 100, 200, ... with mode steps 0, 1, 2, ...: num_steps counts mode steps
    steps = [step_data(100 * (i + 1), eval=1.0, mode_step=i) for i in range(12)]
    out = run(make("LossNotDecreasing", mode="EVAL"), steps)
    assert out.fired_at == 1100  # mode step 10
    assert "global step 1100" in out.finding.message


def test_global_mode_and_losses_by_regex() -> None:
    steps = [step_data(s, train=None) for s in range(3)]
    assert run(make("LossNotDecreasing"), steps).fired_at is None  # no loss at all: never fires
    from rulejobs import header, scalar
    from trainguard.rules.base import StepData

    def g(s: int, v: float) -> StepData:
        return StepData.from_headers([header(s, {"GLOBAL": M(None, {"my_loss": scalar(v, ["metrics"])})})])

    flat = [g(s, 2.0) for s in range(0, 30, 5)]
    assert run(make("LossNotDecreasing"), flat).fired_at is None  # not in "losses"
    assert run(make("LossNotDecreasing", tensor_regex="my_.*"), flat).fired_at == 10
    assert run(make("LossNotDecreasing", collection_names="metrics,other"), flat).fired_at == 10


def test_parameters_from_sagemaker_strings() -> None:
    rule = make(
        "LossNotDecreasing",
        num_steps="20",
        diff_percent="0.1",
        use_losses_collection="False",
        mode="EVAL",
        tensor_regex=r"loss_\d{1,3},val.*",
        collection_names="None",
    )
    cfg = rule.config
    assert (cfg.num_steps, cfg.diff_percent, cfg.use_losses_collection, cfg.mode) == (20, 0.1, False, "EVAL")
    assert cfg.tensor_regex == (r"loss_\d{1,3}", "val.*")
    assert cfg.collection_names is None
    d = LossNotDecreasing.Config()
    assert (d.num_steps, d.diff_percent, d.use_losses_collection, d.mode) == (10, 0.0, True, None)
    assert d.increase_threshold_percent == 5.0


def test_bad_parameters_become_errors() -> None:
    assert "num_steps" in config_error("LossNotDecreasing", num_steps="0")
    assert "num_steps" in config_error("LossNotDecreasing", num_steps="ten")
    assert "mode" in config_error("LossNotDecreasing", mode="TEST")
    assert "invalid regular expression" in config_error("LossNotDecreasing", tensor_regex="(")
    assert "diff_percent" in config_error("LossNotDecreasing", diff_percent="NaN")
    assert "extra" in config_error("LossNotDecreasing", num_step="10").lower()


def test_state_stays_small_after_100000_steps() -> None:
    # num_steps far above MAX_WINDOW with a loss every step: the window is thinned
    rule = make("LossNotDecreasing", num_steps="5000")
    steps = (fast_step(s, {"TRAIN": M(None, {"loss": 1e6 - s})}) for s in range(LONG))
    state, fired = long_run(rule, steps)
    assert fired is None
    assert len(state.tracks["TRAIN"].window) <= MAX_WINDOW + 1
    assert state_bytes(rule, state) < 4096
    # default num_steps, TRAIN then EVAL (TRAIN's track is dropped once EVAL appears)
    rule = make("LossNotDecreasing")
    steps = (
        fast_step(
            s, {"EVAL": M(s - 101, {"loss": 1e6 - s})} if s > 100 else {"TRAIN": M(None, {"loss": 1.0 - s})}
        )
        for s in range(SHORT)
    )
    state, fired = long_run(rule, steps)
    assert fired is None and list(state.tracks) == ["EVAL"] and state_bytes(rule, state) < 1024

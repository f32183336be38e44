"""Golden tests: StepOutlier (more than n_outliers steps above mean + 3 std, after 100 steps)."""

from __future__ import annotations

import pytest
from sysbatches import run, series
from trainguard.rules.profiler import StepOutlier


def make(**params: str) -> StepOutlier:
    return StepOutlier(StepOutlier.Config.model_validate(params))


def steady(i: int) -> float:
    return 0.2 + 0.01 * (i % 5)


def test_defaults_are_sagemakers() -> None:
    cfg = StepOutlier.Config()
    assert (cfg.stddev, cfg.mode, cfg.n_outliers) == (3, None, 10)


def test_eleventh_outlier_fires() -> None:
    slow = set(range(120, 320, 10))  # 20 slow steps, one every 10 from step 120
    batches = series(400, step_s=lambda i: 2.0 if i in slow else steady(i))
    _, found = run(make(), batches)
    f = found[0][1]
    assert f.step == 220 and f.value == 11.0  # the 11th slow step: 120, 130, ..., 220
    assert "11 TRAIN steps took longer" in f.message


def test_ten_outliers_do_not_fire() -> None:
    slow = set(range(120, 220, 10))
    _, found = run(make(), series(400, step_s=lambda i: 2.0 if i in slow else steady(i)))
    assert found == []


def test_slow_steps_in_the_first_100_are_warmup() -> None:
    _, found = run(make(), series(400, step_s=lambda i: 2.0 if i < 30 else steady(i)))
    assert found == []


def test_mode_filter_and_modes_are_separate() -> None:
    slow = set(range(120, 320, 10))
    eval_batches = series(400, step_s=lambda i: 2.0 if i in slow else steady(i), mode="EVAL")
    _, found = run(make(mode="TRAIN"), eval_batches)
    assert found == []
    _, found = run(make(mode="EVAL", n_outliers="3"), eval_batches)
    assert found and found[0][1].step == 150


def test_stats_in_notes() -> None:
    rule = make()
    state, _ = run(rule, series(200, step_s=steady))
    notes = rule.notes(state)["TRAIN"]
    assert notes["steps"] == 200 and notes["mean_s"] == pytest.approx(0.22)

"""The robust noise estimator every loss rule judges its effects against."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from trainguard.rules.noise import (
    MAX_WINDOW,
    MIN_VALUES,
    RobustNoise,
    block_noise,
    diff_sigma,
    effect_size,
    mad_sigma,
    median,
)


def test_median_and_mad() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(median([])) and math.isnan(mad_sigma([]))
    # one wild value does not move a robust scale
    assert mad_sigma([1.0, 2.0, 3.0, 4.0, 5.0]) == mad_sigma([1.0, 2.0, 3.0, 4.0, 5e9])


@pytest.mark.parametrize("seed", range(5))
def test_noise_of_a_falling_series_is_its_noise_not_its_fall(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(2000)
    noise = rng.normal(0, 0.05, t.size)
    for trend in (2.0 * np.exp(-t / 300), 2.0 - 0.0005 * t, np.zeros(t.size)):
        est = diff_sigma(list(trend + noise))
        assert 0.045 < est < 0.055, (seed, est)


def test_a_hard_batch_now_and_then_does_not_inflate_the_noise() -> None:
    rng = np.random.default_rng(1)
    values = 1.0 + rng.normal(0, 0.01, 500)
    values[::50] += 5.0  # one outlier batch in 50
    assert diff_sigma(list(values)) < 0.013


def test_estimator_is_bounded_serialisable_and_skips_non_finite() -> None:
    est = RobustNoise(size=16)
    assert est.level() is None and est.sigma() is None
    for v in range(MIN_VALUES - 1):
        est.add(float(v))
    est.add(math.nan)
    est.add(math.inf)
    assert not est.ready and est.seen == MIN_VALUES - 1
    rng = np.random.default_rng(3)
    for v in rng.normal(10.0, 0.2, 1000):
        est.add(float(v))
    assert len(est.values) == 16 and est.seen == 1000 + MIN_VALUES - 1
    level, sigma = est.level(), est.sigma()
    assert level is not None and abs(level - 10.0) < 0.2
    assert sigma is not None and 0.08 < sigma < 0.4
    again = RobustNoise.model_validate(json.loads(est.model_dump_json()))
    assert again == est
    with pytest.raises(ValueError):
        RobustNoise(size=MAX_WINDOW + 1)


def test_an_exactly_repeating_loss_has_a_floor_not_zero_noise() -> None:
    est = RobustNoise()
    for _ in range(20):
        est.add(0.668413)
    sigma = est.sigma()
    assert sigma is not None and 0 < sigma < 1e-6
    assert math.isfinite(effect_size(1.0, 0.0, 0.668413))


def test_effect_sizes_are_scale_free() -> None:
    rng = np.random.default_rng(2)
    series = 1.0 + 0.01 * np.cumsum(rng.normal(0, 1, 100)) + rng.normal(0, 0.02, 100)
    small = effect_size(0.1, diff_sigma(list(series)), 1.0)
    large = effect_size(100.0, diff_sigma(list(series * 1000)), 1000.0)
    assert small == pytest.approx(large)
    assert block_noise(0.1, 100) == pytest.approx(0.01) and block_noise(0.1, 0) == 0.1


def test_second_differences_ignore_a_bend() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(16)
    bend = 1.5 * np.exp(-t / 3) + rng.normal(0, 0.003, t.size)  # 16 evaluations of a fast fall
    assert diff_sigma(list(bend)) > 0.02  # the bend reads as noise to first differences
    est = RobustNoise(size=16, order=2)
    for v in bend:
        est.add(float(v))
    sigma = est.sigma()
    assert sigma is not None and sigma < 0.012

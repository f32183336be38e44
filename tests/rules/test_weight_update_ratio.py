"""Golden tests for WeightUpdateRatio."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from rulejobs import LONG, config_error, long_run, make, repeat, run, state_bytes, step_data, tensor
from trainguard.rules.weight_update_ratio import MAX_TRACKED

#: SageMaker's check: either threshold given keeps its documented meaning
SAGEMAKER = {"large_threshold": "10"}


def training(updates: list[float | None], steps: list[int] | None = None, workers: int = 1) -> list:
    """A weight tensor W with ||W|| = 2 at every save; ``updates`` gives ||W_s - W_prev||."""
    w = np.full((2, 2), 1.0)  # l2 = 2
    out = []
    for i, u in enumerate(updates):
        t = {
            "weights/fc.weight": tensor(w, ["weights"], update_l2=u),
            "gradients/fc.weight": tensor(w, ["gradients"]),
        }
        out.append(
            step_data((steps or list(range(0, 10 * len(updates), 10)))[i], tensors=t, workers=[t] * workers)
        )
    return out


def test_huge_update_fires() -> None:
    out = run(make("WeightUpdateRatio", **SAGEMAKER), training([None, 0.02, 0.1, 25.0]))
    assert out.fired_at == 30
    assert abs(out.finding.value - 25.0 / (2.0 + 1e-9)) < 1e-9 and out.finding.threshold == 10.0
    assert "large_threshold" in out.finding.message and "step 20 -> 30" in out.finding.message


def test_tiny_update_fires() -> None:
    out = run(make("WeightUpdateRatio", **SAGEMAKER), training([None, 0.02, 0.0]))
    assert out.fired_at == 20 and out.finding.threshold == 1e-8
    out = run(make("WeightUpdateRatio", small_threshold="1e-6"), training([None, 0.02, 1e-6]))
    assert out.fired_at == 20 and out.finding.threshold == 1e-6


def test_an_eval_save_of_the_weights_is_not_an_update() -> None:
    """Weights saved during evaluation equal the last training step's: the hook's update_l2 is
    0 there, which is no sign of a stalled layer."""
    w = np.full((2, 2), 1.0)
    steps = [
        step_data(0, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=None)}),
        step_data(10, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.02)}),
        step_data(
            14, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.0)}, mode="EVAL", mode_step=0
        ),
        step_data(20, tensors={"weights/fc.weight": tensor(w, ["weights"], update_l2=0.02)}),
    ]
    out = run(make("WeightUpdateRatio", **SAGEMAKER), steps)
    assert out.fired_at is None
    assert (out.state.ratios_checked, out.state.tensors_seen) == (2, 3)  # the EVAL save is not read


def test_first_save_and_missing_update_are_not_judged() -> None:
    assert run(make("WeightUpdateRatio", **SAGEMAKER), training([0.0, None, None])).fired_at is None


def test_num_steps_limits_the_gap() -> None:
    steps = training([None, 100.0], steps=[0, 50])
    assert run(make("WeightUpdateRatio", **SAGEMAKER), steps).fired_at == 50
    assert run(make("WeightUpdateRatio", num_steps="20", **SAGEMAKER), steps).fired_at is None
    assert run(make("WeightUpdateRatio", num_steps="50", **SAGEMAKER), steps).fired_at == 50


def test_parameters() -> None:
    c = make(
        "WeightUpdateRatio", num_steps="None", large_threshold="5", small_threshold="1e-6", epsilon="1e-7"
    ).config
    assert (c.num_steps, c.large_threshold, c.small_threshold, c.epsilon) == (None, 5.0, 1e-6, 1e-7)
    assert "small_threshold" in config_error("WeightUpdateRatio", small_threshold="20")
    assert make("WeightUpdateRatio").config.bounds is None  # neither given: the relative method
    assert make("WeightUpdateRatio", small_threshold="1e-6").config.bounds == (1e-6, 10.0)
    assert "num_steps" in config_error("WeightUpdateRatio", num_steps="-3")


def test_state_bounded_by_tracked_tensors() -> None:
    rule = make("WeightUpdateRatio")
    many = {
        f"weights/layer{i:04d}.weight": tensor(np.ones(2), ["weights"], update_l2=0.01) for i in range(300)
    }
    state, fired = long_run(rule, (step_data(s, tensors=many) for s in range(3)))
    assert len(state.prev_l2) == MAX_TRACKED and state.untracked == 300 - MAX_TRACKED
    assert state_bytes(rule, state) < 16384

    state, fired = long_run(rule, repeat(training([0.01])[0], LONG))
    assert fired is None and state_bytes(rule, state) < 300


def ratios(values: list[float]) -> list:
    """Saves of one weight with ||W|| = 2 whose update ratios are ``values`` (None first)."""
    return training([None] + [2.0 * r for r in values])


def healthy(seed: int, n: int, scale: float = 0.01, noise: float = 0.15) -> list[float]:
    """A healthy tensor's ratios: log-normal around ``scale`` (``noise`` orders)."""
    rng = np.random.default_rng(seed)
    return [scale * 10 ** float(rng.normal(0, noise)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_a_30x_learning_rate_blow_up_fires_within_two_saves(seed) -> None:
    """A 30x learning rate gave ratios of 3-7 per save interval: under SageMaker's 10."""
    values = healthy(seed, 12, scale=0.15) + [30 * r for r in healthy(seed + 100, 6, scale=0.15)]
    assert max(values[12:]) < 10
    assert run(make("WeightUpdateRatio", **SAGEMAKER), ratios(values)).fired_at is None
    out = run(make("WeightUpdateRatio"), ratios(values))
    assert out.fired_at in (130, 140)  # value i is saved at step 10 * (i + 1): the blow-up at 130
    assert "orders of magnitude above" in out.finding.message


@pytest.mark.parametrize("seed", range(5))
def test_a_learning_rate_collapse_fires_within_two_saves(seed) -> None:
    """A learning rate cut 1e6-fold gave ratios of 8.8e-7: above SageMaker's 1e-8."""
    values = healthy(seed, 12, scale=0.9) + [1e-6 * r for r in healthy(seed + 100, 6, scale=0.9)]
    assert min(values[12:]) > 1e-8
    assert run(make("WeightUpdateRatio", **SAGEMAKER), ratios(values)).fired_at is None
    out = run(make("WeightUpdateRatio"), ratios(values))
    assert out.fired_at in (130, 140) and "orders of magnitude below" in out.finding.message


@pytest.mark.parametrize("seed", range(20))
def test_healthy_schedules_stay_quiet(seed) -> None:
    """Warmup, cosine decay to near zero, a x0.1 step decay and save-to-save noise: none is a
    jump or a collapse against the tensor's own level."""
    n = 40
    noise = healthy(seed, n, scale=1.0, noise=0.25)
    warmup = [min(1.0, (i + 1) / 10) for i in range(n)]
    cosine = [0.5 * (1 + math.cos(math.pi * i / n)) + 1e-4 for i in range(n)]
    step = [1.0 if i < 20 else 0.1 if i < 30 else 0.01 for i in range(n)]
    for schedule in (warmup, cosine, step):
        values = [0.01 * s * e for s, e in zip(schedule, noise, strict=True)]
        assert run(make("WeightUpdateRatio"), ratios(values)).fired_at is None


def test_a_zero_initialised_weight_has_no_relative_update_and_an_update_above_the_weight_fires() -> None:
    """A weight at 0 (LoRA's B) has no ratio; a ratio above 10 for two saves in a row fires
    without a level to compare with (a learning rate far too high from the start)."""
    zero = [
        step_data(0, tensors={"weights/b": tensor(np.zeros(4), ["weights"], update_l2=None)}),
        step_data(10, tensors={"weights/b": tensor(np.full(4, 0.1), ["weights"], update_l2=0.2)}),
    ]
    assert run(make("WeightUpdateRatio"), zero).state.ratios_checked == 0
    out = run(make("WeightUpdateRatio"), ratios([25.0, 30.0, 40.0]))
    assert out.fired_at == 20 and "larger than the weight" in out.finding.message


def test_frozen_and_structural_weights_are_not_judged() -> None:
    """A frozen weight (the manifest's structure) never moves: SageMaker's small threshold
    fired on it; trainguard does not judge it, and says so when nothing else arrived."""
    frozen = [
        dataclasses.replace(s, structure={"weights/fc.weight": "frozen"}) for s in training([None, 0.0, 0.0])
    ]
    for params in ({}, SAGEMAKER):
        out = run(make("WeightUpdateRatio", **params), frozen)
        assert out.fired_at is None and out.state.structural == 3 and out.state.ratios_checked == 0
    coverage = make("WeightUpdateRatio").coverage(out.state)
    assert not coverage.complete and "3 frozen, unused or constant" in coverage.starved(
        "WeightUpdateRatio", 3
    )

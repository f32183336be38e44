"""Golden tests for LossNotDecreasing: the noise-aware stall test, and SageMaker's block
comparison when diff_percent is given (its meaning kept), on SageMaker's schedule."""

from __future__ import annotations

import math

import numpy as np
from lossfixtures import HEALTHY, fault_job, healthy_job
from rulejobs import (
    LONG,
    SHORT,
    M,
    config_error,
    fast_step,
    header,
    long_run,
    losses,
    make,
    run,
    scalar,
    state_bytes,
    step_data,
)
from trainguard.rules.base import StepData
from trainguard.rules.loss_not_decreasing import LossNotDecreasing


def sagemaker(**params: str) -> LossNotDecreasing:
    """The rule with diff_percent given: SageMaker's block comparison (its default is 0)."""
    rule = make("LossNotDecreasing", diff_percent="0", **params)
    assert isinstance(rule, LossNotDecreasing)
    return rule


def test_sparse_saves_compare_points_as_sagemaker_does() -> None:
    # losses saved every 3 steps from step 9, num_steps 10: SageMaker's documented example.
    # The checks are steps 21 (vs the block {9}) and 33 (block 24-33 vs block 12-21).
    steps = losses([(s, 10.0 - 0.1 * s) for s in range(9, 60, 3)])
    out = run(sagemaker(num_steps="10"), steps)
    assert out.fired_at is None and out.state.checks == 4
    flat_from_24 = losses([(s, 10.0 - 0.1 * min(s, 21)) for s in range(9, 60, 3)])
    out = run(sagemaker(num_steps="10"), flat_from_24)
    assert out.fired_at == 45  # block 36-45 equals block 24-33: both flat
    # one loss per block: exactly the point comparison (step 520 vs step 0, 1040 vs 520)
    sparse = losses([(0, 1.0), (520, 0.9), (1040, 0.9)])
    out = run(sagemaker(num_steps="500"), sparse)
    assert out.fired_at == 1040 and (out.finding.value, out.finding.threshold) == (0.9, 0.9)


def test_exactly_flat_loss_fires_at_diff_percent_0() -> None:
    # learning rate 0 from step 59: the loss is exactly 0.668413 (a sum of equal floats is not)
    vals = [2.0 - 0.02 * s for s in range(59)] + [0.668413] * 241
    out = run(sagemaker(), losses(list(enumerate(vals))))
    assert out.fired_at is not None and 150 <= out.fired_at <= 201
    assert "not lower than" in out.finding.message and "diff_percent=0%" in out.finding.message


def test_noisy_decreasing_loss_does_not_fire() -> None:
    rng = np.random.default_rng(0)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        vals = [(1.0 / (1 + 0.02 * s)) * (1 + rng.normal(0, 0.05)) for s in range(600)]  # 5% noise
        out = run(make("LossNotDecreasing"), losses(list(enumerate(vals))))
        assert out.fired_at is None and out.state.checks == 11, seed
    # the same noise compared point to point (num_steps 1, every step a block) fires
    out = run(make("LossNotDecreasing", num_steps="1"), losses(list(enumerate(vals))))
    assert out.fired_at is not None


def test_rising_loss_fires() -> None:
    vals = [1.0 - 0.005 * s for s in range(100)] + [0.5 + 0.01 * s for s in range(100)]
    out = run(sagemaker(), losses(list(enumerate(vals))))
    assert out.fired_at == 150 and out.finding.tensor == "TRAIN loss"


def test_diff_percent() -> None:
    steps = losses([(0, 1.0), (10, 0.95), (20, 0.90)])
    assert run(make("LossNotDecreasing", num_steps="10", diff_percent="10"), steps).fired_at == 10
    assert run(make("LossNotDecreasing", num_steps="10", diff_percent="1"), steps).fired_at is None


def test_increase_threshold_percent_only_when_given() -> None:
    # each block lower than the previous, but 2 blocks later 80% above the lowest: needs the parameter
    steps = losses([(0, 1.0), (10, 0.5), (20, 0.95), (30, 0.9)])
    assert run(sagemaker(num_steps="10"), steps).fired_at == 20  # 0.95 > 0.5: not lower
    steps = losses([(0, 1.0), (10, 0.5), (20, 0.4), (30, 0.3)])
    assert run(sagemaker(num_steps="10", increase_threshold_percent="5"), steps).fired_at is None
    assert LossNotDecreasing.Config().increase_threshold_percent is None


def test_nan_in_a_block_fires() -> None:
    out = run(
        make("LossNotDecreasing", num_steps="10"), losses([(0, 1.0), (5, math.nan), (10, 0.5), (11, 0.4)])
    )
    assert out.fired_at == 10 and math.isnan(out.finding.value)


def test_mode_none_prefers_eval_once_it_compared() -> None:
    # TRAIN flat (would fire), EVAL decreasing, evaluated every 10 training steps
    steps = [step_data(s, train=1.0, eval=(1.0 / (1 + s) if s % 10 == 0 else None)) for s in range(300)]
    out = run(sagemaker(), steps)
    assert out.fired_at is None and list(out.state.tracks) == ["EVAL"]
    assert run(sagemaker(mode="TRAIN"), steps).fired_at == 50
    train_only = [step_data(s, train=1.0) for s in range(300)]
    assert run(sagemaker(), train_only).fired_at == 50


def test_train_is_judged_while_eval_cannot_compare() -> None:
    # 16 EVAL steps in one evaluation at training step 20; TRAIN losses NaN from step 30 (issue 10)
    steps = [step_data(s, train=(1.0 if s < 30 else math.nan), mode_step=s) for s in range(200)]
    evaluation = [StepData.from_headers([header(200 + i, {"EVAL": M(i, {"loss": 0.5})})]) for i in range(16)]
    job = steps[:21] + evaluation + steps[21:]
    out = run(make("LossNotDecreasing"), job)
    assert out.fired_at is not None and out.finding.tensor == "TRAIN loss" and math.isnan(out.finding.value)


def test_eval_windows_count_training_steps_not_eval_steps() -> None:
    # each evaluation is 5 EVAL steps (EVAL mode steps 5k..5k+4) after every 20 training steps;
    # the global step counts every forward. Blocks are 50 training steps of evaluations.
    job, g, e = [], 0, 0
    for t in range(200):
        job.append(StepData.from_headers([header(g, {"TRAIN": M(t, {"loss": 1.0 / (1 + t)})})]))
        g += 1
        if t % 20 == 19:
            for _ in range(5):
                job.append(StepData.from_headers([header(g, {"EVAL": M(e, {"loss": 0.7})})]))
                g, e = g + 1, e + 1
    out = run(sagemaker(), job)
    # evaluations at training steps 19, 39, ..., 199: blocks {19} and (19, 79]: flat -> fires
    assert out.fired_at is not None and out.finding.tensor == "EVAL loss"
    assert "training steps 39-79" in out.finding.message and "over steps 19-19" in out.finding.message


def test_global_mode_and_losses_by_regex() -> None:
    steps = [step_data(s, train=None) for s in range(3)]
    assert run(sagemaker(), steps).fired_at is None  # no loss at all: never fires

    def g(s: int, v: float) -> StepData:
        return StepData.from_headers([header(s, {"GLOBAL": M(s, {"my_loss": scalar(v, ["metrics"])})})])

    flat = [g(s, 2.0) for s in range(0, 30, 5)]
    assert run(sagemaker(num_steps="10"), flat).fired_at is None  # not in "losses"
    assert run(sagemaker(num_steps="10", tensor_regex="my_.*"), flat).fired_at == 10
    assert (
        run(
            sagemaker(num_steps="10", collection_names="metrics,other"),
            flat,
        ).fired_at
        == 10
    )


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
    assert (d.num_steps, d.window, d.diff_percent, d.use_losses_collection, d.mode, d.horizon) == (
        None,
        50,
        None,
        True,
        None,
        3,
    )


def test_bad_parameters_become_errors() -> None:
    assert "num_steps" in config_error("LossNotDecreasing", num_steps="0")
    assert "num_steps" in config_error("LossNotDecreasing", num_steps="ten")
    assert "mode" in config_error("LossNotDecreasing", mode="TEST")
    assert "invalid regular expression" in config_error("LossNotDecreasing", tensor_regex="(")
    assert "diff_percent" in config_error("LossNotDecreasing", diff_percent="NaN")
    assert "extra" in config_error("LossNotDecreasing", num_step="10").lower()


def test_state_stays_small_after_100000_steps() -> None:
    rule = make("LossNotDecreasing", num_steps="5000")
    steps = (fast_step(s, {"TRAIN": M(None, {"loss": 1e6 - s})}) for s in range(LONG))
    state, fired = long_run(rule, steps)
    assert fired is None and state_bytes(rule, state) < 2048
    # TRAIN then EVAL: TRAIN's track is dropped once EVAL has compared
    rule = make("LossNotDecreasing")
    steps = (
        fast_step(
            s,
            {"TRAIN": M(s, {"loss": 1e6 - s})}
            | ({"EVAL": M(s // 10, {"loss": 1e6 - s})} if s % 10 == 0 else {}),
        )
        for s in range(SHORT)
    )
    state, fired = long_run(rule, steps)
    # the noise-aware test keeps 32 recent losses and 7 block means per mode
    assert fired is None and list(state.tracks) == ["EVAL"] and state_bytes(rule, state) < 2048


# -- the noise-aware test (diff_percent not given) ------------------------------------------


def test_healthy_loss_shapes_do_not_fire() -> None:
    for shape in HEALTHY:
        for seed in range(3):
            for mode in (None, "TRAIN"):
                rule = make("LossNotDecreasing", **({"mode": mode} if mode else {}))
                out = run(rule, healthy_job(shape, seed))
                assert out.fired_at is None, (shape, seed, mode, out.findings)
                assert out.state.checks > 10


def test_a_converged_plateau_is_not_a_stall() -> None:
    # batches 0.08-0.13 at the floor: SageMaker's comparison fires ("0.1255 not lower than 0.0839")
    job = healthy_job("converged_plateau", 0)
    assert run(make("LossNotDecreasing", mode="TRAIN", diff_percent="0"), job).fired_at is not None
    assert run(make("LossNotDecreasing", mode="TRAIN"), job).fired_at is None


def test_a_loss_that_never_fell_is_a_stall_within_the_horizon() -> None:
    for seed in range(3):
        out = run(make("LossNotDecreasing", mode="TRAIN"), fault_job("stall_from_start", seed))
        train_step = out.finding.step  # no EVAL steps before the fault's first 100 steps
        assert out.fired_at is not None and "has not moved since its first value" in out.finding.message
        assert train_step <= 300, train_step  # 4 blocks of 50 after the first loss, and one more
        out = run(make("LossNotDecreasing"), fault_job("stall_from_start", seed))
        assert out.finding.tensor == "EVAL loss"  # evaluations every 100 steps: 4 of them


def test_a_learning_rate_cut_1e6_fold_is_a_stop_not_a_convergence() -> None:
    for seed in range(3):
        out = run(make("LossNotDecreasing", mode="TRAIN"), fault_job("lr_cut", seed))
        assert out.fired_at is not None and "stopped at once" in out.finding.message, seed
        out = run(make("LossNotDecreasing"), fault_job("lr_cut", seed))
        assert out.fired_at is not None and "stopped at once" in out.finding.message, seed


def test_an_exactly_flat_loss_after_a_fall_is_a_stop() -> None:
    # learning rate 0 from step 200 of a steady decline: exactly flat from then on
    vals = [2.0 - 0.005 * s for s in range(200)] + [1.0] * 400
    rng = np.random.default_rng(0)
    vals = [v * (1 + 0.01 * rng.normal()) for v in vals]
    out = run(make("LossNotDecreasing"), losses(list(enumerate(vals))))
    assert out.fired_at is not None and 300 <= out.fired_at <= 450

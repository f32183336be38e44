"""Golden jobs written through the real hook (a plain numpy loop) and judged by replay.

The per-rule golden tests build step documents directly; these check the same verdicts
hold end to end, when the hook computes the statistics and the engine orders the steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import trainguard
from trainguard import modes
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.rules.config import DEFAULT_RULES


def rule(name: str, **params: str) -> dict:
    return {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name, **params}}


def judge(path, rules) -> dict[str, tuple[str, int | None]]:
    result = replay(LocalJob.open(path), rules=rules)
    return {r["RuleConfigurationName"]: (r["RuleEvaluationStatus"], r["Step"]) for r in result.summary()}


@pytest.fixture
def hook_at(tmp_path):
    def make(job: str, collections: list[str]) -> trainguard.Hook:
        return trainguard.Hook(
            tmp_path / job,
            save_config=trainguard.SaveConfig(save_interval=1),
            include_collections=collections,
            stop_check_interval_s=0,
        )

    return make


def test_loss_not_decreasing_documented_example(hook_at, tmp_path):
    # losses 0.30, 0.33, 0.31, 0.30, 0.28 at steps 0, 4, 8, 12, 16, num_steps 10: step 12 is the
    # first check; its block (steps 4-12, mean 0.313) is not lower than the block {0} (0.30)
    with hook_at("lnd", ["losses"]) as hook:
        for step, loss in zip([0, 4, 8, 12, 16], [0.30, 0.33, 0.31, 0.30, 0.28], strict=True):
            hook.save_scalar("loss", loss, step=step, collections=["losses"])
    # diff_percent given: SageMaker's block comparison (its documented default is 0)
    verdict = judge(tmp_path / "lnd", [rule("LossNotDecreasing", num_steps="10", diff_percent="0")])
    assert verdict == {"LossNotDecreasing": ("IssuesFound", 12)}


def test_exploding_tensor_fires_at_the_first_nan_gradient(hook_at, tmp_path):
    with hook_at("nan", ["gradients"]) as hook:
        for step in range(6):
            grad = np.full((8, 8), 0.01, dtype=np.float32)
            if step == 4:
                grad[2, 3] = np.nan
            hook.save_tensor("gradient/fc.weight", grad, collections=["gradients"], step=step)
    assert judge(tmp_path / "nan", [rule("ExplodingTensor")]) == {"ExplodingTensor": ("IssuesFound", 4)}


def test_vanishing_gradient_fires_when_mean_abs_drops_below_threshold(hook_at, tmp_path):
    with hook_at("van", ["gradients"]) as hook:
        for step in range(6):
            scale = 1e-2 if step < 3 else 1e-9
            hook.save_tensor(
                "gradient/fc.weight", np.full((4, 4), scale, np.float32), collections=["gradients"], step=step
            )
    assert judge(tmp_path / "van", [rule("VanishingGradient")]) == {"VanishingGradient": ("IssuesFound", 3)}


def test_dead_relu_fires_when_most_units_never_activate(hook_at, tmp_path):
    rng = np.random.default_rng(0)
    with hook_at("relu", ["relu_output"]) as hook:
        for step in range(5):
            act = rng.normal(size=(128, 10)).astype(np.float32)
            if step >= 2:
                act[:, :8] = -1.0  # 80% of the units dead: > threshold_layer 70%
            hook.save_tensor("fc1/relu_output", np.maximum(act, 0), collections=["relu_output"], step=step)
    assert judge(tmp_path / "relu", [rule("DeadRelu")]) == {"DeadRelu": ("IssuesFound", 2)}


def test_overfit_fires_when_eval_loss_exceeds_train_loss_by_the_ratio(hook_at, tmp_path):
    with hook_at("fit", ["losses"]) as hook:
        for step in range(0, 40):
            hook.save_scalar("loss", 1.0 / (1 + step), step=step, collections=["losses"], mode=modes.TRAIN)
            if step % 10 == 9:
                val = 1.0 / (1 + step) * (1.05 if step < 25 else 1.5)
                hook.save_scalar("loss", val, step=step, collections=["losses"], mode=modes.EVAL)
    status, step = judge(tmp_path / "fit", [rule("Overfit", patience="1", ratio_threshold="0.1")])["Overfit"]
    assert status == "IssuesFound" and step is not None and step >= 29


def test_a_clean_numpy_job_ends_with_every_default_rule_clean(hook_at, tmp_path):
    rng = np.random.default_rng(1)
    with hook_at("clean", ["losses", "gradients", "relu_output"]) as hook:
        for step in range(120):  # LossNotDecreasing compares blocks of 50 training steps
            hook.save_scalar("loss", 2.0 * np.exp(-step / 30) + 0.1, step=step, collections=["losses"])
            if step % 10 == 9:  # Overfit compares validation with training: without EVAL it cannot pass
                val = 1.02 * (2.0 * np.exp(-step / 30) + 0.1)
                hook.save_scalar("loss", val, step=step, collections=["losses"], mode=modes.EVAL)
            hook.save_tensor(
                "gradient/fc.weight",
                rng.normal(0, 0.01, (8, 8)).astype(np.float32),
                collections=["gradients"],
                step=step,
            )
            hook.save_tensor(
                "fc/relu_output",
                np.maximum(rng.normal(size=(64, 16)), 0).astype(np.float32),
                collections=["relu_output"],
                step=step,
            )
    verdicts = judge(tmp_path / "clean", None)
    assert set(verdicts) == set(DEFAULT_RULES)
    assert all(v == ("NoIssuesFound", None) for v in verdicts.values()), verdicts


def test_a_job_without_validation_does_not_pass_overfit(hook_at, tmp_path):
    with hook_at("noeval", ["losses"]) as hook:
        for step in range(30):
            hook.save_scalar("loss", 1.0 / (1 + step), step=step, collections=["losses"])
    assert judge(tmp_path / "noeval", [rule("Overfit")]) == {"Overfit": ("Error", None)}

"""LossConverged (opt-in): the loss has converged; a signal for SageMaker-style early stopping."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from trainguard.format.documents import Mode
from trainguard.rules._trend import Verdict
from trainguard.rules.base import Finding, fmt
from trainguard.rules.loss_not_decreasing import LossNotDecreasing, LossNotDecreasingConfig


class LossConvergedConfig(LossNotDecreasingConfig):
    @model_validator(mode="after")
    def _trend_only(self) -> LossConvergedConfig:
        if self.diff_percent is not None or self.increase_threshold_percent is not None:
            raise ValueError(
                "LossConverged judges the noise-aware trend: diff_percent and "
                "increase_threshold_percent are LossNotDecreasing's"
            )
        return self


class LossConverged(LossNotDecreasing):
    """Fires when the loss has converged: it fell, and its last ``horizon + 1`` block means
    (``num_steps`` training steps each) lie within 4.5 x their robust noise, its decline having
    faded out as its own geometric trend predicted (``trainguard.rules._trend``).

    The complement of LossNotDecreasing's stall: the same blocks, noise and plateau, read the
    other way. Not in the default rules and off the alert path unless configured: a converged
    loss is a healthy job's end, and a user who wants SageMaker-style early stopping configures
    this rule with the StopTraining action. Same parameters as LossNotDecreasing, without
    SageMaker's diff_percent and increase_threshold_percent.

    A decline that stopped at once (a learning rate cut) can read as converged at one block
    before LossNotDecreasing names it a stop at a later one: for early stopping both mean the
    loss stopped improving. A loss that never fell has not converged.

    False-alarm budget: it fires on every job that trains long enough to converge (that is its
    purpose); a loss still falling by more than its noise over 4 blocks does not fire.
    """

    name = "LossConverged"
    Config = LossConvergedConfig
    summary = "The loss has converged (a plateau after its fall): early stopping's signal."
    advice = "Stop training and keep the best checkpoint, or lower the learning rate to go further."
    method: ClassVar[str] = (
        "the loss fell, then 4 block means (num_steps=50 training steps) within 4.5 x their robust "
        "noise, its decline faded as its own geometric trend predicted"
    )
    false_alarm_budget: ClassVar[str] = "not an alarm: opt-in, fires on every job that converges"

    def _trend_finding(self, verdict: Verdict, mode: Mode, what: str, mean: float, at: int) -> list[Finding]:
        if verdict.kind != "converged":
            return []
        cfg = self.config
        return [
            self.finding(
                at,
                f"{self.name}: mean {what} is {fmt(mean)}; the last {cfg.horizon + 1} blocks of num_steps="
                f"{cfg.window} training steps lie within {fmt(verdict.spread)} of each other, within the "
                f"noise of a block mean ({fmt(verdict.noise)}), after its fall: the loss has converged.",
                tensor=f"{mode} loss",
                value=mean,
                threshold=verdict.noise,
            )
        ]

"""LossSpike: the training loss jumps far above its recent median (a custom rule example).

Written only against the public rule contract (``trainguard.rules.base``): a pydantic
config (SageMaker passes every parameter as a string; pydantic converts), a small state
stored between invocations, and a pure ``update``.
"""

from __future__ import annotations

import math
import statistics

from pydantic import Field
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt


class LossSpikeConfig(RuleConfig):
    #: fires when the loss exceeds ``factor`` x the median of the recent losses
    factor: float = Field(default=3.0, gt=1.0)
    #: how many recent saved steps the median is taken over
    window: int = Field(default=20, ge=3, le=500)
    #: saved steps needed before judging (the first losses of a run are noisy)
    min_steps: int = Field(default=5, ge=1)
    #: scalars whose name matches this regex count as the loss too (besides ``losses``)
    tensor_regex: str | None = None


class LossSpikeState(RuleState):
    #: the last ``window`` finite TRAIN losses, oldest first: bounded, so the state stays small
    recent: list[float] = Field(default_factory=list, max_length=500)
    #: losses compared with the median (a new field has a default: stored states still load)
    checked: int = 0


class LossSpike(Rule[LossSpikeConfig, LossSpikeState]):
    """Fires when the TRAIN loss is more than ``factor`` times its median over the last
    ``window`` saved steps (after ``min_steps`` saved steps). Non-finite losses are left to
    ExplodingTensor; a median <= 0 gives no ratio and is skipped."""

    name = "LossSpike"
    Config = LossSpikeConfig
    State = LossSpikeState
    summary = "The TRAIN loss jumps above factor x its running median."
    advice = "Look for a bad batch or a learning-rate jump at that step; consider gradient clipping."

    def reads(self) -> tuple[RuleInput, ...]:
        """What the hook must save for this rule: TRAIN losses (and scalars matching tensor_regex)."""
        regex = (self.config.tensor_regex,) if self.config.tensor_regex else ()
        return (
            RuleInput("TRAIN losses", collections=("losses",), regex=regex, scalars=True, modes=("TRAIN",)),
        )

    def coverage(self, state: LossSpikeState) -> Coverage:
        """How much it checked: a job that never had min_steps losses ends Error, not NoIssuesFound."""
        reason = f"fewer than min_steps={self.config.min_steps} TRAIN losses arrived" if state.recent else ""
        return self.covered(state.checked, "TRAIN losses against their median", "compared", reason=reason)

    def update(self, state: LossSpikeState, step: StepData) -> tuple[LossSpikeState, list[Finding]]:
        cfg = self.config
        loss = step.loss("TRAIN", regex=cfg.tensor_regex)
        if loss is None or not math.isfinite(loss):
            return state, []
        if len(state.recent) >= cfg.min_steps:
            state.checked += 1
            median = statistics.median(state.recent)
            if median > 0 and loss > cfg.factor * median:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: TRAIN loss {fmt(loss)} > factor={fmt(cfg.factor)} x the median "
                        f"{fmt(median)} of the last {len(state.recent)} saved steps.",
                        tensor="TRAIN loss",
                        value=loss / median,
                        threshold=cfg.factor,
                    )
                ]
        state.recent = [*state.recent, loss][-cfg.window :]
        return state, []

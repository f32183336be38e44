"""OscillatingLoss (AUTOTRAINER): the loss swings up and down instead of converging."""

from __future__ import annotations

from pydantic import Field

from trainguard.format.documents import Mode
from trainguard.rules._common import (
    NonNegative,
    Percent,
    PositiveInt,
    RegexList,
    finite,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt


class OscillatingLossConfig(RuleConfig):
    tensor_regex: RegexList = None
    use_losses_collection: bool = True
    mode: Mode = "TRAIN"
    #: a change of at least this much (loss units) that reverses direction is a swing
    swing: NonNegative = 0.03
    #: fires when at least this percent of the recent evaluations are swings
    swing_percent: Percent = 20.0
    #: the recent evaluations considered (a sliding window)
    window: int = Field(default=50, ge=2, le=512)
    #: evaluations needed before judging
    min_evaluations: PositiveInt = 10


class OscillatingLossState(RuleState):
    last: float | None = None
    #: direction of the last change: 1 up, -1 down, 0 none yet
    direction: int = 0
    #: one character per recent evaluation: "1" a swing, "0" not (bounded by ``window``)
    recent: str = ""
    #: losses received, and judgements made (once min_evaluations were seen)
    losses_seen: int = 0
    judgements: int = 0


class OscillatingLoss(Rule[OscillatingLossConfig, OscillatingLossState]):
    """Fires when at least ``swing_percent`` % of the last ``window`` evaluations are swings.

    After AUTOTRAINER's "unstable training" symptom (a metric swinging by >= 0.03 in >= 20% of
    the evaluations). Reads the loss of ``mode`` (the ``losses`` collection, or scalars
    matching ``tensor_regex``); each saved loss after the first is one evaluation. A swing is
    a change of at least ``swing`` whose direction reverses the previous change's: a loss
    falling fast and steadily does not count, a loss zig-zagging does. Judged once
    ``min_evaluations`` evaluations were seen. Non-finite losses are skipped (see
    ExplodingTensor). ``swing`` is absolute: for losses far above 1, raise it.
    """

    name = "OscillatingLoss"
    Config = OscillatingLossConfig
    State = OscillatingLossState
    summary = "The loss oscillates (reverses by >= swing) in too many evaluations."
    advice = "Lower the learning rate, increase the batch size, or add learning-rate warm-up/decay."

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return loss_inputs(
            (cfg.mode,), regex=cfg.tensor_regex, use_losses_collection=cfg.use_losses_collection
        )

    def coverage(self, state: OscillatingLossState) -> Coverage:
        reason = ""
        if state.losses_seen:
            reason = (
                f"{state.losses_seen:,} finite {self.config.mode} losses arrived, fewer than "
                f"min_evaluations={self.config.min_evaluations} changes"
            )
        received = [state.losses_seen] * len(self.reads())
        return self.covered(
            state.judgements,
            f"windows of {self.config.mode} loss",
            "judged",
            received=received,
            reason=reason,
        )

    def update(
        self, state: OscillatingLossState, step: StepData
    ) -> tuple[OscillatingLossState, list[Finding]]:
        cfg = self.config
        loss = loss_value(
            step, cfg.mode, regex=cfg.tensor_regex, use_losses_collection=cfg.use_losses_collection
        )
        if loss is None or not finite(loss):
            return state, []
        state.losses_seen += 1
        if state.last is None:
            state.last = loss
            return state, []
        delta = loss - state.last
        direction = (delta > 0) - (delta < 0)
        swung = abs(delta) >= cfg.swing and direction != 0 and direction == -state.direction
        state.recent = (state.recent + ("1" if swung else "0"))[-cfg.window :]
        if direction:
            state.direction = direction
        state.last = loss
        n = len(state.recent)
        share = 100.0 * state.recent.count("1") / n
        state.judgements += n >= cfg.min_evaluations
        if n >= cfg.min_evaluations and share >= cfg.swing_percent:
            return state, [
                self.finding(
                    step.step,
                    f"{self.name}: {cfg.mode} loss reversed by >= swing={fmt(cfg.swing)} in "
                    f"{state.recent.count('1')} of "
                    f"the last {n} evaluations ({fmt(share)}%) >= swing_percent={fmt(cfg.swing_percent)}%.",
                    tensor=f"{cfg.mode} loss",
                    value=share,
                    threshold=cfg.swing_percent,
                )
            ]
        return state, []

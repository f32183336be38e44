"""OscillatingLoss (AUTOTRAINER): the loss swings up and down instead of converging."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from trainguard.format.documents import Mode
from trainguard.rules._common import (
    NonNegative,
    Percent,
    PositiveInt,
    RegexList,
    TrainingClock,
    finite,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.noise import RobustNoise, block_noise

#: a swing is real at this many noises of a difference of two evaluations
SWING_Z = 4.0
#: a fast swing: extreme to extreme in at most this many evaluations
MAX_SWING_EVALUATIONS = 3


class OscillatingLossConfig(RuleConfig):
    tensor_regex: RegexList = None
    use_losses_collection: bool = True
    mode: Mode = "TRAIN"
    #: given: a move of at least this much (loss units) from one extreme to the next is a
    #: swing (AUTOTRAINER's 0.03); None: the scale-free swing (``swing_relative``, noise)
    swing: NonNegative | None = None
    #: a swing is at least this share of the smoothed loss's level (and 4 noises)
    swing_relative: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = 0.1
    #: fires when at least this percent of the recent evaluations end a swing
    swing_percent: Percent = 20.0
    #: the recent evaluations considered (a sliding window)
    window: int = Field(default=50, ge=2, le=512)
    #: evaluations needed before judging
    min_evaluations: PositiveInt = 10
    #: TRAIN (and GLOBAL): one evaluation is the mean loss of this many training steps
    smoothing_steps: PositiveInt = 10


class OscillatingLossState(RuleState):
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: the evaluation being collected: sum and count of losses, its block (training steps)
    acc_sum: float = 0.0
    acc_n: int = 0
    acc_key: int | None = None
    acc_at: int = 0
    #: the previous evaluation, the direction of the last move (1 up, -1 down, 0 none yet)
    #: and the last turning point (the first evaluation before any turn)
    last: float | None = None
    direction: int = 0
    extreme: float | None = None
    #: one character per recent evaluation: "1" it confirmed a swing, "0" not (``window``)
    recent: str = ""
    losses_seen: int = 0
    judgements: int = 0
    #: the loss's own noise (per loss), for the scale-free swing
    noise: RobustNoise = Field(default_factory=lambda: RobustNoise(size=32))
    #: the last swing threshold used (for the finding's text)
    last_threshold: float = 0.0
    #: evaluations so far, the one of the last turning point, whether the last swing was fast
    evaluated: int = 0
    extreme_at: int = 0
    fast: bool = False


class OscillatingLoss(Rule[OscillatingLossConfig, OscillatingLossState]):
    """Fires when at least ``swing_percent`` % of the last ``window`` evaluations end a swing.

    After AUTOTRAINER's "unstable training" symptom (a metric swinging by >= 0.03 in >= 20% of
    the evaluations). Reads the loss of ``mode`` (the ``losses`` collection, or scalars matching
    ``tensor_regex``).

    An evaluation is one value of a smoothed loss: for TRAIN and GLOBAL, the mean loss over a
    block of ``smoothing_steps`` training steps; for EVAL, one validation pass (consecutive EVAL
    steps). AUTOTRAINER judges per-epoch metrics; judged on every mini-batch loss the rule
    fired on 10 of 10 healthy runs (issue 10), on block means 0-2 of 10. A swing is measured
    extreme to extreme, as AUTOTRAINER does: when the smoothed loss turns, the move from the
    previous turning point to this one is a swing if it is at least the swing threshold. A
    loss falling steadily never turns; one that zig-zags turns at every extreme. Judged once
    ``min_evaluations`` evaluations were seen. Non-finite losses are skipped (ExplodingTensor's
    business).

    The swing threshold is scale-free unless ``swing`` is given: the larger of
    ``swing_relative`` (10 %) of the loss's level (the median of its last 32 losses) and 4
    noises of a difference of two evaluations (the loss's robust per-loss noise over
    sqrt(losses per evaluation), ``trainguard.rules.noise``). So mini-batch noise, however
    large, does not make swings, and a loss near 0.01 swings at 0.001, not at AUTOTRAINER's
    absolute 0.03. Sustained alternation: a swing counts only when it took at most 3
    evaluations and the swing before it did too (a bounce is fast both ways; a schedule
    restart's jump is followed by a slow decline). ``swing`` given: that absolute threshold and
    every swing counts, as before.

    False-alarm budget: under 1 per 100 healthy jobs: 10 swings in 50 evaluations each beyond
    4 noises and 10 % of the level needs a loss that really bounces; a schedule restart is 2
    swings per cycle (a cycle of 10 evaluations or fewer would fire).
    """

    name = "OscillatingLoss"
    Config = OscillatingLossConfig
    State = OscillatingLossState
    summary = "The smoothed loss oscillates (swings of 10% of its level, beyond its noise) too often."
    method = (
        "swing_percent=20% of the last 50 evaluations (10-step means) end a swing, extreme to "
        "extreme, >= max(10% of the level, 4 x the robust noise of a difference)"
    )
    false_alarm_budget = "under 1 per 100 healthy jobs (restarts: 2 swings per cycle)"
    advice = "Lower the learning rate, increase the batch size, or add learning-rate warm-up/decay."

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return loss_inputs(
            (cfg.mode,), regex=cfg.tensor_regex, use_losses_collection=cfg.use_losses_collection
        )

    def coverage(self, state: OscillatingLossState) -> Coverage:
        cfg = self.config
        reason = ""
        if state.losses_seen:
            reason = (
                f"{state.losses_seen:,} finite {cfg.mode} losses arrived, fewer than min_evaluations="
                f"{cfg.min_evaluations} evaluations of the smoothed loss"
            )
        received = [state.losses_seen] * len(self.reads())
        return self.covered(
            state.judgements,
            f"windows of smoothed {cfg.mode} loss",
            "judged",
            received=received,
            reason=reason,
        )

    def update(
        self, state: OscillatingLossState, step: StepData
    ) -> tuple[OscillatingLossState, list[Finding]]:
        cfg = self.config
        t = state.clock.tick(step)
        loss = loss_value(
            step, cfg.mode, regex=cfg.tensor_regex, use_losses_collection=cfg.use_losses_collection
        )
        findings: list[Finding] = []
        if cfg.mode == "EVAL":
            # one validation pass: the EVAL steps after one training step, until training resumes
            key = t
            ends = (
                "TRAIN" in step.modes()
                or "GLOBAL" in step.modes()
                or (loss is not None and key != state.acc_key)
            )
        else:
            key = t // cfg.smoothing_steps
            ends = key != state.acc_key
        if state.acc_n and ends:
            findings = self._evaluation(state)
        if loss is not None and finite(loss):
            state.noise.add(loss)
            state.losses_seen += 1
            state.acc_sum += loss
            state.acc_n += 1
            state.acc_key = key
            state.acc_at = step.step
        return state, findings

    def finish(self, state: OscillatingLossState) -> list[Finding]:
        return self._evaluation(state) if state.acc_n else []

    def _threshold(self, state: OscillatingLossState, n: int) -> float:
        """The swing: ``swing`` when given, else the larger of ``swing_relative`` x the level and
        4 noises of a difference of two evaluations (each the mean of ``n`` losses)."""
        cfg = self.config
        if cfg.swing is not None:
            state.last_threshold = cfg.swing
            return cfg.swing
        sigma, level = state.noise.sigma(), state.noise.level()
        if sigma is None or level is None:
            return float("inf")  # too few losses to know the loss's scale: no swing yet
        state.last_threshold = max(
            cfg.swing_relative * abs(level), SWING_Z * math.sqrt(2.0) * block_noise(sigma, n)
        )
        return state.last_threshold

    def _evaluation(self, state: OscillatingLossState) -> list[Finding]:
        cfg = self.config
        value = state.acc_sum / state.acc_n
        n = state.acc_n
        state.acc_sum, state.acc_n = 0.0, 0
        swung = False
        if state.last is not None:
            delta = value - state.last
            direction = (delta > 0) - (delta < 0)
            if state.extreme is None:
                state.extreme = state.last
            if direction and state.direction and direction != state.direction:
                # the previous evaluation was a turning point: the move from the last one is a swing
                swung = abs(state.last - state.extreme) >= self._threshold(state, n)
                if cfg.swing is None:
                    # scale-free: a bounce is fast both ways; a restart's jump up is followed by a
                    # slow decline (a sawtooth), so only a fast swing after a fast swing counts
                    fast = swung and state.evaluated - state.extreme_at <= MAX_SWING_EVALUATIONS
                    swung, state.fast = fast and state.fast, fast
                state.extreme, state.extreme_at = state.last, state.evaluated
            if direction:
                state.direction = direction
        state.last = value
        state.evaluated += 1
        state.recent = (state.recent + ("1" if swung else "0"))[-cfg.window :]
        n = len(state.recent)
        if n < cfg.min_evaluations:
            return []
        state.judgements += 1
        swings = state.recent.count("1")
        share = 100.0 * swings / n
        if share >= cfg.swing_percent:
            return [
                self.finding(
                    state.acc_at,
                    f"{self.name}: the smoothed {cfg.mode} loss swung by >= {fmt(state.last_threshold)} "
                    + (
                        f"(swing={fmt(cfg.swing)})"
                        if cfg.swing is not None
                        else f"(swing_relative={fmt(cfg.swing_relative)} of its level, and 4 noises)"
                    )
                    + " from one "
                    f"extreme to the next in {swings} of the last {n} evaluations ({fmt(share)}%) >= "
                    f"swing_percent={fmt(cfg.swing_percent)}% (an evaluation: "
                    + (
                        "one validation pass"
                        if cfg.mode == "EVAL"
                        else f"{cfg.smoothing_steps} training steps"
                    )
                    + ").",
                    tensor=f"{cfg.mode} loss",
                    value=share,
                    threshold=cfg.swing_percent,
                )
            ]
        return []

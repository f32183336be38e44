"""Overfit: the validation loss turned up while the training loss kept falling (noise-aware)."""

from __future__ import annotations

from pydantic import Field

from trainguard.rules._common import (
    NonNegative,
    PositiveInt,
    RegexList,
    TrainingClock,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.noise import RobustNoise

#: trainguard's ``patience`` (SageMaker's is 1): consecutive evaluations over the threshold
DEFAULT_PATIENCE = 3
#: SageMaker's ratio_threshold, used only when it is given
SAGEMAKER_RATIO = 0.1
#: a rise (of the validation loss, of the gap) is real at this many noises
RISE_Z = 3.0
#: and material at this share of the best validation loss (a noiseless curve's rounding is not)
MATERIAL = 0.005


class OverfitConfig(RuleConfig):
    tensor_regex: RegexList = None
    #: training steps before which nothing is judged
    start_step: int = Field(default=0, ge=0)
    #: consecutive evaluations (None: ``DEFAULT_PATIENCE``)
    patience: PositiveInt | None = None
    #: given: SageMaker's test, (val - train) / train > ratio_threshold; None: the noise-aware test
    ratio_threshold: NonNegative | None = None

    @property
    def evaluations(self) -> int:
        return self.patience if self.patience is not None else DEFAULT_PATIENCE


class OverfitState(RuleState):
    clock: TrainingClock = Field(default_factory=TrainingClock)
    train_sum: float = 0.0
    train_n: int = 0
    #: mean training loss of the previous training phase (used when an evaluation follows
    #: another without training in between)
    last_train_mean: float | None = None
    eval_sum: float = 0.0
    eval_n: int = 0
    eval_last_step: int | None = None
    #: consecutive evaluations over the threshold
    over: int = 0
    evaluations: int = 0
    #: losses received per mode
    train_seen: int = 0
    eval_seen: int = 0
    #: the noise-aware test: the evaluations' validation losses and gaps, the best evaluation
    val_noise: RobustNoise = Field(default_factory=lambda: RobustNoise(size=16, order=2))
    gap_noise: RobustNoise = Field(default_factory=lambda: RobustNoise(size=16, order=2))
    best_val: float | None = None
    best_gap: float = 0.0
    best_train: float = 0.0


class Overfit(Rule[OverfitConfig, OverfitState]):
    """Fires when, for ``patience`` consecutive evaluations, the validation loss is above its
    best by more than its noise, the validation-minus-training gap is above the gap at that
    best by more than the gap's noise, and the training loss is below its value then: the
    model keeps fitting its training data while it gets worse on held-out data.

    Test (``ratio_threshold`` not given). Per evaluation: its mean EVAL loss ``val`` and the
    mean TRAIN loss of the training phase before it ``train``. The noises are the robust noises
    (``trainguard.rules.noise``, of second differences: an evaluation curve bends within 16
    evaluations) of the last 16 evaluations' ``val`` and ``val - train``; a rise
    counts at 3 x its noise and at least 0.5 % of the best ``val`` (so a noiseless curve's
    rounding is not a rise). Judged from the 8th evaluation on (the noises need 8). A stable
    gap is not overfitting, however large against a near-zero training loss (0.144 vs 0.065); a
    schedule restart raises the training loss too and is not overfitting.

    ``ratio_threshold`` given (SageMaker's test, its meaning kept): fires when
    ``(mean val loss - mean train loss) / |mean train loss| > ratio_threshold`` for
    ``patience`` consecutive evaluations.

    Reads TRAIN and EVAL losses (the ``losses`` collection, or scalars matching
    ``tensor_regex`` when given), from training step ``start_step`` on (SageMaker counted
    saved steps; trainguard counts training steps, see ``TrainingClock``).

    ``patience``: SageMaker's default is 1; trainguard's is 3 consecutive evaluations (one
    validation pass is a noisy sample); an explicit ``patience`` keeps SageMaker's meaning.

    - An *evaluation* is a run of consecutive saved steps with an EVAL loss. It is judged when
      it ends (the next step with a TRAIN loss and no EVAL loss, or the end of the job), or at
      once when a step holds both a TRAIN and an EVAL loss.
    - An evaluation with no train loss yet (or, for the ratio, a zero one) is skipped.

    False-alarm budget: under 1 per 100 healthy jobs: three evaluations in a row 3 noises
    above the best, with the gap growing and the training loss lower, is rare without a real
    turn of the validation loss.
    """

    name = "Overfit"
    Config = OverfitConfig
    State = OverfitState
    summary = "The validation loss turned up while the training loss kept falling: overfitting."
    method = (
        "patience=3 evaluations in a row: validation loss > its best + 3 x its robust noise, gap "
        "(val - train) > the gap at that best + 3 x its noise, training loss below its value then; "
        "ratio_threshold given: SageMaker's ratio"
    )
    false_alarm_budget = "under 1 per 100 healthy jobs: a stable gap, or a restart, never fires"
    advice = (
        "Add regularisation (weight decay, dropout, augmentation), get more data, use a smaller "
        "model, or stop earlier (keep the best checkpoint by validation loss)."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        use_losses = cfg.tensor_regex is None
        return (
            *loss_inputs(("TRAIN",), regex=cfg.tensor_regex, use_losses_collection=use_losses),
            *loss_inputs(("EVAL",), regex=cfg.tensor_regex, use_losses_collection=use_losses),
        )

    def coverage(self, state: OverfitState) -> Coverage:
        per_mode = len(self.reads()) // 2
        received = [state.train_seen] * per_mode + [state.eval_seen] * per_mode
        reason = ""
        if state.train_seen and state.eval_seen:
            reason = "no evaluation had a training phase with a non-zero mean loss before it"
        return self.covered(
            state.evaluations,
            "evaluations (EVAL vs TRAIN loss)",
            "compared",
            received=received,
            reason=reason,
        )

    def update(self, state: OverfitState, step: StepData) -> tuple[OverfitState, list[Finding]]:
        cfg = self.config
        if state.clock.tick(step) < cfg.start_step:
            return state, []
        use_losses = cfg.tensor_regex is None
        train = loss_value(step, "TRAIN", regex=cfg.tensor_regex, use_losses_collection=use_losses)
        val = loss_value(step, "EVAL", regex=cfg.tensor_regex, use_losses_collection=use_losses)
        state.train_seen += train is not None
        state.eval_seen += val is not None
        findings: list[Finding] = []
        if val is None and train is not None and state.eval_n:
            findings = self._close(state)
            if findings:
                return state, findings
        if train is not None:
            state.train_sum += train
            state.train_n += 1
        if val is not None:
            state.eval_sum += val
            state.eval_n += 1
            state.eval_last_step = step.step
            if train is not None:
                findings = self._close(state)
        return state, findings

    def finish(self, state: OverfitState) -> list[Finding]:
        return self._close(state) if state.eval_n else []

    def _close(self, state: OverfitState) -> list[Finding]:
        cfg = self.config
        val_mean = state.eval_sum / state.eval_n
        if state.train_n:
            state.last_train_mean = state.train_sum / state.train_n
        train_mean = state.last_train_mean
        at = state.eval_last_step if state.eval_last_step is not None else 0
        state.train_sum, state.train_n, state.eval_sum, state.eval_n = 0.0, 0, 0.0, 0
        if train_mean is None:
            return []

        if cfg.ratio_threshold is None:
            return self._judge_trend(state, val_mean, train_mean, at)
        if train_mean == 0:
            return []
        state.evaluations += 1
        ratio = (val_mean - train_mean) / abs(train_mean)
        state.over = state.over + 1 if ratio > cfg.ratio_threshold else 0
        if state.over >= cfg.evaluations:
            return [
                self.finding(
                    at,
                    f"{self.name}: mean EVAL loss {fmt(val_mean)} vs mean TRAIN loss {fmt(train_mean)}: "
                    f"ratio {fmt(ratio)} > ratio_threshold={fmt(cfg.ratio_threshold)} for {state.over} "
                    f"consecutive evaluation(s) (patience={cfg.evaluations}).",
                    tensor="EVAL loss",
                    value=ratio,
                    threshold=cfg.ratio_threshold,
                )
            ]
        return []

    def _judge_trend(self, state: OverfitState, val: float, train: float, at: int) -> list[Finding]:
        cfg = self.config
        state.evaluations += 1
        gap = val - train
        val_sigma, gap_sigma = state.val_noise.sigma(), state.gap_noise.sigma()
        state.val_noise.add(val)
        state.gap_noise.add(gap)
        if state.best_val is None or val < state.best_val:
            state.best_val, state.best_gap, state.best_train = val, gap, train
            state.over = 0
            return []
        if val_sigma is None or gap_sigma is None:
            return []
        floor = MATERIAL * abs(state.best_val)
        val_rise, gap_rise = val - state.best_val, gap - state.best_gap
        worse = (
            val_rise > max(RISE_Z * val_sigma, floor)
            and gap_rise > max(RISE_Z * gap_sigma, floor)
            and train < state.best_train
        )
        state.over = state.over + 1 if worse else 0
        if state.over < cfg.evaluations:
            return []
        return [
            self.finding(
                at,
                f"{self.name}: mean EVAL loss {fmt(val)} is {fmt(val_rise)} above its best "
                f"{fmt(state.best_val)} (noise {fmt(val_sigma)}) and the gap to the TRAIN loss "
                f"{fmt(train)} grew by {fmt(gap_rise)} "
                f"(noise {fmt(gap_sigma)}) while the TRAIN loss fell from {fmt(state.best_train)}, for "
                f"{state.over} consecutive evaluations (patience={cfg.evaluations}).",
                tensor="EVAL loss",
                value=val,
                threshold=state.best_val + max(RISE_Z * val_sigma, floor),
            )
        ]

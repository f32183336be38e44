"""Overfit: the validation loss is well above the training loss for ``patience`` evaluations."""

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

#: trainguard's ``patience`` (SageMaker's is 1): consecutive evaluations over the threshold
DEFAULT_PATIENCE = 3


class OverfitConfig(RuleConfig):
    tensor_regex: RegexList = None
    #: training steps before which nothing is judged
    start_step: int = Field(default=0, ge=0)
    #: consecutive evaluations (None: ``DEFAULT_PATIENCE``)
    patience: PositiveInt | None = None
    ratio_threshold: NonNegative = 0.1

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


class Overfit(Rule[OverfitConfig, OverfitState]):
    """Fires when ``(mean val loss - mean train loss) / mean train loss > ratio_threshold``
    for ``patience`` consecutive evaluations.

    Reads TRAIN and EVAL losses (the ``losses`` collection, or scalars matching
    ``tensor_regex`` when given), from training step ``start_step`` on (SageMaker counted
    saved steps; trainguard counts training steps, see ``TrainingClock``).

    ``patience``: SageMaker's default is 1, one evaluation over the threshold. One validation
    pass is a noisy sample (a few batches, a mini-batch training mean), and one evaluation
    over 10% fired on 98 of 100 healthy runs (issue 10). trainguard's default is 3
    consecutive evaluations; an explicit ``patience`` keeps SageMaker's meaning.

    Choices where the documentation left room:

    - An *evaluation* is a run of consecutive saved steps with an EVAL loss. It is judged when
      it ends (the next step with a TRAIN loss and no EVAL loss, or the end of the job), or at
      once when a step holds both a TRAIN and an EVAL loss. Its mean EVAL loss is compared
      with the mean TRAIN loss of the training phase just before it.
    - The denominator is ``abs(mean train loss)``; an evaluation with a zero train loss, or
      with no train loss yet, is skipped. The finding names the evaluation's last step.
    """

    name = "Overfit"
    Config = OverfitConfig
    State = OverfitState
    summary = "Validation loss exceeds training loss by more than ratio_threshold: overfitting."
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
        if train_mean is None or train_mean == 0:
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

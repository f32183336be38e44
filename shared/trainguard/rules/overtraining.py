"""Overtraining: the validation (or training) loss no longer improves."""

from __future__ import annotations

from pydantic import Field, model_validator

from trainguard.rules._common import (
    NonNegative,
    Percent,
    PositiveInt,
    TrainingClock,
    finite,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt
from trainguard.rules.noise import RobustNoise, median

#: the relative improvement of the TRAIN loss when neither ``delta`` nor ``delta_percent`` is
#: given (the validation loss is judged against its noise then)
DEFAULT_DELTA_PERCENT = 1.0
#: validation: an improvement is this many noises of the smoothed loss (a median of 3
#: evaluations has about 0.7 x one evaluation's noise)
IMPROVE_Z = 1.0
SMOOTH_EVALUATIONS = 3
#: smoothing of the TRAIN loss (exponential moving average weight, debiased) when judged
TRAIN_EMA = 0.9


class OvertrainingConfig(RuleConfig):
    #: training steps without improvement of the (smoothed) TRAIN loss; None: not judged
    patience_train: PositiveInt | None = None
    #: evaluations (EVAL phases) without improvement of the validation loss
    patience_validation: PositiveInt = 10
    #: SageMaker's absolute improvement, in loss units (None: ``delta_percent``)
    delta: NonNegative | None = None
    #: trainguard: the improvement as a percent of the best loss
    delta_percent: Percent | None = None

    @model_validator(mode="after")
    def _one_delta(self) -> OvertrainingConfig:
        if self.delta is not None and self.delta_percent is not None:
            raise ValueError("give delta (absolute) or delta_percent (relative), not both")
        return self

    def improved(self, loss: float, best: float) -> bool:
        if self.delta is not None:
            return loss < best - self.delta
        pct = self.delta_percent if self.delta_percent is not None else DEFAULT_DELTA_PERCENT
        return loss < best - abs(best) * pct / 100.0

    def delta_text(self) -> str:
        if self.delta is not None:
            return f"delta={fmt(self.delta)}"
        pct = self.delta_percent if self.delta_percent is not None else DEFAULT_DELTA_PERCENT
        return f"delta_percent={fmt(pct)}%"


class OvertrainingState(RuleState):
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: validation: the evaluation being collected (sum, count), its last global step
    eval_sum: float = 0.0
    eval_n: int = 0
    eval_at: int = 0
    best_validation: float | None = None
    stale_validation: int = 0
    evaluations: int = 0
    #: neither delta given: the last evaluations (smoothed by their median) and their noise
    recent_validation: list[float] = Field(default_factory=list, max_length=SMOOTH_EVALUATIONS)
    validation_noise: RobustNoise = Field(default_factory=lambda: RobustNoise(size=16, order=2))
    #: training: debiased EMA of the TRAIN loss, its best, and the training step of that best
    ema: float = 0.0
    ema_weight: float = 0.0
    best_train: float | None = None
    best_train_step: int | None = None
    train_seen: int = 0


class Overtraining(Rule[OvertrainingConfig, OvertrainingState]):
    """Fires when the validation loss has not improved for ``patience_validation`` evaluations,
    or (when ``patience_train`` is given) the training loss for ``patience_train`` training steps.

    Reads the ``losses`` collection in EVAL and TRAIN mode (mean over workers). An evaluation is
    a run of consecutive steps with an EVAL loss (one validation pass, however many batches):
    its mean is one value. Improvement of the validation loss, with neither ``delta`` nor
    ``delta_percent`` given: the median of the last 3 evaluations falls below the best such
    median by one noise of it (the evaluations' robust noise, ``trainguard.rules.noise``, over
    sqrt(3)): one lucky evaluation is not a new best, and a decline smaller than its noise
    over ``patience_validation`` evaluations is not an improvement. With SageMaker's absolute
    ``delta`` given: ``loss < best - delta``; with ``delta_percent``: ``loss < best * (1 -
    delta_percent/100)``. An improvement sets a new best and resets the count; a non-finite
    loss never improves.

    False-alarm budget: it fires on every job whose validation loss stops improving for 10
    evaluations (early stopping's signal, which is its purpose); a validation loss still
    falling by more than its noise over 10 evaluations does not fire.

    trainguard's defaults and why (issue 10, held-out clean runs):

    - ``delta``: SageMaker's 0.1 is absolute, in loss units: it means "improved by a lot" for a
      loss near 0.1 and "any noise" for a loss near 10. trainguard judges the validation loss
      against its own noise unless ``delta`` or ``delta_percent`` is given (and the TRAIN loss,
      when ``patience_train`` is given, on a 1 % relative improvement).
    - ``patience_train``: SageMaker's 5 counted saved steps; at its 500-step save cadence that
      was 2,500 training steps, with a loss every step it is 5 noisy mini-batches (it fired at
      step 5 on every clean run). trainguard judges the validation loss by default (early
      stopping's signal: 10 of 10 clean alerts down to 3 of 10); given explicitly,
      ``patience_train`` counts training steps and the TRAIN loss is smoothed (debiased
      exponential moving average, weight 0.9) before it is compared.
    - ``patience_validation`` 10 (SageMaker's) counts evaluations, not EVAL batches.
    """

    name = "Overtraining"
    Config = OvertrainingConfig
    State = OvertrainingState
    summary = "The validation (or training) loss stopped improving: the model is overtraining."
    method = (
        "patience_validation=10 evaluations without the median of 3 evaluations falling below its "
        "best by one robust noise; delta or delta_percent given: that improvement"
    )
    false_alarm_budget = "fires on every job whose validation loss stops improving (early stopping's signal)"
    advice = (
        "Stop training (keep the best checkpoint), add early stopping, lower the learning rate "
        "or add regularisation if the validation loss is rising."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        inputs = loss_inputs(("EVAL",), what="EVAL (validation) losses")
        if self.config.patience_train is not None:
            inputs += loss_inputs(("TRAIN",), what="TRAIN losses", required=False)
        return inputs

    def coverage(self, state: OvertrainingState) -> Coverage:
        received = [state.evaluations] + (
            [state.train_seen] if self.config.patience_train is not None else []
        )
        return self.covered(
            state.evaluations + state.train_seen, "evaluations and losses", "judged", received=received
        )

    def update(self, state: OvertrainingState, step: StepData) -> tuple[OvertrainingState, list[Finding]]:
        cfg = self.config
        t = state.clock.tick(step)
        val = loss_value(step, "EVAL")
        train = loss_value(step, "TRAIN") if cfg.patience_train is not None else None
        findings: list[Finding] = []
        if val is None and state.eval_n and ("TRAIN" in step.modes() or "GLOBAL" in step.modes()):
            findings += self._close_evaluation(state)
        if val is not None:
            state.eval_sum += val
            state.eval_n += 1
            state.eval_at = step.step
        if train is not None and cfg.patience_train is not None and not findings:
            findings += self._observe_train(state, train, t, step.step, cfg.patience_train)
        return state, findings[:1]

    def finish(self, state: OvertrainingState) -> list[Finding]:
        return self._close_evaluation(state) if state.eval_n else []

    def _close_evaluation(self, state: OvertrainingState) -> list[Finding]:
        cfg = self.config
        loss = state.eval_sum / state.eval_n
        state.eval_sum, state.eval_n = 0.0, 0
        state.evaluations += 1
        best = state.best_validation
        if cfg.delta is None and cfg.delta_percent is None:
            return self._close_noise_aware(state, loss)
        if finite(loss) and (best is None or cfg.improved(loss, best)):
            state.best_validation, state.stale_validation = loss, 0
            return []
        state.stale_validation += 1
        if state.stale_validation < cfg.patience_validation:
            return []
        return [
            self.finding(
                state.eval_at,
                f"{self.name}: validation (EVAL) loss {fmt(loss)} has not improved on the best "
                f"{fmt(state.best_validation)} by {cfg.delta_text()} for {state.stale_validation} "
                f"evaluations (patience_validation={cfg.patience_validation}).",
                tensor="EVAL loss",
                value=float(state.stale_validation),
                threshold=float(cfg.patience_validation),
            )
        ]

    def _close_noise_aware(self, state: OvertrainingState, loss: float) -> list[Finding]:
        """An improvement: the median of the last 3 evaluations below the best such median by
        one noise of it (the evaluations' robust noise over sqrt(3)); a lucky evaluation is
        not a new best, and a fall smaller than the noise over ``patience_validation``
        evaluations is not improving."""
        cfg = self.config
        if finite(loss):
            sigma = state.validation_noise.sigma()
            state.validation_noise.add(loss)
            state.recent_validation = [*state.recent_validation, loss][-SMOOTH_EVALUATIONS:]
            smoothed = median(state.recent_validation)
            best = state.best_validation
            margin = IMPROVE_Z * sigma / SMOOTH_EVALUATIONS**0.5 if sigma is not None else 0.0
            if best is None or smoothed < best - margin:
                state.best_validation, state.stale_validation = smoothed, 0
                return []
        state.stale_validation += 1
        if state.stale_validation < cfg.patience_validation:
            return []
        return [
            self.finding(
                state.eval_at,
                f"{self.name}: validation (EVAL) loss {fmt(loss)} (median of the last evaluations "
                f"{fmt(median(state.recent_validation))}) has not improved on the best "
                f"{fmt(state.best_validation)} by its noise for {state.stale_validation} evaluations "
                f"(patience_validation={cfg.patience_validation}).",
                tensor="EVAL loss",
                value=float(state.stale_validation),
                threshold=float(cfg.patience_validation),
            )
        ]

    def _observe_train(
        self, state: OvertrainingState, loss: float, t: int, at: int, patience: int
    ) -> list[Finding]:
        cfg = self.config
        state.train_seen += 1
        if not finite(loss):
            smoothed = loss
        else:
            state.ema = TRAIN_EMA * state.ema + (1 - TRAIN_EMA) * loss
            state.ema_weight = TRAIN_EMA * state.ema_weight + (1 - TRAIN_EMA)
            smoothed = state.ema / state.ema_weight
        best = state.best_train
        if finite(smoothed) and (best is None or cfg.improved(smoothed, best)):
            state.best_train, state.best_train_step = smoothed, t
            return []
        since = state.best_train_step if state.best_train_step is not None else t
        if t - since < patience:
            return []
        return [
            self.finding(
                at,
                f"{self.name}: training (TRAIN) loss, smoothed {fmt(smoothed)}, has not improved on the best "
                f"{fmt(best)} by {cfg.delta_text()} for {t - since} training steps "
                f"(patience_train={patience}).",
                tensor="TRAIN loss",
                value=float(t - since),
                threshold=float(patience),
            )
        ]

"""Overtraining: neither training nor validation loss improves any more."""

from __future__ import annotations

from trainguard.format.documents import Mode
from trainguard.rules._common import NonNegative, PositiveInt, finite, loss_inputs, loss_value
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt


class OvertrainingConfig(RuleConfig):
    patience_train: PositiveInt = 5
    patience_validation: PositiveInt = 10
    delta: NonNegative = 0.1


class OvertrainingState(RuleState):
    best_train: float | None = None
    stale_train: int = 0
    best_validation: float | None = None
    stale_validation: int = 0
    #: losses judged per mode
    train_seen: int = 0
    eval_seen: int = 0


class Overtraining(Rule[OvertrainingConfig, OvertrainingState]):
    """Fires when the TRAIN loss has not improved by at least ``delta`` for ``patience_train``
    saved TRAIN steps, or the EVAL loss for ``patience_validation`` saved EVAL steps.

    Reads the ``losses`` collection in TRAIN and EVAL mode (mean over workers). Choices:
    ``delta`` is absolute (loss units), as in early stopping's ``min_delta``; an improvement
    means ``loss < best - delta``, which resets the count and sets a new best; each saved step
    with a loss is one evaluation (SageMaker documents "the number of steps to wait"); a
    non-finite loss never improves.
    """

    name = "Overtraining"
    Config = OvertrainingConfig
    State = OvertrainingState
    summary = "Training or validation loss stopped improving by delta: the model is overtraining."
    advice = (
        "Stop training (keep the best checkpoint), add early stopping, lower the learning rate "
        "or add regularisation if the validation loss is rising."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        # either loss alone is a check (a job without validation is judged on training)
        return (
            *loss_inputs(("TRAIN",), required=False, what="TRAIN (training) losses"),
            *loss_inputs(("EVAL",), required=False, what="EVAL (validation) losses"),
        )

    def coverage(self, state: OvertrainingState) -> Coverage:
        return self.covered(
            state.train_seen + state.eval_seen,
            "losses",
            received=[state.train_seen, state.eval_seen],
        )

    def update(self, state: OvertrainingState, step: StepData) -> tuple[OvertrainingState, list[Finding]]:
        cfg = self.config
        checks: tuple[tuple[Mode, int], ...] = (
            ("TRAIN", cfg.patience_train),
            ("EVAL", cfg.patience_validation),
        )
        for mode, patience in checks:
            loss = loss_value(step, mode)
            if loss is None:
                continue
            if mode == "TRAIN":
                state.train_seen += 1
            else:
                state.eval_seen += 1
            finding = self._observe(state, mode, loss, patience, step.step)
            if finding:
                return state, [finding]
        return state, []

    def _observe(
        self, state: OvertrainingState, mode: Mode, loss: float, patience: int, at: int
    ) -> Finding | None:
        train = mode == "TRAIN"
        best = state.best_train if train else state.best_validation
        stale = state.stale_train if train else state.stale_validation
        if (best is None and finite(loss)) or (
            best is not None and finite(loss) and loss < best - self.config.delta
        ):
            best, stale = loss, 0
        else:
            stale += 1
        if train:
            state.best_train, state.stale_train = best, stale
        else:
            state.best_validation, state.stale_validation = best, stale
        if stale >= patience:
            which = "training" if train else "validation"
            param = "patience_train" if train else "patience_validation"
            return self.finding(
                at,
                f"{self.name}: {which} ({mode}) loss {fmt(loss)} has not improved on the best {fmt(best)} "
                f"by delta={fmt(self.config.delta)} for {stale} saved steps ({param}={patience}).",
                tensor=f"{mode} loss",
                value=float(stale),
                threshold=float(patience),
            )
        return None

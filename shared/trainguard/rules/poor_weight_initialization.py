"""PoorWeightInitialization: signs of a bad initialisation in the first steps."""

from __future__ import annotations

import math

from pydantic import Field

from trainguard.rules._common import (
    NonNegative,
    PositiveInt,
    Regex,
    TrainingClock,
    finite,
    loss_inputs,
    loss_value,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: SageMaker's default ``activation_inputs_regex``: the hook's ``relu_input`` collection
DEFAULT_REGEX = ".*relu_input"


class PoorWeightInitializationConfig(RuleConfig):
    activation_inputs_regex: Regex = DEFAULT_REGEX
    threshold: NonNegative = 10.0
    distribution_range: NonNegative = 0.001
    patience: PositiveInt = 5
    steps: PositiveInt = 10


class PoorWeightInitializationState(RuleState):
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: the first training step seen (the window is ``steps`` training steps from it)
    first: int | None = None
    #: steps analysed so far
    steps_seen: int = 0
    best_step: int | None = None
    best_loss: float | None = None
    stale: int = 0
    #: judgements per check: variance ratios, gradient spreads, losses
    variance_checks: int = 0
    spread_checks: int = 0
    loss_checks: int = 0


class PoorWeightInitialization(Rule[PoorWeightInitializationConfig, PoorWeightInitializationState]):
    """Within the first ``steps`` saved steps, fires on any of:

    1. activation inputs (tensors matching ``activation_inputs_regex``): on one worker, the
       largest variance across layers divided by the smallest is > ``threshold``;
    2. gradients (``gradients`` collection): a tensor's ``p95 - p5`` spread (``percentiles``
       statistic) is < ``distribution_range`` (SageMaker: "the minimum difference between
       the 5th and 95th percentiles");
    3. the TRAIN loss has not decreased for ``patience`` saved steps in a row.

    Choices: ``steps`` and ``patience`` count training steps from the first one seen (the
    rule looks at the initialisation, not at however many saves happened; a save interval
    of 500 sees one step in a 10-step window); a zero smallest variance gives an infinite
    ratio (fires unless every layer has zero variance); the gradient check fires when every
    gradient tensor of a step is that narrow (one recurrent ``weight_hh`` gradient is
    narrow at step 0 in healthy GRUs: 58 of 100 clean runs alarmed with "any tensor", issue
    10); gradients without percentiles are skipped; after ``steps`` the rule is idle.
    """

    name = "PoorWeightInitialization"
    Config = PoorWeightInitializationConfig
    State = PoorWeightInitializationState
    summary = "Activation variances, gradient spread or early loss suggest a poor weight initialisation."
    advice = (
        "Use an initialisation matched to the activation (He for ReLU, Xavier/Glorot for tanh), "
        "check biases start near zero, and add normalisation layers."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        regex = self.config.activation_inputs_regex
        source = ("relu_input",) if regex == DEFAULT_REGEX else ()
        # any one of the three checks is a check of the initialisation
        return (
            RuleInput(
                "activation inputs",
                collections=source,
                regex=(regex,),
                statistics=("numel", "std"),
                required=False,
            ),
            RuleInput("gradients", collections=("gradients",), statistics=("percentiles",), required=False),
            *loss_inputs(("TRAIN",), required=False),
        )

    def coverage(self, state: PoorWeightInitializationState) -> Coverage:
        return self.covered(
            state.variance_checks + state.spread_checks + state.loss_checks,
            "activation variances, gradient spreads and losses",
            received=[state.variance_checks, state.spread_checks, state.loss_checks],
        )

    def update(
        self, state: PoorWeightInitializationState, step: StepData
    ) -> tuple[PoorWeightInitializationState, list[Finding]]:
        cfg = self.config
        t = state.clock.tick(step)
        state.first = t if state.first is None else state.first
        if t >= state.first + cfg.steps:
            return state, []
        state.steps_seen += 1
        for worker in step.workers:
            variances = [
                (v.name, v.stats.std**2)
                for v in step.select(self.reads()[0])
                if v.worker == worker.worker
                and v.stats is not None
                and v.stats.numel is not None
                and v.stats.numel > 1
                and v.stats.std is not None
                and finite(v.stats.std)
            ]
            if len(variances) >= 2:
                state.variance_checks += 1
                (hi_name, hi), (lo_name, lo) = (
                    max(variances, key=lambda x: x[1]),
                    min(variances, key=lambda x: x[1]),
                )
                ratio = math.inf if lo == 0 and hi > 0 else (hi / lo if lo else 1.0)
                if ratio > cfg.threshold:
                    return state, [
                        self.finding(
                            step.step,
                            f"{self.name}: activation-input variance ratio {fmt(ratio)} (max "
                            f"{fmt(hi)} in {hi_name}, "
                            f"min {fmt(lo)} in {lo_name}, worker {worker.worker}) > "
                            f"threshold={fmt(cfg.threshold)}.",
                            tensor=hi_name,
                            value=ratio,
                            threshold=cfg.threshold,
                        )
                    ]
        spreads: list[tuple[str, float]] = []
        for view in step.tensors(collections=["gradients"]):
            pct = view.stats.percentiles if view.stats is not None else None
            if not pct or "5" not in pct or "95" not in pct:
                continue
            spread = pct["95"] - pct["5"]
            if finite(spread):
                spreads.append((view.name, spread))
        if spreads:
            state.spread_checks += 1
            widest_name, widest = max(spreads, key=lambda x: x[1])
            if widest < cfg.distribution_range:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: every gradient's p95-p5 spread is below distribution_range="
                        f"{fmt(cfg.distribution_range)} (the widest, {widest_name}: {fmt(widest)}; "
                        f"{len(spreads)} tensors).",
                        tensor=widest_name,
                        value=widest,
                        threshold=cfg.distribution_range,
                    )
                ]
        loss = loss_value(step, "TRAIN")
        if loss is not None:
            state.loss_checks += 1
            if finite(loss) and (state.best_loss is None or loss < state.best_loss):
                state.best_loss, state.stale, state.best_step = loss, 0, t
            else:
                state.stale = t - (state.best_step if state.best_step is not None else state.first)
            if state.stale >= cfg.patience:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: TRAIN loss {fmt(loss)} has not decreased below "
                        f"{fmt(state.best_loss)} for "
                        f"{state.stale} training steps (patience={cfg.patience}) within the first "
                        f"{cfg.steps} training steps.",
                        tensor="TRAIN loss",
                        value=float(state.stale),
                        threshold=float(cfg.patience),
                    )
                ]
        return state, []

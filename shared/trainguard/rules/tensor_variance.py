"""TensorVariance: a selected tensor's variance is above a maximum or below a minimum."""

from __future__ import annotations

from pydantic import model_validator

from trainguard.rules._common import NameList, NonNegative, RegexList, finite, select
from trainguard.rules.base import Finding, Rule, RuleConfig, RuleState, StepData, fmt


class TensorVarianceConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    max_threshold: NonNegative | None = None
    min_threshold: NonNegative | None = None

    @model_validator(mode="after")
    def _ordered_thresholds(self) -> TensorVarianceConfig:
        if (
            self.max_threshold is not None
            and self.min_threshold is not None
            and (self.min_threshold > self.max_threshold)
        ):
            raise ValueError("min_threshold must not exceed max_threshold")
        return self


class TensorVarianceState(RuleState):
    tensors_checked: int = 0


class TensorVariance(Rule[TensorVarianceConfig, TensorVarianceState]):
    """Fires when ``std**2`` of a selected tensor is > ``max_threshold`` or < ``min_threshold``.

    Reads the ``std`` statistic (population variance) of tensors in ``collection_names`` or
    matching ``tensor_regex`` (neither: every tensor). Choices: with neither threshold (the
    SageMaker defaults, which the SDK sends as they are) the rule is accepted and cannot fire,
    and its configuration carries a note saying so; tensors with fewer than two elements or
    a non-finite std are skipped.
    """

    name = "TensorVariance"
    Config = TensorVarianceConfig
    State = TensorVarianceState
    summary = "A tensor's variance is above max_threshold or below min_threshold."
    advice = (
        "Very high variance: lower the learning rate, clip gradients, normalise. Very low "
        "variance: the tensor has collapsed; check initialisation and dead units."
    )

    def update(self, state: TensorVarianceState, step: StepData) -> tuple[TensorVarianceState, list[Finding]]:
        cfg = self.config
        for view, stats in select(step, cfg.collection_names, cfg.tensor_regex):
            if stats.numel < 2 or not finite(stats.std):
                continue
            state.tensors_checked += 1
            var = stats.std * stats.std
            where = f"{view.name} (worker {view.worker}, {view.mode})"
            if cfg.max_threshold is not None and var > cfg.max_threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: variance of {where} is {fmt(var)} > "
                        f"max_threshold={fmt(cfg.max_threshold)}.",
                        tensor=view.name,
                        value=var,
                        threshold=cfg.max_threshold,
                    )
                ]
            if cfg.min_threshold is not None and var < cfg.min_threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: variance of {where} is {fmt(var)} < "
                        f"min_threshold={fmt(cfg.min_threshold)}.",
                        tensor=view.name,
                        value=var,
                        threshold=cfg.min_threshold,
                    )
                ]
        return state, []

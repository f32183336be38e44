"""TensorVariance: a selected tensor's variance is above a maximum or below a minimum."""

from __future__ import annotations

from pydantic import model_validator

from trainguard.rules._common import (
    NameList,
    NonNegative,
    RegexList,
    finite,
    missing_statistic,
    select,
    tensor_input,
)
from trainguard.rules._structure import BY_CONSTRUCTION, structural, structural_reason
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: trainguard's defaults when neither threshold is given (SageMaker has none: both None)
DEFAULT_MAX = 10.0
DEFAULT_MIN = 1e-5
#: trainguard's default selection when neither collection_names nor tensor_regex is given
DEFAULT_COLLECTIONS = ("weights",)


class TensorVarianceConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    max_threshold: NonNegative | None = None
    min_threshold: NonNegative | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TensorVarianceConfig:
        if (
            self.max_threshold is not None
            and self.min_threshold is not None
            and (self.min_threshold > self.max_threshold)
        ):
            raise ValueError("min_threshold must not exceed max_threshold")
        return self

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(min, max) in force: trainguard's defaults when neither threshold was given."""
        if self.max_threshold is None and self.min_threshold is None:
            return DEFAULT_MIN, DEFAULT_MAX
        return self.min_threshold, self.max_threshold

    @property
    def defaulted(self) -> bool:
        """Neither collection_names nor tensor_regex: trainguard's default selection (weights)."""
        return not self.collection_names and not self.tensor_regex


class TensorVarianceState(RuleState):
    tensors_checked: int = 0
    tensors_seen: int = 0
    #: of those, constant by the model's construction: not judged
    structural: int = 0


class TensorVariance(Rule[TensorVarianceConfig, TensorVarianceState]):
    """Fires when ``std**2`` of a selected tensor is > ``max_threshold`` or < ``min_threshold``.

    Reads the ``std`` statistic (population variance) of tensors in ``collection_names`` or
    matching ``tensor_regex``. Tensors with fewer than two elements or a non-finite std are
    skipped; a threshold given as None is not checked (SageMaker's meaning).

    trainguard's defaults (SageMaker has none: with both thresholds None its rule could never
    fire): with neither threshold given, ``min_threshold`` 1e-5 and ``max_threshold`` 10; with
    neither selection given, the ``weights`` collection, and only weight tensors of two or more
    dimensions (a normalisation layer's scale starts constant, at variance 0, by design). Those
    catch a zero or a far too large initialisation with no alert on 10 held-out clean runs
    (issue 10). Limit: PyTorch's default initialisation gives variance 1/(3·fan_in), below 1e-5
    from a fan-in of ~33,000; set ``min_threshold`` for models that wide.

    Tensors constant by the model's construction (the manifest's structure: a bias feeding
    BatchNorm, an attention key bias; ``trainguard.rules._structure``) are not judged, even
    when selected; frozen weights are (a collapsed frozen weight is a bad load).
    """

    name = "TensorVariance"
    Config = TensorVarianceConfig
    State = TensorVarianceState
    summary = "A tensor's variance is above max_threshold or below min_threshold."
    advice = (
        "Very high variance: lower the learning rate, clip gradients, normalise. Very low "
        "variance: the tensor has collapsed; check initialisation and dead units."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            tensor_input(
                cfg.collection_names,
                cfg.tensor_regex,
                ("numel", "std"),
                default_collections=DEFAULT_COLLECTIONS,
            ),
        )

    def coverage(self, state: TensorVarianceState) -> Coverage:
        reason = missing_statistic(state.tensors_seen, "tensors", "numel", "std")
        if state.structural and state.structural == state.tensors_seen:
            reason = structural_reason(state.structural, "tensors")
        return self.covered(
            state.tensors_checked, "tensor variances", received=[state.tensors_seen], reason=reason
        )

    def update(self, state: TensorVarianceState, step: StepData) -> tuple[TensorVarianceState, list[Finding]]:
        cfg = self.config
        low, high = cfg.bounds
        for view, stats in select(
            step, cfg.collection_names, cfg.tensor_regex, default_collections=DEFAULT_COLLECTIONS
        ):
            state.tensors_seen += 1
            if structural(step.structure, view.name, BY_CONSTRUCTION):
                state.structural += 1
                continue
            if cfg.defaulted and len(view.record.shape) < 2:
                continue  # biases and normalisation scales are not judged by default
            if stats.numel is None or stats.numel < 2 or stats.std is None or not finite(stats.std):
                continue
            state.tensors_checked += 1
            var = stats.std * stats.std
            where = f"{view.name} (worker {view.worker}, {view.mode})"
            if high is not None and var > high:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: variance of {where} is {fmt(var)} > max_threshold={fmt(high)}.",
                        tensor=view.name,
                        value=var,
                        threshold=high,
                    )
                ]
            if low is not None and var < low:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: variance of {where} is {fmt(var)} < min_threshold={fmt(low)}.",
                        tensor=view.name,
                        value=var,
                        threshold=low,
                    )
                ]
        return state, []

"""CheckInputImages: input images do not look normalised (mean far from zero)."""

from __future__ import annotations

from pydantic import Field

from trainguard.rules._common import NonNegative, PositiveInt, Regex, finite
from trainguard.rules.base import Finding, Rule, RuleConfig, RuleState, StepData, fmt


class CheckInputImagesConfig(RuleConfig):
    threshold_mean: NonNegative = 0.2
    threshold_samples: PositiveInt = 500
    regex: Regex = ".*hybridsequential0_input_0"
    channel: int = Field(default=1, ge=0)


class CheckInputImagesState(RuleState):
    #: running sum of element values and element count, and images seen
    value_sum: float = 0.0
    elements: int = 0
    images: int = 0


class CheckInputImages(Rule[CheckInputImagesConfig, CheckInputImagesState]):
    """Once at least ``threshold_samples`` images were seen, fires when ``abs(mean)`` of all
    input elements so far is > ``threshold_mean``.

    Reads the ``mean``, ``numel`` and ``samples`` statistics of tensors matching ``regex``
    (every worker and mode; images are counted by ``samples``, else the first dimension).

    Approximation: SageMaker checks the mean per channel (``channel`` is the channel axis);
    the hook's statistics are per tensor, so the mean here is over all channels. An input
    normalised per channel passes either way; an input with channels offset in opposite
    directions would pass here but not in SageMaker. ``channel`` is accepted and validated.
    """

    name = "CheckInputImages"
    Config = CheckInputImagesConfig
    State = CheckInputImagesState
    summary = "Input images are not normalised: their mean is far from zero."
    advice = "Normalise the inputs (subtract the dataset mean and divide by its std per channel)."

    def update(
        self, state: CheckInputImagesState, step: StepData
    ) -> tuple[CheckInputImagesState, list[Finding]]:
        cfg = self.config
        seen = False
        for view in step.tensors(regex=cfg.regex):
            stats = view.stats
            if stats is None or stats.numel == 0 or not finite(stats.mean):
                continue
            seen = True
            state.value_sum += stats.mean * stats.numel
            state.elements += stats.numel
            shape = view.record.shape
            state.images += stats.samples if stats.samples is not None else (shape[0] if shape else 1)
        if not seen or state.images < cfg.threshold_samples or not state.elements:
            return state, []
        mean = state.value_sum / state.elements
        if abs(mean) > cfg.threshold_mean:
            return state, [
                self.finding(
                    step.step,
                    f"{self.name}: mean of the input images ({cfg.regex}) over {state.images} images "
                    f"is {fmt(mean)}; "
                    f"abs(mean) > threshold_mean={fmt(cfg.threshold_mean)}.",
                    tensor=cfg.regex,
                    value=mean,
                    threshold=cfg.threshold_mean,
                )
            ]
        return state, []

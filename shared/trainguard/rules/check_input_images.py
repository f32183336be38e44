"""CheckInputImages: input images do not look normalised (mean far from zero)."""

from __future__ import annotations

from pydantic import Field

from trainguard.rules._common import NonNegative, PositiveInt, Regex, finite, missing_statistic, select
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: SageMaker's default ``regex``: MXNet Gluon's name for a HybridSequential's first input
SAGEMAKER_REGEX = ".*hybridsequential0_input_0"
#: trainguard's default selection: the model inputs the hook saves, of image shape
DEFAULT_COLLECTIONS = ("inputs",)
#: an image batch: (N, C, H, W) or (N, H, W, C), or more (video)
IMAGE_NDIM = 4


class CheckInputImagesConfig(RuleConfig):
    threshold_mean: NonNegative = 0.2
    threshold_samples: PositiveInt = 500
    #: None: image-shaped tensors of the ``inputs`` collection (see the rule's docstring)
    regex: Regex | None = None
    channel: int = Field(default=1, ge=0)


class CheckInputImagesState(RuleState):
    #: running sum of element values and element count, and images seen
    value_sum: float = 0.0
    elements: int = 0
    images: int = 0
    #: input tensors received (with or without the statistics)
    tensors_seen: int = 0
    #: judgements made (once threshold_samples images were seen, one per step)
    judgements: int = 0


class CheckInputImages(Rule[CheckInputImagesConfig, CheckInputImagesState]):
    """Once at least ``threshold_samples`` images were seen, fires when ``abs(mean)`` of all
    input elements so far is > ``threshold_mean``.

    Reads the ``mean``, ``numel`` and ``samples`` statistics of the selected tensors (every
    worker and mode; images are counted by ``samples``, else the first dimension).

    Default selection: SageMaker's default ``regex``, ``.*hybridsequential0_input_0``, is MXNet
    Gluon's name for a model's input, which no trainguard hook writes (the rule saw nothing
    in any job and passed). trainguard's default (``regex`` None) is the tensors of the
    ``inputs`` collection (``model_input_<i>``) with at least 4 dimensions (image batches).
    Given explicitly, SageMaker's regex keeps its meaning.

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

    def reads(self) -> tuple[RuleInput, ...]:
        regex = self.config.regex
        return (
            RuleInput(
                "input images" if regex is None else f"tensors matching {regex!r}",
                collections=DEFAULT_COLLECTIONS if regex is None else (),
                regex=(regex,) if regex is not None else (),
                statistics=("numel", "mean", "samples"),
            ),
        )

    def coverage(self, state: CheckInputImagesState) -> Coverage:
        cfg = self.config
        reason = missing_statistic(state.tensors_seen, "input tensors", "numel", "mean")
        if state.images:
            reason = (
                f"only {state.images:,} images arrived, fewer than threshold_samples={cfg.threshold_samples}"
            )
        return self.covered(
            state.judgements,
            f"judgements of the input mean (over {state.images:,} images)",
            "made",
            received=[state.tensors_seen],
            reason=reason,
        )

    def update(
        self, state: CheckInputImagesState, step: StepData
    ) -> tuple[CheckInputImagesState, list[Finding]]:
        cfg = self.config
        seen = False
        regex = (cfg.regex,) if cfg.regex is not None else None
        for view, stats in select(step, None, regex, default_collections=DEFAULT_COLLECTIONS):
            shape = view.record.shape
            if regex is None and len(shape) < IMAGE_NDIM:
                continue  # the default selection: image batches only
            state.tensors_seen += 1
            if not stats.numel or stats.mean is None or not finite(stats.mean):
                continue
            seen = True
            state.value_sum += stats.mean * stats.numel
            state.elements += stats.numel
            state.images += stats.samples if stats.samples is not None else (shape[0] if shape else 1)
        if not seen or state.images < cfg.threshold_samples or not state.elements:
            return state, []
        state.judgements += 1
        mean = state.value_sum / state.elements
        if abs(mean) > cfg.threshold_mean:
            where = cfg.regex if cfg.regex is not None else "the inputs collection"
            return state, [
                self.finding(
                    step.step,
                    f"{self.name}: mean of the input images ({where}) over {state.images} images "
                    f"is {fmt(mean)}; "
                    f"abs(mean) > threshold_mean={fmt(cfg.threshold_mean)}.",
                    tensor=cfg.regex or "inputs",
                    value=mean,
                    threshold=cfg.threshold_mean,
                )
            ]
        return state, []

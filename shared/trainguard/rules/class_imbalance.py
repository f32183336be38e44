"""ClassImbalance: the label distribution is skewed, or a class is mostly mispredicted."""

from __future__ import annotations

from pydantic import Field

from trainguard.rules._common import NonNegative, PositiveInt, Regex, class_ids
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: SageMaker's default regexes name the hook's ``labels`` and ``predictions`` collections
DEFAULT_LABELS = ".*labels"
DEFAULT_PREDICTIONS = ".*predictions"

#: distinct classes counted; labels of further classes go to ``other``
MAX_CLASSES = 256


class ClassImbalanceConfig(RuleConfig):
    threshold_imbalance: NonNegative = 10.0
    threshold_misprediction: NonNegative = 0.7
    samples: PositiveInt = 500
    argmax: bool = False
    labels_regex: Regex = DEFAULT_LABELS
    predictions_regex: Regex = DEFAULT_PREDICTIONS


class ClassImbalanceState(RuleState):
    #: class id (as a string: JSON keys) -> labels seen, and -> labels mispredicted
    counts: dict[str, int] = Field(default_factory=dict)
    wrong: dict[str, int] = Field(default_factory=dict)
    total: int = 0
    other: int = 0
    #: judgements made (one per step once ``samples`` labels were seen)
    judgements: int = 0
    #: label tensors received, and steps whose predictions could be paired with the labels
    label_tensors: int = 0
    paired: int = 0


class ClassImbalance(Rule[ClassImbalanceConfig, ClassImbalanceState]):
    """Once at least ``samples`` labels were seen, fires when the largest class count divided
    by the smallest is > ``threshold_imbalance``, or when a class's misprediction rate
    (predictions != label over that class's labels) is > ``threshold_misprediction``.

    Reads the ``values`` statistic (every element; the hook sends it for small tensors) of
    the tensor matching ``labels_regex`` and the one matching ``predictions_regex``, per
    worker and mode (all modes, accumulated over the job). With ``argmax`` the predictions
    are scores of shape (N, C) and the predicted class is each row's argmax.

    Choices: the smallest count is over classes seen at least once (a class never seen
    cannot be counted); a step whose labels and predictions differ in length counts its
    labels but no mispredictions; at most ``MAX_CLASSES`` classes are counted (the state
    stays small), later new classes only add to ``other``. The first matching tensor of
    each kind per worker and mode is used.
    """

    name = "ClassImbalance"
    Config = ClassImbalanceConfig
    State = ClassImbalanceState
    summary = "The training labels are imbalanced, or a class is mostly mispredicted."
    advice = (
        "Resample or reweight the classes (class weights, oversampling, focal loss), collect "
        "more data for rare classes, and check per-class metrics rather than accuracy."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            RuleInput(
                "labels",
                collections=("labels",) if cfg.labels_regex == DEFAULT_LABELS else (),
                regex=(cfg.labels_regex,),
                statistics=("values",),
            ),
            RuleInput(
                "predictions",
                collections=("predictions",) if cfg.predictions_regex == DEFAULT_PREDICTIONS else (),
                regex=(cfg.predictions_regex,),
                statistics=("values",),
                required=False,
            ),
        )

    def coverage(self, state: ClassImbalanceState) -> Coverage:
        reason = ""
        if state.label_tensors:
            reason = (
                f"{state.total:,} labels arrived, fewer than samples={self.config.samples}"
                if state.total
                else f"{state.label_tensors:,} label tensors arrived without the 'values' statistic"
            )
        return self.covered(
            state.judgements,
            f"judgements of the class distribution (over {state.total:,} labels)",
            "made",
            received=[state.label_tensors, state.paired],
            reason=reason,
        )

    def update(self, state: ClassImbalanceState, step: StepData) -> tuple[ClassImbalanceState, list[Finding]]:
        cfg = self.config
        seen = False
        for header in step.workers:
            for mode in header.modes:
                labels_view = next(
                    (v for v in step.tensors(mode, regex=cfg.labels_regex) if v.worker == header.worker), None
                )
                if labels_view is None:
                    continue
                state.label_tensors += 1
                labels = class_ids(labels_view)
                if labels is None:
                    continue
                preds_view = next(
                    (
                        v
                        for v in step.tensors(mode, regex=cfg.predictions_regex)
                        if v.worker == header.worker and v.name != labels_view.name
                    ),
                    None,
                )
                preds = class_ids(preds_view, cfg.argmax) if preds_view is not None else None
                if preds is not None and len(preds) != len(labels):
                    preds = None
                state.paired += preds is not None
                seen = True
                for i, label in enumerate(labels):
                    key = str(label)
                    if key not in state.counts and len(state.counts) >= MAX_CLASSES:
                        state.other += 1
                        continue
                    state.counts[key] = state.counts.get(key, 0) + 1
                    state.total += 1
                    if preds is not None and preds[i] != label:
                        state.wrong[key] = state.wrong.get(key, 0) + 1
        if not seen or state.total < cfg.samples:
            return state, []
        state.judgements += 1
        return state, self._judge(state, step.step)

    def _judge(self, state: ClassImbalanceState, at: int) -> list[Finding]:
        cfg = self.config
        if len(state.counts) >= 2:
            big = max(state.counts, key=lambda k: (state.counts[k], k))
            small = min(state.counts, key=lambda k: (state.counts[k], k))
            ratio = state.counts[big] / state.counts[small]
            if ratio > cfg.threshold_imbalance:
                return [
                    self.finding(
                        at,
                        f"{self.name}: after {state.total} labels, class {big} has "
                        f"{state.counts[big]} and class "
                        f"{small} has {state.counts[small]}: ratio {fmt(ratio)} > threshold_imbalance="
                        f"{fmt(cfg.threshold_imbalance)}.",
                        tensor=cfg.labels_regex,
                        value=ratio,
                        threshold=cfg.threshold_imbalance,
                    )
                ]
        if state.wrong:
            key = min(state.wrong, key=lambda k: (-state.wrong[k] / state.counts[k], k))
            rate = state.wrong[key] / state.counts[key]
            if rate > cfg.threshold_misprediction:
                return [
                    self.finding(
                        at,
                        f"{self.name}: class {key} is mispredicted in {state.wrong[key]} of "
                        f"{state.counts[key]} labels: "
                        f"rate {fmt(rate)} > threshold_misprediction={fmt(cfg.threshold_misprediction)}.",
                        tensor=cfg.predictions_regex,
                        value=rate,
                        threshold=cfg.threshold_misprediction,
                    )
                ]
        return []

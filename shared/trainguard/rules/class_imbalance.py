"""ClassImbalance: the label distribution is skewed, or a class is mostly mispredicted."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from trainguard.format.documents import Mode
from trainguard.rules._common import MODE_PRIORITY, NonNegative, PositiveInt, Regex, class_ids
from trainguard.rules.base import (
    Coverage,
    Finding,
    Rule,
    RuleConfig,
    RuleInput,
    RuleState,
    StepData,
    TensorView,
    fmt,
)

#: distinct classes counted in the window; labels of further classes go to ``other``
MAX_CLASSES = 64
#: the window of the last ``samples`` labels is kept in about this many chunks
CHUNKS = 8
#: SageMaker's default regexes name the hook's ``labels`` and ``predictions`` collections
DEFAULT_LABELS = ".*labels"
DEFAULT_PREDICTIONS = ".*predictions"


class ClassImbalanceConfig(RuleConfig):
    threshold_imbalance: NonNegative = 10.0
    threshold_misprediction: NonNegative = 0.7
    samples: PositiveInt = Field(default=500, le=1_000_000)
    #: SageMaker's default False; None: argmax when the predictions are scores (N, C)
    argmax: bool | None = None
    labels_regex: Regex = DEFAULT_LABELS
    predictions_regex: Regex = DEFAULT_PREDICTIONS
    #: trainguard: the labels judged (None: EVAL once any were saved, else TRAIN, else GLOBAL)
    mode: Mode | None = None


class Chunk(BaseModel):
    """Labels counted per class (class id as a string: JSON keys), and mispredicted."""

    model_config = ConfigDict(extra="forbid")

    counts: dict[str, int] = Field(default_factory=dict, max_length=MAX_CLASSES)
    wrong: dict[str, int] = Field(default_factory=dict, max_length=MAX_CLASSES)
    n: int = 0


class ClassImbalanceState(RuleState):
    #: the mode whose labels are judged, and the window of its last ``samples`` labels
    mode: str | None = None
    chunks: list[Chunk] = Field(default_factory=list, max_length=CHUNKS + 2)
    other: int = 0
    #: labels counted over the job (all modes), judgements made
    total: int = 0
    judgements: int = 0
    #: label tensors received, and label tensors whose predictions could be paired with them
    label_tensors: int = 0
    paired: int = 0


class ClassImbalance(Rule[ClassImbalanceConfig, ClassImbalanceState]):
    """Once ``samples`` labels were seen, fires when, over the last ``samples`` labels, the
    largest class count divided by the smallest is > ``threshold_imbalance``, or a class's
    misprediction rate (predictions != label over that class's labels) is >
    ``threshold_misprediction``.

    Reads the ``values`` statistic (every element; the hook sends it for small tensors) of
    the tensor matching ``labels_regex`` and the one matching ``predictions_regex`` (with the
    default regexes, also the hook's ``labels`` and ``predictions`` collections), per worker.

    trainguard's choices (issue 10):

    - A window of the last ``samples`` labels (SageMaker: "the number of samples processed
      before the rule starts"; it then counted the whole job): a model's early mispredictions
      no longer weigh on its verdict at step 10,000. Counted in chunks of about
      ``samples / 8`` labels, so the window holds between ``samples`` and ``samples * 9/8``.
    - ``mode`` None: EVAL labels once any were saved (the validation set, judged on the current
      model), else TRAIN, else GLOBAL; a higher mode's first labels restart the window. Over
      the whole job's TRAIN labels the rule fired on 7-8 of 10 clean runs, over the last 500
      EVAL labels on none.
    - ``argmax`` None: predictions of shape (N, C), C > 1, next to N labels are scores and the
      predicted class is each row's argmax (a loss's inputs are logits); SageMaker's explicit
      ``False`` keeps the values as class ids.

    The smallest count is over classes seen at least once in the window; a step whose labels
    and predictions differ in length counts its labels but no mispredictions; at most
    ``MAX_CLASSES`` classes are counted, labels of later new classes only add to ``other``.
    """

    name = "ClassImbalance"
    Config = ClassImbalanceConfig
    State = ClassImbalanceState
    summary = "The labels are imbalanced, or a class is mostly mispredicted."
    advice = (
        "Resample or reweight the classes (class weights, oversampling, focal loss), collect "
        "more data for rare classes, and check per-class metrics rather than accuracy."
    )

    def _modes(self) -> tuple[Mode, ...]:
        return (self.config.mode,) if self.config.mode else MODE_PRIORITY

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            RuleInput(
                "labels",
                collections=("labels",) if cfg.labels_regex == DEFAULT_LABELS else (),
                regex=(cfg.labels_regex,),
                statistics=("values",),
                modes=self._modes(),
            ),
            RuleInput(
                "predictions",
                collections=("predictions",) if cfg.predictions_regex == DEFAULT_PREDICTIONS else (),
                regex=(cfg.predictions_regex,),
                statistics=("values",),
                modes=self._modes(),
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
        window = sum(c.n for c in state.chunks)
        return self.covered(
            state.judgements,
            f"judgements of the class distribution (the last {window:,} {state.mode or ''} labels)",
            "made",
            received=[state.label_tensors, state.paired],
            reason=reason,
        )

    def update(self, state: ClassImbalanceState, step: StepData) -> tuple[ClassImbalanceState, list[Finding]]:
        cfg = self.config
        labels_input, predictions_input = self.reads()
        present = [m for m in self._modes() if m in step.modes()]
        seen = False
        for mode in present:
            modes: tuple[str, ...] = self._modes()
            if state.mode in modes and modes.index(mode) > modes.index(state.mode):
                continue  # a lower mode than the one judged
            for header in step.workers:
                labels_view = _first(step.select(labels_input), header.worker, mode)
                if labels_view is None:
                    continue
                state.label_tensors += 1
                labels = class_ids(labels_view)
                if labels is None:
                    continue
                preds_view = _first(step.select(predictions_input), header.worker, mode, labels_view.name)
                preds = None
                if preds_view is not None:
                    argmax = cfg.argmax if cfg.argmax is not None else _scores(preds_view, len(labels))
                    preds = class_ids(preds_view, argmax)
                if preds is not None and len(preds) != len(labels):
                    preds = None
                state.paired += preds is not None
                if state.mode != mode:
                    state.mode, state.chunks, state.other = mode, [], 0  # a higher mode: restart
                self._count(state, labels, preds)
                seen = True
        if not seen or sum(c.n for c in state.chunks) < cfg.samples:
            return state, []
        state.judgements += 1
        return state, self._judge(state, step.step)

    def _count(self, state: ClassImbalanceState, labels: list[int], preds: list[int] | None) -> None:
        cfg = self.config
        size = max(1, cfg.samples // CHUNKS)
        known = {k for c in state.chunks for k in c.counts}
        for i, label in enumerate(labels):
            if not state.chunks or state.chunks[-1].n >= size:
                state.chunks.append(Chunk())
            chunk = state.chunks[-1]
            key = str(label)
            if key not in known and len(known) >= MAX_CLASSES:
                state.other += 1
                continue
            known.add(key)
            chunk.counts[key] = chunk.counts.get(key, 0) + 1
            chunk.n += 1
            state.total += 1
            if preds is not None and preds[i] != label:
                chunk.wrong[key] = chunk.wrong.get(key, 0) + 1
        while len(state.chunks) > 1 and sum(c.n for c in state.chunks) - state.chunks[0].n >= cfg.samples:
            state.chunks.pop(0)

    def _judge(self, state: ClassImbalanceState, at: int) -> list[Finding]:
        cfg = self.config
        counts: dict[str, int] = {}
        wrong: dict[str, int] = {}
        for chunk in state.chunks:
            for k, n in chunk.counts.items():
                counts[k] = counts.get(k, 0) + n
            for k, n in chunk.wrong.items():
                wrong[k] = wrong.get(k, 0) + n
        window = sum(counts.values())
        where = f"the last {window} {state.mode} labels"
        if len(counts) >= 2:
            big = max(counts, key=lambda k: (counts[k], k))
            small = min(counts, key=lambda k: (counts[k], k))
            ratio = counts[big] / counts[small]
            if ratio > cfg.threshold_imbalance:
                return [
                    self.finding(
                        at,
                        f"{self.name}: in {where}, class {big} has {counts[big]} and class {small} has "
                        f"{counts[small]}: ratio {fmt(ratio)} > threshold_imbalance="
                        f"{fmt(cfg.threshold_imbalance)}.",
                        tensor=cfg.labels_regex,
                        value=ratio,
                        threshold=cfg.threshold_imbalance,
                    )
                ]
        if wrong:
            key = min(wrong, key=lambda k: (-wrong[k] / counts[k], k))
            rate = wrong[key] / counts[key]
            if rate > cfg.threshold_misprediction:
                return [
                    self.finding(
                        at,
                        f"{self.name}: in {where}, class {key} is mispredicted in {wrong[key]} of "
                        f"{counts[key]}: rate {fmt(rate)} > threshold_misprediction="
                        f"{fmt(cfg.threshold_misprediction)}.",
                        tensor=cfg.predictions_regex,
                        value=rate,
                        threshold=cfg.threshold_misprediction,
                    )
                ]
        return []


def _first(
    views: Iterable[TensorView], worker: int, mode: Mode, other_than: str | None = None
) -> TensorView | None:
    return next((v for v in views if v.worker == worker and v.mode == mode and v.name != other_than), None)


def _scores(view: TensorView, n: int) -> bool:
    shape = view.record.shape
    return len(shape) == 2 and shape[-1] > 1 and shape[0] == n

"""Confusion: the confusion matrix of labels and predictions is poor."""

from __future__ import annotations

import math
import re
from collections import Counter

from pydantic import Field

from trainguard.format.documents import Mode
from trainguard.rules._common import PositiveInt, Probability, TrainingClock, class_ids
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

#: SageMaker's thresholds, used when one of them is given (the absolute test)
SAGEMAKER_MIN_DIAG = 0.9
SAGEMAKER_MAX_OFF_DIAG = 0.1
#: trainguard's warm-up: training steps before the first judgement
DEFAULT_START_STEP = 100
#: classes whose pairs the state keeps for one evaluation (a k x k matrix)
MAX_CATEGORIES = 32


class ConfusionConfig(RuleConfig):
    category_no: PositiveInt | None = Field(default=None, le=MAX_CATEGORIES)
    labels: str = "labels"
    predictions: str = "predictions"
    labels_collection: str = "labels"
    predictions_collection: str = "predictions"
    #: SageMaker's 0.9 / 0.1; given (either): the absolute test, else the relative one
    min_diag: Probability | None = None
    max_off_diag: Probability | None = None
    #: trainguard: the mode judged (None: every step of every mode, as SageMaker)
    mode: Mode | None = "EVAL"
    #: trainguard: training steps before the first judgement (None: ``DEFAULT_START_STEP``)
    start_step: int | None = Field(default=None, ge=0)

    @property
    def absolute(self) -> bool:
        return self.min_diag is not None or self.max_off_diag is not None

    @property
    def bounds(self) -> tuple[float, float]:
        return (
            self.min_diag if self.min_diag is not None else SAGEMAKER_MIN_DIAG,
            self.max_off_diag if self.max_off_diag is not None else SAGEMAKER_MAX_OFF_DIAG,
        )

    @property
    def warmup(self) -> int:
        return self.start_step if self.start_step is not None else DEFAULT_START_STEP


class ConfusionState(RuleState):
    clock: TrainingClock = Field(default_factory=TrainingClock)
    #: the evaluation being collected: "label,prediction" -> count, and its last step
    pairs: dict[str, int] = Field(default_factory=dict, max_length=MAX_CATEGORIES * MAX_CATEGORIES)
    pairs_at: int = 0
    #: pairs dropped because a class was outside the first MAX_CATEGORIES seen
    dropped: int = 0
    steps_judged: int = 0
    #: steps where a labels and a predictions tensor were both found (values or not)
    pairs_seen: int = 0


def _named(view: TensorView, name: str, collection: str) -> bool:
    return view.name == name or view.name.endswith("/" + name) or collection in view.collections


class Confusion(Rule[ConfusionConfig, ConfusionState]):
    """Fires when the confusion matrix of labels and predictions is poor.

    Reads the ``values`` statistic of the labels tensor (named ``labels`` or in
    ``labels_collection``) and the predictions tensor (named ``predictions`` or in
    ``predictions_collection``) of the same worker and mode; ``confusion[label][prediction]``
    counts each pair. Predictions given as scores (shape (N, C)) are reduced by argmax.

    Normalisation (SageMaker's documentation): an off-diagonal entry ``confusion[j][i]`` is
    divided by its column's total ``sum_j confusion[j][i]`` (of the samples predicted ``i``,
    the share that are ``j``). For the diagonal the documentation divides by
    ``sum_j confusion[j][j]`` (the trace), under which no balanced classifier of two or more
    classes could ever pass 0.9; trainguard reads it as the same column total, so the diagonal
    is each class's precision and both tests use one matrix. The main branch divided by the
    row (recall), a departure.

    A matrix is judged when fully populated: every category in ``0..category_no-1`` (None: every
    label seen) has labels; a category never predicted has precision 0. Tests:

    - absolute (SageMaker's, when ``min_diag`` or ``max_off_diag`` is given): a diagonal entry
      < ``min_diag`` (default 0.9) or an off-diagonal entry > ``max_off_diag`` (0.1);
    - relative (trainguard's default): a class recalled significantly worse (the upper end of
      its Wilson interval, z = 3) than 0.9 x the mean recall of the other classes. It finds a class
      the model confuses, not a model that is still learning or a small validation pass's noise
      (every run's first matrix failed the absolute test: 10 of 10 clean alerts; 0 of 10 with a
      relative test on EVAL after a warm-up, issue 10). Recall, the row-normalised diagonal,
      is defined for every category with labels, also one the model never predicts.

    Data (trainguard's defaults): ``mode`` EVAL, one matrix per validation pass (its EVAL steps
    together), from training step ``start_step`` (100) on. ``mode`` None judges each step of
    every mode on its own pairs, as SageMaker. Labels or predictions outside
    ``0..category_no-1`` are ignored; at most 32 categories.
    """

    name = "Confusion"
    Config = ConfusionConfig
    State = ConfusionState
    summary = "A class is predicted with low precision, or often confused with another."
    advice = (
        "Inspect the confused classes (label noise, look-alike classes), rebalance the data, "
        "and train longer or with a larger model if every class is weak."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        modes: tuple[Mode, ...] = (cfg.mode,) if cfg.mode is not None else ()
        return tuple(
            RuleInput(
                what,
                collections=(collection,),
                regex=(f"(.*/)?{re.escape(name)}$",),
                statistics=("values",),
                modes=modes,
            )
            for what, name, collection in (
                ("labels", cfg.labels, cfg.labels_collection),
                ("predictions", cfg.predictions, cfg.predictions_collection),
            )
        )

    def coverage(self, state: ConfusionState) -> Coverage:
        reason = ""
        if state.pairs_seen:
            reason = (
                f"labels and predictions arrived at {state.pairs_seen:,} steps, but no matrix after "
                f"start_step={self.config.warmup} training steps had 'values' of equal length with every "
                "category present"
            )
        return self.covered(
            state.steps_judged, "confusion matrices", "judged", received=[state.pairs_seen] * 2, reason=reason
        )

    def update(self, state: ConfusionState, step: StepData) -> tuple[ConfusionState, list[Finding]]:
        cfg = self.config
        t = state.clock.tick(step)
        modes: list[Mode] = step.modes() if cfg.mode is None else [m for m in step.modes() if m == cfg.mode]
        findings: list[Finding] = []
        if cfg.mode is not None and state.pairs and cfg.mode not in step.modes():
            findings = self._judge_evaluation(state)  # the validation pass ended
        warm = t >= cfg.warmup
        for header in step.workers:
            for mode in modes:
                views = [v for v in step.tensors(mode) if v.worker == header.worker]
                lv = next((v for v in views if _named(v, cfg.labels, cfg.labels_collection)), None)
                pv = next(
                    (
                        v
                        for v in views
                        if v is not lv and _named(v, cfg.predictions, cfg.predictions_collection)
                    ),
                    None,
                )
                if lv is None or pv is None:
                    continue
                state.pairs_seen += 1
                labels = class_ids(lv)
                preds = class_ids(pv, argmax=_scores(pv, labels))
                if labels is None or preds is None or len(labels) != len(preds) or not labels or not warm:
                    continue
                if cfg.mode is None:
                    pairs = Counter(zip(labels, preds, strict=True))
                    finding = self._judge(state, pairs, step.step, f"({mode}, worker {header.worker})")
                    if finding:
                        return state, [finding]
                else:
                    self._collect(state, labels, preds, step.step)
        return state, findings[:1]

    def finish(self, state: ConfusionState) -> list[Finding]:
        return self._judge_evaluation(state) if state.pairs else []

    # -------------------------------------------------------------------------------------
    def _collect(self, state: ConfusionState, labels: list[int], preds: list[int], at: int) -> None:
        k = self.config.category_no
        for a, b in zip(labels, preds, strict=True):
            if k is not None and not (0 <= a < k and 0 <= b < k):
                continue
            key = f"{a},{b}"
            if key not in state.pairs and len(state.pairs) >= MAX_CATEGORIES * MAX_CATEGORIES:
                state.dropped += 1
                continue
            state.pairs[key] = state.pairs.get(key, 0) + 1
        state.pairs_at = at

    def _judge_evaluation(self, state: ConfusionState) -> list[Finding]:
        pairs: Counter[tuple[int, int]] = Counter()
        for key, n in state.pairs.items():
            a, b = key.split(",")
            pairs[(int(a), int(b))] += n
        state.pairs = {}
        finding = self._judge(state, pairs, state.pairs_at, f"({self.config.mode} pass)")
        return [finding] if finding else []

    def _judge(
        self, state: ConfusionState, matrix: Counter[tuple[int, int]], at: int, where: str
    ) -> Finding | None:
        cfg = self.config
        k = cfg.category_no
        matrix = Counter({p: n for p, n in matrix.items() if k is None or (0 <= p[0] < k and 0 <= p[1] < k)})
        rows = Counter[int]()
        cols = Counter[int]()
        for (a, b), n in matrix.items():
            rows[a] += n
            cols[b] += n
        categories = list(range(k)) if k is not None else sorted(rows)
        if not matrix or len(categories) < 2 or any(rows[c] == 0 for c in categories):
            return None  # not fully populated: a category without labels
        state.steps_judged += 1
        total = sum(matrix.values())
        where = f"{where[:-1]}, {total} pairs)"
        if not cfg.absolute:
            return self._judge_relative(matrix, rows, categories, at, where)
        min_diag, max_off = cfg.bounds
        for c in categories:
            diag = matrix[(c, c)] / cols[c] if cols[c] else 0.0  # never predicted: no precision at all
            if diag < min_diag:
                return self.finding(
                    at,
                    f"{self.name}: class {c}: confusion[{c}][{c}] / column total = {fmt(diag)} < "
                    f"min_diag={fmt(min_diag)} {where}.",
                    tensor=cfg.labels,
                    value=diag,
                    threshold=min_diag,
                )
        for (a, b), n in sorted(matrix.items()):
            off = n / cols[b]
            if a != b and off > max_off:
                return self.finding(
                    at,
                    f"{self.name}: {fmt(off)} of the samples predicted as {b} are class {a}: "
                    f"confusion[{a}][{b}] / column total > max_off_diag={fmt(max_off)} {where}.",
                    tensor=cfg.predictions,
                    value=off,
                    threshold=max_off,
                )
        return None

    def _judge_relative(
        self,
        matrix: Counter[tuple[int, int]],
        rows: Counter[int],
        categories: list[int],
        at: int,
        where: str,
    ) -> Finding | None:
        """A class recalled significantly worse than 0.9 x the other classes' mean recall."""
        factor = SAGEMAKER_MIN_DIAG
        recall = {c: matrix[(c, c)] / rows[c] for c in categories}
        for c in categories:
            others = [recall[o] for o in categories if o != c]
            bar = factor * sum(others) / len(others)
            upper = wilson_upper(matrix[(c, c)], rows[c])
            if upper < bar:
                worst = max((b for b in categories if b != c), key=lambda b: (matrix[(c, b)], -b))
                return self.finding(
                    at,
                    f"{self.name}: class {c} is recalled in {fmt(recall[c])} of its {rows[c]} samples "
                    f"(at most {fmt(upper)} at z=3 confidence), below {fmt(factor)} x the other classes' "
                    f"mean recall = {fmt(bar)}; it is most often predicted as {worst} (relative test) "
                    f"{where}.",
                    tensor=self.config.labels,
                    value=recall[c],
                    threshold=bar,
                )
        return None


#: the Wilson interval's z: 3 (one-sided 0.13%), so many classes and passes judged per job
#: still rarely alarm on sampling noise
WILSON_Z = 3.0


def wilson_upper(successes: int, n: int, z: float = WILSON_Z) -> float:
    """Upper end of the Wilson score interval of a proportion (1.0 for n = 0)."""
    if n <= 0:
        return 1.0
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z * z / n))


def _scores(view: TensorView, labels: list[int] | None) -> bool:
    """Predictions of shape (N, C), C > 1, next to N labels: scores, reduced by argmax."""
    shape = view.record.shape
    return labels is not None and len(shape) == 2 and shape[-1] > 1 and shape[0] == len(labels)

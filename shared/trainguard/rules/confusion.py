"""Confusion: the confusion matrix of a step's labels and predictions is poor."""

from __future__ import annotations

import re
from collections import Counter

from trainguard.format.documents import Mode
from trainguard.rules._common import PositiveInt, Probability, class_ids
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


class ConfusionConfig(RuleConfig):
    category_no: PositiveInt | None = None
    labels: str = "labels"
    predictions: str = "predictions"
    labels_collection: str = "labels"
    predictions_collection: str = "predictions"
    min_diag: Probability = 0.9
    max_off_diag: Probability = 0.1


class ConfusionState(RuleState):
    steps_judged: int = 0
    #: steps where a labels and a predictions tensor were both found (values or not)
    pairs_seen: int = 0


def _named(view: TensorView, name: str, collection: str) -> bool:
    return view.name == name or view.name.endswith("/" + name) or collection in view.collections


class Confusion(Rule[ConfusionConfig, ConfusionState]):
    """Fires when, in a step's confusion matrix, a normalised diagonal entry is < ``min_diag``
    or a normalised off-diagonal entry is > ``max_off_diag``.

    Reads the ``values`` statistic of the labels tensor (named ``labels`` or in
    ``labels_collection``) and the predictions tensor (named ``predictions`` or in
    ``predictions_collection``) of the same worker and mode; ``confusion[label][prediction]``
    counts each pair.

    Choices where the documentation is ambiguous: every entry is normalised by its label's
    row total, so the diagonal is the per-class recall and ``confusion[i][j]`` the share of
    class i predicted as j; the matrix is built from one step's pairs (SageMaker evaluates per
    step, so an untrained model fires at its first saved step: prefer EVAL data) and judged
    only when fully populated: every category in ``0..category_no-1`` (None: every label
    value seen in that step) has at least one label. Labels or predictions outside
    ``0..category_no-1`` are ignored.
    """

    name = "Confusion"
    Config = ConfusionConfig
    State = ConfusionState
    summary = "A class's recall is below min_diag, or a class is often confused with another."
    advice = (
        "Inspect the confused classes (label noise, look-alike classes), rebalance the data, "
        "and train longer or with a larger model if every class is weak."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return tuple(
            RuleInput(
                what,
                collections=(collection,),
                regex=(f"(.*/)?{re.escape(name)}$",),
                statistics=("values",),
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
                f"labels and predictions arrived at {state.pairs_seen:,} steps, but none had 'values' of "
                "equal length with every category present"
            )
        return self.covered(
            state.steps_judged,
            "confusion matrices",
            "judged",
            received=[state.pairs_seen] * 2,
            reason=reason,
        )

    def update(self, state: ConfusionState, step: StepData) -> tuple[ConfusionState, list[Finding]]:
        cfg = self.config
        modes: list[Mode] = step.modes()
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
                labels, preds = class_ids(lv), class_ids(pv)
                if labels is None or preds is None or len(labels) != len(preds) or not labels:
                    continue
                finding = self._judge(state, labels, preds, step.step, mode, header.worker)
                if finding:
                    return state, [finding]
        return state, []

    def _judge(
        self, state: ConfusionState, labels: list[int], preds: list[int], at: int, mode: Mode, worker: int
    ) -> Finding | None:
        cfg = self.config
        k = cfg.category_no
        pairs = [
            (a, b) for a, b in zip(labels, preds, strict=True) if k is None or (0 <= a < k and 0 <= b < k)
        ]
        matrix = Counter(pairs)
        rows = Counter(a for a, _ in pairs)
        categories = range(k) if k is not None else sorted(rows)
        if not pairs or any(rows[c] == 0 for c in categories):
            return None  # not fully populated
        state.steps_judged += 1
        where = f"({mode}, worker {worker}, {len(pairs)} pairs)"
        for c in categories:
            diag = matrix[(c, c)] / rows[c]
            if diag < cfg.min_diag:
                return self.finding(
                    at,
                    f"{self.name}: class {c} normalised diagonal confusion[{c}][{c}] = {fmt(diag)} < "
                    f"min_diag={fmt(cfg.min_diag)} {where}.",
                    tensor=cfg.labels,
                    value=diag,
                    threshold=cfg.min_diag,
                )
        for (a, b), n in sorted(matrix.items()):
            off = n / rows[a]
            if a != b and off > cfg.max_off_diag:
                return self.finding(
                    at,
                    f"{self.name}: class {a} predicted as {b}: confusion[{a}][{b}] = {fmt(off)} > "
                    f"max_off_diag={fmt(cfg.max_off_diag)} {where}.",
                    tensor=cfg.predictions,
                    value=off,
                    threshold=cfg.max_off_diag,
                )
        return None

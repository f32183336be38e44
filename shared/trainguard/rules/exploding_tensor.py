"""ExplodingTensor: a selected tensor (or loss) holds NaN, or infinite values."""

from __future__ import annotations

import math

from trainguard.rules._common import NameList, RegexList, describe_selection, missing_statistic, select
from trainguard.rules.base import (
    Coverage,
    Finding,
    Rule,
    RuleConfig,
    RuleInput,
    RuleState,
    StepData,
    compiled,
)


class ExplodingTensorConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    only_nan: bool = False


class ExplodingTensorState(RuleState):
    #: tensors whose NaN/Inf counts were judged, and selected tensors received
    tensors_checked: int = 0
    tensors_seen: int = 0
    #: scalars (losses, metrics) judged
    scalars_checked: int = 0


class ExplodingTensor(Rule[ExplodingTensorConfig, ExplodingTensorState]):
    """Fires when a selected tensor has a NaN element, or (unless ``only_nan``) a ±Inf one.

    Reads the ``nan``/``inf`` counts of the selected tensors' statistics, and the value of the
    selected scalars (losses and metrics are scalars: a NaN loss is the most common case).
    Selection: tensors and scalars in any of ``collection_names`` or with a name matching any
    of ``tensor_regex``; when neither is given, everything saved (SageMaker's default
    selection). Every worker and mode is examined. A tensor whose counts were not computed is
    not judged (it is not "finite"); the rule ends ``Error`` if it judged nothing.
    """

    name = "ExplodingTensor"
    Config = ExplodingTensorConfig
    State = ExplodingTensorState
    summary = "A tensor or loss contains NaN (or infinite) values."
    advice = (
        "Lower the learning rate, clip gradients, check for division by zero or log of zero in "
        "the loss, and use mixed-precision loss scaling; inspect the input data for NaN."
    )

    def _statistics(self) -> tuple[str, ...]:
        return ("nan",) if self.config.only_nan else ("nan", "inf")

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        cols, regex = tuple(cfg.collection_names or ()), tuple(cfg.tensor_regex or ())
        # either kind suffices (a selection by name may hold only tensors or only scalars)
        return (
            RuleInput(
                describe_selection(cols, regex, "tensors"),
                collections=cols,
                regex=regex,
                statistics=self._statistics(),
                required=False,
            ),
            RuleInput(
                describe_selection(cols, regex, "scalars (losses, metrics)"),
                collections=cols,
                regex=regex,
                scalars=True,
                required=False,
            ),
        )

    def coverage(self, state: ExplodingTensorState) -> Coverage:
        return self.covered(
            state.tensors_checked + state.scalars_checked,
            "tensors and scalars",
            received=[state.tensors_seen, state.scalars_checked],
            reason=missing_statistic(state.tensors_seen, "tensors", *self._statistics())
            if not state.scalars_checked
            else "",
        )

    def update(
        self, state: ExplodingTensorState, step: StepData
    ) -> tuple[ExplodingTensorState, list[Finding]]:
        cfg = self.config
        for view, stats in select(step, cfg.collection_names, cfg.tensor_regex):
            state.tensors_seen += 1
            if stats.nan is None or (not cfg.only_nan and stats.inf is None):
                continue  # not computed: not judged
            state.tensors_checked += 1
            inf = 0 if cfg.only_nan or stats.inf is None else stats.inf
            bad = stats.nan + inf
            if bad > 0:
                what = f"{stats.nan} NaN" + ("" if cfg.only_nan else f" and {inf} infinite")
                of = f" of {stats.numel} values" if stats.numel is not None else ""
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: tensor {view.name} (worker {view.worker}, {view.mode}) has {what}"
                        f"{of} (threshold 0).",
                        tensor=view.name,
                        value=float(bad),
                        threshold=0.0,
                    )
                ]
        patterns = [compiled(r) for r in cfg.tensor_regex or ()]
        wanted = set(cfg.collection_names or ())
        for mode, name, worker, scalar in step.scalars():
            if (wanted or patterns) and not (
                wanted.intersection(scalar.collections) or any(p.match(name) for p in patterns)
            ):
                continue
            state.scalars_checked += 1
            value = scalar.value
            if math.isnan(value) or (not cfg.only_nan and math.isinf(value)):
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: scalar {name} (worker {worker}, {mode}) is {value} (threshold: "
                        "finite).",
                        tensor=name,
                        value=value,
                        threshold=0.0,
                    )
                ]
        return state, []

"""ExplodingTensor: a selected tensor (or loss) holds NaN, or infinite values."""

from __future__ import annotations

import math
import re

from trainguard.rules._common import NameList, RegexList, select
from trainguard.rules.base import Finding, Rule, RuleConfig, RuleState, StepData


class ExplodingTensorConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    only_nan: bool = False


class ExplodingTensorState(RuleState):
    tensors_checked: int = 0


class ExplodingTensor(Rule[ExplodingTensorConfig, ExplodingTensorState]):
    """Fires when a selected tensor has a NaN element, or (unless ``only_nan``) a ±Inf one.

    Reads the ``nan``/``inf`` counts of the selected tensors' statistics, and the value of the
    selected scalars (losses and metrics are scalars: a NaN loss is the most common case).
    Selection: tensors and scalars in any of ``collection_names`` or with a name matching any
    of ``tensor_regex``; when neither is given, everything saved (SageMaker's default
    selection). Every worker and mode is examined.
    """

    name = "ExplodingTensor"
    Config = ExplodingTensorConfig
    State = ExplodingTensorState
    summary = "A tensor or loss contains NaN (or infinite) values."
    advice = (
        "Lower the learning rate, clip gradients, check for division by zero or log of zero in "
        "the loss, and use mixed-precision loss scaling; inspect the input data for NaN."
    )

    def update(
        self, state: ExplodingTensorState, step: StepData
    ) -> tuple[ExplodingTensorState, list[Finding]]:
        cfg = self.config
        for view, stats in select(step, cfg.collection_names, cfg.tensor_regex):
            state.tensors_checked += 1
            bad = stats.nan if cfg.only_nan else stats.nan + stats.inf
            if bad > 0:
                what = f"{stats.nan} NaN" + ("" if cfg.only_nan else f" and {stats.inf} infinite")
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: tensor {view.name} (worker {view.worker}, {view.mode}) has {what} "
                        f"of {stats.numel} values (threshold 0).",
                        tensor=view.name,
                        value=float(bad),
                        threshold=0.0,
                    )
                ]
        patterns = [re.compile(r) for r in cfg.tensor_regex or ()]
        wanted = set(cfg.collection_names or ())
        for mode, name, worker, scalar in step.scalars():
            if (wanted or patterns) and not (
                wanted.intersection(scalar.collections) or any(p.match(name) for p in patterns)
            ):
                continue
            state.tensors_checked += 1
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

"""DataNotNormalized (TheDeepChecker): model inputs are far outside a normalised range."""

from __future__ import annotations

from trainguard.rules._common import (
    NameList,
    NonNegative,
    RegexList,
    finite,
    missing_statistic,
    select,
    tensor_input,
)
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

_INTEGER_DTYPES = ("int", "uint", "bool")


class DataNotNormalizedConfig(RuleConfig):
    #: None (and no tensor_regex): the ``inputs`` collection
    collection_names: NameList = None
    tensor_regex: RegexList = None
    #: abs(mean) above this: not centred
    mean_threshold: NonNegative = 1.0
    #: std above this: not scaled
    std_threshold: NonNegative = 10.0


class DataNotNormalizedState(RuleState):
    tensors_checked: int = 0
    tensors_seen: int = 0
    #: of those, integer or boolean tensors (token ids, masks): not judged
    integer_tensors: int = 0


class DataNotNormalized(Rule[DataNotNormalizedConfig, DataNotNormalizedState]):
    """Fires when a floating-point input tensor has ``abs(mean) > mean_threshold`` or
    ``std > std_threshold``.

    After TheDeepChecker's data-normalisation check. Reads the ``mean`` and ``std``
    statistics of tensors in ``collection_names`` (default: the ``inputs`` collection) or
    matching ``tensor_regex``, per step, worker and mode. Inputs scaled to [0, 1] or
    [-1, 1], or standardised, pass; raw pixel values (0-255) or raw physical units fail.

    Choices: integer and boolean tensors (token ids, masks) are skipped, they are not meant
    to be normalised; whole-tensor statistics cannot see one badly scaled feature among
    well-scaled ones.
    """

    name = "DataNotNormalized"
    Config = DataNotNormalizedConfig
    State = DataNotNormalizedState
    summary = "Model inputs are not normalised (mean or spread far from a unit scale)."
    advice = "Standardise the inputs (subtract the mean, divide by the std) or scale them to [0, 1]."

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            tensor_input(
                cfg.collection_names,
                cfg.tensor_regex,
                ("numel", "mean", "std"),
                default_collections=("inputs",),
                what=None if cfg.collection_names or cfg.tensor_regex else "model inputs",
            ),
        )

    def coverage(self, state: DataNotNormalizedState) -> Coverage:
        reason = missing_statistic(
            state.tensors_seen - state.integer_tensors, "floating-point inputs", "mean", "std"
        )
        if state.tensors_seen and state.tensors_seen == state.integer_tensors:
            reason = (
                f"the {state.tensors_seen:,} inputs that arrived are integer tensors (ids, masks): not judged"
            )
        return self.covered(
            state.tensors_checked, "input tensors", received=[state.tensors_seen], reason=reason
        )

    def update(
        self, state: DataNotNormalizedState, step: StepData
    ) -> tuple[DataNotNormalizedState, list[Finding]]:
        cfg = self.config
        for view, stats in select(
            step, cfg.collection_names, cfg.tensor_regex, default_collections=("inputs",)
        ):
            state.tensors_seen += 1
            dtype = view.record.dtype.lower()
            if dtype.startswith(_INTEGER_DTYPES):
                state.integer_tensors += 1
                continue
            if (
                not stats.numel
                or stats.mean is None
                or stats.std is None
                or not (finite(stats.mean) and finite(stats.std))
            ):
                continue
            state.tensors_checked += 1
            where = f"{view.name} (worker {view.worker}, {view.mode})"
            if abs(stats.mean) > cfg.mean_threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: input {where} has mean {fmt(stats.mean)}; abs(mean) > "
                        f"mean_threshold={fmt(cfg.mean_threshold)}.",
                        tensor=view.name,
                        value=stats.mean,
                        threshold=cfg.mean_threshold,
                    )
                ]
            if stats.std > cfg.std_threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: input {where} has std {fmt(stats.std)} > "
                        f"std_threshold={fmt(cfg.std_threshold)}.",
                        tensor=view.name,
                        value=stats.std,
                        threshold=cfg.std_threshold,
                    )
                ]
        return state, []

"""AllZero: (nearly) every element of a selected tensor is zero."""

from __future__ import annotations

from trainguard.rules._common import NameList, Percent, RegexList, select
from trainguard.rules.base import Finding, Rule, RuleConfig, RuleState, StepData, fmt


class AllZeroConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    threshold: Percent = 100.0


class AllZeroState(RuleState):
    tensors_checked: int = 0


class AllZero(Rule[AllZeroConfig, AllZeroState]):
    """Fires when ``100 * zeros / numel >= threshold`` for a selected tensor.

    Reads the ``zeros`` and ``numel`` statistics of tensors in ``collection_names`` or matching
    ``tensor_regex`` (neither: every tensor), every worker and mode. Choice: empty tensors
    (numel 0) are skipped, they are not "all zero".
    """

    name = "AllZero"
    Config = AllZeroConfig
    State = AllZeroState
    summary = "A tensor is (nearly) all zeros."
    advice = (
        "Check the layer is connected and receives input, the initialisation is not zero, and "
        "activations are not all dead (see DeadRelu)."
    )

    def update(self, state: AllZeroState, step: StepData) -> tuple[AllZeroState, list[Finding]]:
        cfg = self.config
        for view, stats in select(step, cfg.collection_names, cfg.tensor_regex):
            if stats.numel == 0:
                continue
            state.tensors_checked += 1
            share = 100.0 * stats.zeros / stats.numel
            if share >= cfg.threshold:
                return state, [
                    self.finding(
                        step.step,
                        f"{self.name}: {fmt(share)}% of the {stats.numel} elements of {view.name} "
                        f"(worker {view.worker}, {view.mode}) are zero; threshold={fmt(cfg.threshold)}%.",
                        tensor=view.name,
                        value=share,
                        threshold=cfg.threshold,
                    )
                ]
        return state, []

"""AllZero: (nearly) every element of a selected tensor is zero."""

from __future__ import annotations

from trainguard.rules._common import (
    NameList,
    Percent,
    RegexList,
    missing_statistic,
    select,
    tensor_input,
)
from trainguard.rules._structure import BY_CONSTRUCTION, structural, structural_reason
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: trainguard's selection when neither collection_names nor tensor_regex is given: the
#: weights (biases are often initialised to zero, e.g. LayerNorm and BatchNorm shifts, and
#: a parameter's gradient is legitimately all zero while it does not take part in the loss)
DEFAULT_COLLECTIONS = ("weights",)


class AllZeroConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    threshold: Percent = 100.0


class AllZeroState(RuleState):
    tensors_checked: int = 0
    tensors_seen: int = 0
    #: of those, zero or constant by the model's construction: not judged
    structural: int = 0


class AllZero(Rule[AllZeroConfig, AllZeroState]):
    """Fires when ``100 * zeros / numel >= threshold`` for a selected tensor.

    Reads the ``zeros`` and ``numel`` statistics of tensors in ``collection_names`` or matching
    ``tensor_regex``, every worker and mode. Empty tensors (numel 0) are skipped: they are not
    "all zero".

    Neither parameter given: SageMaker's documentation requires one of them; trainguard's
    default is the ``weights`` collection (``DEFAULT_COLLECTIONS``: a zero-initialised layer,
    a layer zeroed by a bad checkpoint load). Reading every saved tensor instead fired on
    labels, masks and ReLU outputs of healthy runs (4 of 10 held-out clean runs, issue 10);
    weights, biases and gradients still fired on 13 of 54 clean runs of the accuracy
    benchmark's dev split (zero-initialised biases), weights alone on 0 with the same
    recall (docs/accuracy.md).

    Tensors zero or constant by the model's construction (the manifest's structure: an
    attention key bias initialised to zero never moves, a bias feeding BatchNorm;
    ``trainguard.rules._structure``) are not judged. Frozen weights are: a frozen all-zero
    weight is a bad checkpoint load, not structure.
    """

    name = "AllZero"
    Config = AllZeroConfig
    State = AllZeroState
    summary = "A tensor is (nearly) all zeros."
    advice = (
        "Check the layer is connected and receives input, the initialisation is not zero, and "
        "activations are not all dead (see DeadRelu)."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            tensor_input(
                cfg.collection_names,
                cfg.tensor_regex,
                ("numel", "zeros"),
                default_collections=DEFAULT_COLLECTIONS,
            ),
        )

    def coverage(self, state: AllZeroState) -> Coverage:
        reason = missing_statistic(state.tensors_seen, "tensors", "numel", "zeros")
        if state.structural and state.structural == state.tensors_seen:
            reason = structural_reason(state.structural, "tensors")
        return self.covered(state.tensors_checked, "tensors", received=[state.tensors_seen], reason=reason)

    def update(self, state: AllZeroState, step: StepData) -> tuple[AllZeroState, list[Finding]]:
        cfg = self.config
        for view, stats in select(
            step, cfg.collection_names, cfg.tensor_regex, default_collections=DEFAULT_COLLECTIONS
        ):
            state.tensors_seen += 1
            if structural(step.structure, view.name, BY_CONSTRUCTION):
                state.structural += 1
                continue
            if not stats.numel or stats.zeros is None:
                continue  # empty, or not computed
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

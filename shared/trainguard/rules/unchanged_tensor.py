"""UnchangedTensor: a tensor stays the same across ``num_steps`` saved steps."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from trainguard.format.documents import Mode, TensorStats
from trainguard.rules._common import (
    PARAMETER_COLLECTIONS,
    NameList,
    NonNegative,
    PositiveInt,
    RegexList,
    missing_statistic,
    select,
    tensor_input,
)
from trainguard.rules._structure import NOT_CHANGING, structural, structural_reason
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: the statistics that stand for a tensor's value
FINGERPRINT = ("min", "max", "mean", "l2")

#: tensors tracked at once (the first ones seen, in the hook's order)
MAX_TRACKED = 64
#: weights do not change in EVAL/PREDICT by design
MODES: tuple[Mode, ...] = ("TRAIN", "GLOBAL")


def fingerprint(stats: TensorStats) -> list[float] | None:
    """What stands for the tensor's value: its min, max, mean and L2 norm (None: not computed)."""
    values = [stats.min, stats.max, stats.mean, stats.l2]
    return None if any(v is None for v in values) else [v for v in values if v is not None]


def allclose(a: list[float], b: list[float], rtol: float, atol: float, equal_nan: bool) -> bool:
    """numpy.allclose(a, b) on fingerprints: ``|a - b| <= atol + rtol * |b|``."""
    for x, y in zip(a, b, strict=True):
        if math.isnan(x) or math.isnan(y):
            if not (equal_nan and math.isnan(x) and math.isnan(y)):
                return False
        elif math.isinf(x) or math.isinf(y):
            if x != y:
                return False
        elif abs(x - y) > atol + rtol * abs(y):
            return False
    return True


class Streak(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: list[float]
    count: int
    since: int


class UnchangedTensorConfig(RuleConfig):
    collection_names: NameList = None
    tensor_regex: RegexList = None
    num_steps: PositiveInt = 3
    rtol: NonNegative = 1e-5
    atol: NonNegative = 1e-8
    equal_nan: bool = False


class UnchangedTensorState(RuleState):
    streaks: dict[str, Streak] = Field(default_factory=dict)
    untracked: int = 0
    #: comparisons with a streak's anchor, and selected tensors received
    comparisons: int = 0
    tensors_seen: int = 0
    #: of those, constant, frozen or unused by the model's construction: not judged
    structural: int = 0


class UnchangedTensor(Rule[UnchangedTensorConfig, UnchangedTensorState]):
    """Fires when a selected tensor is allclose (``rtol``, ``atol``, ``equal_nan``) across its
    last ``num_steps`` saved steps.

    Reads TRAIN and GLOBAL tensors in ``collection_names`` or matching ``tensor_regex``, per
    worker. Neither given: SageMaker's documentation requires one; trainguard's default is the
    ``weights``, ``biases`` and ``gradients`` collections (every saved tensor fired on labels
    and inputs that legitimately repeat: 4 of 10 held-out clean runs, 0 of 10 on parameters
    and gradients, issue 10).

    Approximation (the full tensors are not read): the tensor is represented by the
    fingerprint (min, max, mean, L2 norm) of its statistics, and each save is compared with
    the first save of the current streak (numpy's allclose against one anchor, so slow drift
    within rtol per step does not accumulate into "unchanged"). Two different tensors with the
    same fingerprint would count as unchanged, which in practice means a permutation of the
    same values. Choices: EVAL/PREDICT steps are ignored (weights do not change there by
    design); the state tracks at most ``MAX_TRACKED`` tensors. Parameters (and their gradients)
    that do not change by the model's construction or the user's design are not judged (the
    manifest's structure: a bias feeding BatchNorm, an attention key bias, frozen or unused
    parameters, ``trainguard.rules._structure``); an explicit selection of them included.
    """

    name = "UnchangedTensor"
    Config = UnchangedTensorConfig
    State = UnchangedTensorState
    summary = "A tensor has not changed across num_steps saved steps."
    advice = (
        "Check the tensor's layer is trained (requires_grad, included in the optimizer), the "
        "learning rate is not zero, and gradients reach it."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        cfg = self.config
        return (
            tensor_input(
                cfg.collection_names,
                cfg.tensor_regex,
                FINGERPRINT,
                default_collections=PARAMETER_COLLECTIONS,
                modes=MODES,
            ),
        )

    def coverage(self, state: UnchangedTensorState) -> Coverage:
        reason = missing_statistic(state.tensors_seen, "tensors", *FINGERPRINT)
        if state.structural and state.structural == state.tensors_seen:
            reason = structural_reason(state.structural, "tensors")
        elif state.tensors_seen and not reason:
            reason = f"{state.tensors_seen:,} tensors arrived but no tensor was saved twice"
        return self.covered(
            state.comparisons,
            "tensor comparisons across saved steps",
            "made",
            received=[state.tensors_seen],
            reason=reason,
        )

    def update(
        self, state: UnchangedTensorState, step: StepData
    ) -> tuple[UnchangedTensorState, list[Finding]]:
        cfg = self.config
        finding: Finding | None = None
        for mode in MODES:
            for view, stats in select(
                step, cfg.collection_names, cfg.tensor_regex, mode, default_collections=PARAMETER_COLLECTIONS
            ):
                state.tensors_seen += 1
                if structural(step.structure, view.name, NOT_CHANGING):
                    state.structural += 1
                    continue
                key = f"{view.worker}:{view.mode}:{view.name}"
                fp = fingerprint(stats)
                if fp is None:
                    continue  # not computed: not compared
                streak = state.streaks.get(key)
                if streak is None:
                    if len(state.streaks) >= MAX_TRACKED:
                        state.untracked += 1
                        continue
                    state.streaks[key] = Streak(anchor=fp, count=1, since=step.step)
                elif allclose(fp, streak.anchor, cfg.rtol, cfg.atol, cfg.equal_nan):
                    state.comparisons += 1
                    streak.count += 1
                else:
                    state.comparisons += 1
                    state.streaks[key] = Streak(anchor=fp, count=1, since=step.step)
                streak = state.streaks[key]
                if finding is None and streak.count >= cfg.num_steps:
                    finding = self.finding(
                        step.step,
                        f"{self.name}: {view.name} (worker {view.worker}, {view.mode}) is unchanged across "
                        f"{streak.count} saved steps since step {streak.since} (min/max/mean/l2 "
                        "allclose with "
                        f"rtol={fmt(cfg.rtol)}, atol={fmt(cfg.atol)}); num_steps={cfg.num_steps}.",
                        tensor=view.name,
                        value=float(streak.count),
                        threshold=float(cfg.num_steps),
                    )
        return state, [finding] if finding else []

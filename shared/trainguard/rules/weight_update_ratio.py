"""WeightUpdateRatio: weight updates are tiny or huge relative to the weights."""

from __future__ import annotations

import hashlib
import math

from pydantic import Field, model_validator

from trainguard.format.documents import Mode
from trainguard.rules._common import NonNegative, PositiveInt
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: weight tensors whose previous norm the state keeps (the first ones in the header's order)
MAX_TRACKED = 256

#: modes whose steps change the weights: an EVAL or PREDICT save of the weights repeats the
#: last training step's, so its update is 0 by construction and would fire small_threshold
#: on every job that evaluates (the accuracy benchmark: 54 of 54 clean dev runs)
UPDATING_MODES: tuple[Mode, ...] = ("TRAIN", "GLOBAL")


class WeightUpdateRatioConfig(RuleConfig):
    num_steps: PositiveInt | None = None
    large_threshold: NonNegative = 10.0
    small_threshold: NonNegative = 1e-8
    epsilon: NonNegative = 1e-9

    @model_validator(mode="after")
    def _ordered(self) -> WeightUpdateRatioConfig:
        if self.small_threshold > self.large_threshold:
            raise ValueError("small_threshold must not exceed large_threshold")
        return self


class WeightUpdateRatioState(RuleState):
    #: the previous step with weights, and its weight tensors' L2 norms (7 significant
    #: digits) in the hook's order; ``names`` is a digest of those tensors' names
    prev_step: int | None = None
    prev_l2: list[float] = Field(default_factory=list)
    names: str = ""
    untracked: int = 0
    #: update ratios judged; weight tensors received
    ratios_checked: int = 0
    tensors_seen: int = 0
    #: of those, without ``l2`` or ``update_l2``
    without_norms: int = 0


class WeightUpdateRatio(Rule[WeightUpdateRatioConfig, WeightUpdateRatioState]):
    """Fires when ``||W_s - W_prev|| / (||W_prev|| + epsilon)`` of a weight tensor is
    > ``large_threshold`` or < ``small_threshold``.

    Reads, for TRAIN and GLOBAL steps (``UPDATING_MODES``: evaluation does not change the
    weights), tensors in the ``weights`` collection of the lowest-ranked worker that saved
    weights (data-parallel replicas hold the same weights), the ``update_l2`` statistic
    (``||W_s - W_prev||``, computed by the hook against its previous save of that tensor:
    statistics alone cannot give the norm of a difference) and ``l2``; the state keeps
    ``||W_prev||`` from the previous step with weights.

    Choices: with ``num_steps`` set, a pair is judged only when the previous step with
    weights is at or after ``s - num_steps`` (SageMaker: "compared with a step >= s -
    num_steps"); without it, consecutive saved steps are compared. Tensors without
    ``update_l2`` are skipped. The state keeps at most ``MAX_TRACKED`` norms (the first tensors
    in the hook's order, rounded to 7 digits) with a digest of their names; the rest are
    counted in ``untracked`` and not judged, and a step whose weight tensors differ from the
    previous step's is not judged either. Frozen layers
    have a zero update and fire the small threshold, as in SageMaker.
    """

    name = "WeightUpdateRatio"
    Config = WeightUpdateRatioConfig
    State = WeightUpdateRatioState
    summary = "A weight update is very large or very small relative to the weight."
    advice = (
        "A huge ratio: lower the learning rate or clip gradients. A tiny one: raise the "
        "learning rate, check the layer receives gradients and is not unintentionally frozen."
    )

    def reads(self) -> tuple[RuleInput, ...]:
        # the hook measures update_l2 between two saves of the same mode; ``update`` judges the
        # updating modes only (an EVAL save's "update" is the training between two evaluations)
        return (RuleInput("weights", collections=("weights",), statistics=("l2", "update_l2")),)

    def coverage(self, state: WeightUpdateRatioState) -> Coverage:
        reason = ""
        if state.tensors_seen:
            reason = (
                f"{state.tensors_seen:,} weight tensors arrived ({state.without_norms:,} without the 'l2' "
                "or 'update_l2' statistic); a ratio needs the same weights saved twice, within "
                f"num_steps={self.config.num_steps} steps when it is set"
            )
        return self.covered(
            state.ratios_checked, "weight update ratios", received=[state.tensors_seen], reason=reason
        )

    def update(
        self, state: WeightUpdateRatioState, step: StepData
    ) -> tuple[WeightUpdateRatioState, list[Finding]]:
        cfg = self.config
        weights = [v for v in step.tensors(collections=["weights"]) if v.mode in UPDATING_MODES]
        if not weights:
            return state, []
        state.tensors_seen += len(weights)
        state.without_norms += sum(
            1 for v in weights if v.stats is None or v.stats.l2 is None or v.stats.update_l2 is None
        )
        worker = min(v.worker for v in weights)
        tracked = [v for v in weights if v.worker == worker and v.stats is not None]
        untracked = max(0, len(tracked) - MAX_TRACKED)
        tracked = tracked[:MAX_TRACKED]
        names = _digest([v.name for v in tracked])
        near = (
            state.prev_step is not None
            and names == state.names
            and (cfg.num_steps is None or step.step - state.prev_step <= cfg.num_steps)
        )
        finding: Finding | None = None
        for view, prev in zip(tracked, state.prev_l2 if near else [], strict=False):
            stats = view.stats
            assert stats is not None
            if stats.update_l2 is None or prev != prev:
                continue  # not computed (a NaN previous norm stands for an absent one)
            state.ratios_checked += 1
            ratio = stats.update_l2 / (prev + cfg.epsilon)
            if ratio > cfg.large_threshold:
                kind, op, bound = "large", ">", cfg.large_threshold
            elif ratio < cfg.small_threshold:
                kind, op, bound = "small", "<", cfg.small_threshold
            else:
                continue
            finding = self.finding(
                step.step,
                f"{self.name}: {view.name} update ratio ||dW||/||W_prev|| = {fmt(stats.update_l2)}/"
                f"{fmt(prev)} = {fmt(ratio)} {op} {kind}_threshold={fmt(bound)} "
                f"(step {state.prev_step} -> {step.step}).",
                tensor=view.name,
                value=ratio,
                threshold=bound,
            )
            break
        state.prev_step, state.names, state.untracked = step.step, names, untracked
        state.prev_l2 = [
            float(f"{v.stats.l2:.7g}") if v.stats is not None and v.stats.l2 is not None else math.nan
            for v in tracked
        ]
        return state, [finding] if finding else []


def _digest(names: list[str]) -> str:
    return hashlib.blake2b("\n".join(names).encode(), digest_size=8).hexdigest()

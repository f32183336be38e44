"""WeightUpdateRatio: weight updates jump or collapse by orders of magnitude (or, with
SageMaker's thresholds given, are larger or smaller than them) relative to the weights."""

from __future__ import annotations

import hashlib
import math

from pydantic import Field, model_validator

from trainguard.format.documents import Mode
from trainguard.rules._common import NonNegative, PositiveInt
from trainguard.rules._structure import NOT_CHANGING, structural
from trainguard.rules.base import Coverage, Finding, Rule, RuleConfig, RuleInput, RuleState, StepData, fmt

#: weight tensors whose previous norm the state keeps (the first ones in the header's order)
MAX_TRACKED = 256

#: modes whose steps change the weights: an EVAL or PREDICT save of the weights repeats the
#: last training step's, so its update is 0 by construction and would fire small_threshold
#: on every job that evaluates (the accuracy benchmark: 54 of 54 clean dev runs)
UPDATING_MODES: tuple[Mode, ...] = ("TRAIN", "GLOBAL")

#: SageMaker's documented defaults (in force when either threshold is given)
SAGEMAKER_LARGE = 10.0
SAGEMAKER_SMALL = 1e-8

#: trainguard's method (neither threshold given): orders of magnitude (log10) between a
#: tensor's update ratio and its own running level that count as a jump or a collapse...
JUMP_ORDERS = 1.0
COLLAPSE_ORDERS = 2.0
#: ...and at least this many robust spreads of its own ratios
SPREADS = 4.0
#: judged pairs in a row it must last (one outlier save is not a fault)
PATIENCE = 2
#: judged pairs that make a level before anything is compared with it
HISTORY = 4
#: the level follows a tensor's ratio by this share of each (clipped) difference, so a
#: schedule (warmup, decay) moves it within a few saves and a sudden jump does not
LEVEL_RATE = 0.3
LEVEL_CLIP = 0.5
#: log10 of a ratio at or below 1e-12 (no update at all: log10(0) is -inf)
FLOOR = -12.0


class WeightUpdateRatioConfig(RuleConfig):
    num_steps: PositiveInt | None = None
    #: SageMaker: 10; None (neither given): trainguard's relative method (see the rule)
    large_threshold: NonNegative | None = None
    #: SageMaker: 1e-8; None (neither given): trainguard's relative method
    small_threshold: NonNegative | None = None
    epsilon: NonNegative = 1e-9

    @model_validator(mode="after")
    def _ordered(self) -> WeightUpdateRatioConfig:
        bounds = self.bounds
        if bounds is not None and bounds[0] > bounds[1]:
            raise ValueError("small_threshold must not exceed large_threshold")
        return self

    @property
    def bounds(self) -> tuple[float, float] | None:
        """(small, large) when either threshold is given (SageMaker's check, the other at its
        SageMaker default); None: trainguard's relative method."""
        if self.large_threshold is None and self.small_threshold is None:
            return None
        small = SAGEMAKER_SMALL if self.small_threshold is None else self.small_threshold
        large = SAGEMAKER_LARGE if self.large_threshold is None else self.large_threshold
        return small, large


class WeightUpdateRatioState(RuleState):
    #: the previous step with weights, and its weight tensors' L2 norms (7 significant
    #: digits) in the hook's order; ``names`` is a digest of those tensors' names
    prev_step: int | None = None
    prev_l2: list[float] = Field(default_factory=list)
    names: str = ""
    untracked: int = 0
    #: per tracked tensor (relative method): running level and spread of log10(ratio), pairs
    #: judged, the current streak (+n: n jumps in a row, -n: n collapses) and pairs in a row
    #: above SageMaker's large threshold
    level: list[float] = Field(default_factory=list)
    spread: list[float] = Field(default_factory=list)
    seen: list[int] = Field(default_factory=list)
    streak: list[int] = Field(default_factory=list)
    over: list[int] = Field(default_factory=list)
    #: update ratios judged; weight tensors received
    ratios_checked: int = 0
    tensors_seen: int = 0
    #: of those, without ``l2`` or ``update_l2``
    without_norms: int = 0
    #: of those, not changing by the model's construction (the manifest's structure)
    structural: int = 0


class WeightUpdateRatio(Rule[WeightUpdateRatioConfig, WeightUpdateRatioState]):
    """Judges ``ratio = ||W_s - W_prev|| / (||W_prev|| + epsilon)`` of each weight tensor
    between two saves.

    Test (neither ``large_threshold`` nor ``small_threshold`` given, trainguard's method): a
    tensor's ratio against its own running level, in orders of magnitude. The level is a
    robust running estimate of its log10 ratio (each save moves it by ``LEVEL_RATE`` of the
    difference, clipped to ``LEVEL_CLIP`` orders, so a learning-rate schedule is followed and
    a sudden change is not; a save that departs is not folded in), its spread the same
    running mean of absolute differences. Fires
    when, after ``HISTORY`` judged pairs, ``PATIENCE`` judged pairs in a row are at least
    ``JUMP_ORDERS`` (10x) above the level (a learning-rate blow-up: 30x gave ratios of 3-7,
    under SageMaker's 10) or ``COLLAPSE_ORDERS`` (100x) below it (a collapse: a learning rate
    cut 1e6-fold gave 8.8e-7, above SageMaker's 1e-8), and at least ``SPREADS`` of its spreads
    away; or when ``PATIENCE`` pairs in a row exceed SageMaker's 10 (a blow-up from the start,
    with no level to compare with). False-alarm budget: <= 1 per 100 healthy runs; a step
    decay (x0.1) and warmups stay quiet; limits: a warm restart from a near-zero learning rate
    (SGDR) may read as a jump, a tensor that never moves from its first save is not judged
    (no level; name it with SageMaker's thresholds, or see UnchangedTensor).

    Either threshold given: SageMaker's check, ``ratio > large_threshold`` or ``ratio <
    small_threshold`` on one pair (the other threshold at SageMaker's default, 10 / 1e-8).

    Reads, for TRAIN and GLOBAL steps (``UPDATING_MODES``: evaluation does not change the
    weights), tensors in the ``weights`` collection of the lowest-ranked worker that saved
    weights (data-parallel replicas hold the same weights), the ``update_l2`` statistic
    (``||W_s - W_prev||``, computed by the hook against its previous save of that tensor:
    statistics alone cannot give the norm of a difference) and ``l2``; the state keeps
    ``||W_prev||`` from the previous step with weights.

    Choices: with ``num_steps`` set, a pair is judged only when the previous step with
    weights is at or after ``s - num_steps`` (SageMaker: "compared with a step >= s -
    num_steps"); without it, consecutive saved steps are compared. Tensors without
    ``update_l2``, and a previous norm of 0 (a zero-initialised weight: no relative update)
    under the relative method, are skipped. The state keeps at most ``MAX_TRACKED`` tensors
    (the first in the hook's order, norms rounded to 7 digits) with a digest of their names;
    the rest are counted in ``untracked`` and not judged, and a step whose weight tensors
    differ from the previous step's is not judged (and starts the levels again). Parameters
    that do not change by the model's construction or the user's design (the manifest's
    structure: frozen, unused, a bias feeding BatchNorm, ``trainguard.rules._structure``)
    are not judged: in SageMaker a frozen layer fires the small threshold.
    """

    name = "WeightUpdateRatio"
    Config = WeightUpdateRatioConfig
    State = WeightUpdateRatioState
    summary = (
        "A weight update jumps or collapses by orders of magnitude against the tensor's own "
        "history (or passes SageMaker's thresholds, when given)."
    )
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
                f"or 'update_l2' statistic, {state.structural:,} frozen, unused or constant by the "
                "model's construction); a ratio needs the same weights saved twice, within "
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
        kept = [v for v in tracked if not structural(step.structure, v.name, NOT_CHANGING)]
        state.structural += len(tracked) - len(kept)
        tracked = kept
        untracked = max(0, len(tracked) - MAX_TRACKED)
        tracked = tracked[:MAX_TRACKED]
        names = _digest([v.name for v in tracked])
        if names != state.names:
            n = len(tracked)
            state.level, state.spread = [0.0] * n, [0.0] * n
            state.seen, state.streak, state.over = [0] * n, [0] * n, [0] * n
        near = (
            state.prev_step is not None
            and names == state.names
            and (cfg.num_steps is None or step.step - state.prev_step <= cfg.num_steps)
        )
        finding: Finding | None = None
        for index, (view, prev) in enumerate(zip(tracked, state.prev_l2 if near else [], strict=False)):
            stats = view.stats
            assert stats is not None
            if stats.update_l2 is None or prev != prev:
                continue  # not computed (a NaN previous norm stands for an absent one)
            ratio = stats.update_l2 / (prev + cfg.epsilon)
            bounds = cfg.bounds
            if bounds is None:
                if prev == 0 or ratio != ratio:
                    continue  # a zero weight has no relative update; a NaN is ExplodingTensor's
                state.ratios_checked += 1
                message = self._relative(state, index, ratio)
                if message is None or finding is not None:
                    continue
                finding = self.finding(
                    step.step,
                    f"{self.name}: {view.name} update ratio ||dW||/||W_prev|| = {fmt(stats.update_l2)}/"
                    f"{fmt(prev)} = {fmt(ratio)} (step {state.prev_step} -> {step.step}): {message}.",
                    tensor=view.name,
                    value=ratio,
                )
                continue
            state.ratios_checked += 1
            small, large = bounds
            if ratio > large:
                kind, op, bound = "large", ">", large
            elif ratio < small:
                kind, op, bound = "small", "<", small
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

    @staticmethod
    def _relative(state: WeightUpdateRatioState, i: int, ratio: float) -> str | None:
        """Fold one ratio into tensor ``i``'s level; the finding's text when it fires."""
        x = max(FLOOR, math.log10(ratio)) if ratio > 0 else FLOOR
        seen, level, spread = state.seen[i], state.level[i], state.spread[i]
        state.seen[i] = seen + 1
        over = state.over[i] = state.over[i] + 1 if ratio > SAGEMAKER_LARGE else 0
        diff = x - level
        noise = SPREADS * spread
        streak = 0
        if seen >= HISTORY and diff >= max(JUMP_ORDERS, noise):
            streak = max(state.streak[i], 0) + 1
        elif seen >= HISTORY and -diff >= max(COLLAPSE_ORDERS, noise):
            streak = min(state.streak[i], 0) - 1
        state.streak[i] = streak
        if seen == 0:
            state.level[i] = round(x, 4)
        elif not streak:  # a save that departs is judged against the level, not folded into it
            state.level[i] = round(level + LEVEL_RATE * max(-LEVEL_CLIP, min(LEVEL_CLIP, diff)), 4)
            state.spread[i] = round(spread + LEVEL_RATE * (min(abs(diff), LEVEL_CLIP) - spread), 4)
        if abs(streak) >= PATIENCE:
            state.streak[i] = state.over[i] = 0
            word = "above" if streak > 0 else "below"
            return (
                f"{fmt(abs(diff))} orders of magnitude {word} its running level 10^{fmt(level)} "
                f"(spread {fmt(spread)} orders) for {PATIENCE} saves in a row; the test fires at "
                f"{fmt(JUMP_ORDERS if streak > 0 else COLLAPSE_ORDERS)} orders and {fmt(SPREADS)} spreads"
            )
        if over >= PATIENCE:
            state.streak[i] = state.over[i] = 0
            return (
                f"above {fmt(SAGEMAKER_LARGE)} for {PATIENCE} saves in a row: the update is larger "
                "than the weight"
            )
        return None


def _digest(names: list[str]) -> str:
    return hashlib.blake2b("\n".join(names).encode(), digest_size=8).hexdigest()

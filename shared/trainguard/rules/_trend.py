"""Stalled or converged: how LossNotDecreasing and LossConverged read a loss's block means.

Not a rule module (it defines no ``Rule`` subclass). ``BlockTrend`` keeps, per mode, the last
few block means with their sizes, the first loss and the range of the block means so far;
``judge`` says what the newest block shows, against the series' own noise ``sigma`` (from
``trainguard.rules.noise``; a block of n losses has noise ``sigma / sqrt(n)``):

- ``moving``: the last ``horizon + 1`` blocks differ beyond their noise (falling, rising,
  wandering as adversarial losses do): not a plateau, nothing to say.
- a *plateau*: the last ``horizon + 1`` block means lie within ``RANGE_Z`` x their noise.
  - ``stalled``: the loss never moved: every block so far within ``HISTORY_Z`` x the noise,
    and the first loss not above the plateau by ``FALL_Z`` x the per-loss noise (learning
    rate 0, a frozen model, a loss that ignores the parameters).
  - ``stopped``: it was falling and stopped at once: the two block-to-block falls before
    the plateau, extrapolated as a geometric decline (ratio ``r`` of the second to the first),
    predict a further fall that the plateau lacks by more than ``MISS_Z`` x the noise (and it
    fell less than a quarter of it). A learning rate cut 1e6-fold mid-decline does this; a converging
    loss, whose falls shrink block by block, does not: its own ratio predicts the plateau.
  - ``flat``: it moved before but is no lower than its first loss (adversarial losses).
  - ``converged``: it fell before and its decline faded out as its own ratio predicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from trainguard.rules.noise import block_noise

#: block means of a plateau lie within this many block noises of each other (4 means of pure
#: noise exceed 4.5 in about 1 % of windows)
RANGE_Z = 4.5
#: every block of a loss that never moved lies within this many noises (wider: many blocks)
HISTORY_Z = 6.0
#: the first loss above the plateau by this many per-loss noises: the loss fell
FALL_Z = 4.0
#: a fall before the plateau is a real fall at this many noises of a difference
SIGNIFICANT_Z = 3.0
#: the fall the plateau lacks, in noises of a difference, for an abrupt stop
MISS_Z = 4.0
#: the most block means kept: the plateau window and the three blocks before it
MAX_HORIZON = 8


class BlockTrend(BaseModel):
    """One mode's recent block means (bounded: ``horizon + 4``), the first loss, the range."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    means: list[float] = Field(default_factory=list, max_length=MAX_HORIZON + 4)
    counts: list[int] = Field(default_factory=list, max_length=MAX_HORIZON + 4)
    first: float | None = None
    #: lowest and highest block mean after the first block (``means`` holds only those too)
    low: float | None = None
    high: float | None = None
    blocks: int = 0

    def add(self, mean: float, n: int, horizon: int) -> None:
        """A closed block. The first (SageMaker's schedule: the first loss alone) is not kept:
        one loss is as noisy as a block of 50 is not; ``first`` judges the start."""
        self.blocks += 1
        if self.blocks == 1:
            return
        if math.isfinite(mean):
            self.low = mean if self.low is None else min(self.low, mean)
            self.high = mean if self.high is None else max(self.high, mean)
        self.means.append(mean)
        self.counts.append(n)
        keep = horizon + 4
        del self.means[:-keep], self.counts[:-keep]


@dataclass(frozen=True)
class Verdict:
    kind: str  # "moving", "stalled", "stopped", "converged", "flat", "unknown"
    #: the plateau's noise (of one block mean), its range, and for "stopped" the falls
    noise: float = 0.0
    spread: float = 0.0
    predicted: float = 0.0
    observed: float = 0.0


def judge(trend: BlockTrend, sigma: float | None, horizon: int, *, learned: bool = False) -> Verdict:
    """What the newest block shows (see the module docstring).

    ``learned``: another mode's loss of the job fell (an EVAL loss first seen once the model
    had converged never moves, yet the model learned: not a stall from the start).
    """
    means, counts = trend.means, trend.counts
    if sigma is None or len(means) < horizon + 1 or not all(math.isfinite(m) for m in means):
        return Verdict("unknown")
    window = means[-(horizon + 1) :]
    noise = max(block_noise(sigma, n) for n in counts[-(horizon + 1) :])
    spread = max(window) - min(window)
    if spread >= RANGE_Z * noise:
        return Verdict("moving", noise, spread)
    history = (trend.high or 0.0) - (trend.low or 0.0)
    first = trend.first if trend.first is not None else window[-1]
    fell = first - window[-1] >= FALL_Z * sigma
    if history < HISTORY_Z * noise and not fell and not learned:
        return Verdict("stalled", noise, spread)
    if not fell:
        return Verdict("flat", noise, spread)  # it moved, or another mode fell
    if len(means) >= horizon + 4:
        a, b, c = means[-(horizon + 4)], means[-(horizon + 3)], means[-(horizon + 2)]
        diff_noise = math.sqrt(2.0) * noise
        before, last = a - b, b - c
        # both falls real: a ratio of two noisy falls predicts anything
        if min(before, last) > SIGNIFICANT_Z * diff_noise:
            r = min(last / before, 0.99)
            predicted = last * sum(r**k for k in range(1, horizon + 2))
            observed = c - window[-1]
            if predicted - observed > MISS_Z * diff_noise and observed < predicted / 4:
                return Verdict("stopped", noise, spread, predicted, observed)
    return Verdict("converged", noise, spread)

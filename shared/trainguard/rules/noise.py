"""A job's own noise, estimated online: the scale every loss rule judges its effects against.

A loss moves for two reasons: the model changed, or this mini-batch differed from the last.
A rule that compares raw values (a block mean with the previous one, a gap with 10 % of the
training loss, a swing with 0.03) mistakes the second for the first on a noisy or near-zero
loss. The loss rules instead measure an *effect* (a fall, a rise, a gap's growth) in units of
the series' own noise, estimated robustly from a bounded window of recent values.

``RobustNoise`` keeps the last ``size`` finite values of one series. Its noise ``sigma`` is
the median absolute deviation of the *first differences* around their median, scaled to a
standard deviation: differencing removes a slowly changing level (a falling loss), removing
the median difference removes a steady slope, and the median ignores the rare outlier (one
hard batch). For independent noise of standard deviation s, a difference has 2 s^2 variance,
hence the 1/sqrt(2). A block of n values has a mean whose noise is ``sigma / sqrt(n)``.

Not a rule module (it defines no ``Rule`` subclass); the state is small (``MAX_WINDOW`` floats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

from pydantic import BaseModel, ConfigDict, Field

#: median absolute deviation -> standard deviation of a normal distribution
MAD_TO_SIGMA = 1.4826
#: the most values one estimator keeps (its DynamoDB bytes are bounded by this)
MAX_WINDOW = 128
#: values needed before a noise estimate is given (fewer: ``sigma`` is None)
MIN_VALUES = 8
#: the smallest noise a series can have, relative to its level: a loss that repeats exactly
#: (a sum of equal floats) still has rounding, and an effect against zero noise is infinite
RELATIVE_FLOOR = 1e-9


def median(values: Sequence[float]) -> float:
    """The median (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def mad_sigma(values: Sequence[float]) -> float:
    """Robust standard deviation: 1.4826 x the median absolute deviation from the median."""
    if not values:
        return math.nan
    centre = median(values)
    return MAD_TO_SIGMA * median([abs(v - centre) for v in values])


def diff_sigma(values: Sequence[float]) -> float:
    """The noise of a series around its slowly changing level (see the module docstring)."""
    if len(values) < 3:
        return math.nan
    diffs = [b - a for a, b in pairwise(values)]
    return mad_sigma(diffs) / math.sqrt(2.0)


def diff2_sigma(values: Sequence[float]) -> float:
    """Like ``diff_sigma`` on second differences: also blind to a changing slope (a curve's
    bend), for short series of evaluations whose trend curves within the window. For
    independent noise of standard deviation s, a second difference has 6 s^2 variance."""
    if len(values) < 4:
        return math.nan
    d2 = [c - 2 * b + a for a, b, c in zip(values, values[1:], values[2:], strict=False)]
    return mad_sigma(d2) / math.sqrt(6.0)


def effect_size(effect: float, noise: float, level: float = 0.0) -> float:
    """``effect / noise``, with the noise floored at ``RELATIVE_FLOOR`` of the level.

    Scale-free: the same job's loss multiplied by 1000 gives the same effect size.
    """
    floor = max(abs(level) * RELATIVE_FLOOR, 1e-300)
    return effect / max(noise, floor) if noise == noise else math.nan


def block_noise(sigma: float, n: int) -> float:
    """The noise of the mean of ``n`` values whose noise is ``sigma``."""
    return sigma / math.sqrt(max(n, 1))


class RobustNoise(BaseModel):
    """The last ``size`` finite values of one series: its robust level and noise.

    Non-finite values are not kept (they are what ExplodingTensor and LossDivergence judge);
    ``seen`` counts every finite value received.
    """

    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=64, ge=MIN_VALUES, le=MAX_WINDOW)
    #: 1: first differences (a steady slope removed); 2: second differences (a bend removed too)
    order: int = Field(default=1, ge=1, le=2)
    values: list[float] = Field(default_factory=list, max_length=MAX_WINDOW)
    seen: int = 0

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            return
        self.values.append(value)
        self.seen += 1
        if len(self.values) > self.size:
            del self.values[: len(self.values) - self.size]

    @property
    def ready(self) -> bool:
        return len(self.values) >= MIN_VALUES

    def level(self) -> float | None:
        """The median of the window (None while fewer than ``MIN_VALUES`` values)."""
        return median(self.values) if self.ready else None

    def sigma(self) -> float | None:
        """The noise around the level, floored relative to it (None while not ``ready``)."""
        if not self.ready:
            return None
        level = median(self.values)
        noise = diff_sigma(self.values) if self.order == 1 else diff2_sigma(self.values)
        return max(noise, abs(level) * RELATIVE_FLOOR)

"""StepOutlier: step durations well above the usual ones, more than ``n_outliers`` times.

Reads the step timings (``end - start`` of each step event). Each mode is judged on its own
(TRAIN steps and EVAL steps differ in length), or only ``mode`` when it is set. Keeps a
running mean and variance per mode (Welford); from the 101st step of a mode on, a step is an
outlier when its duration > mean + ``stddev`` · std of the steps before it. All steps enter
the running statistics, outliers included (SageMaker's "mean + stddev·std" of the durations).
Fires when a mode has more than ``n_outliers`` outliers; the finding names the step that
crossed the count. Steps of all workers are pooled per mode.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from trainguard.format.documents import Mode
from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState

WARMUP_STEPS = 100
KEEP_OUTLIERS = 10


class StepOutlierConfig(RuleConfig):
    stddev: float = Field(default=3.0, gt=0)
    mode: Mode | None = None
    n_outliers: int = Field(default=10, ge=0)


class StepStats(BaseModel):
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    max: float = 0.0
    outliers: int = 0
    #: the latest outliers: (step, duration seconds)
    recent: list[tuple[int, float]] = Field(default_factory=list, max_length=KEEP_OUTLIERS)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0


class StepOutlierState(ProfilerState):
    modes: dict[Mode, StepStats] = Field(default_factory=dict, max_length=4)


class StepOutlier(ProfilerRule[StepOutlierConfig, StepOutlierState]):
    """Fires when a mode has more than ``n_outliers`` steps above mean + ``stddev`` std.

    Details and the choices made are in the module docstring.
    """

    name = "StepOutlier"
    Config = StepOutlierConfig
    State = StepOutlierState
    summary = "more than `n_outliers` steps longer than mean + `stddev`·std"
    advice = (
        "Some steps take much longer than the rest: look for periodic work in the loop (checkpoints, "
        "evaluation, logging), data-loading stalls, garbage collection or contention from other processes."
    )

    def _update(self, state: StepOutlierState, batch: SystemBatch) -> tuple[StepOutlierState, list[Finding]]:
        cfg = self.config
        for event in batch.steps:
            if cfg.mode is not None and event.mode != cfg.mode:
                continue
            stats = state.modes.setdefault(event.mode, StepStats())
            d = event.duration
            if stats.n >= WARMUP_STEPS:
                limit = stats.mean + cfg.stddev * stats.std
                if d > limit:
                    stats.outliers += 1
                    stats.recent = [*stats.recent, (event.step, d)][-KEEP_OUTLIERS:]
                    if stats.outliers > cfg.n_outliers:
                        _welford(stats, d)
                        return state, [
                            self.finding(
                                event.step,
                                f"{stats.outliers} {event.mode} steps took longer than mean + "
                                f"{fmt(cfg.stddev)}·std "
                                f"({fmt(limit)} s; mean {fmt(stats.mean)} s over {stats.n} steps); step "
                                f"{event.step} took {fmt(d)} s; n_outliers {cfg.n_outliers}.",
                                value=float(stats.outliers),
                                threshold=float(cfg.n_outliers),
                            )
                        ]
            _welford(stats, d)
        return state, []

    def describe(self, state: StepOutlierState) -> dict[str, Any]:
        return {
            mode: {"steps": s.n, "mean_s": s.mean, "std_s": s.std, "max_s": s.max, "outliers": s.outliers}
            for mode, s in state.modes.items()
        }


def _welford(stats: StepStats, x: float) -> None:
    stats.n += 1
    delta = x - stats.mean
    stats.mean += delta / stats.n
    stats.m2 += delta * (x - stats.mean)
    stats.max = max(stats.max, x)

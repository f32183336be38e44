"""What every profiler rule shares: the update contract over system batches and bounded helpers.

A profiler rule reads :class:`~trainguard.format.system.SystemBatch` documents (host samples
and step timings) instead of step objects::

    rule = CPUBottleneck(CPUBottleneck.Config.model_validate({"threshold": "50"}))
    state = rule.initial_state()
    for batch in batches:            # each worker's batches in seq order, workers interleaved
        state, findings = rule.update(state, batch)
    findings = rule.finish(state)

``update`` never mutates the state it is given (it works on a copy). State stays bounded
whatever the job's length: counters, fixed-bin histograms over 0..100 % (percentiles are read
from the bins, interpolated), per-GPU entries capped at :data:`MAX_TRACKED_GPUS`.

Shared choices, documented once:

* ``patience`` (SageMaker: "data points to skip before the rule starts evaluating") is
  turned into time: samples earlier than ``t0 + patience * interval_s`` are skipped, where
  ``t0`` is the earliest sample seen. With several workers this skips the first
  ``patience`` samples of each of them, without a per-worker counter.
* A rule that needs GPU data and never sees any (``gpus`` is ``None``: absent, not zero)
  does not fire; its :meth:`ProfilerRule.notes` say it was not applicable.
* A finding's ``step`` is the newest training step seen in the step timings (0 when none
  was seen yet); the message says what was measured, over how many samples.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from trainguard.format.system import SystemBatch, SystemSample
from trainguard.rules.base import Coverage, Finding, RuleConfig, RuleState, SystemRule

#: GPUs (worker, index) whose per-GPU histograms a rule keeps; more are counted, not tracked
MAX_TRACKED_GPUS = 64
#: samples a share-based rule needs (after patience) before it judges
MIN_EVAL_SAMPLES = 100


class ProfilerState(RuleState):
    """Fields every profiler rule's state carries."""

    #: earliest sample time seen (patience is measured from here)
    t0: float | None = None
    #: newest training step seen in the step timings
    last_step: int = 0
    #: samples read (all workers)
    samples: int = 0
    #: samples that carried GPU data
    gpu_samples: int = 0


C = TypeVar("C", bound=RuleConfig)
S = TypeVar("S", bound=ProfilerState)


class ProfilerRule(SystemRule[C, S]):
    """Base of the profiler rules: ``update(state, batch: SystemBatch)``, per worker."""

    kind: ClassVar[str] = "profiler"
    #: the rule judges GPU metrics: without GPU data it cannot fire
    needs_gpu: ClassVar[bool] = False

    def coverage(self, state: S) -> Coverage:
        """System samples judged (a GPU rule on a job without GPU data judged nothing)."""
        if self.needs_gpu:
            reason = self.not_applicable(state) or ""
            return self.covered(state.gpu_samples, "system samples with GPU data", reason=reason)
        return self.covered(
            state.samples, "system samples", reason="" if state.samples else "no system samples were received"
        )

    def check(self, state: S, now: float, *, started: float | None = None) -> tuple[S, list[Finding]]:
        return self.check_clock(state, now, started)

    def check_clock(self, state: S, now: float, job_start: float | None = None) -> tuple[S, list[Finding]]:
        """The timer's call for profiler clock rules (``uses_clock``); the default does nothing."""
        return state, []

    def update(self, state: S, batch: SystemBatch) -> tuple[S, list[Finding]]:
        state = state.model_copy(deep=True)
        if batch.samples:
            first = min(s.t for s in batch.samples)
            state.t0 = first if state.t0 is None else min(state.t0, first)
            state.samples += len(batch.samples)
            state.gpu_samples += sum(1 for s in batch.samples if s.gpus is not None)
        if batch.steps:
            state.last_step = max(state.last_step, max(e.step for e in batch.steps))
        return self._update(state, batch)

    @abstractmethod
    def _update(self, state: S, batch: SystemBatch) -> tuple[S, list[Finding]]:
        """The rule's own judgement of one batch (state already counted its samples)."""

    def describe(self, state: S) -> dict[str, Any]:
        """What the report shows for this rule besides its findings: numbers and notes."""
        return {}

    def notes(self, state: S) -> dict[str, Any]:
        """``describe`` plus a ``note`` when the rule could not judge the job."""
        out = dict(self.describe(state))
        note = self.not_applicable(state)
        if note:
            out["note"] = note
        return out

    def not_applicable(self, state: S) -> str | None:
        if self.needs_gpu and state.samples and not state.gpu_samples:
            return "not applicable: no GPU data was recorded (NVML absent or no GPU), so the rule cannot fire"
        if self.needs_gpu and not state.samples:
            return "no system samples were received"
        return None

    # helpers --------------------------------------------------------------------------
    def active_samples(self, state: S, batch: SystemBatch, patience: int) -> list[SystemSample]:
        """The batch's samples past the patience period."""
        if state.t0 is None:
            return []
        start = state.t0 + patience * batch.interval_s
        return [s for s in batch.samples if s.t >= start]


# fixed-bin histograms over 0..100 % ---------------------------------------------------------
def pct_bin(value: float, bins: int) -> int:
    return min(bins - 1, max(0, int(value * bins / 100.0)))


def hist_add(counts: list[int], value: float) -> None:
    counts[pct_bin(value, len(counts))] += 1


def hist_percentile(counts: Sequence[int], q: float, lo: float = 0.0, hi: float = 100.0) -> float | None:
    """The q-th percentile (0..100) of a fixed-bin histogram, interpolated inside the bin."""
    total = sum(counts)
    if total <= 0:
        return None
    width = (hi - lo) / len(counts)
    target = q / 100.0 * total
    running = 0
    for i, c in enumerate(counts):
        if c and running + c >= target:
            frac = (target - running) / c
            return lo + width * (i + frac)
        running += c
    return hi


def js_distance(p: Sequence[int], q: Sequence[int]) -> float:
    """Jensen-Shannon distance (base 2, in 0..1) between two histograms of the same bins."""
    sp, sq = sum(p), sum(q)
    if sp <= 0 or sq <= 0:
        return 0.0
    div = 0.0
    for a, b in zip(p, q, strict=True):
        pa, qb = a / sp, b / sq
        m = (pa + qb) / 2
        if pa > 0:
            div += 0.5 * pa * math.log2(pa / m)
        if qb > 0:
            div += 0.5 * qb * math.log2(qb / m)
    return math.sqrt(max(0.0, min(1.0, div)))


def gpu_key(worker: int, index: int) -> str:
    return f"w{worker}:gpu{index}"


class BottleneckState(ProfilerState):
    #: samples judged (past patience, with GPU data)
    counted: int = 0
    #: of which the GPU starved while the host resource was saturated
    bottlenecked: int = 0
    #: time of the latest bottlenecked sample
    last_bottleneck_t: float | None = None


def step_at(batch: SystemBatch, t: float, default: int) -> int:
    """The newest step of the batch that had started by time ``t`` (``default`` if none)."""
    steps = [e.step for e in batch.steps if e.start <= t]
    return max(steps) if steps else default


def gpu_mean_util(sample: SystemSample) -> float | None:
    if not sample.gpus:
        return None
    return sum(g.util_percent for g in sample.gpus) / len(sample.gpus)


def count_bottlenecks(
    state: BottleneckState,
    samples: Sequence[SystemSample],
    gpu_threshold: float,
    host_value: str,
    host_threshold: float,
    share_threshold: float,
) -> SystemSample | None:
    """Count samples whose mean GPU utilisation < gpu_threshold while ``host_value`` > threshold.

    Returns the first sample at which, with at least :data:`MIN_EVAL_SAMPLES` judged, the
    bottlenecked share exceeds ``share_threshold`` % (counting stops there: the rule fired).
    """
    for s in samples:
        util = gpu_mean_util(s)
        if util is None:
            continue
        state.counted += 1
        if util < gpu_threshold and float(getattr(s, host_value)) > host_threshold:
            state.bottlenecked += 1
            state.last_bottleneck_t = s.t
        if state.counted >= MIN_EVAL_SAMPLES and 100.0 * state.bottlenecked > share_threshold * state.counted:
            return s
    return None

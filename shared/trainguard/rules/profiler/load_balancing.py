"""LoadBalancing: the GPUs do unequal work.

Reads each GPU's utilisation (every GPU of every worker's host, keyed by worker and index).
After ``patience`` samples, each GPU's utilisation goes into a 20-bin histogram (5 % bins:
coarse enough that two equally loaded GPUs' sampling noise stays far below the threshold).
After each batch, once at least two GPUs have :data:`~.base.MIN_EVAL_SAMPLES` samples, the
Jensen-Shannon distance (base 2, so 0..1) between every pair of GPUs' histograms is
computed; the rule fires when the largest exceeds ``threshold``. A GPU that the job does not
use at all (on a host with several) counts as unbalanced load: that is the point. With fewer
than two GPUs, or no GPU data, it cannot fire.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import (
    MAX_TRACKED_GPUS,
    MIN_EVAL_SAMPLES,
    ProfilerRule,
    ProfilerState,
    gpu_key,
    hist_add,
    js_distance,
)

BINS = 20


class LoadBalancingConfig(RuleConfig):
    threshold: float = Field(default=0.5, ge=0, le=1)
    patience: int = Field(default=1000, ge=0)


class LoadBalancingState(ProfilerState):
    gpus: dict[str, list[int]] = Field(default_factory=dict, max_length=MAX_TRACKED_GPUS)
    untracked_gpus: int = 0
    max_distance: float | None = None
    max_pair: tuple[str, str] | None = None


class LoadBalancing(ProfilerRule[LoadBalancingConfig, LoadBalancingState]):
    """Fires when two GPUs' utilisation histograms are further apart than ``threshold`` (JS distance).

    Details and the choices made are in the module docstring.
    """

    name = "LoadBalancing"
    Config = LoadBalancingConfig
    State = LoadBalancingState
    needs_gpu = True
    summary = "the GPUs' utilisation distributions differ (Jensen-Shannon distance)"
    advice = (
        "Work is unevenly spread over the GPUs: check that every GPU is used (DistributedDataParallel "
        "rather than DataParallel), that shards are equal, and that rank 0 does no extra work in the loop."
    )

    def _update(
        self, state: LoadBalancingState, batch: SystemBatch
    ) -> tuple[LoadBalancingState, list[Finding]]:
        cfg = self.config
        for sample in self.active_samples(state, batch, cfg.patience):
            for g in sample.gpus or ():
                key = gpu_key(batch.worker, g.index)
                counts = state.gpus.get(key)
                if counts is None:
                    if len(state.gpus) >= MAX_TRACKED_GPUS:
                        state.untracked_gpus += 1
                        continue
                    counts = state.gpus[key] = [0] * BINS
                hist_add(counts, g.util_percent)
        ready = sorted(k for k, c in state.gpus.items() if sum(c) >= MIN_EVAL_SAMPLES)
        if len(ready) < 2:
            return state, []
        best, pair = -1.0, (ready[0], ready[1])
        for a, b in combinations(ready, 2):
            d = js_distance(state.gpus[a], state.gpus[b])
            if d > best:
                best, pair = d, (a, b)
        state.max_distance, state.max_pair = best, pair
        if best > cfg.threshold:
            return state, [
                self.finding(
                    state.last_step,
                    f"The utilisation of {pair[0]} and {pair[1]} differ: Jensen-Shannon distance "
                    f"{fmt(best)} > threshold {fmt(cfg.threshold)} (over {len(ready)} GPUs).",
                    tensor=f"{pair[0]},{pair[1]}",
                    value=best,
                    threshold=cfg.threshold,
                )
            ]
        return state, []

    def not_applicable(self, state: LoadBalancingState) -> str | None:
        note = super().not_applicable(state)
        if note is None and state.samples and len(state.gpus) < 2 and state.gpu_samples:
            return "not applicable: fewer than two GPUs were seen"
        return note

    def describe(self, state: LoadBalancingState) -> dict[str, Any]:
        return {"gpus": len(state.gpus), "max_distance": state.max_distance, "pair": state.max_pair}

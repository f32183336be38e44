"""GPUMemoryIncrease: a GPU's memory use keeps growing (a leak, or tensors kept across steps).

Reads each GPU's used memory as a percentage of its total. After ``patience`` samples, the
samples of each GPU are averaged over consecutive blocks of ``window`` samples (the moving
mean, sampled every ``window`` samples; only a running sum is kept). The lowest block mean
seen is the baseline; the rule fires when a block mean exceeds the baseline by more than
``increase`` percentage points. (SageMaker documents "moving average increases by more than
``increase`` %"; measuring from the lowest mean rather than the first one means memory that
is freed and then grows again still counts.) Without GPU data it cannot fire.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import MAX_TRACKED_GPUS, ProfilerRule, ProfilerState, gpu_key, step_at


class GPUMemoryIncreaseConfig(RuleConfig):
    increase: float = Field(default=5.0, ge=0, le=100)
    patience: int = Field(default=1000, ge=0)
    window: int = Field(default=10, ge=1, le=1_000_000)


class MemoryBlock(BaseModel):
    total: float = 0.0
    n: int = 0
    baseline: float | None = None
    last_mean: float | None = None
    max_mean: float | None = None


class GPUMemoryIncreaseState(ProfilerState):
    gpus: dict[str, MemoryBlock] = Field(default_factory=dict, max_length=MAX_TRACKED_GPUS)
    untracked_gpus: int = 0


class GPUMemoryIncrease(ProfilerRule[GPUMemoryIncreaseConfig, GPUMemoryIncreaseState]):
    """Fires when a GPU's block-mean memory use rises more than ``increase`` points over its lowest.

    Details and the choices made are in the module docstring.
    """

    name = "GPUMemoryIncrease"
    Config = GPUMemoryIncreaseConfig
    State = GPUMemoryIncreaseState
    needs_gpu = True
    summary = "the moving mean of GPU memory use rises by more than `increase` points"
    advice = (
        "GPU memory keeps growing: look for tensors kept across steps (losses appended without "
        ".item()/.detach(), caches, growing sequence lengths); it ends in an out-of-memory error."
    )

    def _update(
        self, state: GPUMemoryIncreaseState, batch: SystemBatch
    ) -> tuple[GPUMemoryIncreaseState, list[Finding]]:
        cfg = self.config
        for sample in self.active_samples(state, batch, cfg.patience):
            for g in sample.gpus or ():
                key = gpu_key(batch.worker, g.index)
                block = state.gpus.get(key)
                if block is None:
                    if len(state.gpus) >= MAX_TRACKED_GPUS:
                        state.untracked_gpus += 1
                        continue
                    block = state.gpus[key] = MemoryBlock()
                block.total += g.mem_used_percent
                block.n += 1
                if block.n < cfg.window:
                    continue
                mean = block.total / block.n
                block.total, block.n = 0.0, 0
                block.last_mean = mean
                block.max_mean = mean if block.max_mean is None else max(block.max_mean, mean)
                if block.baseline is None or mean < block.baseline:
                    block.baseline = mean
                    continue
                rise = mean - block.baseline
                if rise > cfg.increase:
                    return state, [
                        self.finding(
                            step_at(batch, sample.t, state.last_step),
                            f"{key} memory use rose from a mean of {fmt(block.baseline)}% to {fmt(mean)}% "
                            f"of its memory (+{fmt(rise)} points > increase {fmt(cfg.increase)}).",
                            tensor=key,
                            value=rise,
                            threshold=cfg.increase,
                        )
                    ]
        return state, []

    def describe(self, state: GPUMemoryIncreaseState) -> dict[str, Any]:
        return {
            "gpus": {
                k: {"baseline": b.baseline, "last": b.last_mean, "max": b.max_mean}
                for k, b in state.gpus.items()
            }
        }

"""LowGPUUtilization: a GPU is under-used, or its utilisation swings between busy and idle.

Reads each GPU's utilisation (every GPU NVML reports, keyed by worker and index). After
``patience`` samples, each GPU's samples fill tumbling windows of ``window`` samples (a
50-bin histogram, so the state stays small; SageMaker's window slides, a tumbling one judges
the same data without keeping the samples). When a window is full:

* p95 < ``threshold_p95``: under-utilised (the batch or the model is too small for the GPU,
  or something else starves it);
* p95 > ``threshold_p95`` and p5 < ``threshold_p5``: fluctuating (busy, then idle: typically
  waiting for data or for synchronisation).

The percentiles are interpolated inside 2 %-wide bins. Without GPU data it cannot fire.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import (
    MAX_TRACKED_GPUS,
    ProfilerRule,
    ProfilerState,
    gpu_key,
    hist_add,
    hist_percentile,
    step_at,
)

BINS = 50


class LowGPUUtilizationConfig(RuleConfig):
    threshold_p95: float = Field(default=70.0, ge=0, le=100)
    threshold_p5: float = Field(default=10.0, ge=0, le=100)
    window: int = Field(default=500, ge=1, le=1_000_000)
    patience: int = Field(default=1000, ge=0)


class GpuWindow(BaseModel):
    counts: list[int] = Field(default_factory=lambda: [0] * BINS, max_length=BINS)
    n: int = 0
    windows: int = 0
    last_p95: float | None = None
    last_p5: float | None = None


class LowGPUUtilizationState(ProfilerState):
    gpus: dict[str, GpuWindow] = Field(default_factory=dict, max_length=MAX_TRACKED_GPUS)
    untracked_gpus: int = 0


class LowGPUUtilization(ProfilerRule[LowGPUUtilizationConfig, LowGPUUtilizationState]):
    """Fires when a GPU's windowed p95 is low, or its p95 high with its p5 low (fluctuating).

    Details and the choices made are in the module docstring.
    """

    name = "LowGPUUtilization"
    Config = LowGPUUtilizationConfig
    State = LowGPUUtilizationState
    needs_gpu = True
    summary = "GPU utilisation low (p95) or fluctuating (p95 high, p5 low)"
    advice = (
        "Under-used GPU: increase the batch size or use a smaller instance. Fluctuating: look for "
        "a data-loading or synchronisation bottleneck (more loader workers, prefetching)."
    )

    def _update(
        self, state: LowGPUUtilizationState, batch: SystemBatch
    ) -> tuple[LowGPUUtilizationState, list[Finding]]:
        cfg = self.config
        for sample in self.active_samples(state, batch, cfg.patience):
            for g in sample.gpus or ():
                key = gpu_key(batch.worker, g.index)
                win = state.gpus.get(key)
                if win is None:
                    if len(state.gpus) >= MAX_TRACKED_GPUS:
                        state.untracked_gpus += 1
                        continue
                    win = state.gpus[key] = GpuWindow()
                hist_add(win.counts, g.util_percent)
                win.n += 1
                if win.n < cfg.window:
                    continue
                p95 = hist_percentile(win.counts, 95) or 0.0
                p5 = hist_percentile(win.counts, 5) or 0.0
                win.last_p95, win.last_p5 = p95, p5
                win.windows += 1
                win.counts = [0] * BINS
                win.n = 0
                if p95 < cfg.threshold_p95:
                    return state, [
                        self.finding(
                            step_at(batch, sample.t, state.last_step),
                            f"{key} is under-utilised: p95 utilisation {fmt(p95)}% < threshold_p95 "
                            f"{fmt(cfg.threshold_p95)}% over the last {cfg.window} samples.",
                            tensor=key,
                            value=p95,
                            threshold=cfg.threshold_p95,
                        )
                    ]
                if p5 < cfg.threshold_p5:
                    return state, [
                        self.finding(
                            step_at(batch, sample.t, state.last_step),
                            f"{key} utilisation fluctuates: p95 {fmt(p95)}% > {fmt(cfg.threshold_p95)}% but "
                            f"p5 {fmt(p5)}% < threshold_p5 {fmt(cfg.threshold_p5)}% over the last "
                            f"{cfg.window} samples.",
                            tensor=key,
                            value=p5,
                            threshold=cfg.threshold_p5,
                        )
                    ]
        return state, []

    def describe(self, state: LowGPUUtilizationState) -> dict[str, Any]:
        return {
            "gpus": {
                k: {"p95": w.last_p95, "p5": w.last_p5, "windows": w.windows} for k, w in state.gpus.items()
            }
        }

"""BatchSize: CPU, GPU and GPU memory are all lightly used: the batch is probably too small.

Reads each sample's total CPU utilisation and the mean utilisation and memory use of its
GPUs. After ``patience`` samples, samples with GPU data fill tumbling windows of ``window``
samples (three 50-bin histograms, job-wide: all workers' samples share one window). When a
window is full, the rule fires if the p95 of CPU, GPU and GPU memory are all below their
thresholds. Without GPU data it cannot fire.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState, hist_add, hist_percentile, step_at

BINS = 50


def _zeros() -> list[int]:
    return [0] * BINS


class BatchSizeConfig(RuleConfig):
    cpu_threshold_p95: float = Field(default=70.0, ge=0, le=100)
    gpu_threshold_p95: float = Field(default=70.0, ge=0, le=100)
    gpu_memory_threshold_p95: float = Field(default=70.0, ge=0, le=100)
    patience: int = Field(default=1000, ge=0)
    window: int = Field(default=500, ge=1, le=1_000_000)


class BatchSizeState(ProfilerState):
    cpu: list[int] = Field(default_factory=_zeros, max_length=BINS)
    gpu: list[int] = Field(default_factory=_zeros, max_length=BINS)
    gpu_memory: list[int] = Field(default_factory=_zeros, max_length=BINS)
    n: int = 0
    windows: int = 0
    last_p95: tuple[float, float, float] | None = None


class BatchSize(ProfilerRule[BatchSizeConfig, BatchSizeState]):
    """Fires when the windowed p95 of CPU, GPU and GPU memory are all below their thresholds.

    Details and the choices made are in the module docstring.
    """

    name = "BatchSize"
    Config = BatchSizeConfig
    State = BatchSizeState
    needs_gpu = True
    summary = "CPU, GPU and GPU memory p95 all low: the batch size is probably too small"
    advice = (
        "Increase the batch size (scale the learning rate with it) or move to a smaller, "
        "cheaper instance type."
    )

    def _update(self, state: BatchSizeState, batch: SystemBatch) -> tuple[BatchSizeState, list[Finding]]:
        cfg = self.config
        for s in self.active_samples(state, batch, cfg.patience):
            if not s.gpus:
                continue
            hist_add(state.cpu, s.cpu_total)
            hist_add(state.gpu, sum(g.util_percent for g in s.gpus) / len(s.gpus))
            hist_add(state.gpu_memory, sum(g.mem_used_percent for g in s.gpus) / len(s.gpus))
            state.n += 1
            if state.n < cfg.window:
                continue
            cpu = hist_percentile(state.cpu, 95) or 0.0
            gpu = hist_percentile(state.gpu, 95) or 0.0
            mem = hist_percentile(state.gpu_memory, 95) or 0.0
            state.last_p95 = (cpu, gpu, mem)
            state.windows += 1
            state.cpu, state.gpu, state.gpu_memory, state.n = _zeros(), _zeros(), _zeros(), 0
            if (
                cpu < cfg.cpu_threshold_p95
                and gpu < cfg.gpu_threshold_p95
                and mem < cfg.gpu_memory_threshold_p95
            ):
                return state, [
                    self.finding(
                        step_at(batch, s.t, state.last_step),
                        f"p95 over the last {cfg.window} samples: CPU {fmt(cpu)}% < "
                        f"{fmt(cfg.cpu_threshold_p95)}%, "
                        f"GPU {fmt(gpu)}% < {fmt(cfg.gpu_threshold_p95)}%, GPU memory {fmt(mem)}% < "
                        f"{fmt(cfg.gpu_memory_threshold_p95)}%: the batch size is probably too small.",
                        value=gpu,
                        threshold=cfg.gpu_threshold_p95,
                    )
                ]
        return state, []

    def describe(self, state: BatchSizeState) -> dict[str, Any]:
        if state.last_p95 is None:
            return {"windows": 0}
        cpu, gpu, mem = state.last_p95
        return {"windows": state.windows, "cpu_p95": cpu, "gpu_p95": gpu, "gpu_memory_p95": mem}

"""IOBottleneck: the GPUs starve while the CPUs wait for I/O.

Same method as :mod:`.cpu_bottleneck`, with the host's I/O-wait share (``iowait`` in
``/proc/stat``: CPU time idle while the host had I/O outstanding) > ``io_threshold`` in place
of CPU utilisation. Fires when those samples are more than ``threshold`` % of the samples
judged (after patience, at least :data:`~.base.MIN_EVAL_SAMPLES`). Without GPU data it
cannot fire.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import BottleneckState, ProfilerRule, count_bottlenecks, step_at
from trainguard.rules.profiler.cpu_bottleneck import bottleneck_share


class IOBottleneckConfig(RuleConfig):
    threshold: float = Field(default=50.0, ge=0, le=100)
    gpu_threshold: float = Field(default=10.0, ge=0, le=100)
    io_threshold: float = Field(default=50.0, ge=0, le=100)
    patience: int = Field(default=1000, ge=0)


class IOBottleneck(ProfilerRule[IOBottleneckConfig, BottleneckState]):
    """Fires when the GPUs starve while the host waits for I/O in more than ``threshold`` % of samples.

    Details and the choices made are in the module docstring.
    """

    name = "IOBottleneck"
    Config = IOBottleneckConfig
    State = BottleneckState
    needs_gpu = True
    summary = "GPU utilisation low while the host waits for I/O"
    advice = (
        "Data reads are too slow: prefetch, use more data-loader workers, cache or shard the data "
        "on local NVMe, use a faster file system or fewer, larger files."
    )

    def _update(self, state: BottleneckState, batch: SystemBatch) -> tuple[BottleneckState, list[Finding]]:
        cfg = self.config
        samples = self.active_samples(state, batch, cfg.patience)
        hit = count_bottlenecks(
            state, samples, cfg.gpu_threshold, "iowait_percent", cfg.io_threshold, cfg.threshold
        )
        if hit is not None:
            share = 100.0 * state.bottlenecked / state.counted
            return state, [
                self.finding(
                    step_at(batch, hit.t, state.last_step),
                    f"I/O bottleneck in {fmt(share)}% of {state.counted} samples (GPU utilisation < "
                    f"{fmt(cfg.gpu_threshold)}% while I/O wait > {fmt(cfg.io_threshold)}%); "
                    f"threshold {fmt(cfg.threshold)}%.",
                    value=share,
                    threshold=cfg.threshold,
                )
            ]
        return state, []

    def describe(self, state: BottleneckState) -> dict[str, Any]:
        return bottleneck_share(state)

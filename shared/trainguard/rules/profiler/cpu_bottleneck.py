"""CPUBottleneck: the GPUs starve while the CPUs are saturated.

Reads each sample's total CPU utilisation and its GPUs' utilisation (mean over the host's
GPUs). Skips the first ``patience`` samples (warm-up; see :mod:`.base`), then counts the
samples where GPU utilisation < ``gpu_threshold`` while CPU utilisation > ``cpu_threshold``.
Fires when those are more than ``threshold`` % of the samples judged, once at least
:data:`~.base.MIN_EVAL_SAMPLES` samples were judged (a choice: a share of three samples says
nothing). Samples without GPU data are not judged: on a host where GPUs are absent the rule
never fires, and its summary says why.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import BottleneckState, ProfilerRule, count_bottlenecks, step_at


class CPUBottleneckConfig(RuleConfig):
    threshold: float = Field(default=50.0, ge=0, le=100)
    gpu_threshold: float = Field(default=10.0, ge=0, le=100)
    cpu_threshold: float = Field(default=90.0, ge=0, le=100)
    patience: int = Field(default=1000, ge=0)


class CPUBottleneck(ProfilerRule[CPUBottleneckConfig, BottleneckState]):
    """Fires when the GPUs starve while the CPUs are saturated in more than ``threshold`` % of samples.

    Details and the choices made are in the module docstring.
    """

    name = "CPUBottleneck"
    Config = CPUBottleneckConfig
    State = BottleneckState
    needs_gpu = True
    summary = "GPU utilisation low while CPU utilisation is high"
    advice = (
        "The CPUs cannot feed the GPUs: use more data-loader workers, move preprocessing to the "
        "GPU or offline, or pick an instance with more CPU cores per GPU."
    )

    def _update(self, state: BottleneckState, batch: SystemBatch) -> tuple[BottleneckState, list[Finding]]:
        cfg = self.config
        samples = self.active_samples(state, batch, cfg.patience)
        hit = count_bottlenecks(
            state, samples, cfg.gpu_threshold, "cpu_total", cfg.cpu_threshold, cfg.threshold
        )
        if hit is not None:
            share = 100.0 * state.bottlenecked / state.counted
            return state, [
                self.finding(
                    step_at(batch, hit.t, state.last_step),
                    f"CPU bottleneck in {fmt(share)}% of {state.counted} samples (GPU utilisation < "
                    f"{fmt(cfg.gpu_threshold)}% while CPU > {fmt(cfg.cpu_threshold)}%); "
                    f"threshold {fmt(cfg.threshold)}%.",
                    value=share,
                    threshold=cfg.threshold,
                )
            ]
        return state, []

    def describe(self, state: BottleneckState) -> dict[str, Any]:
        return bottleneck_share(state)


def bottleneck_share(state: BottleneckState) -> dict[str, Any]:
    share = 100.0 * state.bottlenecked / state.counted if state.counted else None
    return {"samples_judged": state.counted, "bottlenecked": state.bottlenecked, "share_percent": share}

"""Dataloader: too few or too many data-loader worker processes for the CPU cores.

Reads the batches' ``dataloader`` block (``num_workers`` of the training loop's DataLoader,
as the hook saw it, and the CPU cores available to the worker process). Fires when
``num_workers / cpu_count`` is below ``min_threshold`` % (the loader cannot use the cores:
data loading may starve the GPU) or above ``max_threshold`` % (processes compete for cores).
Judged per worker, with the cores the hook reports for that worker (with several processes
per host the hook should report each one's share). Also sums the time steps waited for data,
for the report. Without data-loader information it cannot fire.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Coverage, Finding, RuleConfig, fmt
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState

_NO_LOADER = "the hook reported no data-loader workers (no torch DataLoader went through hook.timed_loader)"


class DataloaderConfig(RuleConfig):
    min_threshold: float = Field(default=70.0, ge=0)
    max_threshold: float = Field(default=200.0, ge=0)


class DataloaderState(ProfilerState):
    num_workers: int | None = None
    cpu_count: int | None = None
    wait_s: float = 0.0
    step_s: float = 0.0
    steps: int = 0


class Dataloader(ProfilerRule[DataloaderConfig, DataloaderState]):
    """Fires when data-loader workers are below ``min_threshold`` or above ``max_threshold`` % of cores.

    Details and the choices made are in the module docstring.
    """

    name = "Dataloader"
    Config = DataloaderConfig
    State = DataloaderState
    summary = "data-loader worker processes below `min_threshold` % or above `max_threshold` % of the cores"
    advice = (
        "Set the DataLoader's num_workers near the number of CPU cores per training process "
        "(and pin_memory=True, persistent_workers=True for GPU training)."
    )

    def _update(self, state: DataloaderState, batch: SystemBatch) -> tuple[DataloaderState, list[Finding]]:
        cfg = self.config
        for e in batch.steps:
            state.wait_s += e.data_wait_s
            state.step_s += e.duration
            state.steps += 1
        info = batch.dataloader
        if info is None:
            return state, []
        state.num_workers, state.cpu_count = info.num_workers, info.cpu_count
        ratio = 100.0 * info.num_workers / info.cpu_count
        if ratio < cfg.min_threshold:
            what = f"below min_threshold {fmt(cfg.min_threshold)}%"
            limit = cfg.min_threshold
        elif ratio > cfg.max_threshold:
            what = f"above max_threshold {fmt(cfg.max_threshold)}%"
            limit = cfg.max_threshold
        else:
            return state, []
        return state, [
            self.finding(
                state.last_step,
                f"Worker {batch.worker} runs {info.num_workers} data-loader workers for "
                f"{info.cpu_count} CPU cores "
                f"({fmt(ratio)}%), {what}.",
                value=ratio,
                threshold=limit,
            )
        ]

    def coverage(self, state: DataloaderState) -> Coverage:
        """Judged once the hook reported the loader's workers; timed data waits alone judge nothing."""
        reason = "" if state.num_workers is not None else _NO_LOADER
        if state.num_workers is None and not state.samples and not state.steps:
            reason = "no system batches were received"
        return self.covered(0 if state.num_workers is None else 1, "data-loader reports", reason=reason)

    def not_applicable(self, state: DataloaderState) -> str | None:
        if state.num_workers is None:
            return "not applicable: the hook reported no data-loader information"
        return None

    def describe(self, state: DataloaderState) -> dict[str, Any]:
        share = (
            100.0 * state.wait_s / (state.wait_s + state.step_s) if state.wait_s + state.step_s > 0 else None
        )
        return {
            "num_workers": state.num_workers,
            "cpu_count": state.cpu_count,
            "data_wait_s": state.wait_s,
            "data_wait_percent": share,
        }

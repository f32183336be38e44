"""OverallSystemUsage: never fires; keeps per-node usage statistics for the report and status.

Reads every sample. Per node (the batch's ``host``, else ``worker-<rank>``) it keeps, for
CPU, GPU (all GPUs pooled), memory, GPU memory and I/O wait, a 50-bin histogram over
0..100 % with exact min and max, and for disk read/write and network rx/tx rates a
histogram over powers of two (1 B/s .. 1 TiB/s). p50/p95/p99 are read from the bins. At
most :data:`MAX_NODES` nodes are kept separately; more are pooled under ``"other"`` so the
state stays a few KB.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Finding, RuleConfig
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState, hist_add, hist_percentile

PCT_BINS = 50
LOG_BINS = 41  # bin 0: < 1 B/s; bin i: [2^(i-1), 2^i)
MAX_NODES = 8
PERCENT_METRICS = ("cpu", "gpu", "memory", "gpu_memory", "iowait")
RATE_METRICS = ("disk_read", "disk_write", "net_rx", "net_tx")


class UsageHist(BaseModel):
    counts: list[int]
    min: float | None = None
    max: float | None = None

    def add(self, values: list[float], log_scale: bool) -> None:
        if not values:
            return
        counts = self.counts
        if log_scale:
            top = LOG_BINS - 1
            for v in values:
                counts[0 if v < 1 else min(top, int(math.log2(v)) + 1)] += 1
        else:
            for v in values:
                hist_add(counts, v)
        lo, hi = min(values), max(values)
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)

    def stats(self, log_scale: bool) -> dict[str, float | None]:
        out: dict[str, float | None] = {"min": self.min, "max": self.max}
        for q in (50, 95, 99):
            if log_scale:
                pos = hist_percentile(self.counts, q, 0.0, float(LOG_BINS))
                value = None if pos is None else (0.0 if pos < 1 else 2 ** (pos - 1))
            else:
                value = hist_percentile(self.counts, q)
            if value is not None and self.min is not None and self.max is not None:
                value = min(max(value, self.min), self.max)
            out[f"p{q}"] = value
        return out


def _node() -> dict[str, UsageHist]:
    hists = {m: UsageHist(counts=[0] * PCT_BINS) for m in PERCENT_METRICS}
    hists.update({m: UsageHist(counts=[0] * LOG_BINS) for m in RATE_METRICS})
    return hists


class OverallSystemUsageConfig(RuleConfig):
    pass


class OverallSystemUsageState(ProfilerState):
    nodes: dict[str, dict[str, UsageHist]] = Field(default_factory=dict, max_length=MAX_NODES + 1)


class OverallSystemUsage(ProfilerRule[OverallSystemUsageConfig, OverallSystemUsageState]):
    """Never fires: per-node p50/p95/p99/min/max of CPU, GPU, memory, I/O and network.

    Details and the choices made are in the module docstring.
    """

    name = "OverallSystemUsage"
    Config = OverallSystemUsageConfig
    State = OverallSystemUsageState
    summary = "summary statistics of CPU, GPU, memory, I/O and network use per node (never fires)"
    advice = "Informational: compare p95 against capacity to right-size the instance type."

    def _update(
        self, state: OverallSystemUsageState, batch: SystemBatch
    ) -> tuple[OverallSystemUsageState, list[Finding]]:
        if not batch.samples:
            return state, []
        name = batch.host or f"worker-{batch.worker}"
        if name not in state.nodes and len(state.nodes) >= MAX_NODES:
            name = "other"
        node = state.nodes.setdefault(name, _node())
        samples = batch.samples
        gpus = [g for s in samples for g in s.gpus or ()]
        node["cpu"].add([s.cpu_total for s in samples], False)
        node["memory"].add([s.mem_used_percent for s in samples], False)
        node["iowait"].add([s.iowait_percent for s in samples], False)
        node["gpu"].add([g.util_percent for g in gpus], False)
        node["gpu_memory"].add([g.mem_used_percent for g in gpus], False)
        node["disk_read"].add([s.disk_read_bytes_s for s in samples], True)
        node["disk_write"].add([s.disk_write_bytes_s for s in samples], True)
        node["net_rx"].add([s.net_rx_bytes_s for s in samples], True)
        node["net_tx"].add([s.net_tx_bytes_s for s in samples], True)
        return state, []

    def describe(self, state: OverallSystemUsageState) -> dict[str, Any]:
        return {
            node: {m: h.stats(m in RATE_METRICS) for m, h in hists.items() if h.min is not None}
            for node, hists in state.nodes.items()
        }

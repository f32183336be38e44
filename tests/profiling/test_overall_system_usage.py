"""Golden tests: OverallSystemUsage (never fires; per-node percentiles from fixed bins)."""

from __future__ import annotations

import numpy as np
from sysbatches import run, series
from trainguard.rules.profiler import OverallSystemUsage


def make() -> OverallSystemUsage:
    return OverallSystemUsage(OverallSystemUsage.Config())


def test_never_fires_and_reports_percentiles_within_a_bin() -> None:
    cpu = [float((i * 37) % 100) for i in range(5000)]
    rule = make()
    state, found = run(rule, series(5000, cpu=lambda i: cpu[i], gpu=lambda i: ((50.0 + i % 20, 10.0),)))
    assert found == []
    stats = rule.notes(state)["node-a"]
    for q in (50, 95, 99):
        assert abs(stats["cpu"][f"p{q}"] - float(np.percentile(cpu, q))) <= 2.0
    assert stats["cpu"]["min"] == 0.0 and stats["cpu"]["max"] == 99.0
    assert 50.0 <= stats["gpu"]["p50"] <= 70.0
    assert 500 <= stats["disk_read"]["p50"] <= 1000  # log2 bins: within a factor of two
    assert set(stats) >= {"cpu", "gpu", "memory", "gpu_memory", "iowait", "net_rx", "net_tx"}


def test_absent_gpus_leave_gpu_rows_out() -> None:
    rule = make()
    state, _ = run(rule, series(100, gpu=lambda i: None))
    assert "gpu" not in rule.notes(state)["node-a"]


def test_nodes_are_capped() -> None:
    rule = make()
    state = rule.initial_state()
    for w in range(12):
        for b in series(20, worker=w, host=f"node-{w}"):
            state, _ = rule.update(state, b)
    assert len(state.nodes) == 9 and "other" in state.nodes

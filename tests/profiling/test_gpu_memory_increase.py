"""Golden tests: GPUMemoryIncrease (block mean of GPU memory rises > `increase` points)."""

from __future__ import annotations

from sysbatches import run, series
from trainguard.rules.profiler import GPUMemoryIncrease


def make(**params: str) -> GPUMemoryIncrease:
    return GPUMemoryIncrease(GPUMemoryIncrease.Config.model_validate(params))


def test_defaults_are_sagemakers() -> None:
    cfg = GPUMemoryIncrease.Config()
    assert (cfg.increase, cfg.patience, cfg.window) == (5, 1000, 10)


def test_step_up_of_six_points_fires_at_the_end_of_its_block() -> None:
    batches = series(300, gpu=lambda i: ((80.0, 40.0 if i < 100 else 46.0),))
    _, found = run(make(patience="0"), batches)
    assert [i for i, _ in found] == [5]  # sample 109 is in batch 5
    f = found[0][1]
    assert f.step == 109 and f.value is not None and abs(f.value - 6.0) < 1e-9 and f.tensor == "w0:gpu0"


def test_rise_of_four_points_does_not_fire() -> None:
    _, found = run(make(patience="0"), series(300, gpu=lambda i: ((80.0, 40.0 if i < 100 else 44.0),)))
    assert found == []


def test_slow_leak_fires_after_patience() -> None:
    # +0.012 points per sample; judged from sample 1000: the first block (1000..1009) is the
    # baseline; the block ending at sample k is 0.012 * (k - 1009) above it: > 5 first at k = 1429
    batches = series(3000, gpu=lambda i: ((80.0, 40.0 + i * 0.012),))
    _, found = run(make(), batches)
    assert found and found[0][1].step == 1429


def test_memory_freed_then_regrown_counts_from_the_lowest_mean() -> None:
    def mem(i: int) -> float:
        return 60.0 if i < 100 else (30.0 if i < 200 else 37.0)

    _, found = run(make(patience="0"), series(400, gpu=lambda i: ((80.0, mem(i)),)))
    assert found and found[0][1].step == 209


def test_absent_gpus_never_fire() -> None:
    rule = make(patience="0")
    state, found = run(rule, series(300, gpu=lambda i: None))
    assert found == [] and "not applicable" in rule.notes(state)["note"]

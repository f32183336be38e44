"""Every profiler rule's state stays small (one DynamoDB item per job) after 100,000 samples."""

from __future__ import annotations

import pytest
from sysbatches import run, series, state_bytes
from trainguard.format.system import DataloaderInfo
from trainguard.rules.profiler import PROFILER_RULES

N = 100_000
GPUS = 4  # per host; the cap on tracked GPUs is tested by its own rule tests


@pytest.fixture(scope="module")
def long_job():
    # noisy values so every histogram bin and every GPU window gets used; built unvalidated (fast)
    return series(
        N,
        fast=True,
        steps_every=5,
        per_batch=500,
        cpu=lambda i: float((i * 37) % 101),
        iowait=lambda i: float((i * 13) % 60),
        mem=lambda i: 20.0 + (i % 50),
        gpu=lambda i: tuple((float((i * (7 + g)) % 101), float((i * 3 + g) % 90)) for g in range(GPUS)),
        step_s=lambda i: 0.1 + (i % 97) / 100.0,
        dataloader=DataloaderInfo(num_workers=8, cpu_count=8),
    )


@pytest.mark.parametrize("name", sorted(set(PROFILER_RULES) - {"ProfilerReport"}))
def test_state_stays_small_after_100k_samples_with_4_gpus(name: str, long_job) -> None:
    cls = PROFILER_RULES[name]
    rule = cls(cls.Config())
    state = rule.initial_state()
    for batch in long_job:  # do not stop at findings: the state must stay bounded anyway
        state, _ = rule.update(state, batch)
    size = state_bytes(rule, state)
    assert size < 8_000, f"{name}: {size} bytes"


def test_single_gpu_states_are_a_few_kb() -> None:
    # ProfilerReport holds every other rule's state: this bounds it too
    batches = series(
        20_000, per_batch=500, cpu=lambda i: float(i % 101), gpu=lambda i: ((float(i % 101), 40.0),)
    )
    for name, cls in PROFILER_RULES.items():
        rule = cls(cls.Config())
        state, _ = run(rule, batches)
        assert state_bytes(rule, state) < (8_000 if name == "ProfilerReport" else 3_000), name

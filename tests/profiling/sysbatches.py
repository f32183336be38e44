"""Hand-made system batches for the profiler-rule golden tests."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.format.system import (
    DataloaderInfo,
    GpuSample,
    InitInfo,
    StepEvent,
    SystemBatch,
    SystemSample,
)
from trainguard.rules.base import Finding

T0 = 1_000_000.0
JOB = "prof-job"
ABSENT = "absent"

Value = Callable[[int], float]


def const(v: float) -> Value:
    return lambda i: v


def sample(
    t: float,
    cpu: float = 20.0,
    iowait: float = 0.0,
    mem: float = 30.0,
    gpus: Sequence[tuple[float, float]] | None = ((80.0, 50.0),),
    cores: int = 4,
    rates: float = 1000.0,
    fast: bool = False,
) -> SystemSample:
    make = SystemSample.model_construct if fast else SystemSample
    return make(
        t=t,
        cpu_percent=[cpu] * cores,
        cpu_total=cpu,
        iowait_percent=iowait,
        mem_used_percent=mem,
        disk_read_bytes_s=rates,
        disk_write_bytes_s=rates / 2,
        net_rx_bytes_s=rates * 4,
        net_tx_bytes_s=rates * 3,
        gpus=None if gpus is None else (_gpus_cached(tuple(gpus)) if fast else _gpus(gpus)),
    )


def _gpus(gpus: Sequence[tuple[float, float]]) -> list[GpuSample]:
    return [
        GpuSample(index=i, util_percent=u, mem_used_percent=m, mem_used_bytes=int(m * 1e8))
        for i, (u, m) in enumerate(gpus)
    ]


@functools.lru_cache(maxsize=4096)
def _gpus_cached(gpus: tuple[tuple[float, float], ...]) -> list[GpuSample]:
    return _gpus(gpus)


def series(
    n: int,
    *,
    cpu: Value = const(20.0),
    iowait: Value = const(0.0),
    mem: Value = const(30.0),
    gpu: Callable[[int], Sequence[tuple[float, float]] | None] = lambda i: ((80.0, 50.0),),
    step_s: Value | None = None,
    per_batch: int = 20,
    interval: float = 0.5,
    worker: int = 0,
    t0: float = T0,
    mode: str = "TRAIN",
    init: InitInfo | None = None,
    dataloader: DataloaderInfo | None = None,
    host: str = "node-a",
    fast: bool = False,
    steps_every: int = 1,
) -> list[SystemBatch]:
    """``n`` samples, one every ``interval`` s; sample ``i`` also ends training step ``i``."""
    batches = []
    for seq, first in enumerate(range(0, n, per_batch)):
        idx = range(first, min(n, first + per_batch))
        samples = [
            sample(t0 + i * interval, cpu=cpu(i), iowait=iowait(i), mem=mem(i), gpus=gpu(i), fast=fast)
            for i in idx
        ]
        steps = []
        for i in idx:
            if i % steps_every:
                continue
            d = step_s(i) if step_s else interval * 0.9
            end = t0 + i * interval
            event = StepEvent.model_construct if fast else StepEvent
            steps.append(event(mode=mode, step=i, start=end - d, end=end, data_wait_s=0.0))  # type: ignore[arg-type]
        make = SystemBatch.model_construct if fast else SystemBatch
        batches.append(
            make(
                job=JOB,
                worker=worker,
                world_size=max(1, worker + 1),
                seq=seq,
                host=host,
                start_time=t0 + first * interval - interval,
                end_time=t0 + idx[-1] * interval,
                interval_s=interval,
                samples=samples,
                steps=steps,
                init=init,
                dataloader=dataloader,
                dropped_samples=0,
                dropped_events=0,
            )
        )
    return batches


def run(rule: Any, batches: Sequence[SystemBatch]) -> tuple[Any, list[tuple[int, Finding]]]:
    """Drive a rule like the service: stop at the first finding. Returns (state, [(batch, finding)])."""
    state = rule.initial_state()
    for index, batch in enumerate(batches):
        state, findings = rule.update(state, batch)
        if findings:
            return state, [(index, f) for f in findings]
    return state, [(len(batches), f) for f in rule.finish(state)]


def state_bytes(rule: Any, state: Any) -> int:
    return len(json.dumps(rule.dump_state(state), separators=(",", ":")))

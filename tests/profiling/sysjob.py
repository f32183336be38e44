"""A synthetic but realistic job folder for the report tests (and for looking at a report).

Two nodes (``algo-1``, ``algo-2``), one worker each, two GPUs per node, sampled every 0.5 s
for 20 minutes: 90 s of initialisation, a training loop with a checkpoint stall every 250
steps, a slowly leaking GPU on algo-2 that also does less work, too few data-loader workers,
and TRAIN/EVAL losses saved every 10 steps by worker 0.

``diverge=True``: the loss blows up near the end (one 2.57e7, then inf and NaN) and both
workers write their end markers, so the job's model rules (the default set) are judged:
ExplodingTensor fires. The report must show it, clip the loss axis and mark the onset.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from trainguard.format import layout
from trainguard.format.documents import (
    EndMarker,
    FrameworkInfo,
    Manifest,
    ModeRecord,
    ScalarRecord,
    StepHeader,
    dump_document,
    encode_step,
)
from trainguard.format.system import (
    DataloaderInfo,
    GpuSample,
    InitInfo,
    StepEvent,
    SystemBatch,
    SystemSample,
    dump_system_batch,
)

T0 = 1_790_000_000.0
INTERVAL = 0.5
INIT_S = 90.0
TOTAL_S = 20 * 60.0
FINAL_S = 25.0
STEP_S = 0.32


def _write(root: Path, key: str, body: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def step_events(total_s: float = TOTAL_S) -> list[tuple[int, float, float, float]]:
    """(step, start, end, data wait) of the training loop."""
    rng = random.Random(7)
    out = []
    t = T0 + INIT_S
    step = 0
    while t < T0 + total_s - FINAL_S:
        wait = 0.02 + rng.random() * 0.02
        d = STEP_S * (0.9 + 0.2 * rng.random()) + (2.5 if step and step % 250 == 0 else 0.0)
        start = t + wait
        out.append((step, start, start + d, wait))
        t = start + d
        step += 1
    return out


def write_demo_job(
    root: Path, job: str = "demo-job", total_s: float = TOTAL_S, diverge: bool = False
) -> Path:
    folder = root / job
    rng = random.Random(11)
    events = step_events(total_s)
    loop_end = events[-1][2]
    _write(
        folder,
        layout.MANIFEST,
        dump_document(
            Manifest(
                job=job,
                created=T0,
                hook_version="0.1.0",
                frameworks=[FrameworkInfo(name="torch", version="2.13.0")],
                world_size=2,
                system_interval_s=INTERVAL,
            )
        ),
    )
    for worker, host in ((0, "algo-1"), (1, "algo-2")):
        samples = []
        n = int(total_s / INTERVAL)
        for i in range(1, n + 1):
            t = T0 + i * INTERVAL
            training = T0 + INIT_S <= t <= loop_end
            checkpoint = training and (int((t - T0 - INIT_S) / STEP_S) % 250) < 8
            base = 85.0 if training and not checkpoint else 2.0
            gpus = []
            for g in range(2):
                util = base + rng.uniform(-8, 8) if base > 50 else rng.uniform(0, 4)
                if worker == 1 and g == 1 and training:
                    util = 35.0 + rng.uniform(-10, 10)
                mem = 30.0 + (20.0 if training else 0.0)
                if worker == 1 and g == 1 and training:
                    mem += (t - T0 - INIT_S) / 60.0 * 1.2  # leaks ~1.2 points per minute
                gpus.append(
                    GpuSample(
                        index=g,
                        util_percent=max(0.0, min(100.0, util)),
                        mem_used_percent=min(100.0, mem),
                        mem_used_bytes=int(min(100.0, mem) / 100 * 80e9),
                    )
                )
            cpu = (55.0 if training else 12.0) + rng.uniform(-10, 10)
            samples.append(
                SystemSample(
                    t=t,
                    cpu_percent=[max(0.0, min(100.0, cpu + rng.uniform(-15, 15))) for _ in range(8)],
                    cpu_total=max(0.0, cpu),
                    iowait_percent=(20.0 if t < T0 + INIT_S else 1.0) + rng.uniform(0, 3),
                    mem_used_percent=35.0 + (10.0 if training else 0.0) + math.sin(i / 300) * 2,
                    disk_read_bytes_s=(200e6 if t < T0 + INIT_S else 30e6) * rng.uniform(0.5, 1.5),
                    disk_write_bytes_s=(150e6 if checkpoint else 1e6) * rng.uniform(0.5, 1.5),
                    net_rx_bytes_s=40e6 * rng.uniform(0.5, 1.5) if training else 1e5,
                    net_tx_bytes_s=40e6 * rng.uniform(0.5, 1.5) if training else 1e5,
                    gpus=gpus,
                )
            )
        per_batch = int(10 / INTERVAL)
        for seq, first in enumerate(range(0, len(samples), per_batch)):
            chunk = samples[first : first + per_batch]
            lo, hi = chunk[0].t - INTERVAL, chunk[-1].t
            steps = [
                StepEvent(mode="TRAIN", step=s, start=a, end=b, data_wait_s=w)
                for s, a, b, w in events
                if lo < b <= hi
            ]
            first_step = events[0][1] if hi >= events[0][1] else None
            batch = SystemBatch(
                job=job,
                worker=worker,
                world_size=2,
                seq=seq,
                host=host,
                start_time=lo,
                end_time=hi,
                interval_s=INTERVAL,
                samples=chunk,
                steps=steps,
                init=InitInfo(hook_start=T0, initialized=T0 + 5, first_step_start=first_step),
                dataloader=DataloaderInfo(num_workers=2, cpu_count=8),
            )
            _write(folder, layout.system_key(worker, seq), dump_system_batch(batch))
    prev = None
    saved = [e for e in events if e[0] % 10 == 0]
    blow_up = {
        s[0]: v
        for s, v in zip(saved[-6:], (2.57e7, math.inf, math.inf, math.nan, math.nan, math.inf), strict=True)
    }
    for step, _, end, _ in events:
        if step % 10:
            continue
        loss = 2.3 * math.exp(-step / 900) + 0.15 + rng.uniform(-0.05, 0.05)
        if diverge and step in blow_up:
            loss = blow_up[step]
        modes = {
            "TRAIN": ModeRecord(
                mode_step=step, scalars={"loss": ScalarRecord(value=loss, collections=["losses"])}
            )
        }
        if step % 200 == 0:
            modes["EVAL"] = ModeRecord(
                mode_step=step // 200,
                scalars={
                    "loss": ScalarRecord(value=loss * 1.1 + 0.05, collections=["losses"]),
                    "accuracy": ScalarRecord(value=1 - loss / 2.6, collections=["metrics"]),
                },
            )
        header = StepHeader(
            job=job, step=step, worker=0, world_size=2, prev_step=prev, wall_time=end, modes=modes
        )
        _write(folder, layout.step_key(step, 0), encode_step(header, {}))
        prev = step
    if diverge:
        batches = len(list((folder / "system" / "worker-00000").glob("*.json")))
        for worker in (0, 1):
            marker = EndMarker(
                job=job,
                worker=worker,
                world_size=2,
                last_step=prev if worker == 0 else None,
                wall_time=T0 + total_s,
                steps_written=len(saved) if worker == 0 else 0,
                system_batches=batches,
            )
            _write(folder, layout.end_key(worker), dump_document(marker))
    return folder


if __name__ == "__main__":  # python tests/profiling/sysjob.py /tmp/jobs  -> writes a demo job folder
    import sys

    print(write_demo_job(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/trainguard-demo")))

"""How the hook's writer competes with training: the window length, and threads against a child process.

    python bench/hook_writer.py                 # ~2 minutes; prints two tables (docs: hook.md)
    python bench/hook_writer.py --quick         # a smoke run

Two measurements, each configuration in its own process (nothing of one configuration runs
while the next is timed), training on every core:

1. **Window length** (``window_s`` 0.2 ... 5 s, to a folder and to S3 on a local moto server):
   a CPU-bound training loop (the benchmark MLP, 15 ms steps, default hook config) runs for
   ``--seconds``; reported are segments per second, the hook's *background* CPU per second
   (process CPU minus the training thread's own CPU, ``time.thread_time``) and the mean step
   time against a no-hook run. The default window is the shortest one whose background CPU is
   negligible even through the S3 client while the service's cost stays under $0.02 per
   worker-hour (segments per hour x ~$10 per million objects).
2. **Writer: threads or a child process.** The same loop, writing to S3, with the delivery
   (the S3 PUT: signing, HTTP, the client's own Python) in the hook's sender thread, or in a
   child process fed through a pipe (``ChildProcessStore`` below: the parent writes each
   encoded segment to the pipe, which releases the GIL, and waits for the child's answer).
   Encoding stays in the parent either way: handing records to a child would need them
   serialised in the parent, which is the encoding. Reported: mean step time, and the time
   the training thread spent waiting for the GIL (wall time minus its own CPU, the part not
   explained by the no-hook run). The faster design is the one the hook uses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "shared"))

CHILD = r"""
import struct, sys
sys.path.insert(0, sys.argv[2])
from trainguard.hook.storage import open_store
store = open_store(sys.argv[1])
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    klen, dlen = struct.unpack("<II", head)
    key = inp.read(klen).decode()
    data = inp.read(dlen)
    try:
        store.put(key, data)
        out.write(b"ok\n")
    except Exception as exc:
        out.write(("err " + str(exc).replace("\n", " ")[:500] + "\n").encode())
    out.flush()
"""


class ChildProcessStore:
    """A ``Store`` whose PUTs run in a child process (the prototype measured against threads)."""

    def __init__(self, url: str) -> None:
        from trainguard.hook.storage import open_store

        self.url = url
        self._reads = open_store(url)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(ROOT / "shared")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        from trainguard.hook.storage import StoreError

        raw = key.encode()
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(struct.pack("<II", len(raw), len(data)) + raw)
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
            answer = self._proc.stdout.readline().decode().strip()
        if answer != "ok":
            raise StoreError(f"PUT {self.url}/{key} failed in the child: {answer}")

    def get(self, key: str) -> bytes:
        return self._reads.get(key)

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]:
        return self._reads.get_range(key, start, end)

    def exists(self, key: str) -> bool:
        return self._reads.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._reads.list(prefix)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(30)


def mlp() -> tuple[Any, Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = [nn.Linear(256, 512), nn.ReLU()]
    for _ in range(7):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    layers.append(nn.Linear(512, 10))
    model = nn.Sequential(*layers)
    data = (torch.randn(128, 256), torch.randint(0, 10, (128,)))
    return model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), data


def worker(config: dict[str, Any]) -> dict[str, Any]:
    """One configuration, in this process: train for ``seconds``; step times and CPU split."""
    import torch
    import trainguard

    torch.set_num_threads(os.cpu_count() or 1)
    model, loss_fn, opt, (x, y) = mlp()
    hook = None
    store = None
    if config["hook"]:
        if config["delivery"] == "process":
            store = ChildProcessStore(config["url"])
        hook = trainguard.Hook(
            config["url"], window_s=config["window_s"], stop_check_interval_s=0, store=store
        )
        hook.register_module(model)
        hook.register_loss(loss_fn)
    for _ in range(10):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    times = []
    cpu0, thread0, started = time.process_time(), time.thread_time(), time.perf_counter()
    while time.perf_counter() - started < config["seconds"]:
        t = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - started
    cpu, own = time.process_time() - cpu0, time.thread_time() - thread0
    segments = 0
    if hook is not None:
        report = hook.close()
        segments = report.segments
    if store is not None:
        store.close()
    return {
        "step_ms": 1000 * statistics.fmean(times),
        "median_ms": 1000 * statistics.median(times),
        "segments_per_s": segments / wall,
        # torch's intra-op threads count in the process CPU: subtract the no-hook run's
        "other_cpu_per_s": (cpu - own) / wall,
        "off_cpu_ms_per_step": 1000 * (wall - own) / max(1, len(times)),
    }


def segment_cpu(url: str, count: int, steps_per_segment: int) -> dict[str, float]:
    """CPU of the training process per segment, measured in the calling thread (thread_time, so
    load on the machine barely moves it): encoding one window, and delivering it in-process
    (a thread's share of the GIL) or through a pipe to a child (what stays in the parent)."""
    import numpy as np
    from trainguard.hook.segments import ModeBuffer, PendingTensor, SegmentBuilder, StepRecord
    from trainguard.hook.stats import numpy_stats
    from trainguard.hook.storage import open_store

    grads = [
        numpy_stats(np.random.default_rng(i).normal(size=(512, 512)).astype(np.float32)) for i in range(9)
    ]

    def records(first: int) -> list[StepRecord]:
        out = []
        for step in range(first, first + steps_per_segment):
            buf = ModeBuffer(step)
            buf.scalars["CrossEntropyLoss_output_0"] = (0.5, ["losses"])
            if step % 50 == 0:
                for i, stats in enumerate(grads):
                    buf.tensors[f"gradient/Sequential_{2 * i}.weight"] = PendingTensor(
                        ["gradients"], "float32", [512, 512], stats
                    )
            out.append(StepRecord(step, time.time(), {"TRAIN": buf}))
        return out

    builder = SegmentBuilder("bench", 0, 1, window_s=3600)
    prepared = [records(i * steps_per_segment) for i in range(count)]
    t = time.thread_time()
    segments = []
    for batch in prepared:
        for rec in batch:
            builder.add(rec)
        closed = builder.close("time")
        assert closed is not None
        segments.append(closed)
    encode = (time.thread_time() - t) / count
    out = {"encode_ms": 1000 * encode, "bytes": statistics.fmean(len(s.data) for s in segments)}
    for name, store in (("thread", open_store(url + "/t")), ("process", ChildProcessStore(url + "/p"))):
        store.put("warm-up", b"x")
        t = time.thread_time()
        for seg in segments:
            store.put(seg.key, seg.data)
        out[f"put_{name}_ms"] = 1000 * (time.thread_time() - t) / count
        if isinstance(store, ChildProcessStore):
            store.close()
    return out


def run(config: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", json.dumps(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"worker failed: {proc.stderr[-2000:]}")
    return dict(json.loads(line[-1].split(" ", 1)[1]))


def moto() -> tuple[Any, str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    return server, endpoint


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.quick:
        args.seconds, args.reps = 1.5, 1
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server, _ = moto()
    print("CPU in the training process per segment (2 s window of a 15 ms-step job: 133 steps)")
    print("| target | encode (ms) | deliver in a thread (ms) | deliver via a child (parent's ms) | bytes |")
    print("|---|---|---|---|---|")
    folder = tempfile.mkdtemp(prefix="tg-writer-cpu-")
    for target, url in (("folder", folder), ("S3 (moto)", "s3://bench/jobs/cpu")):
        cpu = segment_cpu(url, 10 if args.quick else 40, 133)
        print(
            f"| {target} | {cpu['encode_ms']:.2f} | {cpu['put_thread_ms']:.2f} | {cpu['put_process_ms']:.2f} "
            f"| {cpu['bytes']:,.0f} |"
        )
    print()
    tmp = tempfile.mkdtemp(prefix="tg-writer-")
    windows = [0.2, 1.0, 2.0, 5.0] if not args.quick else [0.2, 2.0]
    base = {"hook": False, "delivery": "thread", "window_s": 2.0, "seconds": args.seconds, "url": ""}
    rows: list[tuple[str, dict[str, Any]]] = []
    for rep in range(args.reps):
        rows.append(("no hook", run(base)))
        for target in ("folder", "s3"):
            for w in windows:
                url = (
                    f"{tmp}/w{w}-{rep}"
                    if target == "folder"
                    else f"s3://bench/jobs/w{str(w).replace('.', '_')}-{rep}"
                )
                rows.append(
                    (f"{target} window {w:g} s", run({**base, "hook": True, "window_s": w, "url": url}))
                )
        for delivery in ("thread", "process"):
            url = f"s3://bench/jobs/{delivery}-{rep}"
            cfg = {**base, "hook": True, "window_s": 0.2, "delivery": delivery, "url": url}
            rows.append((f"s3, window 0.2 s, delivery in a {delivery}", run(cfg)))
    server.stop()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for label, result in rows:
        grouped.setdefault(label, []).append(result)
    base_rows = grouped["no hook"]
    base_step = statistics.median(r["step_ms"] for r in base_rows)
    base_cpu = statistics.median(r["other_cpu_per_s"] for r in base_rows)
    print(f"{os.cpu_count()} cores, {args.seconds:g} s per run, {args.reps} repetitions (medians)")
    print("| configuration | step (ms) | ratio | segments/s | $ per worker-hour | extra CPU (ms/s) |")
    print("|---|---|---|---|---|---|")
    for label, results in grouped.items():
        step = statistics.median(r["step_ms"] for r in results)
        seg = statistics.median(r["segments_per_s"] for r in results)
        extra = 1000 * (statistics.median(r["other_cpu_per_s"] for r in results) - base_cpu)
        cost = seg * 3600 * 10 / 1e6
        print(f"| {label} | {step:.2f} | {step / base_step:.3f} | {seg:.2f} | {cost:.4f} | {extra:.1f} |")


if __name__ == "__main__":
    main()

"""The service benchmarks: does the local pipeline keep up, how fast a NaN stops a job, what it costs.

    python bench/pipeline.py          # the full run (~10 min); rewrites "## Pipeline" in docs/benchmarks.md
    python bench/pipeline.py --quick  # a smoke run with tiny sizes; docs left alone

Every configuration runs in its own process (``--config``), with its own local cloud
(``LocalCloud``: a moto server and the real handlers) and its own training process
(``--train``) whose worker threads write format-2 segments to the local S3. The workers
are ``WRITER``: today a synthetic writer that builds each step's records (a loss, gradient
and weight statistics, ReLU activity: what the default rules read) and cuts them into
segments with the hook's window rules (``trainguard.format.convert.SegmentWriter``, the same
``encode_segment``); ``hook_worker`` writes through the real ``trainguard.Hook`` instead.

1. **Evaluate CPU per step** (no AWS): decode a segment's header, then ``advance()`` over its
   steps with the 5 default rules, and the state's dump.
2. **Throughput**: N workers x R steps/s for T seconds; every 0.5 s the job's watermark
   (last step evaluated) is read and compared with the newest step the workers recorded.
3. **NaN to stop**: a NaN at a random step of a random worker; the time from the moment the
   worker records it to the moment the job sees ``control/stop.json`` (polled every 20 ms
   from the training process), over K runs (ExplodingTensor with the StopTraining action).
4. **Requests and cost**: per configuration (1 and 8 workers at 15 ms, 100 ms and 1 s steps),
   the requests made while the job runs, counted where they are made (the training process
   counts its S3 PUTs; botocore hooks in the local cloud count SQS records, evaluate
   invocations and their duration, DynamoDB requests and capacity units from the items'
   sizes, S3 GETs, PutEvents entries), per 1,000 training steps and per worker-hour, and the
   cost of 10 hours at us-east-1 list prices.
5. **Cold import** of ``functions/evaluate/handler.py`` in fresh interpreters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "shared"))
from trainguard.hook.core import DEFAULT_WINDOW_S  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Pipeline"
INTRO = (
    "# Benchmarks\n\n"
    "Each section is written by its own script under `bench/`. Ratios and figures in a section are "
    "taken side by side in one run of its script on a noisy 2-core machine (a shared VM): compare "
    "figures within a section, and expect run-to-run variation of tens of percent in absolute times.\n"
)
HANDLER = ROOT / "functions" / "evaluate" / "handler.py"

# us-east-1 list prices (/work/shared/notes/aws-offline.md; SQS from the AWS price page)
PRICE = {
    "lambda_request": 0.20e-6,
    "lambda_gb_s": 0.0000166667,
    "sqs_request": 0.40e-6,
    "ddb_wru": 0.625e-6,
    "ddb_rru": 0.125e-6,
    "s3_put": 0.005e-3,
    "s3_get": 0.0004e-3,
    "event": 1.00e-6,
}
EVALUATE_MEMORY_GB = 1024 / 1024  # trainguard.wiring: evaluate memory_mb=1024
TARGET_STEP_MS = 1.0
TARGET_NAN_P50_S, TARGET_NAN_P95_S = 2.0, 5.0
TARGET_WORKER_HOUR = 0.02
TARGET_IMPORT_S = 1.0
#: the segment window of the synthetic writer: the hook's default (``Hook(window_s=...)``)
WINDOW_S = DEFAULT_WINDOW_S
STOP_POLL_S = 0.02
#: a NaN run that is not stopped this long after its planned end counts as not stopped
NAN_PATIENCE_S = 20.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.2f}" if value < 10 else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def default_rules(stop: bool) -> list[dict[str, Any]]:
    """The default rule set; with ``stop``, ExplodingTensor also stops the job."""
    from trainguard.rules.config import DEFAULT_RULES

    rules: list[dict[str, Any]] = []
    for name in DEFAULT_RULES:
        entry: dict[str, Any] = {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}}
        if stop and name == "ExplodingTensor":
            entry["Actions"] = ["StopTraining"]
        rules.append(entry)
    return rules


# ============================================================== the training process (--train)
@dataclass
class TrainRun:
    job: str
    seconds: float
    #: (worker, step) that records a NaN loss and gradient; None: a clean run
    nan: tuple[int, int] | None = None


@dataclass
class TrainPlan:
    bucket: str
    workers: int
    rate: float
    window_s: float
    runs: list[TrainRun]
    stop_rules: bool = False


class WorkerContext:
    """What one worker thread needs: its schedule, a place to write, a way to report."""

    def __init__(self, plan: TrainPlan, run: TrainRun, worker: int, trainer: Trainer) -> None:
        self.plan, self.run, self.worker, self.trainer = plan, run, worker, trainer
        self.job = run.job
        self.out_dir = f"s3://{plan.bucket}/jobs/{run.job}"
        self.last_step: int | None = None

    def schedule(self) -> Iterator[tuple[int, bool]]:
        """(step, is_nan) at ``rate`` steps/s until the run's time is up or the job was stopped.

        Steps keep an absolute schedule (no drift); between steps ``idle`` runs, so a writer
        can close a window whose time ran out.
        """
        t0 = self.trainer.t0
        # a clean run ends on time; a NaN run goes on until the job is stopped (or gives up)
        until = self.run.seconds if self.run.nan is None else self.run.seconds + NAN_PATIENCE_S
        step = 0
        while not self.trainer.stopped.is_set():
            due = t0 + step / self.plan.rate
            if due - t0 > until:
                return
            while (now := time.time()) < due:
                self.idle(now)
                time.sleep(min(0.02, due - now))
            nan = self.run.nan == (self.worker, step)
            yield step, nan
            self.last_step = step
            self.trainer.recorded(self.worker, step, nan)
            step += 1

    def idle(self, now: float) -> None:
        """Called between steps (the synthetic writer closes a window on time here)."""

    def put(self, key: str, data: bytes) -> None:
        self.trainer.put(f"jobs/{self.job}/{key}", data)


def synthetic_worker(ctx: WorkerContext) -> None:
    """Records like the hook's (SyntheticJob's step records), windows like the hook's."""
    from trainguard.format import documents as d
    from trainguard.format.convert import SegmentWriter, WindowRules
    from trainguard.format.layout import end_key
    from trainguard.local.synthetic import SyntheticJob, noisy_decreasing

    plan = ctx.plan
    writer = SegmentWriter(ctx.job, ctx.worker, plan.workers, WindowRules(window_s=plan.window_s))
    clean = SyntheticJob(ctx.job, world_size=plan.workers, loss=noisy_decreasing(ctx.worker))
    lock = threading.Lock()

    def idle(now: float) -> None:
        with lock:
            closed = writer.poll(now)
        if closed is not None:
            ctx.put(closed.key, closed.data)

    ctx.idle = idle  # type: ignore[method-assign]
    for step, nan in ctx.schedule():
        # a NaN step: the gradient statistics hold a NaN (ExplodingTensor reads them)
        source = SyntheticJob(ctx.job, world_size=plan.workers, nan_steps=frozenset({step})) if nan else clean
        modes = source.header(step, ctx.worker, None, 0.0).modes
        with lock:
            closed = writer.add(step, time.time(), modes)
        for segment in closed:
            ctx.put(segment.key, segment.data)
    final = writer.close()
    if final is not None:
        ctx.put(final.key, final.data)
    marker = d.EndMarker(
        job=ctx.job,
        worker=ctx.worker,
        world_size=plan.workers,
        last_step=ctx.last_step,
        wall_time=time.time(),
        stopped=ctx.trainer.stopped.is_set(),
        segments=writer.segments_written,
        steps_written=0 if ctx.last_step is None else ctx.last_step + 1,
    )
    ctx.put(end_key(ctx.worker), d.dump_document(marker))


def hook_worker(ctx: WorkerContext) -> None:
    """The same schedule through the real ``trainguard.Hook`` (its own windows, manifest, end marker)."""
    import trainguard

    rules = default_rules(ctx.plan.stop_rules)
    with trainguard.Hook(
        ctx.out_dir, rank=ctx.worker, world_size=ctx.plan.workers, rules=rules, raise_on_stop=False
    ) as hook:
        for step, nan in ctx.schedule():
            value = math.nan if nan else 1.0 / (1 + step)
            hook.save_scalar("loss", value, step=step, collections=["losses"])


#: the writer every worker runs: switch to ``hook_worker`` once the hook writes segments
WRITER: Callable[[WorkerContext], None] = synthetic_worker


class Trainer:
    """The training process: one thread per worker; reports progress as JSON lines on stdout."""

    def __init__(self, plan: TrainPlan) -> None:
        import boto3

        self.plan = plan
        self.s3 = boto3.client("s3")
        self.lock = threading.Lock()
        self.puts = 0
        self.put_bytes = 0
        self.t0 = 0.0
        self.newest: dict[int, int] = {}
        self.stopped = threading.Event()
        self.nan_recorded = threading.Event()

    def emit(self, **event: Any) -> None:
        with self.lock:
            print(json.dumps(event), flush=True)

    def put(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.plan.bucket, Key=key, Body=data)
        with self.lock:
            self.puts += 1
            self.put_bytes += len(data)

    def recorded(self, worker: int, step: int, nan: bool) -> None:
        with self.lock:
            self.newest[worker] = step
        if nan:
            self.nan_recorded.set()
            self.emit(e="nan", worker=worker, step=step, t=time.time())

    def run(self, run: TrainRun) -> None:
        from trainguard.format import documents as d
        from trainguard.format.layout import MANIFEST, STOP_SIGNAL

        self.stopped.clear()
        self.nan_recorded.clear()
        self.newest = {}
        puts_before = self.puts
        if WRITER is synthetic_worker:
            manifest = d.Manifest(
                job=run.job,
                created=time.time(),
                hook_version="bench",
                world_size=self.plan.workers,
                rules=default_rules(self.plan.stop_rules),
            )
            self.put(f"jobs/{run.job}/{MANIFEST}", d.dump_document(manifest))
        time.sleep(0.5)  # the manifest is evaluated before the first segment, as in a real job
        self.t0 = time.time()
        done = threading.Event()

        def watch_stop() -> None:
            while not done.is_set():
                try:
                    self.s3.head_object(Bucket=self.plan.bucket, Key=f"jobs/{run.job}/{STOP_SIGNAL}")
                except Exception:  # not there yet: keep polling
                    time.sleep(STOP_POLL_S)
                    continue
                self.emit(e="stop", job=run.job, t=time.time())
                self.stopped.set()
                return

        def report() -> None:
            while not done.wait(0.25):
                with self.lock:
                    newest, puts = dict(self.newest), self.puts - puts_before
                self.emit(e="progress", job=run.job, t=time.time(), newest=newest, puts=puts)

        helpers = [threading.Thread(target=report, daemon=True)]
        if run.nan is not None:
            helpers.append(threading.Thread(target=watch_stop, daemon=True))
        for thread in helpers:
            thread.start()
        workers = [
            threading.Thread(
                target=WRITER, args=(WorkerContext(self.plan, run, w, self),), name=f"worker-{w}"
            )
            for w in range(self.plan.workers)
        ]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        done.set()
        with self.lock:
            newest = dict(self.newest)
        self.emit(
            e="run_done",
            job=run.job,
            t=time.time(),
            seconds=time.time() - self.t0,
            puts=self.puts - puts_before,
            newest=newest,
            steps=sum(s + 1 for s in newest.values()),
        )


def train_main(plan_json: str) -> int:
    raw = json.loads(plan_json)
    runs = [TrainRun(r["job"], r["seconds"], tuple(r["nan"]) if r["nan"] else None) for r in raw["runs"]]
    plan = TrainPlan(**{**raw, "runs": runs})
    trainer = Trainer(plan)
    for run in plan.runs:
        trainer.run(run)
    trainer.emit(e="done", put_bytes=trainer.put_bytes)
    return 0


# ====================================================== one configuration (--config), local cloud
@dataclass
class Config:
    kind: str  # "pure", "throughput", "nan", "cost", "import"
    workers: int = 1
    rate: float = 10.0
    seconds: float = 5.0
    runs: int = 1
    window_s: float = WINDOW_S
    steps: int = 1000
    layers: int = 1
    repeats: int = 3
    label: str = ""


@dataclass
class Counters:
    """AWS requests as the local cloud sees them (botocore hooks on the service's clients)."""

    evaluate_invocations: int = 0
    evaluate_records: int = 0
    evaluate_seconds: list[float] = field(default_factory=list)
    ddb: dict[str, int] = field(default_factory=dict)
    wru: float = 0.0
    rru: float = 0.0
    s3_gets: int = 0
    events: int = 0


def item_bytes(item: dict[str, Any]) -> int:
    """DynamoDB's item size: attribute names plus values (S: UTF-8, B: bytes, N: ~digits/2+1)."""
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "S":
            size += len(raw.encode())
        elif kind == "B":
            size += len(raw)
        elif kind == "N":
            size += len(raw.lstrip("-").replace(".", "")) // 2 + 1
        else:
            size += len(json.dumps(raw).encode())
    return size


def watch_requests(cloud: Any) -> Counters:
    """Count what the evaluate function does (its poller's thread), not the other functions."""
    from trainguard.service import evaluate

    counters = Counters()
    service = evaluate.service()  # the process's pipeline: the handler's own
    lock = threading.Lock()

    def evaluating() -> bool:
        return threading.current_thread().name == "tg-local-evaluate"

    def on_invoke(fid: str, event: dict[str, Any], result: Any, seconds: float) -> None:
        if fid == "evaluate":
            with lock:
                counters.evaluate_invocations += 1
                counters.evaluate_records += len(event.get("Records", []))
                counters.evaluate_seconds.append(seconds)

    def ddb_params(params: dict[str, Any], model: Any, **_: Any) -> None:
        if not evaluating():
            return
        op = model.name
        units = 0.0
        if op == "PutItem":
            units = math.ceil(item_bytes(params["Item"]) / 1024)
        elif op == "TransactWriteItems":
            units = 2 * sum(math.ceil(item_bytes(t["Put"]["Item"]) / 1024) for t in params["TransactItems"])
        elif op == "BatchWriteItem":
            units = sum(len(v) for v in params["RequestItems"].values())  # deletes of ~100-byte pointers
        with lock:
            counters.ddb[op] = counters.ddb.get(op, 0) + 1
            counters.wru += units

    def ddb_read(parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if evaluating() and model.name in ("Query", "GetItem"):
            items = parsed.get("Items") or ([parsed["Item"]] if parsed.get("Item") else [])
            with lock:
                counters.rru += max(1, math.ceil(sum(item_bytes(i) for i in items) / 4096))

    def s3_get(model: Any, **_: Any) -> None:
        if evaluating() and model.name == "GetObject":
            with lock:
                counters.s3_gets += 1

    def put_events(params: dict[str, Any], **_: Any) -> None:
        if not evaluating():
            return
        with lock:
            counters.events += len(params.get("Entries", []))

    cloud.on_invoke.append(on_invoke)
    # the function's calls go through the clients of its own identity (local IAM enforcement):
    # register on those, not on the benchmark's
    from trainguard.service import clients

    identity = cloud.authority.credentials("evaluate") if cloud.authority is not None else None
    with clients.acting_as(identity):
        service.store.client.meta.events.register("before-parameter-build.dynamodb", ddb_params)
        service.store.client.meta.events.register("after-call.dynamodb", ddb_read)
        service.s3.meta.events.register("before-call.s3", s3_get)
        service.publisher.client.meta.events.register("before-parameter-build.events.PutEvents", put_events)
    return counters


def run_trainer(cloud: Any, plan: TrainPlan, on_event: Callable[[dict[str, Any]], None]) -> int:
    env = dict(os.environ)
    env.update(cloud.resources.client_env())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "shared"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--train", json.dumps(asdict(plan))]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            on_event(json.loads(line))
    return proc.wait()


def config_pure(config: Config) -> dict[str, Any]:
    """Evaluate CPU per step: decode a segment's header, advance over its steps, dump the state."""
    from trainguard.engine.evaluator import advance, apply_manifest
    from trainguard.engine.model import JobState
    from trainguard.engine.sources import read_manifest, segment_arrival
    from trainguard.format.convert import WindowRules, convert_objects
    from trainguard.format.layout import parse_relative
    from trainguard.local.synthetic import SyntheticJob
    from trainguard.service.state_store import _pack

    job = SyntheticJob("pure", steps=list(range(config.steps)), layers=config.layers, ended=False)
    objects = convert_objects(job.objects(), WindowRules(window_s=None, max_steps=100))
    state = apply_manifest(JobState(job="pure"), read_manifest(objects["manifest.json"]), 0.0).state
    segments = sorted(k for k in objects if k.startswith("segments/"))
    cpu = time.process_time
    decode = evaluate = dump = 0.0
    steps = 0
    for repeat in range(config.repeats + 1):  # the first pass warms up
        run_state = state
        d0 = e0 = p0 = 0.0
        for key in segments:
            data = objects[key]
            t0 = cpu()
            arrival = segment_arrival(parse_relative("pure", key), data, len(data))
            t1 = cpu()
            out = advance(run_state, [arrival], 0.0)
            t2 = cpu()
            _pack(out.state.model_dump(mode="json"))
            t3 = cpu()
            run_state = out.state
            d0, e0, p0 = d0 + t1 - t0, e0 + t2 - t1, p0 + t3 - t2
        assert run_state.steps_evaluated == config.steps
        if repeat:
            decode, evaluate, dump, steps = decode + d0, evaluate + e0, dump + p0, steps + config.steps
    tensors = sum(len(m.tensors) for m in job.header(0, 0, None, 0.0).modes.values())
    return {
        "layers": config.layers,
        "tensors": tensors,
        "segment_bytes": len(objects[segments[0]]),
        "steps_per_segment": 100,
        "decode": decode / steps,
        "advance": evaluate / steps,
        "dump_per_segment": dump / (steps / 100),
        "total": (decode + evaluate + dump) / steps,
        "state_bytes": len(_pack(run_state.model_dump(mode="json"))),
    }


def config_cloud(config: Config) -> dict[str, Any]:
    """A throughput, NaN or cost configuration against its own local cloud."""
    import boto3
    from trainguard.local.runtime import LocalCloud
    from trainguard.service.state_store import StateStore

    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    name = f"tg-bench-{config.kind}"
    rng = random.Random(7)
    with LocalCloud(name=name, observe=False) as cloud:
        counters = watch_requests(cloud)
        res = cloud.resources
        assert res is not None
        reader = boto3.client("dynamodb")  # the benchmark's own reads, apart from the service's
        watcher = StateStore(res.table, reader)
        runs: list[TrainRun] = []
        for i in range(config.runs):
            job = f"{config.kind}-{config.workers}w-{i:03d}"
            nan = None
            if config.kind == "nan":  # a random step after a second, on a random worker
                low, high = int(config.rate * 1.0), int(config.rate * max(1.5, config.seconds))
                nan = (rng.randrange(config.workers), rng.randint(low, max(low, high)))
            runs.append(TrainRun(job=job, seconds=config.seconds, nan=nan))
        plan = TrainPlan(
            bucket=res.bucket,
            workers=config.workers,
            rate=config.rate,
            window_s=config.window_s,
            runs=runs,
            stop_rules=config.kind == "nan",
        )
        events: list[dict[str, Any]] = []
        timeline: list[tuple[float, int, int]] = []  # (t, newest recorded step, watermark)
        current = {"job": runs[0].job, "newest": -1}
        finished = threading.Event()

        def sample() -> None:
            while not finished.wait(0.5):
                loaded = watcher.load_state(current["job"])
                watermark = loaded[0].watermark if loaded else -1
                timeline.append((time.time(), current["newest"], watermark))

        steady: dict[str, Any] = {}

        def snapshot(event: dict[str, Any]) -> dict[str, Any]:
            steps = sum(s + 1 for s in event["newest"].values())
            return {"t": event["t"], "puts": event["puts"], "steps": steps, "counters": asdict(counters)}

        def on_event(event: dict[str, Any]) -> None:
            events.append(event)
            if event["e"] == "progress" and event["job"] == runs[0].job and event["newest"]:
                # steady state: after the job's start (manifest, first windows), before its end markers
                first = steady.setdefault("start_t", event["t"])
                if "a" not in steady and event["t"] - first >= min(5.0, config.seconds / 4):
                    steady["a"] = snapshot(event)
                if "a" in steady:
                    steady["b"] = snapshot(event)
            if event["e"] == "progress" and event["job"] == current["job"]:
                current["newest"] = max(event["newest"].values(), default=-1)
            elif event["e"] == "run_done":
                index = next(i for i, r in enumerate(runs) if r.job == event["job"])
                if index + 1 < len(runs):
                    current.update(job=runs[index + 1].job, newest=-1)

        sampler = threading.Thread(target=sample, daemon=True)
        if config.kind == "throughput":
            sampler.start()
        started = time.time()
        code = run_trainer(cloud, plan, on_event)
        written = time.time()
        drained = cloud.wait_idle(timeout=120, settle=0.5)
        drain_s = time.time() - written
        finished.set()
        if code != 0:
            raise RuntimeError(f"the training process exited with {code}")
        states = {r.job: watcher.load_state(r.job) for r in runs}
        state_items = [
            item_bytes(i) for i in reader.scan(TableName=res.table)["Items"] if i["sk"]["S"] == "STATE"
        ]
        done = [e for e in events if e["e"] == "run_done"]
        result: dict[str, Any] = {
            "config": asdict(config),
            "wall_s": written - started,
            "drained": drained,
            "drain_s": drain_s,
            "errors": list(cloud.errors)[:5],
            "steps": sum(e["steps"] for e in done),
            "seconds": sum(e["seconds"] for e in done),
            "puts": sum(e["puts"] for e in done),
            "put_bytes": next((e["put_bytes"] for e in events if e["e"] == "done"), 0),
            "counters": asdict(counters),
            "state_item_bytes": max(state_items, default=0),
            "finished": all(s is not None and s[0].finished for s in states.values()),
            "timeline": [row for row in timeline if row[1] >= 0],
            "steady": steady_state(steady),
        }
        if config.kind == "nan":
            latencies = []
            by_job = {r.job: r for r in runs}
            stops = {e["job"]: e["t"] for e in events if e["e"] == "stop"}
            for job, run in by_job.items():
                assert run.nan is not None
                loaded = states[job]
                fired = loaded is not None and loaded[0].rule("ExplodingTensor").status == "IssuesFound"
                t_nan = next(
                    (
                        e["t"]
                        for e in events
                        if e["e"] == "nan" and e["worker"] == run.nan[0] and e["step"] == run.nan[1]
                    ),
                    math.nan,
                )
                latencies.append(
                    {
                        "job": job,
                        "nan": list(run.nan),
                        "fired": fired,
                        "step": loaded[0].rule("ExplodingTensor").step if loaded else None,
                        "seconds": stops.get(job, math.nan) - t_nan,
                    }
                )
            result["nan"] = latencies
        return result


def steady_state(steady: dict[str, Any]) -> dict[str, Any] | None:
    """What was counted between two progress reports of a running job (no start, no end)."""
    if "a" not in steady or steady["b"]["t"] <= steady["a"]["t"]:
        return None
    a, b = steady["a"], steady["b"]
    ca, cb = a["counters"], b["counters"]
    counters = {
        "evaluate_invocations": cb["evaluate_invocations"] - ca["evaluate_invocations"],
        "evaluate_records": cb["evaluate_records"] - ca["evaluate_records"],
        "evaluate_seconds": cb["evaluate_seconds"][len(ca["evaluate_seconds"]) :],
        "ddb": {op: n - ca["ddb"].get(op, 0) for op, n in cb["ddb"].items()},
        "wru": cb["wru"] - ca["wru"],
        "rru": cb["rru"] - ca["rru"],
        "s3_gets": cb["s3_gets"] - ca["s3_gets"],
        "events": cb["events"] - ca["events"],
    }
    return {
        "seconds": b["t"] - a["t"],
        "puts": b["puts"] - a["puts"],
        "steps": b["steps"] - a["steps"],
        "counters": counters,
    }


def config_import(config: Config) -> dict[str, Any]:
    return bench_import(config.repeats)


def config_main(config_json: str, out: str) -> int:
    config = Config(**json.loads(config_json))
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    runner = {"pure": config_pure, "import": config_import}.get(config.kind, config_cloud)
    Path(out).write_text(json.dumps(runner(config)))
    return 0


def in_own_process(config: Config) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter (nothing carried over from the last one)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        t0 = time.perf_counter()
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--config",
            json.dumps(asdict(config)),
            "--out",
            str(out),
        ]
        subprocess.run(cmd, check=True, cwd=ROOT, timeout=3600)
        label = config.label or config.kind
        print(f"  {label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


# ------------------------------------------------------------------------ 5. cold import
IMPORT_SNIPPET = """
import importlib.util, sys, time
t0, c0 = time.perf_counter(), time.process_time()
spec = importlib.util.spec_from_file_location("evaluate_handler", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
t1, c1 = time.perf_counter(), time.process_time()
from trainguard.service import clients
for name in ("s3", "dynamodb", "events"):
    clients.client(name)
t2, c2 = time.perf_counter(), time.process_time()
print(t1 - t0, c1 - c0, t2 - t1, c2 - c1)
"""


def bench_import(repeats: int) -> dict[str, Any]:
    env: dict[str, str] = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "shared"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env.pop("AWS_ENDPOINT_URL", None)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cached = Path(tmp) / "pyc"

        def run(extra: dict[str, str | None]) -> tuple[float, ...]:
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-c", IMPORT_SNIPPET, str(HANDLER)],
                env={k: v for k, v in {**env, **extra}.items() if v is not None},
                capture_output=True,
                text=True,
                check=True,
            )
            wall = time.perf_counter() - t0
            return (*(float(x) for x in proc.stdout.split()), wall)

        run({"PYTHONPYCACHEPREFIX": str(cached), "PYTHONDONTWRITEBYTECODE": None})
        for label, extra_fn in (
            ("pyc", lambda _i: {"PYTHONPYCACHEPREFIX": str(cached), "PYTHONDONTWRITEBYTECODE": "1"}),
            (
                "no pyc",
                lambda i: {
                    "PYTHONPYCACHEPREFIX": str(Path(tmp) / f"empty{i}"),
                    "PYTHONDONTWRITEBYTECODE": "1",
                },
            ),
        ):
            samples = [run(extra_fn(i)) for i in range(repeats)]
            out[label] = {
                key: statistics.median(s[i] for s in samples)
                for i, key in enumerate(("import", "import_cpu", "setup", "setup_cpu", "process"))
            }
    return out


# ------------------------------------------------------------------------------ cost model
def per_worker_hour(r: dict[str, Any]) -> dict[str, float]:
    """Requests per worker-hour, from what one configuration counted in its steady state."""
    measured = r["steady"] or r  # a run too short for a steady state: everything it did
    c = measured["counters"]
    scale = 3600 / max(measured["seconds"], 1e-9)
    workers = r["config"]["workers"]
    invocations = c["evaluate_invocations"]
    return {
        "S3 PUT": measured["puts"] * scale / workers,
        "SQS messages": measured["puts"] * scale / workers,
        "SQS receive + delete": 2 * invocations * scale / workers,
        "invocations": invocations * scale / workers,
        "Lambda GB-s": sum(c["evaluate_seconds"]) * EVALUATE_MEMORY_GB * scale / workers,
        "DynamoDB requests": sum(c["ddb"].values()) * scale / workers,
        "DynamoDB WRU": c["wru"] * scale / workers,
        "DynamoDB RRU": c["rru"] * scale / workers,
        "S3 GET": c["s3_gets"] * scale / workers,
        "PutEvents entries": c["events"] * scale / workers,
    }


def dollars(rates: dict[str, float]) -> dict[str, float]:
    return {
        "S3 PUT (hook)": rates["S3 PUT"] * PRICE["s3_put"],
        "SQS": (rates["SQS messages"] + rates["SQS receive + delete"]) * PRICE["sqs_request"],
        "Lambda requests": rates["invocations"] * PRICE["lambda_request"],
        "Lambda GB-s": rates["Lambda GB-s"] * PRICE["lambda_gb_s"],
        "DynamoDB": rates["DynamoDB WRU"] * PRICE["ddb_wru"] + rates["DynamoDB RRU"] * PRICE["ddb_rru"],
        "S3 GET": rates["S3 GET"] * PRICE["s3_get"],
        "EventBridge": rates["PutEvents entries"] * PRICE["event"],
    }


# ------------------------------------------------------------------------------ report
def cost_section(cost: list[dict[str, Any]]) -> list[str]:
    """Section 4: requests per 1,000 steps and the cost of 10 hours (also ``--only-cost``)."""
    lines: list[str] = []
    add = lines.append
    add("### 4. Requests per 1,000 training steps, and the cost of 10 hours (measured counts, list prices)")
    add("")
    add(
        "| step time | workers | S3 PUT | SQS messages | invocations | DynamoDB requests | PutEvents "
        f"| per worker-hour | 10 hours | goal ≤ ${TARGET_WORKER_HOUR} per worker-hour "
        "| per worker-hour at 2 s / 5 s windows (estimated) |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in cost:
        cfg = r["config"]
        measured = r["steady"] or r
        c = measured["counters"]
        per_k = 1000 / max(measured["steps"], 1)
        hour = sum(dollars(per_worker_hour(r)).values())
        add(
            f"| {1 / cfg['rate'] * 1e3:g} ms | {cfg['workers']} | {measured['puts'] * per_k:.1f} | "
            f"{measured['puts'] * per_k:.1f} | {c['evaluate_invocations'] * per_k:.1f} | "
            f"{sum(c['ddb'].values()) * per_k:.1f} | {c['events'] * per_k:.2f} | **${hour:.4f}** | "
            f"${hour * cfg['workers'] * 10:.3f} | {'met' if hour <= TARGET_WORKER_HOUR else 'MISSED'} | "
            f"${hour * cfg['window_s'] / 2:.4f} / ${hour * cfg['window_s'] / 5:.4f} |"
        )
    add("")
    add(
        "Counts per 1,000 training steps of the whole job (all workers) and per worker-hour are taken "
        "while the job runs (between two progress reports of the training process: its start and its "
        "end markers are left out; a job's start costs one transaction and 5 InProgress events, its end "
        "a few requests and 6 events, whatever its length). With a window longer than the step, "
        "every line but EventBridge follows the number of segments, so the last column scales the "
        "measured cost by segments per hour (an estimate: a longer window's invocations do more work)."
    )
    add("")
    worst = max(cost, key=lambda r: sum(dollars(per_worker_hour(r)).values()))
    lines_of = dollars(per_worker_hour(worst))
    total = sum(lines_of.values())
    add(
        f"Where a worker-hour's cost goes ({1 / worst['config']['rate'] * 1e3:g} ms steps, "
        f"{worst['config']['workers']} workers, the dearest row): "
        + ", ".join(
            f"{k} ${v:.4f} ({v / total:.0%})" for k, v in sorted(lines_of.items(), key=lambda kv: -kv[1])
        )
        + f". The STATE item is {worst['state_item_bytes']:,} B; a buffered segment pointer about 100 B."
    )
    add("")
    add(
        "Counted: the training process's S3 PUTs (segments, manifest, end markers: each is one S3 → SQS "
        "message); evaluate invocations, their records and their duration (the local cloud's `on_invoke`); "
        "DynamoDB requests by operation, with write units from the items written (1 KB each; a "
        "transaction counts twice; a delete of a pointer one) and read units from the items read (4 KB "
        "per strongly consistent read); S3 GETs and PutEvents entries of the evaluate function. "
        "Assumed: SQS is billed one send per object plus one receive and one delete per invocation (the "
        "event source mapping's idle polls are not included); Lambda GB-s is the local invocation time "
        "at 1 GB; the local poller batches whatever is waiting (AWS's 1 s batching window batches at "
        "least as much). Not included: the notify and stop-job functions (per alert, not per step), "
        "CloudWatch metrics and logs, S3 storage. Per 1,000 steps counts steps of the whole job (all "
        "workers); per worker-hour scales the run's counts to an hour of one worker."
    )
    add("")

    return lines


def render(results: dict[str, Any], elapsed: float, quick: bool, load: tuple[float, float]) -> str:
    lines: list[str] = []
    add = lines.append
    add(
        f"`python bench/pipeline.py{' --quick' if quick else ''}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} vCPU (nproc), "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}; whole run "
        f"{elapsed:.0f} s; 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end). "
        "Every configuration ran in its own process, with its own local cloud (moto's server and the real "
        "handlers in one process) and its own training process; the workers write format-2 segments "
        f"({WRITER.__name__}, {results['throughput']['config']['window_s']:g} s windows). Local absolute "
        "times are this machine's, not AWS's."
    )
    add("")
    add("### 1. Evaluate CPU per step, no AWS calls (measured)")
    add("")
    add(
        "Decode a segment's header (100 steps) → `advance()` over its steps with the 5 default rules → "
        "dump and zlib the state once per segment. CPU time (`process_time`) per step."
    )
    add("")
    add(
        "| model | tensors per step | segment bytes | decode | advance | state dump per segment "
        "| total per step | target |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---|")
    for p in results["pure"]:
        verdict = "met" if p["total"] * 1e3 <= TARGET_STEP_MS else "MISSED"
        add(
            f"| layers={p['layers']} | {p['tensors']} | {p['segment_bytes']:,} | {ms(p['decode'])} ms | "
            f"{ms(p['advance'])} ms | {ms(p['dump_per_segment'])} ms | **{ms(p['total'])} ms** | "
            f"≤ {TARGET_STEP_MS:g} ms: {verdict} |"
        )
    add("")

    t = results["throughput"]
    cfg = t["config"]
    add(
        f"### 2. Throughput in local mode: {cfg['workers']} workers x {cfg['rate']:g} steps/s "
        f"for {cfg['seconds']:g} s"
    )
    add("")
    timeline = t["timeline"]
    rate = cfg["rate"]
    if timeline:
        t0 = timeline[0][0]
        every = max(1, len(timeline) // 12)
        add("| time | newest step recorded | watermark (last step evaluated) | lag |")
        add("|---:|---:|---:|---:|")
        for when, newest, watermark in timeline[::every]:
            add(f"| {when - t0:.0f} s | {newest} | {watermark} | {(newest - watermark) / rate:.1f} s |")
        lags = [(n - w) / rate for _, n, w in timeline if n >= 0]
        third = max(1, len(lags) // 3)
        first, last = statistics.mean(lags[:third] or [0]), statistics.mean(lags[-third:] or [0])
        # evaluation is caught up when the watermark reaches the newest step written; the
        # queues' drain also waits for the other functions (the report of the whole job)
        final_newest = max(n for _, n, _ in timeline)
        last_write = min(when for when, n, _ in timeline if n == final_newest)
        caught_up = [when for when, _, w in timeline if w >= final_newest]
        eval_drain = (caught_up[0] - last_write) if caught_up else math.nan
        kept_up = bool(caught_up) and last <= first + 2 * cfg["window_s"]
        add("")
        add(
            f"Lag p50 {pct(lags, 50):.1f} s, p95 {pct(lags, 95):.1f} s, "
            f"max {max(lags, default=math.nan):.1f} s; mean over the first third {first:.1f} s, over the "
            f"last third {last:.1f} s; the watermark reached the newest step written {eval_drain:.1f} s "
            f"after the last write was seen (sampling every 0.5 s), and every queue (the profiler report "
            f"of the whole job included) was idle {t['drain_s']:.1f} s after it"
            f"{'' if t['drained'] else ' (the 120 s limit of the wait: still busy)'}. "
            f"**{'Kept up' if kept_up else 'Fell behind'}** (the lag stays within two windows of where it "
            f"started and everything written was evaluated). {t['steps']:,} steps of "
            f"{cfg['workers']} workers, {t['puts']:,} objects, "
            f"{t['counters']['evaluate_invocations']:,} evaluate invocations."
        )
    add("")

    nan = results["nan"]
    ncfg = nan["config"]
    seconds = [r["seconds"] for r in nan["nan"] if r["fired"]]
    p50, p95 = pct(seconds, 50), pct(seconds, 95)
    met = p50 <= TARGET_NAN_P50_S and p95 <= TARGET_NAN_P95_S and len(seconds) == len(nan["nan"])
    add(
        f"### 3. A NaN at a random step to the job's stop signal: {len(nan['nan'])} runs, "
        f"{ncfg['workers']} workers x {ncfg['rate']:g} steps/s (measured)"
    )
    add("")
    add(
        "From the moment one random worker records a NaN loss at a random step to the moment the training "
        f"process sees `control/stop.json` (polled every {STOP_POLL_S * 1e3:.0f} ms): the worker's window "
        "closes at once on the non-finite value, but the step is complete only when every other worker's "
        "window that holds it has been written."
    )
    add("")
    add("| runs fired | p50 | p95 | max | target |")
    add("|---:|---:|---:|---:|---|")
    add(
        f"| {len(seconds)} / {len(nan['nan'])} | {p50:.2f} s | {p95:.2f} s | "
        f"{max(seconds, default=math.nan):.2f} s | "
        f"p50 ≤ {TARGET_NAN_P50_S:g} s, p95 ≤ {TARGET_NAN_P95_S:g} s: {'met' if met else 'MISSED'} |"
    )
    add("")

    lines += cost_section(results["cost"])

    imp = results["import"]
    add("### 5. Cold import of `functions/evaluate/handler.py` (measured)")
    add("")
    add(
        "| | import handler: wall (CPU) | + boto3 s3/dynamodb/events clients: wall (CPU) "
        "| whole fresh process, wall | target |"
    )
    add("|---|---:|---:|---:|---|")
    for label in ("pyc", "no pyc"):
        i = imp[label]
        verdict = f"≤ {TARGET_IMPORT_S:g} s: {'met' if i['import'] <= TARGET_IMPORT_S else 'MISSED'}"
        add(
            f"| {'with .pyc' if label == 'pyc' else 'no .pyc'} | "
            f"{i['import']:.2f} s ({i['import_cpu']:.2f} s) | "
            f"{i['setup']:.2f} s ({i['setup_cpu']:.2f} s) | {i['process']:.2f} s | {verdict} |"
        )
    errors = [e for group in ("throughput", "nan") for e in results[group]["errors"]]
    errors += [e for r in results["cost"] for e in r["errors"]]
    if errors:
        add("")
        add(f"Errors seen by the local clouds: {errors[:5]}")
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> None:
    current = DOCS.read_text() if DOCS.exists() else INTRO
    block = f"{SECTION}\n\n{text.strip()}\n"
    start = current.find(f"\n{SECTION}\n")
    if current.startswith(f"{SECTION}\n"):
        start = 0
    elif start != -1:
        start += 1
    if start == -1:
        new = current.rstrip("\n") + "\n\n" + block
    else:
        end = current.find("\n## ", start + len(SECTION))
        new = current[:start] + block + ("" if end == -1 else "\n" + current[end + 1 :])
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(new.rstrip("\n") + "\n")


def plan(quick: bool, window_s: float = WINDOW_S) -> dict[str, Any]:
    configs = _plan(quick)
    for group in configs.values():
        for config in group if isinstance(group, list) else [group]:
            config.window_s = window_s
    return configs


def _plan(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "pure": [
                Config("pure", steps=200, layers=1, repeats=1),
                Config("pure", steps=100, layers=10, repeats=1),
            ],
            "throughput": Config("throughput", workers=2, rate=20, seconds=4),
            "nan": Config("nan", workers=2, rate=20, seconds=2, runs=2),
            "cost": [Config("cost", workers=w, rate=10, seconds=3, label=f"cost {w}w") for w in (1, 2)],
            "import": Config("import", repeats=1),
        }
    return {
        "pure": [Config("pure", steps=2000, layers=1), Config("pure", steps=500, layers=20)],
        "throughput": Config("throughput", workers=4, rate=100, seconds=180),
        "nan": Config("nan", workers=4, rate=100, seconds=3, runs=20),
        "cost": [
            Config("cost", workers=w, rate=1 / step_s, seconds=30, label=f"cost {w}w {step_s:g}s")
            for step_s in (0.015, 0.1, 1.0)
            for w in (1, 8)
        ],
        "import": Config("import", repeats=5),
    }


def replace_cost_section(section: str) -> None:
    """Swap section 4 of "## Pipeline" in docs/benchmarks.md for ``section``."""
    doc = DOCS.read_text()
    head = doc.index("### 4. Requests per 1,000 training steps")
    tail = doc.index("### 5. Cold import", head)
    note = (
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: this section rerun alone with "
        "`bench/pipeline.py --only-cost`.)\n\n"
    )
    first_line_end = section.index("\n") + 2
    body = section[:first_line_end] + note + section[first_line_end:].rstrip("\n") + "\n\n"
    DOCS.write_text(doc[:head] + body + doc[tail:])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run with tiny sizes; docs left alone")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--window", type=float, default=WINDOW_S, help="segment window of the writers (s)")
    parser.add_argument("--config", help=argparse.SUPPRESS)  # one configuration, in this process
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--train", help=argparse.SUPPRESS)  # the training process of a configuration
    parser.add_argument(
        "--only-cost", action="store_true", help="rerun section 4 only and replace it in the docs"
    )
    args = parser.parse_args()
    if args.train:
        return train_main(args.train)
    if args.config:
        return config_main(args.config, args.out)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    configs = plan(args.quick, args.window)
    results: dict[str, Any] = {}
    if args.only_cost:
        section = "\n".join(cost_section([in_own_process(c) for c in configs["cost"]]))
        print(section)
        if not (args.no_docs or args.quick):
            replace_cost_section(section)
        return 0
    print("1. evaluate CPU per step", file=sys.stderr)
    results["pure"] = [in_own_process(c) for c in configs["pure"]]
    print("2. throughput", file=sys.stderr)
    results["throughput"] = in_own_process(configs["throughput"])
    print("3. NaN to stop", file=sys.stderr)
    results["nan"] = in_own_process(configs["nan"])
    print("4. requests and cost", file=sys.stderr)
    results["cost"] = [in_own_process(c) for c in configs["cost"]]
    print("5. cold import", file=sys.stderr)
    results["import"] = in_own_process(configs["import"])
    load = (load_start, os.getloadavg()[0])
    text = render(results, time.perf_counter() - started, args.quick, load)
    print(f"{SECTION}\n\n{text}")
    if not (args.no_docs or args.quick):
        write_docs(text)
        print(f"wrote {SECTION!r} in {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Read what the report needs from a job folder (local or ``s3://``): system batches, scalars.

System batches come from ``system/worker-*/*.json``; training scalars (losses, metrics) from
the step objects' headers through :mod:`trainguard.trial`. Reads are bounded: at most
:data:`MAX_SYSTEM_OBJECTS` system objects and :data:`MAX_STEP_OBJECTS` step headers (evenly
spaced when the job has more; the report says so). An object that cannot be read or parsed
is listed in ``problems`` and skipped, never fatal.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainguard.format import layout
from trainguard.format.documents import Manifest, parse_document, read_bounded_document
from trainguard.format.system import MAX_SYSTEM_BYTES, SystemBatch, parse_system_batch

MAX_SYSTEM_OBJECTS = 50_000
MAX_STEP_OBJECTS = 5_000
#: concurrent reads (S3 GETs are latency-bound; the stores are thread-safe)
FETCH_THREADS = 16
MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


@dataclass
class JobData:
    """Everything :func:`trainguard.report.build_report` renders."""

    job: str
    batches: list[SystemBatch] = field(default_factory=list)
    #: name -> [(step, value)] in step order; non-TRAIN modes are named "<name> (EVAL)"
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    manifest: Manifest | None = None
    source: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _job_name(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return layout.validate_job_name(name)
    except layout.LayoutError:
        return "job"


def load_job_data(path_or_s3: str | os.PathLike[str], store: Any = None) -> JobData:
    """Load a job folder: ``s3://bucket/prefix/<job>`` or a local directory."""
    from trainguard.hook.storage import open_store  # the one storage adapter (boto3 only for s3://)

    url = os.fspath(path_or_s3)
    store = store or open_store(url)
    data = JobData(job=_job_name(url), source=url)
    try:
        raw = read_bounded_document(store, layout.MANIFEST)
        data.manifest = parse_document(Manifest, raw)
        data.job = data.manifest.job
    except Exception as exc:
        data.notes.append(f"no readable manifest ({type(exc).__name__})")
    _load_system(store, data)
    _load_scalars(url, store, data)
    return data


def _load_system(store: Any, data: JobData) -> None:
    keys = []
    for key in store.list("system/"):
        try:
            ref = layout.parse_relative("job", key)
        except layout.LayoutError:
            data.problems.append(f"{key}: not a system object key")
            continue
        if ref.kind == layout.ObjectKind.SYSTEM and ref.worker is not None and ref.seq is not None:
            keys.append((ref.worker, ref.seq, key))
    keys.sort()
    if len(keys) > MAX_SYSTEM_OBJECTS:
        data.notes.append(f"{len(keys)} system objects; the report reads the first {MAX_SYSTEM_OBJECTS}")
        keys = keys[:MAX_SYSTEM_OBJECTS]

    def fetch(key: str) -> SystemBatch | str:
        try:
            return parse_system_batch(read_bounded_document(store, key, MAX_SYSTEM_BYTES))
        except Exception as exc:
            return f"{key}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"

    with ThreadPoolExecutor(FETCH_THREADS) as pool:  # S3 GETs are latency-bound
        for result in pool.map(fetch, [key for _, _, key in keys]):
            if isinstance(result, str):
                data.problems.append(result)
            else:
                data.batches.append(result)


def _load_scalars(url: str, store: Any, data: JobData) -> None:
    try:
        from trainguard.trial import create_trial

        trial = create_trial(url, store=store)
        steps = trial.steps()
    except Exception as exc:
        data.notes.append(f"training scalars unavailable ({type(exc).__name__}: {str(exc)[:200]})")
        return
    if len(steps) > MAX_STEP_OBJECTS:
        stride = len(steps) / MAX_STEP_OBJECTS
        steps = [steps[int(i * stride)] for i in range(MAX_STEP_OBJECTS)]
        data.notes.append(f"scalars shown for {MAX_STEP_OBJECTS} evenly spaced steps of {len(trial.steps())}")
    series: dict[str, list[tuple[int, float]]] = {}
    worker = min(trial.workers() or [0])

    def fetch(step: int) -> Any:
        try:
            return trial.header(step, worker)
        except Exception as exc:
            return f"step {step}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        headers = list(pool.map(fetch, steps))
    for step, header in zip(steps, headers, strict=True):
        if isinstance(header, str):
            data.problems.append(header)
            continue
        for mode in MODES:
            record = header.modes.get(mode)  # type: ignore[call-overload]
            if record is None:
                continue
            for name, scalar in record.scalars.items():
                label = name if mode == "TRAIN" else f"{name} ({mode})"
                series.setdefault(label, []).append((step, scalar.value))
    data.scalars = {k: sorted(v) for k, v in sorted(series.items())}

"""Where a job's objects live. The key alone tells job, step and worker.

Under a job folder (``out_dir`` of the hook: a local folder or ``s3://bucket/.../<job>``)::

    manifest.json                               job manifest, written at start by rank 0
    steps/<step:012d>/worker-<rank:05d>.safetensors   one object per (step, worker)
    system/worker-<rank:05d>/<seq:012d>.json    batched system-monitor samples (profiling)
    end/worker-<rank:05d>.json                  end marker, written by each worker at close()
    control/stop.json                           cooperative stop signal, written by the service

The deployed stack watches ``<INGEST_PREFIX><job>/...`` in its bucket. Step numbers are
zero-padded so that a listing is in step order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

INGEST_PREFIX = "jobs/"
JOB_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
_JOB_RE = re.compile(rf"^{JOB_NAME_PATTERN}$")
MAX_STEP = 10**12 - 1
MAX_WORKERS = 100_000

MANIFEST = "manifest.json"
STOP_SIGNAL = "control/stop.json"
REPORT = "report/profiler-report.html"
XGBOOST_REPORT = "report/xgboost-report.html"


class ObjectKind(str, Enum):
    MANIFEST = "manifest"
    STEP = "step"
    SYSTEM = "system"
    END = "end"
    STOP = "stop"
    REPORT = "report"


class LayoutError(ValueError):
    """A key or name that is outside trainguard's layout."""


@dataclass(frozen=True)
class ObjectRef:
    """A parsed key relative to the ingest root: which job, which kind, which step and worker."""

    job: str
    kind: ObjectKind
    step: int | None = None
    worker: int | None = None
    seq: int | None = None


def validate_job_name(job: str) -> str:
    if not isinstance(job, str) or not _JOB_RE.match(job) or ".." in job:
        raise LayoutError(
            f"invalid job name {str(job)[:80]!r}: use 1-128 letters, digits, '-', '_' or '.', "
            "starting with a letter or digit, no '..'"
        )
    return job


def step_key(step: int, worker: int) -> str:
    _check_step(step)
    _check_worker(worker)
    return f"steps/{step:012d}/worker-{worker:05d}.safetensors"


def end_key(worker: int) -> str:
    _check_worker(worker)
    return f"end/worker-{worker:05d}.json"


def system_key(worker: int, seq: int) -> str:
    _check_worker(worker)
    return f"system/worker-{worker:05d}/{seq:012d}.json"


_PATTERNS: list[tuple[re.Pattern[str], ObjectKind]] = [
    (re.compile(r"^manifest\.json$"), ObjectKind.MANIFEST),
    (re.compile(r"^steps/(?P<step>\d{12})/worker-(?P<worker>\d{5})\.safetensors$"), ObjectKind.STEP),
    (re.compile(r"^system/worker-(?P<worker>\d{5})/(?P<seq>\d{12})\.json$"), ObjectKind.SYSTEM),
    (re.compile(r"^end/worker-(?P<worker>\d{5})\.json$"), ObjectKind.END),
    (re.compile(r"^control/stop\.json$"), ObjectKind.STOP),
    (re.compile(r"^report/(?:profiler|xgboost)-report\.html$"), ObjectKind.REPORT),
]


def parse_relative(job: str, relative: str) -> ObjectRef:
    """Parse a key relative to a job folder."""
    validate_job_name(job)
    for pattern, kind in _PATTERNS:
        match = pattern.match(relative)
        if match:
            groups = match.groupdict()
            return ObjectRef(
                job=job,
                kind=kind,
                step=int(groups["step"]) if "step" in groups else None,
                worker=int(groups["worker"]) if "worker" in groups else None,
                seq=int(groups["seq"]) if "seq" in groups else None,
            )
    raise LayoutError(f"key {relative[:200]!r} under job {job!r} is outside the trainguard layout")


def parse_key(key: str, ingest_prefix: str = INGEST_PREFIX) -> ObjectRef:
    """Parse a bucket key ``<ingest_prefix><job>/<relative>`` (already URL-decoded)."""
    if len(key) > 1024:
        raise LayoutError("key longer than 1024 characters")
    if not key.startswith(ingest_prefix):
        raise LayoutError(f"key {key[:200]!r} is not under the ingest prefix {ingest_prefix!r}")
    job, sep, relative = key[len(ingest_prefix) :].partition("/")
    if not sep:
        raise LayoutError(f"key {key[:200]!r} names no object inside a job folder")
    return parse_relative(job, relative)


def job_prefix(job: str, ingest_prefix: str = INGEST_PREFIX) -> str:
    return f"{ingest_prefix}{validate_job_name(job)}/"


def _check_step(step: int) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise LayoutError(f"step must be an integer in 0..{MAX_STEP}, got {step!r}")


def _check_worker(worker: int) -> None:
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < MAX_WORKERS:
        raise LayoutError(f"worker rank must be an integer in 0..{MAX_WORKERS - 1}, got {worker!r}")

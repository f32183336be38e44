r"""Where a job's objects live. The key alone tells job, step and worker.

Under a job folder (``out_dir`` of the hook: a local folder or ``s3://bucket/.../<job>``)::

    manifest.json                               job manifest, written at start by rank 0
    segments/worker-<rank:05d>/<seq:012d>-<first:012d>-<last:012d>.safetensors
                                                format 2: one object per worker per flush
                                                window, every step it recorded in it
    steps/<step:012d>/worker-<rank:05d>.safetensors   format 1: one object per (step, worker)
    system/worker-<rank:05d>/<seq:012d>.json    batched system-monitor samples (profiling)
    end/worker-<rank:05d>.json                  end marker, written by each worker at close()
    control/stop.json                           cooperative stop signal, written by the service

The deployed stack watches ``<INGEST_PREFIX><job>/...`` in its bucket. Numbers are
zero-padded so that a listing is in step (or sequence) order. Patterns match ASCII digits
only and the whole key (``\Z``, not ``$``, which would accept a trailing newline), so a
key parses the same way in the live service and in replay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

INGEST_PREFIX = "jobs/"
JOB_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
_JOB_RE = re.compile(rf"{JOB_NAME_PATTERN}\Z", re.ASCII)
MAX_STEP = 10**12 - 1
MAX_WORKERS = 100_000
MAX_SEQ = 10**12 - 1

MANIFEST = "manifest.json"
STOP_SIGNAL = "control/stop.json"
REPORT = "report/profiler-report.html"
XGBOOST_REPORT = "report/xgboost-report.html"


class ObjectKind(str, Enum):
    MANIFEST = "manifest"
    STEP = "step"
    SEGMENT = "segment"
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
    #: segments: the last step the segment holds (``step`` is its first)
    last_step: int | None = None


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


def segment_key(worker: int, seq: int, first_step: int, last_step: int) -> str:
    """Key of a worker's ``seq``-th segment, holding its steps ``first_step..last_step``."""
    _check_worker(worker)
    _check_seq(seq)
    _check_step(first_step)
    _check_step(last_step)
    if last_step < first_step:
        raise LayoutError(f"segment step range {first_step}..{last_step} is empty")
    return f"segments/worker-{worker:05d}/{seq:012d}-{first_step:012d}-{last_step:012d}.safetensors"


def relative_key(ref: ObjectRef) -> str:
    """The key of ``ref`` inside its job folder (the inverse of :func:`parse_relative`)."""
    if ref.kind is ObjectKind.MANIFEST:
        return MANIFEST
    if ref.kind is ObjectKind.STEP and ref.step is not None and ref.worker is not None:
        return step_key(ref.step, ref.worker)
    if (
        ref.kind is ObjectKind.SEGMENT
        and ref.worker is not None
        and ref.seq is not None
        and ref.step is not None
        and ref.last_step is not None
    ):
        return segment_key(ref.worker, ref.seq, ref.step, ref.last_step)
    if ref.kind is ObjectKind.SYSTEM and ref.worker is not None and ref.seq is not None:
        return system_key(ref.worker, ref.seq)
    if ref.kind is ObjectKind.END and ref.worker is not None:
        return end_key(ref.worker)
    if ref.kind is ObjectKind.STOP:
        return STOP_SIGNAL
    if ref.kind is ObjectKind.REPORT:
        return REPORT
    raise LayoutError(f"{ref} does not name one object")


def end_key(worker: int) -> str:
    _check_worker(worker)
    return f"end/worker-{worker:05d}.json"


def system_key(worker: int, seq: int) -> str:
    _check_worker(worker)
    return f"system/worker-{worker:05d}/{seq:012d}.json"


_PATTERNS: list[tuple[re.Pattern[str], ObjectKind]] = [
    (re.compile(r"manifest\.json\Z"), ObjectKind.MANIFEST),
    (
        re.compile(
            r"segments/worker-(?P<worker>[0-9]{5})/"
            r"(?P<seq>[0-9]{12})-(?P<step>[0-9]{12})-(?P<last_step>[0-9]{12})\.safetensors\Z"
        ),
        ObjectKind.SEGMENT,
    ),
    (re.compile(r"steps/(?P<step>[0-9]{12})/worker-(?P<worker>[0-9]{5})\.safetensors\Z"), ObjectKind.STEP),
    (re.compile(r"system/worker-(?P<worker>[0-9]{5})/(?P<seq>[0-9]{12})\.json\Z"), ObjectKind.SYSTEM),
    (re.compile(r"end/worker-(?P<worker>[0-9]{5})\.json\Z"), ObjectKind.END),
    (re.compile(r"control/stop\.json\Z"), ObjectKind.STOP),
    (re.compile(r"report/(?:profiler|xgboost)-report\.html\Z"), ObjectKind.REPORT),
]


def parse_relative(job: str, relative: str) -> ObjectRef:
    """Parse a key relative to a job folder."""
    validate_job_name(job)
    for pattern, kind in _PATTERNS:
        match = pattern.match(relative)
        if match:
            groups = match.groupdict()
            ref = ObjectRef(
                job=job,
                kind=kind,
                step=int(groups["step"]) if "step" in groups else None,
                worker=int(groups["worker"]) if "worker" in groups else None,
                seq=int(groups["seq"]) if "seq" in groups else None,
                last_step=int(groups["last_step"]) if "last_step" in groups else None,
            )
            if ref.last_step is not None and ref.step is not None and ref.last_step < ref.step:
                raise LayoutError(f"segment key {relative[:200]!r}: last step before first step")
            return ref
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


def _check_seq(seq: int) -> None:
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
        raise LayoutError(f"sequence number must be an integer in 0..{MAX_SEQ}, got {seq!r}")


def _check_worker(worker: int) -> None:
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < MAX_WORKERS:
        raise LayoutError(f"worker rank must be an integer in 0..{MAX_WORKERS - 1}, got {worker!r}")

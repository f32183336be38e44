"""Reading a job's objects, from a local folder or S3, for the rule engine.

The engine needs only step *headers*: a step object is read with one ranged GET of its
first ``HEADER_PROBE_BYTES`` (a second GET only when the header is longer). Every byte is
checked by the codec before use; a bad object becomes a ``StepArrival`` with ``bad`` set.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from trainguard.engine.model import StepArrival, SystemArrival
from trainguard.format import stepfile
from trainguard.format.documents import (
    MAX_DOCUMENT_BYTES,
    EndMarker,
    Manifest,
    decode_step_header,
    parse_document,
)
from trainguard.format.layout import ObjectKind, ObjectRef, parse_relative
from trainguard.format.system import parse_system_batch
from trainguard.rules.base import StepData

#: a step object larger than this is refused outright (its header would still be bounded,
#: but no trainguard writer produces one; full tensors belong in their own collections)
MAX_STEP_OBJECT_BYTES = 5 * 1024**3


class ObjectError(ValueError):
    """An object that cannot be used; the message is the reason recorded for it."""


def step_arrival(ref: ObjectRef, head: bytes, size: int) -> StepArrival:
    """Decode a step object's header (``head`` = at least the first 8+N bytes)."""
    assert ref.step is not None and ref.worker is not None
    try:
        if size > MAX_STEP_OBJECT_BYTES:
            raise ObjectError(f"object is {size} bytes; at most {MAX_STEP_OBJECT_BYTES}")
        header, _ = decode_step_header(head, object_size=size)
        if (header.job, header.step, header.worker) != (ref.job, ref.step, ref.worker):
            raise ObjectError(
                f"header says job {header.job!r} step {header.step} worker {header.worker}, "
                f"key says job {ref.job!r} step {ref.step} worker {ref.worker}"
            )
        if header.prev_step is not None and header.prev_step >= header.step:
            raise ObjectError(f"prev_step {header.prev_step} is not before step {header.step}")
    except (ValueError, stepfile.StepFormatError) as exc:
        reason = f"steps/{ref.step:012d}/worker-{ref.worker:05d}: {exc}"
        return StepArrival(ref.step, ref.worker, None, None, bad=reason[:1000])
    return StepArrival(header.step, header.worker, header.prev_step, header)


def system_arrival(ref: ObjectRef, raw: bytes) -> SystemArrival:
    """Decode a system-monitor batch; a bad one keeps its place in the worker's seq chain."""
    assert ref.worker is not None and ref.seq is not None
    try:
        batch = parse_system_batch(raw)
        if (batch.job, batch.worker, batch.seq) != (ref.job, ref.worker, ref.seq):
            raise ObjectError(
                f"batch says job {batch.job!r} worker {batch.worker} seq {batch.seq}, "
                f"key says job {ref.job!r} worker {ref.worker} seq {ref.seq}"
            )
    except ValueError as exc:
        reason = f"system/worker-{ref.worker:05d}/{ref.seq:012d}.json: {_short(exc)}"
        return SystemArrival(ref.worker, ref.seq, None, bad=reason)
    return SystemArrival(ref.worker, ref.seq, batch)


def read_manifest(raw: bytes) -> Manifest:
    try:
        return parse_document(Manifest, raw)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ObjectError(f"manifest.json: {_short(exc)}") from None


def read_end(raw: bytes) -> EndMarker:
    try:
        return parse_document(EndMarker, raw)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ObjectError(f"end marker: {_short(exc)}") from None


def _short(exc: Exception) -> str:
    return " | ".join(str(exc).splitlines()[:4])[:500]


class JobSource(Protocol):
    job: str

    def objects(self) -> Iterator[ObjectRef]: ...
    def head(self, ref: ObjectRef) -> tuple[bytes, int]: ...
    def document(self, ref: ObjectRef) -> bytes: ...


def relative_path(ref: ObjectRef) -> str:
    if ref.kind is ObjectKind.MANIFEST:
        return "manifest.json"
    if ref.kind is ObjectKind.STEP:
        return f"steps/{ref.step:012d}/worker-{ref.worker:05d}.safetensors"
    if ref.kind is ObjectKind.END:
        return f"end/worker-{ref.worker:05d}.json"
    if ref.kind is ObjectKind.SYSTEM:
        return f"system/worker-{ref.worker:05d}/{ref.seq:012d}.json"
    if ref.kind is ObjectKind.STOP:
        return "control/stop.json"
    return "report/profiler-report.html"


@dataclass
class LocalJob:
    """A job folder on disk (the hook's local ``out_dir``)."""

    root: Path
    job: str

    @staticmethod
    def open(path: str | os.PathLike[str]) -> LocalJob:
        root = Path(path).resolve()
        if not root.is_dir():
            raise FileNotFoundError(f"{path}: no such job folder")
        job = root.name
        manifest = root / "manifest.json"
        if manifest.is_file():
            with contextlib.suppress(ObjectError):  # a bad manifest: the folder name is the job
                job = read_manifest(manifest.read_bytes()).job
        return LocalJob(root, job)

    def objects(self) -> Iterator[ObjectRef]:
        for path in sorted(self.root.rglob("*")):
            if path.is_file():
                rel = path.relative_to(self.root).as_posix()
                try:
                    yield parse_relative(self.job, rel)
                except ValueError:
                    continue

    def head(self, ref: ObjectRef) -> tuple[bytes, int]:
        path = self.root / relative_path(ref)
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(stepfile.HEADER_PROBE_BYTES)
            try:
                need = 8 + stepfile.header_length(prefix)
            except stepfile.StepFormatError:
                return prefix, size
            if need > len(prefix):
                prefix += fh.read(need - len(prefix))
        return prefix, size

    def document(self, ref: ObjectRef) -> bytes:
        path = self.root / relative_path(ref)
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise ObjectError(f"{relative_path(ref)} is larger than {MAX_DOCUMENT_BYTES} bytes")
        return path.read_bytes()


class S3Job:
    """A job folder in S3 (``s3://bucket/.../<job>``)."""

    def __init__(self, bucket: str, prefix: str, s3: Any, job: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.rstrip("/") + "/"
        self.s3 = s3
        self.job = job or self.prefix.rstrip("/").rsplit("/", 1)[-1]

    @staticmethod
    def from_uri(uri: str, s3: Any) -> S3Job:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an s3:// URI: {uri!r}")
        return S3Job(parsed.netloc, parsed.path.lstrip("/"), s3)

    def objects(self) -> Iterator[ObjectRef]:
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", []):
                try:
                    yield parse_relative(self.job, item["Key"][len(self.prefix) :])
                except ValueError:
                    continue

    def key(self, ref: ObjectRef) -> str:
        return self.prefix + relative_path(ref)

    def head(self, ref: ObjectRef) -> tuple[bytes, int]:
        return read_head(self.s3, self.bucket, self.key(ref))

    def document(self, ref: ObjectRef) -> bytes:
        return read_document(self.s3, self.bucket, self.key(ref))


_RANGE_TOTAL = re.compile(r"/(\d+)$")


def read_head(s3: Any, bucket: str, key: str) -> tuple[bytes, int]:
    """First bytes of an object (enough for its header) and the object's total size."""
    resp = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{stepfile.HEADER_PROBE_BYTES - 1}")
    body = resp["Body"].read()
    match = _RANGE_TOTAL.search(resp.get("ContentRange", "") or "")
    size = int(match.group(1)) if match else int(resp.get("ContentLength", len(body)))
    try:
        need = 8 + stepfile.header_length(body)
    except stepfile.StepFormatError:
        return body, size
    if need > len(body) and need <= size:
        rest = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={len(body)}-{need - 1}")["Body"].read()
        body += rest
    return body, size


def read_document(s3: Any, bucket: str, key: str) -> bytes:
    resp = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{MAX_DOCUMENT_BYTES}")
    body: bytes = resp["Body"].read()
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ObjectError(f"{key.rsplit('/', 1)[-1]} is larger than {MAX_DOCUMENT_BYTES} bytes")
    return body


class OtherJobs:
    """The same step of another, already written job (SimilarAcrossRuns's ``other_trials``).

    ``opener`` turns a job name (or an s3:// URI / folder) into its JobSource. A job or step
    that cannot be read is None: that step is simply not compared.
    """

    def __init__(self, opener: Callable[[str], JobSource]) -> None:
        self.opener = opener
        self._sources: dict[str, tuple[JobSource, int] | None] = {}

    def _source(self, job: str) -> tuple[JobSource, int] | None:
        if job not in self._sources:
            try:
                source = self.opener(job)
                world = 1
                with contextlib.suppress(Exception):  # no manifest: assume one worker
                    world = read_manifest(
                        source.document(ObjectRef(source.job, ObjectKind.MANIFEST))
                    ).world_size
                self._sources[job] = (source, world)
            except Exception:
                self._sources[job] = None
        return self._sources[job]

    def __call__(self, job: str, step: int) -> StepData | None:
        opened = self._source(job)
        if opened is None:
            return None
        source, world = opened
        headers = []
        for worker in range(world):
            ref = ObjectRef(source.job, ObjectKind.STEP, step, worker)
            try:
                head, size = source.head(ref)
            except Exception:  # noqa: S112 - missing (404, or 403 without ListBucket): not compared
                continue
            arrival = step_arrival(ref, head, size)
            if arrival.header is not None:
                headers.append(arrival.header)
        return StepData.from_headers(headers) if headers else None


def sibling_opener(source: JobSource, s3: Any = None) -> Callable[[str], JobSource]:
    """Open ``other_trials`` as replay sees it: a URI or path as given, else a sibling job folder."""

    def opener(name: str) -> JobSource:
        if name.startswith("s3://"):
            return S3Job.from_uri(name, s3 if s3 is not None else _s3())
        if "/" in name or name.startswith("."):
            return LocalJob.open(name)
        if isinstance(source, LocalJob):
            return LocalJob.open(source.root.parent / name)
        if isinstance(source, S3Job):
            parent = source.prefix.rstrip("/").rsplit("/", 1)[0]
            return S3Job(source.bucket, f"{parent}/{name}", source.s3, job=name)
        raise ValueError(f"cannot locate job {name!r}")

    return opener


def _s3() -> Any:
    from trainguard.service.clients import client

    return client("s3")

"""S3 adapter for a job's objects: bounded ranged reads, the S3 job source, the header reader.

Every read is bounded in bytes before it is made. A header is read with one ranged GET of
its object's first ``HEADER_PROBE_BYTES`` (step objects) or ``SEGMENT_PROBE_BYTES``
(segments: the hook closes a window before its header passes 256 KiB); a longer header (at
most ``MAX_HEADER_BYTES``) costs one more GET of exactly the missing bytes. A buffered
pointer knows its header's length, so re-reading it is one GET of exactly that range.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from trainguard.engine.model import SegmentArrival, StepArrival, UnreadableObject
from trainguard.engine.sources import (
    JobSource,
    ObjectError,
    bad_segment,
    bad_step,
    decode_segment_object,
    decode_step_object,
    document_limit,
    header_probe_bytes,
    segment_ref,
)
from trainguard.format import stepfile
from trainguard.format.documents import MAX_DOCUMENT_BYTES, SegmentHeader, StepHeader
from trainguard.format.layout import ObjectKind, ObjectRef, parse_relative, relative_key

_RANGE_TOTAL = re.compile(r"/([0-9]{1,20})\Z", re.ASCII)
#: decoded headers kept per process, in bytes of their JSON (a warm Lambda has 1 GB)
HEADER_CACHE_BYTES = 64 * 1024 * 1024


class ObjectMissing(FileNotFoundError):
    """The object is not there (S3 NoSuchKey): deleted, or never written."""


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _missing(exc: Exception) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound")


def get_range(s3: Any, bucket: str, key: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of an object (fewer at its end) and the object's total size.

    Never reads more than ``end - start`` bytes of the body, whatever the response claims.
    An empty object (S3 answers a range of it with InvalidRange) is ``(b"", 0)``.
    """
    try:
        resp = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
    except Exception as exc:
        if _missing(exc):
            raise ObjectMissing(f"{key}: no such object (NoSuchKey)") from None
        if _code(exc) == "InvalidRange" and start == 0:
            return b"", 0
        raise
    body: bytes = resp["Body"].read(end - start)
    resp["Body"].close()  # the rest of a body that claims more is never read
    match = _RANGE_TOTAL.search(resp.get("ContentRange", "") or "")
    size = int(match.group(1)) if match else int(resp.get("ContentLength", len(body)))
    return body[: end - start], size


def read_head(s3: Any, bucket: str, key: str, probe: int = stepfile.HEADER_PROBE_BYTES) -> tuple[bytes, int]:
    """The first bytes of an object (its whole header when it is valid) and its total size."""
    body, size = get_range(s3, bucket, key, 0, probe)
    try:
        need = 8 + stepfile.header_length(body)
    except stepfile.StepFormatError:
        return body, size  # the decoder says what is wrong
    if need > len(body) and need <= size:
        rest, _ = get_range(s3, bucket, key, len(body), need)
        body += rest
    return body, size


def read_document(s3: Any, bucket: str, key: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """A small JSON document (manifest, end marker, system batch); refused past ``limit``.

    One ranged GET of ``limit + 1`` bytes: a 3 GB manifest costs a megabyte, never the object.
    """
    body, size = get_range(s3, bucket, key, 0, limit + 1)
    if len(body) > limit or size > limit:
        raise ObjectError(f"{key.rsplit('/', 1)[-1]} is {size:,} bytes; at most {limit:,}")
    return body


class S3Job:
    """A job folder in S3 (``s3://bucket/.../<job>``): the S3 :class:`JobSource`."""

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
        return self.prefix + relative_key(ref)

    def head(self, ref: ObjectRef) -> tuple[bytes, int]:
        return read_head(self.s3, self.bucket, self.key(ref), header_probe_bytes(ref))

    def document(self, ref: ObjectRef) -> bytes:
        return read_document(self.s3, self.bucket, self.key(ref), document_limit(ref))

    def sibling(self, name: str) -> JobSource:
        if name.startswith("s3://"):
            return S3Job.from_uri(name, self.s3)
        if "/" in name or name.startswith("."):
            raise ObjectError(f"{name}: a local folder cannot be opened from the S3 job {self.prefix}")
        parent = self.prefix.rstrip("/").rsplit("/", 1)[0]
        return S3Job(self.bucket, f"{parent}/{name}", self.s3, job=name)


class HeaderCache:
    """Decoded headers by (bucket, key, size), least recently used out first, bounded in bytes.

    The objects an invocation ingests are put here, so evaluating them costs no second read;
    a warm process also keeps the segments other invocations buffered.
    """

    def __init__(self, max_bytes: int = HEADER_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str, int], tuple[StepHeader | SegmentHeader, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, bucket: str, key: str, size: int) -> StepHeader | SegmentHeader | None:
        with self._lock:
            item = self._items.get((bucket, key, size))
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end((bucket, key, size))
            self.hits += 1
            return item[0]

    def put(self, bucket: str, key: str, size: int, header: StepHeader | SegmentHeader, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop((bucket, key, size), None)
            if old is not None:
                self._bytes -= old[1]
            self._items[(bucket, key, size)] = (header, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped


class S3Headers:
    """The live service's :class:`~trainguard.engine.model.HeaderReader` for one job.

    A pointer's header comes from the cache, else from one ranged GET of exactly its
    ``header_end`` bytes, decoded and checked against its key and size again. A missing
    object (NoSuchKey) or one that changed is :class:`UnreadableObject`: a bad arrival.
    """

    def __init__(self, s3: Any, bucket: str, job_prefix: str, job: str, cache: HeaderCache) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.job_prefix = job_prefix
        self.job = job
        self.cache = cache
        self.requests = 0

    def _read(self, ref: ObjectRef, size: int, header_end: int) -> tuple[bytes, int]:
        key = self.job_prefix + relative_key(ref)
        if not 8 < header_end <= 8 + stepfile.MAX_HEADER_BYTES:
            raise UnreadableObject(
                f"{relative_key(ref)}: buffered header length {header_end} is out of bounds"
            )
        self.requests += 1
        try:
            head, actual = get_range(self.s3, self.bucket, key, 0, header_end)
        except ObjectMissing:
            raise UnreadableObject(
                f"{relative_key(ref)}: no longer exists (NoSuchKey) when it was to be evaluated"
            ) from None
        if actual != size:
            raise UnreadableObject(f"{relative_key(ref)}: was {size} bytes when it arrived, is {actual} now")
        return head, actual

    def step(self, arrival: StepArrival) -> StepHeader:
        ref = ObjectRef(self.job, ObjectKind.STEP, arrival.step, arrival.worker)
        key = self.job_prefix + arrival.key
        cached = self.cache.get(self.bucket, key, arrival.size)
        if isinstance(cached, StepHeader):
            return cached
        head, size = self._read(ref, arrival.size, arrival.header_end)
        try:
            header = decode_step_object(ref, head, size)[0]
        except ValueError as exc:
            raise UnreadableObject(bad_step(ref, str(exc)).bad or str(exc)) from None
        self.cache.put(self.bucket, key, size, header, arrival.header_end)
        return header

    def segment(self, arrival: SegmentArrival) -> SegmentHeader:
        ref = segment_ref(self.job, arrival)
        key = self.job_prefix + arrival.key
        cached = self.cache.get(self.bucket, key, arrival.size)
        if isinstance(cached, SegmentHeader):
            return cached
        head, size = self._read(ref, arrival.size, arrival.header_end)
        try:
            header = decode_segment_object(ref, head, size)[0]
        except ValueError as exc:
            raise UnreadableObject(bad_segment(ref, str(exc)).bad or str(exc)) from None
        self.cache.put(self.bucket, key, size, header, arrival.header_end)
        return header


def default_client() -> Any:
    from trainguard.service.clients import client

    return client("s3")

"""Reading a job's objects for the rule engine: decoders, the job-source interface, local folders.

The engine needs only headers. A step object (format 1) or a segment (format 2) is decoded
from its first bytes (``head``: the 8-byte length and the JSON header); every byte is
checked by the codec before use, and the document must agree with its key. A bad object
becomes an arrival with ``bad`` set, which keeps its place in the worker's chain.

Nothing here talks to AWS: the S3 job source and the live service's header reader are AWS
adapters (``trainguard.service.s3_objects``); they implement the same interfaces.
"""

from __future__ import annotations

import bisect
import contextlib
import fnmatch
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainguard.engine.model import SegmentArrival, StepArrival, SystemArrival, UnreadableObject
from trainguard.format import stepfile
from trainguard.format.documents import (
    MAX_DOCUMENT_BYTES,
    EndMarker,
    Manifest,
    SegmentHeader,
    StepHeader,
    decode_segment_header,
    decode_step_header,
    parse_document,
)
from trainguard.format.layout import ObjectKind, ObjectRef, parse_relative, relative_key
from trainguard.format.system import MAX_SYSTEM_BYTES, parse_system_batch
from trainguard.rules.base import StepData
from trainguard.text import validation_text

#: a step object or segment larger than this is refused outright (S3's largest single PUT;
#: no trainguard writer produces one: full tensors are split across windows)
MAX_STEP_OBJECT_BYTES = 5 * 1024**3


class ObjectError(ValueError):
    """An object that cannot be used; the message is the reason recorded for it."""


def step_arrival(ref: ObjectRef, head: bytes, size: int) -> StepArrival:
    """Decode a step object's header (``head`` = at least the first 8+N bytes)."""
    assert ref.step is not None and ref.worker is not None
    try:
        header, parsed = decode_step_object(ref, head, size)
    except (ValueError, stepfile.StepFormatError) as exc:
        return bad_step(ref, str(exc))
    return StepArrival(
        header.step, header.worker, header.prev_step, header, size=size, header_end=parsed.data_start
    )


def decode_step_object(ref: ObjectRef, head: bytes, size: int) -> tuple[StepHeader, stepfile.ParsedHeader]:
    """The step document of ``ref``, checked against its key; raises ValueError with the reason."""
    if size > MAX_STEP_OBJECT_BYTES:
        raise ObjectError(f"object is {size} bytes; at most {MAX_STEP_OBJECT_BYTES}")
    header, parsed = decode_step_header(head, object_size=size)
    if (header.job, header.step, header.worker) != (ref.job, ref.step, ref.worker):
        raise ObjectError(
            f"header says job {header.job!r} step {header.step} worker {header.worker}, "
            f"key says job {ref.job!r} step {ref.step} worker {ref.worker}"
        )
    if header.prev_step is not None and header.prev_step >= header.step:
        raise ObjectError(f"prev_step {header.prev_step} is not before step {header.step}")
    return header, parsed


def bad_step(ref: ObjectRef, reason: str) -> StepArrival:
    """A step object that cannot be used: its key still places it in the worker's chain."""
    assert ref.step is not None and ref.worker is not None
    text = f"{relative_key(ref)}: {_short_text(reason)}"
    return StepArrival(ref.step, ref.worker, None, None, bad=text[:1000])


def segment_arrival(ref: ObjectRef, head: bytes, size: int) -> SegmentArrival:
    """Decode a segment's header (``head`` = at least its first 8+N bytes)."""
    try:
        header, parsed = decode_segment_object(ref, head, size)
    except (ValueError, stepfile.StepFormatError) as exc:
        return bad_segment(ref, str(exc))
    return SegmentArrival(
        header.worker,
        header.seq,
        header.first_step,
        header.last_step,
        header.prev_step,
        header,
        size=size,
        header_end=parsed.data_start,
    )


def decode_segment_object(
    ref: ObjectRef, head: bytes, size: int
) -> tuple[SegmentHeader, stepfile.ParsedHeader]:
    """The segment document of ``ref``, checked against its key; raises ValueError with the reason."""
    if size > MAX_STEP_OBJECT_BYTES:
        raise ObjectError(f"object is {size} bytes; at most {MAX_STEP_OBJECT_BYTES}")
    header, parsed = decode_segment_header(head, object_size=size)
    said = (header.job, header.worker, header.seq, header.first_step, header.last_step)
    keyed = (ref.job, ref.worker, ref.seq, ref.step, ref.last_step)
    if said != keyed:
        raise ObjectError(
            f"header says job {said[0]!r} worker {said[1]} seq {said[2]} steps {said[3]}..{said[4]}, "
            f"key says job {keyed[0]!r} worker {keyed[1]} seq {keyed[2]} steps {keyed[3]}..{keyed[4]}"
        )
    return header, parsed


def bad_segment(ref: ObjectRef, reason: str) -> SegmentArrival:
    """A segment that cannot be used: its key gives worker, seq and step range all the same."""
    assert ref.worker is not None and ref.seq is not None
    assert ref.step is not None and ref.last_step is not None
    text = f"{relative_key(ref)}: {_short_text(reason)}"
    return SegmentArrival(ref.worker, ref.seq, ref.step, ref.last_step, bad=text[:1000])


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
    return _short_text(validation_text(exc))  # a pydantic error without its lines and URLs


def _short_text(text: str) -> str:
    return " | ".join(text.splitlines()[:4])[:500]


def document_limit(ref: ObjectRef) -> int:
    """The most bytes a JSON document of this kind may have (read no more than one past it)."""
    return MAX_SYSTEM_BYTES if ref.kind is ObjectKind.SYSTEM else MAX_DOCUMENT_BYTES


def read_bounded(path: Path, limit: int) -> bytes:
    """A file's bytes, refused past ``limit`` without reading more than ``limit + 1`` of them."""
    with path.open("rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ObjectError(f"{path.name} is larger than {limit} bytes")
    return raw


def header_probe_bytes(ref: ObjectRef) -> int:
    """How many bytes the first read of an object fetches: enough for most headers."""
    return stepfile.SEGMENT_PROBE_BYTES if ref.kind is ObjectKind.SEGMENT else stepfile.HEADER_PROBE_BYTES


class JobSource(Protocol):
    """A stored job: a local folder here, an S3 prefix in ``trainguard.service.s3_objects``."""

    job: str

    def objects(self) -> Iterator[ObjectRef]: ...

    def head(self, ref: ObjectRef) -> tuple[bytes, int]:
        """The object's first bytes (at least its whole header) and its size."""

    def document(self, ref: ObjectRef) -> bytes:
        """A small JSON document, bounded by ``MAX_DOCUMENT_BYTES``."""

    def sibling(self, name: str) -> JobSource:
        """Another job next to this one (or at a path / URI this kind of source can open)."""


def relative_path(ref: ObjectRef) -> str:
    return relative_key(ref)


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
            # a bad manifest: the folder name is the job (replay reports the manifest's problem)
            with contextlib.suppress(ObjectError):
                job = read_manifest(read_bounded(manifest, MAX_DOCUMENT_BYTES)).job
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
        path = self.root / relative_key(ref)
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(header_probe_bytes(ref))
            try:
                need = 8 + stepfile.header_length(prefix)
            except stepfile.StepFormatError:
                return prefix, size
            if need > len(prefix):
                prefix += fh.read(need - len(prefix))
        return prefix, size

    def document(self, ref: ObjectRef) -> bytes:
        return read_bounded(self.root / relative_key(ref), document_limit(ref))

    def sibling(self, name: str) -> JobSource:
        if name.startswith("s3://"):
            raise ObjectError(
                f"{name}: a job in S3 cannot be opened from the local replay of {self.root} "
                "(replay an s3:// job, or copy the other job next to this one)"
            )
        if "/" in name or name.startswith("."):
            return LocalJob.open(name)
        return LocalJob.open(self.root.parent / name)


class SourceHeaders:
    """The :class:`~trainguard.engine.model.HeaderReader` of a job source (replay's reader)."""

    def __init__(self, source: JobSource) -> None:
        self.source = source

    def _head(self, ref: ObjectRef) -> tuple[bytes, int]:
        try:
            return self.source.head(ref)
        except (OSError, KeyError, ValueError) as exc:  # gone since listed, unreadable
            raise UnreadableObject(
                f"{relative_key(ref)}: cannot be read ({type(exc).__name__}: {exc})"
            ) from None

    def step(self, arrival: StepArrival) -> StepHeader:
        ref = ObjectRef(self.source.job, ObjectKind.STEP, arrival.step, arrival.worker)
        head, size = self._head(ref)
        try:
            return decode_step_object(ref, head, size)[0]
        except ValueError as exc:
            raise UnreadableObject(bad_step(ref, str(exc)).bad or "") from None

    def segment(self, arrival: SegmentArrival) -> SegmentHeader:
        ref = segment_ref(self.source.job, arrival)
        head, size = self._head(ref)
        try:
            return decode_segment_object(ref, head, size)[0]
        except ValueError as exc:
            raise UnreadableObject(bad_segment(ref, str(exc)).bad or "") from None


def segment_ref(job: str, arrival: SegmentArrival) -> ObjectRef:
    return ObjectRef(
        job,
        ObjectKind.SEGMENT,
        arrival.first_step,
        arrival.worker,
        seq=arrival.seq,
        last_step=arrival.last_step,
    )


def pointer_of(ref: ObjectRef) -> SegmentArrival:
    """A segment as its key describes it (the header is read when evaluation reaches it)."""
    assert ref.worker is not None and ref.seq is not None
    assert ref.step is not None and ref.last_step is not None
    return SegmentArrival(ref.worker, ref.seq, ref.step, ref.last_step)


#: headers of another job kept per process for SimilarAcrossRuns (a segment's serves many steps)
OTHER_JOB_HEADERS = 64
#: other jobs whose listing (and permission) a process keeps, and for how long: a reference
#: job written later, or a permission changed, is seen again after this
OTHER_JOBS_KEPT = 16
OTHER_JOB_TTL_S = 300.0
#: error codes that mean "you may not read this", whatever the store
_DENIED = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "NoSuchBucket"})


class ComparisonRefused(ObjectError):
    """Another job cannot be compared with: it did not allow it, or it cannot be read.

    The cross-job rule that asked ends ``Error`` with this reason: a rule cannot have
    passed a job it never compared.
    """


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _denied(exc: BaseException) -> bool:
    return isinstance(exc, PermissionError) or _error_code(exc) in _DENIED


def comparison_allowed(manifest: Manifest, requester: str) -> bool:
    """Whether ``manifest``'s job lets ``requester`` compare with it (``allow_comparison_from``)."""
    return any(fnmatch.fnmatchcase(requester, pattern) for pattern in manifest.allow_comparison_from)


class OtherJobs:
    """The same step of another, already written job (SimilarAcrossRuns's ``other_trials``).

    ``opener`` turns a job name (or, in replay, an s3:// URI / folder) into its JobSource.

    Authorisation: a job names the job it compares with in its own rule configuration, so
    naming is not permission. The other job must allow it: its manifest's
    ``allow_comparison_from`` lists the requesting job's name (or a ``*`` pattern matching
    it). The other job's data never leaves the comparison: the rule reports that a tensor
    differs, not the other job's values.

    :meth:`for_job` gives the ``(job, step) -> StepData | None`` function of one requesting
    job. A job that refused, or that cannot be read (AccessDenied, no manifest, not a job),
    raises :class:`ComparisonRefused`; a step it does not hold is None (not compared; the
    rule counts it), with the reason kept in ``problems`` when an object was unreadable.
    """

    def __init__(
        self,
        opener: Callable[[str], JobSource],
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = OTHER_JOB_TTL_S,
    ) -> None:
        self.opener = opener
        self.clock = clock
        self.ttl_s = ttl_s
        #: job -> (opened at, the listing and manifest, or the reason it cannot be used)
        self._jobs: OrderedDict[str, tuple[float, _IndexedJob | ComparisonRefused]] = OrderedDict()
        self._headers: OrderedDict[tuple[str, str], SegmentHeader | StepHeader | None] = OrderedDict()
        self.problems: list[str] = []

    def for_job(self, requester: str) -> Callable[[str, int], StepData | None]:
        """The other-job reader of the job ``requester`` (its permission is checked per call)."""
        return lambda job, step: self.step(requester, job, step)

    def _job(self, job: str) -> _IndexedJob:
        now = self.clock()
        kept = self._jobs.get(job)
        if kept is None or now - kept[0] > self.ttl_s:
            indexed: _IndexedJob | ComparisonRefused
            try:
                indexed = _IndexedJob.open(self.opener(job))
            except ComparisonRefused as exc:
                indexed = exc
            except Exception as exc:  # denied, gone, not a job: the rule says so (never skipped)
                what = "is not readable" if _denied(exc) else "cannot be read"
                indexed = ComparisonRefused(f"job {job!r} {what}: {type(exc).__name__}: {_short(exc)}")
            kept = (now, indexed)
            self._jobs[job] = kept
            while len(self._jobs) > OTHER_JOBS_KEPT:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job)
        if isinstance(kept[1], ComparisonRefused):
            raise kept[1]
        return kept[1]

    def _problem(self, text: str) -> None:
        if len(self.problems) < 20 and text not in self.problems:
            self.problems.append(text)

    def _header(self, indexed: _IndexedJob, ref: ObjectRef) -> SegmentHeader | StepHeader | None:
        cache_key = (indexed.source.job, relative_key(ref))
        if cache_key in self._headers:
            self._headers.move_to_end(cache_key)
            return self._headers[cache_key]
        header: SegmentHeader | StepHeader | None = None
        try:
            head, size = indexed.source.head(ref)
            if ref.kind is ObjectKind.SEGMENT:
                header = decode_segment_object(ref, head, size)[0]
            else:
                header = decode_step_object(ref, head, size)[0]
        except Exception as exc:
            if _denied(exc):  # a permission problem is not a missing step: never skipped silently
                raise ComparisonRefused(
                    f"job {indexed.source.job!r}: {relative_key(ref)} is not readable: "
                    f"{type(exc).__name__}: {_short(exc)}"
                ) from None
            # gone or malformed: this step is not compared (the rule counts it), the reason kept
            self._problem(f"other job {indexed.source.job!r}: {relative_key(ref)}: {_short(exc)}")
        self._headers[cache_key] = header
        while len(self._headers) > OTHER_JOB_HEADERS:
            self._headers.popitem(last=False)
        return header

    def step(self, requester: str, job: str, step: int) -> StepData | None:
        """``job``'s data at ``step`` for a rule of ``requester``; raises ComparisonRefused."""
        if job == requester:
            raise ComparisonRefused(f"job {job!r} cannot be compared with itself")
        indexed = self._job(job)
        if not comparison_allowed(indexed.manifest, requester):
            raise ComparisonRefused(
                f"job {job!r} does not allow comparison from job {requester!r}: its manifest's "
                f"allow_comparison_from must name {requester!r} (or a pattern matching it)"
            )
        headers: list[StepHeader] = []
        for ref in indexed.refs_at(step):
            header = self._header(indexed, ref)
            if isinstance(header, SegmentHeader):
                index = bisect.bisect_left(header.steps, step, key=lambda entry: entry.step)
                if index < len(header.steps) and header.steps[index].step == step:
                    headers.append(header.step_header(index))
            elif header is not None:
                headers.append(header)
        return StepData.from_headers(headers) if headers else None


#: objects of another job a process indexes for one comparison (a bigger job is refused)
MAX_OTHER_JOB_OBJECTS = 1_000_000


@dataclass
class _IndexedJob:
    """Another job's manifest and listing: which object holds each worker's step."""

    source: JobSource
    manifest: Manifest
    steps: dict[int, list[int]]  # step -> workers (format 1)
    segments: dict[int, list[ObjectRef]]  # worker -> segments in step order (format 2)
    firsts: dict[int, list[int]]

    @staticmethod
    def open(source: JobSource) -> _IndexedJob:
        try:
            raw = source.document(ObjectRef(source.job, ObjectKind.MANIFEST))
        except (FileNotFoundError, KeyError) as exc:
            raise ComparisonRefused(
                f"job {source.job!r} has no manifest.json, so it has not allowed comparison ({_short(exc)})"
            ) from None
        try:
            manifest = read_manifest(raw)
        except ObjectError as exc:
            raise ComparisonRefused(f"job {source.job!r}: {exc}") from None
        steps: dict[int, list[int]] = {}
        segments: dict[int, list[ObjectRef]] = {}
        for count, ref in enumerate(source.objects()):
            if count >= MAX_OTHER_JOB_OBJECTS:
                raise ComparisonRefused(f"job {source.job!r} holds more than {MAX_OTHER_JOB_OBJECTS} objects")
            if ref.kind is ObjectKind.STEP and ref.step is not None and ref.worker is not None:
                steps.setdefault(ref.step, []).append(ref.worker)
            elif ref.kind is ObjectKind.SEGMENT and ref.worker is not None:
                segments.setdefault(ref.worker, []).append(ref)
        for refs in segments.values():
            refs.sort(key=lambda r: (r.step or 0, r.seq or 0))
        firsts = {w: [r.step or 0 for r in refs] for w, refs in segments.items()}
        return _IndexedJob(source, manifest, steps, segments, firsts)

    def refs_at(self, step: int) -> list[ObjectRef]:
        refs = [
            ObjectRef(self.source.job, ObjectKind.STEP, step, w) for w in sorted(self.steps.get(step, []))
        ]
        for worker in sorted(self.segments):
            index = bisect.bisect_right(self.firsts[worker], step) - 1
            if index >= 0:
                ref = self.segments[worker][index]
                if ref.last_step is not None and step <= ref.last_step:
                    refs.append(ref)
        return refs


def sibling_opener(source: JobSource) -> Callable[[str], JobSource]:
    """Open ``other_trials`` as replay sees it: a URI or path as given, else a sibling job."""
    return source.sibling

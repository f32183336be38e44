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
import os
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
from trainguard.format.system import parse_system_batch
from trainguard.rules.base import StepData

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
    return _short_text(str(exc))


def _short_text(text: str) -> str:
    return " | ".join(text.splitlines()[:4])[:500]


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
        path = self.root / relative_key(ref)
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise ObjectError(f"{relative_key(ref)} is larger than {MAX_DOCUMENT_BYTES} bytes")
        return path.read_bytes()

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


class OtherJobs:
    """The same step of another, already written job (SimilarAcrossRuns's ``other_trials``).

    ``opener`` turns a job name (or an s3:// URI / folder) into its JobSource. A job that
    cannot be opened, or a step it does not hold, is None: that step is not compared, and
    the reason is kept in ``problems`` (replay prints them).
    """

    def __init__(self, opener: Callable[[str], JobSource]) -> None:
        self.opener = opener
        self._jobs: dict[str, _IndexedJob | None] = {}
        self._headers: OrderedDict[tuple[str, str], SegmentHeader | StepHeader | None] = OrderedDict()
        self.problems: list[str] = []

    def _job(self, job: str) -> _IndexedJob | None:
        if job not in self._jobs:
            try:
                self._jobs[job] = _IndexedJob.open(self.opener(job))
            except Exception as exc:  # the comparison is skipped, with the reason kept
                self._jobs[job] = None
                self._problem(f"other job {job!r} cannot be read: {type(exc).__name__}: {_short(exc)}")
        return self._jobs[job]

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
        except Exception as exc:  # gone, unreadable: not compared, with the reason kept
            self._problem(f"other job {indexed.source.job!r}: {relative_key(ref)}: {_short(exc)}")
        self._headers[cache_key] = header
        while len(self._headers) > OTHER_JOB_HEADERS:
            self._headers.popitem(last=False)
        return header

    def __call__(self, job: str, step: int) -> StepData | None:
        indexed = self._job(job)
        if indexed is None:
            return None
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


@dataclass
class _IndexedJob:
    """Another job's listing: which object holds each worker's step."""

    source: JobSource
    steps: dict[int, list[int]]  # step -> workers (format 1)
    segments: dict[int, list[ObjectRef]]  # worker -> segments in step order (format 2)
    firsts: dict[int, list[int]]

    @staticmethod
    def open(source: JobSource) -> _IndexedJob:
        steps: dict[int, list[int]] = {}
        segments: dict[int, list[ObjectRef]] = {}
        for ref in source.objects():
            if ref.kind is ObjectKind.STEP and ref.step is not None and ref.worker is not None:
                steps.setdefault(ref.step, []).append(ref.worker)
            elif ref.kind is ObjectKind.SEGMENT and ref.worker is not None:
                segments.setdefault(ref.worker, []).append(ref)
        for refs in segments.values():
            refs.sort(key=lambda r: (r.step or 0, r.seq or 0))
        firsts = {w: [r.step or 0 for r in refs] for w, refs in segments.items()}
        return _IndexedJob(source, steps, segments, firsts)

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

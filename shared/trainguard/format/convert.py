"""Format 1 → format 2: rewrite a job folder's step objects as segments.

A version-1 job holds one object per (step, worker) under ``steps/``; a version-2 job holds one
object per worker per flush window under ``segments/`` (see docs/format.md). The converter reads
each worker's step objects in step order and groups them into segments with the same window
rules the hook uses (:class:`WindowRules`), by a step count or a window of the steps' wall
times; full tensors move into the segment's body under
:func:`~trainguard.format.documents.segment_tensor_key`. Everything else (manifest, system
batches, stop signal, reports) is copied as is, and each end marker gains ``segments``.

:class:`SegmentWriter` is the window logic on its own, for writers that are not the hook
(the converter, the service benchmark's synthetic workers)::

    writer = SegmentWriter("my-job", worker=0, world_size=1, rules=WindowRules(window_s=1.0))
    for closed in writer.add(step, wall_time, modes, tensors):
        store.put(closed.key, closed.data)
    final = writer.close()

Command line (either folder may be ``s3://bucket/prefix/<job>``)::

    python -m trainguard.format.convert runs/job-v1 runs/job-v2 --window 1.0
    python -m trainguard.format.convert runs/job-v1 runs/job-v2 --steps 100
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    MAX_SEGMENT_STEPS,
    EndMarker,
    Manifest,
    Mode,
    ModeRecord,
    SegmentHeader,
    SegmentStep,
    decode_step_header,
    dump_document,
    encode_segment,
    parse_document,
    read_bounded_document,
    segment_tensor_key,
)

CloseReason = Literal["time", "size", "full", "nonfinite", "close"]
#: what a tensor's entry in the JSON header costs besides its name (dtype, shape, offsets)
_ENTRY_OVERHEAD_BYTES = 96
#: the segment document's own fields (job, worker, seq, times, reason...)
_SEGMENT_OVERHEAD_BYTES = 512


class ConversionError(ValueError):
    """The source job cannot be converted; the message names the object and the problem."""


@dataclass(frozen=True)
class WindowRules:
    """When a segment's window closes (the hook's rules, for writers that are not the hook).

    ``window_s``: a step whose wall time is ``window_s`` or more past the window's first step
    opens a new window (None: no time limit). ``max_steps``: at most this many steps per
    segment (None: no count limit). A window also closes before its header would pass
    ``header_target_bytes``, after a step that stores full tensors (``close_on_full``), and
    right after a step holding a non-finite value (``close_on_nonfinite``), so a NaN is read
    by the service at once.
    """

    window_s: float | None = 1.0
    max_steps: int | None = None
    header_target_bytes: int = stepfile.SEGMENT_HEADER_TARGET_BYTES
    close_on_full: bool = True
    close_on_nonfinite: bool = True

    def __post_init__(self) -> None:
        if self.window_s is not None and not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a positive number of seconds, got {self.window_s!r}")
        if self.max_steps is not None and not 1 <= self.max_steps <= MAX_SEGMENT_STEPS:
            raise ValueError(f"max_steps must be in 1..{MAX_SEGMENT_STEPS}, got {self.max_steps!r}")
        if not 1024 <= self.header_target_bytes <= stepfile.MAX_HEADER_BYTES - _SEGMENT_OVERHEAD_BYTES:
            raise ValueError(
                f"header_target_bytes must be in 1024..{stepfile.MAX_HEADER_BYTES - _SEGMENT_OVERHEAD_BYTES}"
            )


@dataclass(frozen=True)
class ClosedSegment:
    """A segment ready to be written: its key in the job folder, its bytes, its document."""

    key: str
    data: bytes
    header: SegmentHeader


def is_nonfinite(modes: Mapping[Mode, ModeRecord]) -> bool:
    """Whether a step holds a non-finite scalar or a tensor whose statistics saw NaN or Inf."""
    for record in modes.values():
        for scalar in record.scalars.values():
            if not math.isfinite(scalar.value):
                return True
        for tensor in record.tensors.values():
            stats = tensor.stats
            if stats is not None and (
                stats.nan
                or stats.inf
                or not all(
                    v is None or math.isfinite(v) for v in (stats.mean, stats.min, stats.max, stats.l2)
                )
            ):
                return True
    return False


@dataclass
class SegmentWriter:
    """One worker's chain of segments, windowed by :class:`WindowRules`."""

    job: str
    worker: int
    world_size: int
    rules: WindowRules = field(default_factory=WindowRules)
    #: segments closed so far (the next one's ``seq``)
    segments_written: int = 0
    #: the last step of the last closed segment (the next one's ``prev_step``)
    last_step: int | None = None
    _steps: list[SegmentStep] = field(default_factory=list)
    _tensors: dict[str, stepfile.TensorBlob] = field(default_factory=dict)
    _header_bytes: int = 0

    def add(
        self,
        step: int,
        wall_time: float,
        modes: Mapping[Mode, ModeRecord],
        tensors: Mapping[str, stepfile.TensorBlob] | None = None,
    ) -> list[ClosedSegment]:
        """Record one step; return the segments this closed (zero, one or two).

        ``tensors`` maps ``"<MODE>/<name>"`` (format 1's ``tensor_key``) to full tensors.
        """
        closed: list[ClosedSegment] = []
        if self._steps and self._steps[-1].step >= step:
            raise ConversionError(
                f"worker {self.worker}: step {step} does not come after step {self._steps[-1].step}"
            )
        entry = SegmentStep.model_construct(step=step, wall_time=wall_time, modes=dict(modes))
        tensors = dict(tensors or {})
        cost = len(entry.model_dump_json()) + sum(len(n) + 24 + _ENTRY_OVERHEAD_BYTES for n in tensors)
        if self._steps:
            opened = self._steps[0].wall_time
            if self.rules.window_s is not None and wall_time - opened >= self.rules.window_s:
                closed.append(self._close("time", closed_at=opened + self.rules.window_s))
            elif self._header_bytes + cost > self.rules.header_target_bytes:
                closed.append(self._close("size"))
        self._steps.append(entry)
        self._header_bytes += cost
        for name, blob in tensors.items():
            mode, _, tensor_name = name.partition("/")
            self._tensors[segment_tensor_key(step, mode, tensor_name)] = blob
        reason: CloseReason | None = None
        if self.rules.close_on_nonfinite and is_nonfinite(modes):
            reason = "nonfinite"
        elif self.rules.close_on_full and tensors:
            reason = "full"
        elif (self.rules.max_steps is not None and len(self._steps) >= self.rules.max_steps) or (
            self._header_bytes + _SEGMENT_OVERHEAD_BYTES > self.rules.header_target_bytes
        ):
            reason = "size"
        if reason is not None:
            closed.append(self._close(reason))
        return closed

    def poll(self, now: float) -> ClosedSegment | None:
        """Close the window if its time ran out by ``now`` though no new step came (a live writer's timer)."""
        window = self.rules.window_s
        if self._steps and window is not None and now - self._steps[0].wall_time >= window:
            return self._close("time", closed_at=self._steps[0].wall_time + window)
        return None

    def close(self) -> ClosedSegment | None:
        """Close the open window (``reason="close"``); None when it holds no step."""
        return self._close("close") if self._steps else None

    def _close(self, reason: CloseReason, closed_at: float | None = None) -> ClosedSegment:
        steps, tensors = self._steps, self._tensors
        opened = steps[0].wall_time
        closed = max(opened, closed_at if closed_at is not None else steps[-1].wall_time)
        header = SegmentHeader(
            job=self.job,
            worker=self.worker,
            world_size=self.world_size,
            seq=self.segments_written,
            prev_step=self.last_step,
            first_step=steps[0].step,
            last_step=steps[-1].step,
            opened=opened,
            closed=closed,
            reason=reason,
            steps=steps,
        )
        data = encode_segment(header, tensors)
        key = layout.segment_key(self.worker, header.seq, header.first_step, header.last_step)
        self.segments_written += 1
        self.last_step = header.last_step
        self._steps, self._tensors, self._header_bytes = [], {}, 0
        return ClosedSegment(key, data, header)


class Folder(Protocol):
    """What the converter needs of a job folder (``trainguard.hook.storage.Store`` has it)."""

    def list(self, prefix: str = "") -> list[str]: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]: ...
    def put(self, key: str, data: bytes) -> None: ...


class MemoryFolder:
    """A job folder held in a dict (relative key → bytes): tests and in-process conversions."""

    def __init__(self, objects: Mapping[str, bytes] | None = None) -> None:
        self.objects: dict[str, bytes] = dict(objects or {})

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def get(self, key: str) -> bytes:
        return self.objects[key]

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]:
        data = self.objects[key]
        return data[start:end], len(data)

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data


@dataclass
class ConversionReport:
    steps: int = 0
    segments: dict[int, int] = field(default_factory=dict)
    copied: int = 0
    #: keys outside the layout, left behind
    skipped: list[str] = field(default_factory=list)


WindowChoice = WindowRules | Mapping[int, WindowRules] | Callable[[int], WindowRules]


def convert_job(source: Folder, target: Folder, rules: WindowChoice | None = None) -> ConversionReport:
    """Write the version-2 form of the version-1 job in ``source`` into ``target``.

    ``rules``: one :class:`WindowRules` for every worker, or per worker (a mapping or a
    function of the rank): workers may use different windows.
    """
    report = ConversionReport()
    by_worker: dict[int, list[tuple[int, str]]] = {}
    ends: dict[int, str] = {}
    job = "job"
    keys = source.list("")
    if layout.MANIFEST in keys:
        try:
            job = parse_document(Manifest, read_bounded_document(source, layout.MANIFEST)).job
        except ValueError as exc:
            raise ConversionError(f"{layout.MANIFEST}: {exc}") from None
    for key in keys:
        try:
            ref = layout.parse_relative(job, key)
        except layout.LayoutError:
            report.skipped.append(key)
            continue
        if ref.kind is layout.ObjectKind.STEP and ref.step is not None and ref.worker is not None:
            by_worker.setdefault(ref.worker, []).append((ref.step, key))
        elif ref.kind is layout.ObjectKind.END and ref.worker is not None:
            ends[ref.worker] = key
        elif ref.kind is layout.ObjectKind.SEGMENT:
            raise ConversionError(f"{key}: the source already holds format-2 segments")
        else:
            target.put(key, source.get(key))
            report.copied += 1
    for worker, steps in sorted(by_worker.items()):
        writer: SegmentWriter | None = None
        for step, key in sorted(steps):
            data = source.get(key)
            try:
                header, parsed = decode_step_header(data, object_size=len(data))
            except stepfile.StepFormatError as exc:
                raise ConversionError(f"{key}: {exc}") from None
            if writer is None:
                writer = SegmentWriter(header.job, worker, header.world_size, _rules_for(rules, worker))
            view = memoryview(data)
            tensors = {
                name: stepfile.TensorBlob(entry.dtype, entry.shape, bytes(view[entry.begin : entry.end]))
                for name, entry in parsed.tensors.items()
            }
            for closed in writer.add(step, header.wall_time, header.modes, tensors):
                target.put(closed.key, closed.data)
            report.steps += 1
        if writer is not None:
            final = writer.close()
            if final is not None:
                target.put(final.key, final.data)
            report.segments[worker] = writer.segments_written
    for worker, key in sorted(ends.items()):
        try:
            marker = parse_document(EndMarker, read_bounded_document(source, key))
        except ValueError as exc:
            raise ConversionError(f"{key}: {exc}") from None
        marker = marker.model_copy(update={"segments": report.segments.get(worker, 0)})
        target.put(key, dump_document(marker))
    return report


def convert_objects(objects: Mapping[str, bytes], rules: WindowChoice | None = None) -> dict[str, bytes]:
    """:func:`convert_job` on a dict of relative key → bytes (a whole job in memory)."""
    target = MemoryFolder()
    convert_job(MemoryFolder(objects), target, rules)
    return target.objects


def _rules_for(rules: WindowChoice | None, worker: int) -> WindowRules:
    if rules is None:
        return WindowRules()
    if isinstance(rules, WindowRules):
        return rules
    if callable(rules):
        return rules(worker)
    return rules.get(worker, WindowRules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainguard.format.convert",
        description="Rewrite a version-1 job folder (steps/) as a version-2 job folder (segments/).",
    )
    parser.add_argument("source", help="version-1 job folder (local path or s3://bucket/prefix/<job>)")
    parser.add_argument("target", help="where to write the version-2 job folder")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--window", type=float, default=1.0, help="window in seconds of wall time (1.0)")
    group.add_argument("--steps", type=int, default=None, help="steps per segment instead of a window")
    args = parser.parse_args(argv)
    from trainguard.hook.storage import open_store  # the one storage adapter (boto3 only for s3://)

    rules = WindowRules(window_s=None, max_steps=args.steps) if args.steps else WindowRules(args.window)
    try:
        report = convert_job(_store(open_store, args.source), _store(open_store, args.target), rules)
    except (ConversionError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{report.steps} step objects -> {sum(report.segments.values())} segments "
        f"({len(report.segments)} workers); {report.copied} other objects copied"
    )
    for key in report.skipped[:20]:
        print(f"warning: {key} is outside the trainguard layout; not copied", file=sys.stderr)
    return 0


def _store(open_store: Any, where: str) -> Folder:
    store: Folder = open_store(where)
    return store


if __name__ == "__main__":
    sys.exit(main())

"""Segment windows (format 2): a worker's steps batched into one object per flush window.

``SegmentBuilder`` runs in the background writer. It turns each sealed step record into its
``SegmentStep`` document (statistics finalised, full tensors as blobs), adds it to the open
window, and closes the window into a segment object when

* ``time``: the window has been open ``window_s`` seconds (the writer's timer also closes
  it when no new step arrives);
* ``size``: adding the next step would take the safetensors header past
  ``stepfile.SEGMENT_HEADER_TARGET_BYTES`` (so the service reads any header with one bounded
  GET), or the body (full tensors) past ``body_limit_bytes``, or the window holds
  ``MAX_SEGMENT_STEPS`` steps; a single step larger than that gets a segment of its own;
* ``full``: the step stores full tensors that were due (a ``save_full`` collection): full
  tensors are large, so they go out at once and the hook never holds more than one step's;
* ``nonfinite``: a value saved in the step is NaN or infinite: flushed at once, so a
  diverging job is judged as fast as a step object was in format 1;
* ``close``: the hook closed.

A worker's segments chain: ``seq`` 0, 1, 2, ... and ``prev_step`` (the last step of the
previous segment). The header is built once per segment: each step's JSON is made once
when the step arrives (its escaped size is what the size cap counts) and the segment
document is assembled from those pieces.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    MAX_SEGMENT_STEPS,
    ModeRecord,
    ScalarRecord,
    SegmentHeader,
    SegmentStep,
    TensorRecord,
    TensorStats,
    construct,
    segment_tensor_key,
)
from trainguard.hook.stats import PendingStats

#: full tensors held in one open window, at most (a larger single step is written alone)
DEFAULT_BODY_LIMIT_BYTES = 64 * 1024 * 1024
#: the segment document without its steps (up to 32 drop reasons of <= 64 characters), the
#: safetensors framing and padding: a margin
_FIXED_HEADER_BYTES = 4096
_STEPS_MARKER = '"steps":[]'
CloseReason = Literal["time", "size", "full", "nonfinite", "close"]


@dataclass
class PendingTensor:
    """A tensor recorded in a step: its statistics (maybe still on the device) and full copy."""

    collections: list[str]
    dtype: str
    shape: list[int]
    stats: PendingStats | TensorStats | None
    #: a host copy (torch CPU tensor or numpy array) when the full tensor is stored
    full: Any = None


class DeviceCopy:
    """A full tensor's host copy still in flight from an accelerator; ``wait`` before reading."""

    __slots__ = ("event", "tensor")

    def __init__(self, tensor: Any, event: Any) -> None:
        self.tensor = tensor
        self.event = event

    def wait(self) -> Any:
        self.event.synchronize()
        return self.tensor


@dataclass
class ModeBuffer:
    mode_step: int
    scalars: dict[str, tuple[Any, list[str]]] = field(default_factory=dict)
    tensors: dict[str, PendingTensor] = field(default_factory=dict)


@dataclass
class StepRecord:
    """Everything one worker recorded at one global step, handed from the training thread."""

    step: int
    wall_time: float
    modes: dict[str, ModeBuffer] = field(default_factory=dict)
    #: full tensors of a ``save_full`` collection were due: the window closes after this step
    full_due: bool = False
    #: memory the record holds (full copies, statistics), for the writer's byte bound
    nbytes: int = 256


@dataclass(frozen=True)
class Segment:
    """One closed window, encoded."""

    key: str
    data: bytes
    seq: int
    first_step: int
    last_step: int
    steps: int
    reason: CloseReason


@dataclass
class _Window:
    opened_wall: float
    opened_mono: float
    steps: list[str] = field(default_factory=list)
    step_numbers: list[int] = field(default_factory=list)
    blobs: dict[str, stepfile.TensorBlob] = field(default_factory=dict)
    header_bytes: int = _FIXED_HEADER_BYTES
    body_bytes: int = 0


@dataclass
class _Prepared:
    step: int
    wall_time: float
    text: str
    blobs: dict[str, stepfile.TensorBlob]
    header_bytes: int
    body_bytes: int
    nonfinite: bool
    full_due: bool


class SegmentBuilder:
    """Builds a worker's chain of segments from sealed step records (one writer thread)."""

    def __init__(
        self,
        job: str,
        worker: int,
        world_size: int,
        *,
        window_s: float,
        header_target_bytes: int = stepfile.SEGMENT_HEADER_TARGET_BYTES,
        body_limit_bytes: int = DEFAULT_BODY_LIMIT_BYTES,
        order: Mapping[str, int] | None = None,
        take_dropped: Callable[[], dict[str, int]] | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.worker = worker
        self.world_size = world_size
        self.window_s = window_s
        self.header_target = header_target_bytes
        self.body_limit = body_limit_bytes
        #: tensor name -> position (parameters in model order: GradientNormRatio relies on it)
        self.order: Mapping[str, int] = order if order is not None else {}
        self._take_dropped = take_dropped or dict
        self._wall = wall_clock
        self._mono = monotonic
        self._window: _Window | None = None
        self.seq = 0
        self.prev_step: int | None = None
        self.steps_written = 0

    # ------------------------------------------------------------------ window state
    @property
    def open_steps(self) -> int:
        return len(self._window.steps) if self._window is not None else 0

    def deadline(self) -> float | None:
        """Monotonic time at which the open window closes on time (None: nothing open)."""
        return None if self._window is None else self._window.opened_mono + self.window_s

    def expired(self) -> Segment | None:
        """Close the open window if its time is up."""
        deadline = self.deadline()
        if deadline is not None and self._mono() >= deadline:
            return self.close("time")
        return None

    # ------------------------------------------------------------------ steps
    def add(self, record: StepRecord) -> list[Segment]:
        """Add a sealed step; the segments this closed (before it, or with it)."""
        prepared = self._prepare(record)
        out: list[Segment] = []
        window = self._window
        if window is not None:
            if self._mono() >= window.opened_mono + self.window_s:
                out.append(self._close(window, "time"))
            elif (
                window.header_bytes + prepared.header_bytes > self.header_target
                or (prepared.body_bytes and window.body_bytes + prepared.body_bytes > self.body_limit)
                or len(window.steps) >= MAX_SEGMENT_STEPS
            ):
                out.append(self._close(window, "size"))
        if self._window is None:
            self._window = _Window(min(prepared.wall_time, self._wall()), self._mono())
        window = self._window
        window.steps.append(prepared.text)
        window.step_numbers.append(prepared.step)
        window.blobs.update(prepared.blobs)
        window.header_bytes += prepared.header_bytes
        window.body_bytes += prepared.body_bytes
        if prepared.nonfinite:
            out.append(self._close(window, "nonfinite"))
        elif prepared.full_due:
            out.append(self._close(window, "full"))
        return out

    def close(self, reason: CloseReason) -> Segment | None:
        """Close the open window now (``time`` from the timer, ``close`` at the end)."""
        return self._close(self._window, reason) if self._window is not None else None

    def _close(self, window: _Window, reason: CloseReason) -> Segment:
        self._window = None
        first, last = window.step_numbers[0], window.step_numbers[-1]
        closed = max(self._wall(), window.opened_wall)
        header = SegmentHeader.model_construct(
            job=self.job,
            worker=self.worker,
            world_size=self.world_size,
            seq=self.seq,
            prev_step=self.prev_step,
            first_step=first,
            last_step=last,
            opened=window.opened_wall,
            closed=closed,
            reason=reason,
            steps=[],
            dropped=dict(list(self._take_dropped().items())[:32]),
        )
        text = header.model_dump_json()
        # the steps were serialised once each, on arrival: splice them into the document
        at = text.index(_STEPS_MARKER) + len(_STEPS_MARKER) - 1
        document = text[:at] + ",".join(window.steps) + text[at:]
        data = stepfile.encode(window.blobs, {stepfile.METADATA_KEY: document})
        segment = Segment(
            key=layout.segment_key(self.worker, self.seq, first, last),
            data=data,
            seq=self.seq,
            first_step=first,
            last_step=last,
            steps=len(window.steps),
            reason=reason,
        )
        self.seq += 1
        self.prev_step = last
        self.steps_written += len(window.steps)
        return segment

    # ------------------------------------------------------------------ one step's document
    def _prepare(self, record: StepRecord) -> _Prepared:
        blobs: dict[str, stepfile.TensorBlob] = {}
        modes: dict[Any, ModeRecord] = {}
        nonfinite = False
        entry_bytes = 0
        for mode, buf in record.modes.items():
            scalars: dict[str, ScalarRecord] = {}
            for name, (value, cols) in buf.scalars.items():
                number = to_float(value)
                nonfinite = nonfinite or not math.isfinite(number)
                scalars[name] = construct(ScalarRecord, value=number, collections=cols)
            tensors: dict[str, TensorRecord] = {}
            order = self.order
            items = (
                sorted(buf.tensors.items(), key=lambda kv: order.get(kv[0], 1 << 30))
                if order
                else buf.tensors.items()
            )
            for name, pending in items:
                stats = pending.stats.finalize() if isinstance(pending.stats, PendingStats) else pending.stats
                if stats is not None and not nonfinite:
                    nonfinite = not _finite_stats(stats)
                stored = False
                if pending.full is not None:
                    full = pending.full.wait() if isinstance(pending.full, DeviceCopy) else pending.full
                    key = segment_tensor_key(record.step, mode, name)
                    blob = tensor_blob(full)
                    blobs[key] = blob
                    stored = True
                    entry_bytes += len(json.dumps(key)) + 64 + 12 * len(blob.shape)
                    nonfinite = nonfinite or _blob_nonfinite(full)
                tensors[name] = construct(
                    TensorRecord,
                    collections=pending.collections[:32],
                    dtype=pending.dtype,
                    shape=pending.shape,
                    stats=stats,
                    stored=stored,
                )
            modes[mode] = construct(ModeRecord, mode_step=buf.mode_step, scalars=scalars, tensors=tensors)
        text = construct(
            SegmentStep, step=record.step, wall_time=record.wall_time, modes=modes
        ).model_dump_json()
        return _Prepared(
            step=record.step,
            wall_time=record.wall_time,
            text=text,
            blobs=blobs,
            header_bytes=escaped_length(text) + 1 + entry_bytes,
            body_bytes=sum(len(b.data) for b in blobs.values()),
            nonfinite=nonfinite,
            full_due=record.full_due,
        )


def escaped_length(text: str) -> int:
    """Length of ``text`` once JSON-escaped as a string value (the segment document sits in
    the safetensors header's ``__metadata__`` as a string), without the quotes."""
    if text.isascii():
        return len(text) + text.count('"') + text.count("\\") + sum(text.count(c) for c in "\n\r\t")
    return len(json.dumps(text)) - 2


def _finite_stats(stats: TensorStats) -> bool:
    if getattr(stats, "nan", 0) or getattr(stats, "inf", 0):
        return False
    for name in ("mean", "std", "min", "max", "l1", "l2", "mean_abs"):
        value = getattr(stats, name, None)
        if isinstance(value, float) and not math.isfinite(value):
            return False
    return True


def _blob_nonfinite(value: Any) -> bool:
    """A full copy with NaN/Inf (only checked for float tensors saved in full)."""
    try:
        if type(value).__module__.startswith("torch"):
            return bool(value.is_floating_point() and not bool(value.isfinite().all()))
        array = np.asarray(value)
        return bool(array.dtype.kind == "f" and not np.isfinite(array).all())
    except Exception:
        return False


def to_float(value: Any) -> float:
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def tensor_blob(value: Any) -> stepfile.TensorBlob:
    """A full tensor (host copy) as a TensorBlob over its buffer (no extra copy); bfloat16 as raw bits."""
    if type(value).__module__.startswith("torch"):
        import torch

        if value.dtype == torch.bfloat16:
            return _view_blob("BF16", value.contiguous().view(torch.int16).numpy().view(np.uint16))
        array = value.contiguous().numpy()
    else:
        array = np.asarray(value)
        if array.dtype.name == "bfloat16":
            return _view_blob("BF16", array.view(np.uint16))
    blob = stepfile.TensorBlob.from_numpy(np.zeros(0, dtype=array.dtype))  # validates the dtype, names it
    return _view_blob(blob.dtype, array.astype(array.dtype.newbyteorder("<"), copy=False))


def _view_blob(name: str, array: np.ndarray[Any, Any]) -> stepfile.TensorBlob:
    """Wrap a little-endian array's buffer (copied only if it is not contiguous)."""
    shape = tuple(int(d) for d in array.shape)
    flat = np.ascontiguousarray(array).reshape(-1)  # (ascontiguousarray makes 0-d arrays 1-d)
    data = memoryview(flat).cast("B") if flat.size else b""  # type: ignore[arg-type]
    return stepfile.TensorBlob(name, shape, data)

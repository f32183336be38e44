"""The background writer: sealed step records -> segment windows -> delivery, off the training thread.

The training thread only appends each sealed ``StepRecord`` to an inbox (a lock and a deque
append; no serialisation). One daemon *writer* thread wakes every ``batch_s`` (or at once
when the inbox holds ``wake_bytes``, or a window's time is up), finalises the records'
statistics (the host copies of device reductions), builds each step's document, feeds the
``SegmentBuilder`` and hands closed segments to ``Delivery``. It yields the GIL between
records, so a burst never holds the training thread up for long.

Memory is bounded in bytes, not in steps: the inbox holds at most ``max_bytes`` of records
(full tensor copies count by their size, a statistics record by an estimate), the open
window at most the segment header target and one step's full tensors, delivery its own
memory cap (then disk). When the inbox is full, ``submit`` waits (backpressure: a training
loop that produces faster than the writer can encode slows down rather than loses data).
Only if the writer makes no progress for ``max_wait_s`` is a record dropped, and that is
counted by reason (``writer_stalled``), as everything the hook ever drops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from trainguard.hook.segments import Segment, SegmentBuilder, StepRecord
from trainguard.hook.uploader import Delivery, lower_priority

log = logging.getLogger("trainguard.hook")

DEFAULT_MAX_BYTES = 128 * 1024 * 1024
DEFAULT_BATCH_S = 0.05
DEFAULT_WAKE_BYTES = 4 * 1024 * 1024


class DropCounter:
    """Values the hook could not record, by reason; thread-safe.

    ``take_new`` returns what was counted since it was last called (each segment carries the
    drops of its window); ``totals`` everything (the end marker).
    """

    MAX_REASONS = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: Counter[str] = Counter()
        self._new: Counter[str] = Counter()

    def add(self, reason: str, count: int = 1) -> None:
        if count <= 0:
            return
        reason = reason[:64]
        with self._lock:
            if reason not in self._total and len(self._total) >= self.MAX_REASONS - 1:
                reason = "other"
            self._total[reason] += count
            self._new[reason] += count

    def take_new(self) -> dict[str, int]:
        with self._lock:
            out, self._new = dict(self._new), Counter()
        return out

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._total)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._total)


class SegmentWriter:
    """Inbox -> writer thread (documents, windows, encoding) -> ``Delivery``."""

    def __init__(
        self,
        builder: SegmentBuilder,
        delivery: Delivery,
        drops: DropCounter,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_wait_s: float = 30.0,
        batch_s: float = DEFAULT_BATCH_S,
        wake_bytes: int = DEFAULT_WAKE_BYTES,
        on_error: Callable[[BaseException], None] | None = None,
        on_segment: Callable[[Segment], None] | None = None,
        nice: int = 10,
    ) -> None:
        self.builder = builder
        self.delivery = delivery
        self.drops = drops
        self.max_bytes = max_bytes
        self.max_wait_s = max_wait_s
        self.batch_s = batch_s
        self.wake_bytes = wake_bytes
        self._on_error = on_error
        self._on_segment = on_segment
        self.nice = nice
        self._inbox: deque[Any] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._flush_now = False
        self._failed = False
        #: close() gave up waiting: the thread stops at the next record, delivering nothing more
        self._abandoned = False
        #: step records submitted and not yet in a window (counted as lost if close() gives up)
        self._unwindowed = 0
        self._thread = threading.Thread(target=self._loop, name="trainguard-writer", daemon=True)
        self._started = False
        self._closed = False
        #: seconds the training thread waited in ``submit`` (backpressure), in total
        self.waited_s = 0.0
        #: the most bytes the inbox ever held
        self.peak_bytes = 0
        self.segments = 0

    # ------------------------------------------------------------------ training thread
    def submit(self, record: StepRecord) -> bool:
        """Queue a sealed step. Waits only while the inbox is full; False if it was dropped."""
        with self._cond:
            if self._closed or self._failed:
                self.drops.add("writer_failed" if self._failed else "after_close")
                return False
            self._start()
            full = self._bytes + record.nbytes > self.max_bytes and bool(self._inbox)
            if full and not self._wait_for_room(record.nbytes):
                self.drops.add("writer_stalled")
                log.warning(
                    "trainguard: the writer made no progress for %.0f s; dropped step %d (counted)",
                    self.max_wait_s,
                    record.step,
                )
                return False
            self._inbox.append(record)
            self._bytes += record.nbytes
            self._unwindowed += 1
            self.peak_bytes = max(self.peak_bytes, self._bytes)
            if self._bytes >= self.wake_bytes:
                self._cond.notify_all()
        return True

    def submit_raw(self, key: str, data: bytes) -> None:
        """An already encoded object (manifest, system batch), delivered in order; never waits."""
        with self._cond:
            if self._closed:
                self.drops.add("after_close")
                return
            self._start()
            self._inbox.append((key, data))
            self._cond.notify_all()

    def request_flush(self) -> None:
        """Close the open window soon (its time is not up): used by ``Hook.flush``."""
        with self._cond:
            self._flush_now = True
            self._cond.notify_all()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def _wait_for_room(self, need: int) -> bool:
        """Backpressure (caller holds the lock): wait until the record fits or no progress is made."""
        started = time.monotonic()
        progress_at = started
        last = self._bytes
        self._cond.notify_all()
        while self._bytes + need > self.max_bytes and self._inbox and not self._failed:
            self._cond.wait(0.1)
            now = time.monotonic()
            if self._bytes < last:
                last, progress_at = self._bytes, now
            elif now - progress_at >= self.max_wait_s:
                self.waited_s += now - started
                return False
        self.waited_s += time.monotonic() - started
        return not self._failed

    def close(self, timeout_s: float) -> None:
        """Encode everything queued, close the open window (``close``), stop the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cond.notify_all()
            started = self._started
        if started:
            self._thread.join(max(0.0, timeout_s))
            if self._thread.is_alive():
                with self._cond:
                    self._abandoned = True
                    self._cond.notify_all()
                self._thread.join(5.0)  # it stops at the next record
                with self._cond:
                    lost = self._unwindowed + self.builder.open_steps
                self.drops.add("close_timeout", lost)
                log.error(
                    "trainguard: the writer did not finish in %.0f s; %d steps were not written (counted)",
                    timeout_s,
                    lost,
                )

    # ------------------------------------------------------------------ writer thread
    def _loop(self) -> None:
        lower_priority(self.nice)
        try:
            while True:
                batch, stopping, flush = self._next_batch()
                for item in batch:
                    if self._abandoned:
                        return
                    self._handle(item)
                    time.sleep(0)  # yield the GIL between records
                if self._abandoned:
                    return
                if flush:
                    self._deliver(self.builder.close("time"))
                else:
                    self._deliver(self.builder.expired())
                if stopping and not batch:
                    if not self._abandoned:
                        self._deliver(self.builder.close("close"))
                    return
        except Exception as exc:  # a bug here must not break training: the hook disables itself
            with self._cond:
                self._failed = True
                self._inbox.clear()
                self._bytes = 0
                lost, self._unwindowed = self._unwindowed, 0
                self._cond.notify_all()
            self.drops.add("writer_failed", lost + self.builder.open_steps)
            if self._on_error is not None:
                self._on_error(exc)

    def _next_batch(self) -> tuple[list[Any], bool, bool]:
        with self._cond:
            wait_until = time.monotonic() + self.batch_s
            while not self._stopping and not self._flush_now and self._bytes < self.wake_bytes:
                deadline = self.builder.deadline()
                until = wait_until if deadline is None else min(wait_until, deadline)
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = list(self._inbox)
            self._inbox.clear()
            self._bytes = 0
            flush, self._flush_now = self._flush_now, False
            self._cond.notify_all()  # room again: wake a waiting submit
            return batch, self._stopping, flush

    def _handle(self, item: Any) -> None:
        if isinstance(item, StepRecord):
            segments = self.builder.add(item)
            with self._cond:
                self._unwindowed -= 1
            for segment in segments:
                self._deliver(segment)
        else:
            key, data = item  # the manifest, a system batch: delivered in submission order
            self.delivery.submit(key, data)

    def _deliver(self, segment: Segment | None) -> None:
        if segment is None:
            return
        self.segments += 1
        self.delivery.submit(segment.key, segment.data)
        if self._on_segment is not None:
            self._on_segment(segment)

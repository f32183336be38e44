"""Background writing that never blocks the training step and never loses data silently.

Two daemon threads, so that a slow PUT never stops encoding:

* the **writer** takes step records from a bounded queue (``submit`` never waits: when the
  queue is full the record is dropped and counted), encodes them (the expensive part:
  statistics to documents, tensors to bytes) and hands the encoded objects on;
* the **sender** delivers encoded objects to the store in order. When a PUT fails it
  spills the object to a local spill folder and retries with exponential backoff; while
  the store is failing, the writer spills every new object to disk at once, so memory
  stays bounded however long S3 is down. Encoded objects waiting in memory are capped too
  (``memory_bytes``); beyond that they go to disk.

``close`` drains both within a deadline. Whatever is still undelivered then is counted as
dropped (and reported by the hook's end marker and a log line); spilled files are left on
disk and the log line says where.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.hook.storage import Store

log = logging.getLogger("trainguard.hook")

_STOP = object()


def _lower_priority(nice: int) -> None:
    """Make the calling thread yield the CPU to training when cores are busy.

    On Linux a thread is a task with its own nice value, so this affects only the
    background thread: it uses idle CPU freely, but when training keeps every core busy
    the scheduler favours the training threads (the work here is never urgent: the queue
    absorbs bursts). Elsewhere, or without permission, it is a no-op.
    """
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass


@dataclass
class UploadStats:
    """Counters, readable at any time (ints: atomic enough under the GIL)."""

    submitted: int = 0
    written: int = 0
    bytes_written: int = 0
    #: records refused at submit (queue full) or objects undelivered at close
    dropped: int = 0
    spilled: int = 0
    failed_puts: int = 0
    encode_errors: int = 0


@dataclass
class _Pending:
    key: str
    data: bytes | None
    path: Path | None = None
    size: int = 0
    attempts: int = field(default=0)


class Uploader:
    """Bounded queue -> writer thread (encode) -> sender thread (PUT, spill, retry)."""

    def __init__(
        self,
        store: Store,
        encode: Callable[[Any], tuple[str, bytes] | None],
        *,
        queue_size: int = 256,
        memory_bytes: int = 256 * 1024 * 1024,
        spill_dir: Path | None = None,
        max_spill_bytes: int = 10 * 1024**3,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        on_error: Callable[[BaseException], None] | None = None,
        nice: int = 10,
    ) -> None:
        self.store = store
        self._encode = encode
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._memory_limit = memory_bytes
        self._spill_dir = spill_dir
        self._max_spill = max_spill_bytes
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._on_error = on_error
        self.stats = UploadStats()
        #: niceness of the background threads (Linux: per thread); 0 leaves them alone
        self.nice = nice
        self._pending: deque[_Pending] = deque()
        self._memory = 0
        self._spill_bytes = 0
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._healthy = True
        self._writer_done = False
        self._abort = False
        self._drop_logged = 0
        self._writer = threading.Thread(target=self._write_loop, name="trainguard-writer", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="trainguard-sender", daemon=True)
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ training thread
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._writer.start()
            self._sender.start()

    def submit(self, item: Any) -> bool:
        """Queue a record for encoding; never blocks. False (and counted) when it was dropped."""
        if self._closed:
            return False
        self.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.stats.dropped += 1
            self._log_drop("the write queue is full (writing is slower than training)")
            return False
        self.stats.submitted += 1
        return True

    def submit_encoded(self, key: str, data: bytes) -> bool:
        """Queue an already encoded object (manifest); never blocks."""
        return self.submit(("raw", key, data))

    @property
    def backlog(self) -> int:
        with self._cond:
            return self._queue.qsize() + len(self._pending)

    def close(self, timeout_s: float) -> int:
        """Drain within ``timeout_s``; returns how many objects stayed undelivered (counted as dropped)."""
        if self._closed:
            return 0
        self._closed = True
        if not self._started:
            return 0
        deadline = time.monotonic() + max(0.0, timeout_s)
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=max(0.01, deadline - time.monotonic()))
        self._writer.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._writer_done = True
            self._cond.notify_all()
        self._sender.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._abort = True
            self._cond.notify_all()
            undelivered = len(self._pending) + self._queue.qsize()
            spilled = [p.path for p in self._pending if p.path is not None]
            # anything the writer had not taken yet
            while True:
                try:
                    leftover = self._queue.get_nowait()
                except queue.Empty:
                    break
                if leftover is _STOP:
                    undelivered -= 1
        if undelivered:
            self.stats.dropped += undelivered
            where = f"; {len(spilled)} spilled objects kept in {self._spill_dir}" if spilled else ""
            log.error(
                "trainguard: %d objects could not be delivered to %s before the %.0f s close timeout%s",
                undelivered,
                self.store.url,
                timeout_s,
                where,
            )
        elif self._spill_dir is not None and self._spill_dir.exists():
            shutil.rmtree(self._spill_dir, ignore_errors=True)
        return undelivered

    def _log_drop(self, reason: str) -> None:
        self._drop_logged += 1
        n = self._drop_logged
        if n == 1 or n % 100 == 0:
            log.warning("trainguard: dropped %d step records so far: %s", self.stats.dropped, reason)

    # ------------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        _lower_priority(self.nice)
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if isinstance(item, tuple) and len(item) == 3 and item[0] == "raw":
                    encoded: tuple[str, bytes] | None = (item[1], item[2])
                else:
                    encoded = self._encode(item)
            except Exception as exc:
                self.stats.encode_errors += 1
                self.stats.dropped += 1
                if self._on_error is not None:
                    self._on_error(exc)
                continue
            if encoded is not None:
                self._hand_over(*encoded)

    def _hand_over(self, key: str, data: bytes) -> None:
        entry = _Pending(key, data, size=len(data))
        with self._cond:
            if not self._healthy or self._memory + len(data) > self._memory_limit:
                self._spill(entry, counted=False)
            if entry.data is not None:
                self._memory += len(data)
            self._pending.append(entry)
            self._cond.notify_all()

    def _spill(self, entry: _Pending, *, counted: bool) -> None:
        """Move an entry's bytes to the spill folder (caller holds the lock)."""
        if entry.data is None:
            return
        if self._spill_dir is None or self._spill_bytes + entry.size > self._max_spill:
            return  # no room on disk: keep it in memory rather than lose it
        try:
            self._spill_dir.mkdir(parents=True, exist_ok=True)
            path = self._spill_dir / f"{next(self._seq):012d}-{entry.key.replace('/', '__')}"
            path.write_bytes(entry.data)
        except OSError as exc:
            log.warning(
                "trainguard: cannot spill to %s (%s); keeping the object in memory", self._spill_dir, exc
            )
            return
        if counted:
            self._memory -= entry.size
        entry.path, entry.data = path, None
        self._spill_bytes += entry.size
        self.stats.spilled += 1

    # ------------------------------------------------------------------ sender thread
    def _send_loop(self) -> None:
        _lower_priority(self.nice)
        backoff = self._backoff_initial
        while True:
            with self._cond:
                while not self._pending and not self._writer_done and not self._abort:
                    self._cond.wait(1.0)
                if self._abort or (not self._pending and self._writer_done):
                    return
                entry = self._pending[0]
            try:
                data = entry.data if entry.data is not None else entry.path.read_bytes()  # type: ignore[union-attr]
                self.store.put(entry.key, data)
            except Exception as exc:
                self.stats.failed_puts += 1
                entry.attempts += 1
                with self._cond:
                    if self._healthy or entry.attempts == 1:
                        log.warning(
                            "trainguard: writing %s to %s failed (%s); spilling to disk and retrying",
                            entry.key,
                            self.store.url,
                            exc,
                        )
                    self._healthy = False
                    for pending in self._pending:  # the store is failing: get everything onto disk
                        self._spill(pending, counted=True)
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            backoff = self._backoff_initial
            with self._cond:
                self._pending.popleft()
                if entry.path is not None:
                    entry.path.unlink(missing_ok=True)
                    self._spill_bytes -= entry.size
                else:
                    self._memory -= entry.size
                if not self._healthy:
                    log.info("trainguard: writing to %s works again; sending spilled objects", self.store.url)
                self._healthy = True
                self.stats.written += 1
                self.stats.bytes_written += entry.size

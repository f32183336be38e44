"""Delivery: encoded objects to the job folder, in order, never blocking and never lost silently.

A daemon *sender* thread delivers encoded objects (segments, the manifest, system batches)
to the store in the order they were handed over. When a PUT fails it spills the object to a
local spill folder and retries with exponential backoff; while the store is failing every
new object goes to disk at once, so memory stays bounded however long S3 is down. Objects
waiting in memory are capped too (``memory_bytes``); beyond that they go to disk.

Failures are said plainly, once, at the first one (``storage.describe_failure``: "the
bucket does not exist", "access denied", "no credentials"...), and again when the store
works again. ``close`` drains within a deadline (shortened to one last try when the
failure is permanent and nothing was ever delivered: waiting would not help); whatever is
undelivered then is counted and described in the returned ``DeliveryReport``; spilled
files are left on disk for a later upload and the report says where.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.hook.storage import Store, describe_failure

log = logging.getLogger("trainguard.hook")

#: how long ``close`` still tries when every PUT so far failed for a permanent reason
PERMANENT_FAILURE_GRACE_S = 2.0


def lower_priority(nice: int) -> None:
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
    except OSError as exc:
        log.debug("trainguard: cannot lower the writer's priority (%s); it runs at normal priority", exc)


@dataclass
class UploadStats:
    """Counters, readable at any time (ints: atomic enough under the GIL)."""

    submitted: int = 0
    written: int = 0
    bytes_written: int = 0
    #: objects undelivered at close
    dropped: int = 0
    spilled: int = 0
    failed_puts: int = 0
    #: the first failure, in words (None: none yet)
    first_error: str | None = None
    #: the last failure was permanent (no bucket, no access, no credentials)
    permanent_failure: bool = False


@dataclass(frozen=True)
class DeliveryReport:
    """What ``close`` could not deliver (``undelivered == 0``: everything arrived)."""

    url: str
    written: int
    undelivered: int
    undelivered_bytes: int
    spill_dir: str | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.undelivered == 0


@dataclass
class _Pending:
    key: str
    data: bytes | None
    path: Path | None = None
    size: int = 0
    attempts: int = field(default=0)


class Delivery:
    """Encoded objects -> sender thread (PUT in order, spill, retry)."""

    def __init__(
        self,
        store: Store,
        *,
        memory_bytes: int = 256 * 1024 * 1024,
        spill_dir: Path | None = None,
        max_spill_bytes: int = 10 * 1024**3,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        nice: int = 10,
    ) -> None:
        self.store = store
        self._memory_limit = memory_bytes
        self._spill_dir = spill_dir
        self._max_spill = max_spill_bytes
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stats = UploadStats()
        #: niceness of the sender thread (Linux: per thread); 0 leaves it alone
        self.nice = nice
        self._pending: deque[_Pending] = deque()
        self._memory = 0
        self._spill_bytes = 0
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._healthy = True
        self._done = False
        self._abort = False
        self._sender = threading.Thread(target=self._send_loop, name="trainguard-sender", daemon=True)
        self._started = False
        self._closed = False

    @property
    def spill_dir(self) -> Path | None:
        return self._spill_dir

    def submit(self, key: str, data: bytes) -> bool:
        """Queue an encoded object; never blocks. False when the delivery is already closed."""
        with self._cond:
            if self._closed:
                return False
            if not self._started:
                self._started = True
                self._sender.start()
            entry = _Pending(key, data, size=len(data))
            if not self._healthy or self._memory + len(data) > self._memory_limit:
                self._spill(entry, counted=False)
            if entry.data is not None:
                self._memory += len(data)
            self._pending.append(entry)
            self.stats.submitted += 1
            self._cond.notify_all()
        return True

    @property
    def backlog(self) -> int:
        with self._cond:
            return len(self._pending)

    def close(self, timeout_s: float) -> DeliveryReport:
        """Deliver what is queued within ``timeout_s``; report what could not be."""
        with self._cond:
            already, self._closed = self._closed, True
            started = self._started
            self._done = True
            self._cond.notify_all()
        if already or not started:
            return self._report()
        timeout = max(0.0, timeout_s)
        if self.stats.permanent_failure and self.stats.written == 0:
            timeout = min(timeout, PERMANENT_FAILURE_GRACE_S)
        self._sender.join(timeout)
        with self._cond:
            self._abort = True
            self._cond.notify_all()
        report = self._report()
        if report.undelivered:
            self.stats.dropped += report.undelivered
        elif self._spill_dir is not None and self._spill_dir.exists():
            shutil.rmtree(self._spill_dir, ignore_errors=True)
        return report

    def _report(self) -> DeliveryReport:
        with self._cond:
            pending = list(self._pending)
        spilled = any(p.path is not None for p in pending)
        return DeliveryReport(
            url=self.store.url,
            written=self.stats.written,
            undelivered=len(pending),
            undelivered_bytes=sum(p.size for p in pending),
            spill_dir=str(self._spill_dir) if spilled and self._spill_dir is not None else None,
            error=self.stats.first_error,
        )

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

    def _send_loop(self) -> None:
        lower_priority(self.nice)
        backoff = self.backoff_initial_s
        while True:
            with self._cond:
                while not self._pending and not self._done and not self._abort:
                    self._cond.wait(1.0)
                if self._abort or (not self._pending and self._done):
                    return
                entry = self._pending[0]
            try:
                data = entry.data if entry.data is not None else entry.path.read_bytes()  # type: ignore[union-attr]
                self.store.put(entry.key, data)
            except Exception as exc:
                self._failed(entry, exc)
                with self._cond:
                    if self._abort:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
                continue
            backoff = self.backoff_initial_s
            with self._cond:
                self._pending.popleft()
                if entry.path is not None:
                    entry.path.unlink(missing_ok=True)
                    self._spill_bytes -= entry.size
                else:
                    self._memory -= entry.size
                if not self._healthy:
                    log.warning(
                        "trainguard: writing to %s works again; sending what was kept", self.store.url
                    )
                self._healthy = True
                self.stats.permanent_failure = False
                self.stats.written += 1
                self.stats.bytes_written += entry.size

    def _failed(self, entry: _Pending, exc: Exception) -> None:
        permanent, text = describe_failure(self.store.url, exc)
        self.stats.failed_puts += 1
        entry.attempts += 1
        with self._cond:
            first = self.stats.first_error is None
            if first:
                self.stats.first_error = text
            if self._healthy or first:
                where = f" in {self._spill_dir}" if self._spill_dir is not None else " in memory"
                if permanent:
                    log.error(
                        "trainguard: %s. Nothing this job records reaches the service until that is "
                        "fixed; it is kept%s and retried.",
                        text,
                        where,
                    )
                else:
                    log.warning("trainguard: %s; keeping objects%s and retrying", text, where)
            self.stats.permanent_failure = permanent
            self._healthy = False
            for pending in self._pending:  # the store is failing: get everything onto disk
                self._spill(pending, counted=True)

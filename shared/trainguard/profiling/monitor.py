"""The system monitor: a daemon thread that samples the host and batches step timings.

The hook creates one per worker and drives the tiny step-timer API from the training loop::

    monitor = SystemMonitor(emit, job="my-job", worker=rank, world_size=n).start()
    monitor.mark_initialized()
    for batch in monitor.timed_loader(loader):   # measures time spent in next()
        monitor.step_started("TRAIN", step)
        ...
        monitor.step_ended("TRAIN", step)
    monitor.close()                              # final flush

``emit(relative_key, body)`` receives each :class:`~trainguard.format.system.SystemBatch` as
JSON under ``system/worker-<rank>/<seq>.json`` at least every ``flush_s`` seconds (earlier
when a batch fills) and on ``close()``. ``seq`` is contiguous from 0.

Guarantees: the hot-path calls take an uncontended lock and a clock read (about a
microsecond); nothing ever raises into training: the first error is logged once, with its
traceback, and the monitor disables itself. Host metrics come from ``/proc`` on Linux
(psutil elsewhere), GPUs from NVML when ``pynvml`` imports, else GPUs are recorded as absent.
When several workers share a host, pass ``sample_system=False`` to all but one of them
(e.g. local rank 0 samples): the others still send their step timings.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from trainguard.format.layout import system_key, validate_job_name
from trainguard.format.system import (
    MAX_EVENTS,
    MAX_SAMPLES,
    MAX_SYSTEM_BYTES,
    DataloaderInfo,
    GpuSample,
    InitInfo,
    StepEvent,
    SystemBatch,
    SystemSample,
    check_interval,
    dump_system_batch,
)
from trainguard.profiling.sampler import NvmlReader, ProcReader, PsutilReader

log = logging.getLogger(__name__)

Emit = Callable[[str, bytes], None]
T = TypeVar("T")

#: the thread flushes early once this many step events are pending
FLUSH_EVENTS = MAX_EVENTS // 2
#: and once the pending samples would make a batch this large (bytes, estimated)
FLUSH_BYTES = MAX_SYSTEM_BYTES // 2
MAX_FLUSH_S = 3600.0
_MODES = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


class HostReader(Protocol):
    def prime(self, t: float) -> None: ...

    def sample(self, t: float, gpus: list[GpuSample] | None) -> SystemSample | None: ...


class GpuReader(Protocol):
    def read(self) -> list[GpuSample] | None: ...

    def close(self) -> None: ...


def _mode_name(mode: Any) -> str:
    name = getattr(mode, "value", mode)
    return name if isinstance(name, str) else str(name)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class SystemMonitor:
    """Samples the host every ``interval_s`` and emits batches every ``flush_s`` seconds.

    Parameters
    ----------
    emit:
        ``emit(relative_key, body)``; called from the monitor thread (and from ``close``).
    job, worker, world_size:
        The batch's identity; ``worker`` is the rank.
    interval_s:
        Sampling interval, 0.1 s to 60 s (SageMaker's range); anything else is a ValueError.
    flush_s:
        Longest time between two emitted batches (0 < flush_s <= 3600).
    sample_system:
        False: send step timings only (another worker on the host samples it).
    gpus:
        True: NVML if available; False: never look; or a reader object (tests).
    reader:
        A host reader (tests); default ``/proc`` on Linux, else psutil.
    """

    def __init__(
        self,
        emit: Emit,
        job: str,
        worker: int = 0,
        world_size: int = 1,
        interval_s: float = 0.5,
        flush_s: float = 10.0,
        *,
        host: str | None = None,
        sample_system: bool = True,
        gpus: bool | GpuReader = True,
        reader: HostReader | None = None,
        hook_start: float | None = None,
    ) -> None:
        self.interval_s = check_interval(interval_s)
        if not isinstance(flush_s, (int, float)) or not 0 < float(flush_s) <= MAX_FLUSH_S:
            raise ValueError(f"flush_s must be in (0, {MAX_FLUSH_S:g}] seconds, got {flush_s!r}")
        if not isinstance(worker, int) or not 0 <= worker < 100_000:
            raise ValueError(f"worker must be a rank in 0..99999, got {worker!r}")
        if not isinstance(world_size, int) or not worker < world_size <= 100_000:
            raise ValueError(f"world_size must be > worker and <= 100000, got {world_size!r}")
        self.flush_s = float(flush_s)
        self.job = validate_job_name(job)
        self.worker = worker
        self.world_size = world_size
        self.host = (host if host is not None else socket.gethostname())[:256]
        self._emit = emit
        self._sample_system = sample_system
        self._gpus_option = gpus
        self._reader = reader
        self._gpu: GpuReader | None = None

        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._disabled = False
        self._failed_once = False
        self._closed = False

        # hot-path state (under _lock)
        self._open: dict[str, tuple[int, float]] = {}
        self._events: list[tuple[str, int, float, float, float]] = []
        self._pending_wait = 0.0
        self._dropped_events = 0
        self._hook_start = time.time() if hook_start is None else float(hook_start)
        self._initialized: float | None = None
        self._first_step: float | None = None
        self._dataloader: tuple[int, int] | None = None

        # thread state
        self._samples: list[SystemSample] = []
        self._sample_bytes = 0
        self._dropped_samples = 0
        self._seq = 0
        self._batch_start = self._hook_start
        self._emit_lock = threading.Lock()
        self._cpu_time_s = 0.0
        self._samples_taken = 0
        _watch_forks(self)

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> SystemMonitor:
        if self._thread is not None or self._disabled or self._closed:
            return self
        try:
            if self._sample_system:
                self._open_readers()
            self._thread = threading.Thread(target=self._run, name="trainguard-system-monitor", daemon=True)
            self._thread.start()
        except Exception as exc:
            self._fail(exc)
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop sampling and emit what is pending. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            thread = self._thread
            if thread is not None and thread.is_alive():
                self._stopping = True
                self._wake.set()
                thread.join(timeout)
            elif not self._disabled:
                self._flush()
        except Exception as exc:
            self._fail(exc)
        finally:
            if self._gpu is not None:
                self._gpu.close()

    def __enter__(self) -> SystemMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def enabled(self) -> bool:
        return not self._disabled

    def stats(self) -> dict[str, float | int | bool]:
        """Counters for tests and benchmarks (``cpu_time_s``: the monitor thread's CPU time)."""
        return {
            "samples": self._samples_taken,
            "batches": self._seq,
            "cpu_time_s": self._cpu_time_s,
            "dropped_events": self._dropped_events,
            "dropped_samples": self._dropped_samples,
            "enabled": not self._disabled,
            "gpus": self._gpu is not None,
        }

    # hot path ---------------------------------------------------------------------------
    def mark_initialized(self) -> None:
        """The hook finished setting up (model registered); the training loop comes next."""
        if self._initialized is None:
            self._initialized = time.time()

    def step_started(self, mode: Any, step: int) -> None:
        if self._disabled:
            return
        try:
            t = time.time()
            with self._lock:
                self._open[_mode_name(mode)] = (step, t)
                if self._first_step is None:
                    self._first_step = t
        except Exception as exc:
            self._fail(exc)

    def step_ended(self, mode: Any, step: int) -> None:
        if self._disabled:
            return
        try:
            t = time.time()
            name = _mode_name(mode)
            with self._lock:
                opened = self._open.pop(name, None)
                if opened is None:
                    return
                if len(self._events) >= MAX_EVENTS:
                    self._dropped_events += 1
                    return
                self._events.append((name, step, opened[1], t, self._pending_wait))
                self._pending_wait = 0.0
                wake = len(self._events) == FLUSH_EVENTS
            if wake:
                self._wake.set()
        except Exception as exc:
            self._fail(exc)

    def data_wait(self, seconds: float) -> None:
        """The loop waited ``seconds`` for data; added to the next step that ends."""
        if self._disabled:
            return
        try:
            if seconds > 0:
                with self._lock:
                    self._pending_wait += float(seconds)
        except Exception as exc:
            self._fail(exc)

    def set_dataloader(self, num_workers: int, cpu_count: int | None = None) -> None:
        """Data-loader worker processes and the CPU cores available (default: this process's)."""
        try:
            cores = available_cpus() if cpu_count is None else int(cpu_count)
            self._dataloader = (max(0, int(num_workers)), max(1, cores))
        except Exception as exc:
            self._fail(exc)

    def timed_loader(self, iterable: Iterable[T]) -> TimedLoader[T]:
        """Wrap a DataLoader (or any iterable) so the time spent in ``next()`` counts as data wait."""
        num_workers = getattr(iterable, "num_workers", None)
        if isinstance(num_workers, int) and self._dataloader is None:
            self.set_dataloader(num_workers)
        return TimedLoader(iterable, self)

    # thread -----------------------------------------------------------------------------
    def _open_readers(self) -> None:
        if self._reader is None:
            self._reader = ProcReader() if ProcReader.available() else PsutilReader()
        option = self._gpus_option
        if option is True:
            self._gpu = NvmlReader.open()
        elif option is not False:
            self._gpu = option

    def _run(self) -> None:
        try:
            reader = self._reader if self._sample_system else None
            if reader is not None:
                reader.prime(time.time())
            interval = self.interval_s
            next_sample = time.monotonic() + interval
            last_flush = time.monotonic()
            while not self._stopping:
                now = time.monotonic()
                deadline = (
                    min(next_sample, last_flush + self.flush_s) if reader else last_flush + self.flush_s
                )
                if deadline > now:
                    self._wake.wait(deadline - now)
                    self._wake.clear()
                if self._stopping:
                    break
                now = time.monotonic()
                if reader is not None and now >= next_sample:
                    self._sample(reader)
                    next_sample += interval
                    if next_sample <= now:  # fell behind (suspended, overloaded): skip, don't burst
                        next_sample = now + interval
                if now - last_flush >= self.flush_s or self._flush_due():
                    self._flush()
                    last_flush = time.monotonic()
                self._cpu_time_s = time.thread_time()
            self._flush()
            self._cpu_time_s = time.thread_time()
        except Exception as exc:
            self._fail(exc)

    def _sample(self, reader: HostReader) -> None:
        gpus = self._gpu.read() if self._gpu is not None else None
        sample = reader.sample(time.time(), gpus)
        if sample is None:
            return
        self._samples_taken += 1
        if len(self._samples) >= MAX_SAMPLES:
            self._dropped_samples += 1
            return
        if not self._sample_bytes:
            self._sample_bytes = len(sample.model_dump_json()) + 2
        self._samples.append(sample)

    def _flush_due(self) -> bool:
        return (
            len(self._events) >= FLUSH_EVENTS
            or len(self._samples) >= MAX_SAMPLES
            or len(self._samples) * self._sample_bytes >= FLUSH_BYTES
        )

    def _flush(self) -> None:
        with self._emit_lock:
            with self._lock:
                events, self._events = self._events, []
                dropped_events, self._dropped_events = self._dropped_events, 0
                first_step = self._first_step
            samples, self._samples = self._samples, []
            dropped_samples, self._dropped_samples = self._dropped_samples, 0
            if not samples and not events and not dropped_events and not dropped_samples:
                return
            end = time.time()
            start = min(self._batch_start, end)
            step_events: list[StepEvent] = []
            for mode, step, t0, t1, wait in events:
                if mode not in _MODES or not isinstance(step, int) or step < 0:
                    dropped_events += 1
                    continue
                step_events.append(
                    StepEvent(mode=mode, step=step, start=t0, end=max(t0, t1), data_wait_s=wait)  # type: ignore[arg-type]
                )
            dataloader = self._dataloader
            batch = SystemBatch(
                job=self.job,
                worker=self.worker,
                world_size=self.world_size,
                seq=self._seq,
                host=self.host,
                start_time=start,
                end_time=end,
                interval_s=self.interval_s,
                samples=samples,
                steps=step_events,
                init=InitInfo(
                    hook_start=self._hook_start, initialized=self._initialized, first_step_start=first_step
                ),
                dataloader=None
                if dataloader is None
                else DataloaderInfo(num_workers=dataloader[0], cpu_count=dataloader[1]),
                dropped_samples=dropped_samples,
                dropped_events=dropped_events,
            )
            self._emit(system_key(self.worker, self._seq), dump_system_batch(batch))
            self._seq += 1
            self._batch_start = end

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) must never emit: its seq numbers would collide."""
        self._disabled = True
        self._closed = True
        self._thread = None
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._gpu = None

    def _fail(self, exc: BaseException) -> None:
        self._disabled = True
        self._stopping = True
        self._wake.set()
        if not self._failed_once:
            self._failed_once = True
            log.warning("trainguard: system monitor disabled after an error: %r", exc, exc_info=exc)


_MONITORS: weakref.WeakSet[SystemMonitor] = weakref.WeakSet()
_FORK_HOOKED = False


def _watch_forks(monitor: SystemMonitor) -> None:
    global _FORK_HOOKED
    _MONITORS.add(monitor)
    if not _FORK_HOOKED and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_disable_in_child)
        _FORK_HOOKED = True


def _disable_in_child() -> None:
    for monitor in list(_MONITORS):
        monitor._after_fork_in_child()


class TimedLoader(Generic[T]):
    """Iterates like the wrapped loader; the time each ``next()`` takes is reported as data wait."""

    def __init__(self, iterable: Iterable[T], monitor: SystemMonitor) -> None:
        self._iterable = iterable
        self._monitor = monitor

    def __iter__(self) -> Iterator[T]:
        iterator = iter(self._iterable)
        clock = time.perf_counter
        monitor = self._monitor
        while True:
            t0 = clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            monitor.data_wait(clock() - t0)
            yield item

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._iterable, name)

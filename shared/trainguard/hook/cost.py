"""What the hook itself costs a training job, measured inside the job's own process.

Two figures, read at any time with ``Hook.cost()``:

* ``training_thread_s``: wall time spent inside the hook's entry points on the threads that
  call them (module and backward callbacks, ``save_*``, step bookkeeping): time the training
  step waits for the hook. Only the outermost entry point of a nested call is timed.
* ``background_cpu_s``: CPU time of the hook's own threads (``trainguard-*``: writer,
  sender, stop poller, system monitor), read from each thread's CPU clock. Where no core is
  free (a CPU-only job using every core) this is taken from the training step too.

Side-by-side timings of separate processes vary by +-10-15% on a shared VM, far more than a
1% target; these figures come from the same process as the step they are compared with, so
that noise cancels. They leave out indirect costs (caches, memory bandwidth, a preempted
PyTorch worker thread), which only the side-by-side ratio shows.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

THREAD_PREFIX = "trainguard-"


@dataclass(frozen=True)
class HookCost:
    training_thread_s: float
    background_cpu_s: float
    #: False where the platform has no per-thread CPU clock (background_cpu_s is then 0)
    background_measured: bool


class CostMeter:
    """Accumulates time inside entry points; reads the hook threads' CPU clocks."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._inside_s = 0.0
        #: thread ident -> last CPU time read (kept after the thread ends)
        self._threads: dict[int, float] = {}

    def enter(self) -> bool:
        """Start timing unless already inside an entry point on this thread; True if started."""
        local = self._local
        if getattr(local, "started", None) is not None:
            return False
        local.started = time.perf_counter()
        return True

    def exit(self) -> None:
        local = self._local
        started = local.started
        local.started = None
        if started is not None:
            elapsed = time.perf_counter() - started
            with self._lock:
                self._inside_s += elapsed

    def read(self) -> HookCost:
        measured = hasattr(time, "pthread_getcpuclockid")
        with self._lock:
            if measured:
                for thread in threading.enumerate():
                    if not thread.name.startswith(THREAD_PREFIX) or thread.ident is None:
                        continue
                    try:
                        used = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                    except (OSError, ValueError, OverflowError):
                        # the thread ended between enumerate() and the read: keep its last reading
                        used = self._threads.get(thread.ident, 0.0)
                    self._threads[thread.ident] = used
            return HookCost(self._inside_s, sum(self._threads.values()), measured)

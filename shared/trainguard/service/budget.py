"""Time budgets: one job's slow evaluation never delays another's.

A budget has two edges. The *soft* one is cooperative: the evaluator stops between steps
once it has passed (what was evaluated is committed; the rest waits for the next
invocation or tick). The *hard* one catches a single step that never ends (a rule stuck in
one call): when the code runs in the main thread, as a Lambda handler does, ``SIGALRM``
raises :class:`JobTimeBudgetExceeded` inside it, even inside a regular-expression match,
so the caller moves on to the next job with that job's failure reported. In another thread
(the local mode's handlers) only the soft edge applies.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

#: the hard edge comes this long after the soft one (seconds, and a share of the budget)
HARD_GRACE_S = 1.0
HARD_GRACE_SHARE = 0.5


class JobTimeBudgetExceeded(BaseException):
    """A job's evaluation ran past its hard time budget.

    A BaseException, so that no ``except Exception`` on the way (a rule's error handling)
    swallows it: it always reaches the per-job boundary that set the budget.
    """


@dataclass(frozen=True)
class Deadline:
    """A point on the monotonic clock; ``None`` ends never."""

    at: float | None

    @staticmethod
    def after(seconds: float | None) -> Deadline:
        return Deadline(None if seconds is None else time.monotonic() + seconds)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def remaining(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def sooner(self, other: Deadline) -> Deadline:
        if self.at is None:
            return other
        if other.at is None:
            return self
        return Deadline(min(self.at, other.at))


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_budget(seconds: float, what: str) -> Iterator[Deadline]:
    """Run a block with a soft deadline (yielded) and, where possible, a hard one.

    ``what`` names the work in the exception's message ("job run-7"). An interval timer
    already running (an outer budget, a test's timeout) is kept: when it would fire first it
    is left alone; otherwise it is suspended and restored, less the time spent, afterwards.
    """
    soft = Deadline.after(seconds)
    if seconds <= 0 or not _can_alarm():
        yield soft  # not the main thread: the soft edge only
        return
    hard = seconds + HARD_GRACE_S + HARD_GRACE_SHARE * seconds
    outer_remaining, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < outer_remaining <= hard:
        yield soft  # an outer timer fires first anyway
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise JobTimeBudgetExceeded(
            f"{what}: still running {hard:.0f} s after it started (its time budget is {seconds:.0f} s); "
            "one step took too long, the other jobs went on"
        )

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, hard)
    try:
        yield soft
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_remaining > 0:
            left = max(outer_remaining - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)

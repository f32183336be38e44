"""Stop polling: a background thread looks for the service's ``control/stop.json``.

When a rule with the StopTraining action fires, the service writes the job's stop signal.
``StopWatcher`` checks for it every ``interval_s`` (a HEAD, then one GET when it exists) and
sets ``requested``; the hook raises ``StopTrainingRequested`` at its next safe point (or
the training loop polls ``hook.should_stop``). A failing check is retried quietly after
one warning: not being able to read the signal must never break the job.
"""

from __future__ import annotations

import logging
import threading

from trainguard.format import layout
from trainguard.format.documents import StopSignal, parse_document
from trainguard.hook.storage import Store

log = logging.getLogger("trainguard.hook")


class StopTrainingRequested(Exception):
    """The service asked this job to stop (a rule with the StopTraining action fired).

    Raised once, at a step boundary, when the hook has ``raise_on_stop=True``. Catch it to
    checkpoint and exit cleanly; ``signal`` says which rule asked and why.
    """

    def __init__(self, signal: StopSignal | None) -> None:
        self.signal = signal
        why = f" by rule {signal.rule}: {signal.reason}" if signal is not None else ""
        super().__init__(f"trainguard: stop requested{why}")


class StopWatcher:
    """Polls the job folder for the stop signal (``interval_s`` <= 0: only on ``check_now``)."""

    def __init__(self, store: Store, job: str, interval_s: float) -> None:
        self.store = store
        self.job = job
        self.interval_s = float(interval_s)
        self.requested = threading.Event()
        self.signal: StopSignal | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._poll, name="trainguard-stop", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closing.set()

    def check_now(self) -> bool:
        """Look for the signal synchronously; returns whether the job was asked to stop."""
        if not self.requested.is_set() and self.store.exists(layout.STOP_SIGNAL):
            self._read()
        return self.requested.is_set()

    def _poll(self) -> None:
        failures = 0
        while not self._closing.wait(self.interval_s):
            try:
                present = self.store.exists(layout.STOP_SIGNAL)
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("trainguard: cannot check for the stop signal (%s); will keep trying", exc)
                continue
            failures = 0
            if present:
                try:
                    self._read()
                except Exception as exc:
                    log.warning("trainguard: cannot read the stop signal (%s); will try again", exc)
                    continue
                return

    def _read(self) -> None:
        raw = self.store.get(layout.STOP_SIGNAL)
        try:
            self.signal = parse_document(StopSignal, raw)
        except ValueError as exc:
            log.warning("trainguard: the stop signal is malformed (%s); stopping anyway", str(exc)[:200])
        log.warning(
            "trainguard: the service asked job %s to stop%s",
            self.job,
            f" (rule {self.signal.rule}: {self.signal.reason})" if self.signal else "",
        )
        self.requested.set()

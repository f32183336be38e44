"""What ``Hook.close()`` says: the report of what reached the job folder, loud when something did not.

A job whose data never arrived must not look like a success: the summary is logged as an
error and, when logging would not show it on stderr (a file-only configuration, a logger
switched off), printed there too.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

log = logging.getLogger("trainguard.hook")


@dataclass(frozen=True)
class HookReport:
    """What ``close()`` delivered and what it could not (``ok``: everything arrived)."""

    job: str
    worker: int
    url: str
    segments: int
    steps_written: int
    #: objects (segments, manifest, system batches) that never reached the job folder
    undelivered: int
    undelivered_bytes: int
    #: values not recorded, by reason
    dropped: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    spill_dir: str | None = None
    end_marker_written: bool = True

    @property
    def ok(self) -> bool:
        return not self.undelivered and not self.dropped and self.end_marker_written


def announce(report: HookReport) -> None:
    """Say, so that it cannot be missed, what did not reach the job folder."""
    lines = [f"trainguard: job {report.job} worker {report.worker}: NOT everything reached {report.url}"]
    if report.error:
        lines.append(f"  {report.error}")
    if report.undelivered:
        size = f"{report.undelivered_bytes / 1e6:.1f} MB"
        where = f"; kept in {report.spill_dir}" if report.spill_dir else ""
        lines.append(
            f"  {report.undelivered} objects ({size}) were not delivered ({report.segments} segments "
            f"made){where}. The service did not see them: rules may not have judged this job."
        )
    if not report.end_marker_written:
        lines.append("  The end marker was not written: the service cannot tell that this worker finished.")
    if report.dropped:
        what = ", ".join(f"{n} {r}" for r, n in sorted(report.dropped.items()))
        lines.append(f"  Values not recorded: {what}.")
    message = "\n".join(lines)
    log.error(message)
    if not logging_reaches_stderr():
        print(message, file=sys.stderr, flush=True)


def logging_reaches_stderr() -> bool:
    """Whether an ERROR from ``trainguard.hook`` is printed to stderr by logging itself."""
    logger: logging.Logger | None = log
    handlers: list[logging.Handler] = []
    while logger is not None:
        handlers.extend(logger.handlers)
        if not logger.propagate:
            break
        logger = logger.parent
    if not handlers:
        return logging.lastResort is not None
    return any(
        isinstance(h, logging.StreamHandler)
        and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__)
        and h.level <= logging.ERROR
        for h in handlers
    )

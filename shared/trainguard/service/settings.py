"""The only place the service reads its environment (set by the CDK stack or the local mode)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainguard.format.layout import INGEST_PREFIX

#: a job that has sent nothing for this many days is ended by the clock (clear status per rule)
STALE_JOB_DAYS_ENV = "TRAINGUARD_STALE_JOB_DAYS"
DEFAULT_STALE_JOB_DAYS = 7.0


@dataclass(frozen=True)
class Settings:
    table_name: str
    bus_name: str
    bucket_name: str
    topic_arn: str | None
    ingest_dlq_url: str | None
    ingest_prefix: str = INGEST_PREFIX
    #: seconds of silence after which the clock ends a job (``TRAINGUARD_STALE_JOB_DAYS``)
    stale_after_s: float = DEFAULT_STALE_JOB_DAYS * 86400

    @staticmethod
    def from_env() -> Settings:
        missing = [n for n in ("TABLE_NAME", "BUS_NAME", "BUCKET_NAME") if not os.environ.get(n)]
        if missing:
            raise RuntimeError(f"trainguard service: environment variables {missing} are not set")
        return Settings(
            table_name=os.environ["TABLE_NAME"],
            bus_name=os.environ["BUS_NAME"],
            bucket_name=os.environ["BUCKET_NAME"],
            topic_arn=os.environ.get("TOPIC_ARN") or None,
            ingest_dlq_url=os.environ.get("INGEST_DLQ_URL") or None,
            ingest_prefix=os.environ.get("INGEST_PREFIX", INGEST_PREFIX),
            stale_after_s=stale_job_days(os.environ.get(STALE_JOB_DAYS_ENV)) * 86400,
        )


def stale_job_days(raw: str | None) -> float:
    """The stale-job setting: a finite number of days above zero (default 7)."""
    if raw is None or not raw.strip():
        return DEFAULT_STALE_JOB_DAYS
    try:
        days = float(raw)
    except ValueError:
        days = float("nan")
    if not 0 < days < 3650:  # NaN fails this too
        raise RuntimeError(f"{STALE_JOB_DAYS_ENV}={raw!r}: expected a number of days in (0, 3650)")
    return days

"""The only place the service reads its environment, and the one list of its variable names.

The CDK stack and the local runtime build each function's environment from
``trainguard.wiring.Wiring.environment``, which names the variables with :class:`Env`; this
module reads them back. A name is written once, here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from trainguard.format.layout import INGEST_PREFIX

#: a job that has sent nothing for this many days is ended by the clock (clear status per rule)
DEFAULT_STALE_JOB_DAYS = 7.0


class Env:
    """Names of the environment variables of the functions."""

    TABLE_NAME: Final = "TABLE_NAME"
    BUS_NAME: Final = "BUS_NAME"
    BUCKET_NAME: Final = "BUCKET_NAME"
    TOPIC_ARN: Final = "TOPIC_ARN"
    INGEST_DLQ_URL: Final = "INGEST_DLQ_URL"
    INGEST_PREFIX: Final = "INGEST_PREFIX"
    #: "true" when the operator enabled StopTrainingJob (stack config ``sagemakerStop``)
    SAGEMAKER_STOP: Final = "TRAINGUARD_SAGEMAKER_STOP"
    #: Powertools: the ``service`` key of log lines (never a metric dimension: see metrics.py)
    POWERTOOLS_SERVICE_NAME: Final = "POWERTOOLS_SERVICE_NAME"
    POWERTOOLS_METRICS_NAMESPACE: Final = "POWERTOOLS_METRICS_NAMESPACE"
    #: Powertools' own name; its legacy LOG_LEVEL is not used
    POWERTOOLS_LOG_LEVEL: Final = "POWERTOOLS_LOG_LEVEL"
    POWERTOOLS_METRICS_DISABLED: Final = "POWERTOOLS_METRICS_DISABLED"
    POWERTOOLS_TRACE_DISABLED: Final = "POWERTOOLS_TRACE_DISABLED"
    #: custom rule modules (trainguard.rules.plugins.ENV_VAR; a test keeps the two equal)
    RULE_MODULES: Final = "TRAINGUARD_RULE_MODULES"
    #: the stack's defaultRules (trainguard.rules.config.DEFAULT_RULES_ENV; a test keeps them equal)
    DEFAULT_RULES: Final = "TRAINGUARD_DEFAULT_RULES"
    #: days of silence after which the clock ends a job (default 7; not set by the stack)
    STALE_JOB_DAYS: Final = "TRAINGUARD_STALE_JOB_DAYS"


REQUIRED = (Env.TABLE_NAME, Env.BUS_NAME, Env.BUCKET_NAME)


@dataclass(frozen=True)
class Settings:
    table_name: str
    bus_name: str
    bucket_name: str
    topic_arn: str | None
    ingest_dlq_url: str | None
    ingest_prefix: str = INGEST_PREFIX
    sagemaker_stop: bool = False
    #: seconds of silence after which the clock ends a job (``TRAINGUARD_STALE_JOB_DAYS``)
    stale_after_s: float = DEFAULT_STALE_JOB_DAYS * 86400

    @staticmethod
    def from_env() -> Settings:
        missing = [n for n in REQUIRED if not os.environ.get(n)]
        if missing:
            raise RuntimeError(f"trainguard service: environment variables {missing} are not set")
        return Settings(
            table_name=os.environ[Env.TABLE_NAME],
            bus_name=os.environ[Env.BUS_NAME],
            bucket_name=os.environ[Env.BUCKET_NAME],
            topic_arn=os.environ.get(Env.TOPIC_ARN) or None,
            ingest_dlq_url=os.environ.get(Env.INGEST_DLQ_URL) or None,
            ingest_prefix=os.environ.get(Env.INGEST_PREFIX, INGEST_PREFIX),
            sagemaker_stop=os.environ.get(Env.SAGEMAKER_STOP, "").lower() == "true",
            stale_after_s=stale_job_days(os.environ.get(Env.STALE_JOB_DAYS)) * 86400,
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
        raise RuntimeError(f"{Env.STALE_JOB_DAYS}={raw!r}: expected a number of days in (0, 3650)")
    return days

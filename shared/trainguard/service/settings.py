"""The only place the service reads its environment (set by the CDK stack or the local mode)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainguard.format.layout import INGEST_PREFIX


@dataclass(frozen=True)
class Settings:
    table_name: str
    bus_name: str
    bucket_name: str
    topic_arn: str | None
    ingest_dlq_url: str | None
    ingest_prefix: str = INGEST_PREFIX

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
        )

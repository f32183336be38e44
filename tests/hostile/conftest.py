"""One moto account for the whole corpus: each case uses its own job names, so they never meet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws
from trainguard.local.runtime import create_table
from trainguard.service.pipeline import JobPipeline
from trainguard.service.publisher import Publisher
from trainguard.service.state_store import StateStore


@dataclass
class Cloud:
    s3: Any
    ddb: Any
    events: Any
    bucket: str = "tg-hostile"
    table: str = "tg-hostile-state"
    bus: str = "tg-hostile-bus"

    def pipeline(self) -> JobPipeline:
        return JobPipeline(
            StateStore(self.table, self.ddb), self.s3, Publisher(self.events, self.bus), bucket=self.bucket
        )


@pytest.fixture(scope="module")
def cloud():
    with mock_aws():
        made = Cloud(
            boto3.client("s3", region_name="us-east-1"),
            boto3.client("dynamodb", region_name="us-east-1"),
            boto3.client("events", region_name="us-east-1"),
        )
        made.s3.create_bucket(Bucket=made.bucket)
        made.s3.create_bucket(Bucket="someone-elses")
        create_table(made.ddb, made.table)
        made.events.create_event_bus(Name=made.bus)
        yield made

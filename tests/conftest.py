"""Shared fixtures: no test ever reaches real AWS."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws
from trainguard.local.runtime import create_table
from trainguard.service.pipeline import JobPipeline
from trainguard.service.publisher import Publisher
from trainguard.service.state_store import StateStore

# Dummy credentials before any boto3 client exists; never a real account.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")


@pytest.fixture(autouse=True)
def _no_real_endpoint(monkeypatch):
    """A test that wants a local endpoint sets it itself."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


# --- moto-backed resources for service tests (the same shapes the stack creates) ---


@dataclass
class Aws:
    s3: Any
    ddb: Any
    events: Any
    sqs: Any
    bucket: str
    table: str
    bus: str
    capture_url: str

    def service(self) -> JobPipeline:
        return JobPipeline(
            StateStore(self.table, self.ddb), self.s3, Publisher(self.events, self.bus), bucket=self.bucket
        )

    def put_job(self, job: str, objects: dict[str, bytes]) -> list[str]:
        keys = []
        for rel, body in objects.items():
            key = f"jobs/{job}/{rel}"
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
            keys.append(key)
        return keys

    def drain_events(self) -> list[dict[str, Any]]:
        out = []
        while True:
            msgs = self.sqs.receive_message(QueueUrl=self.capture_url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not msgs:
                return out
            for m in msgs:
                out.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.capture_url, ReceiptHandle=m["ReceiptHandle"])


_DDB_LOCK = threading.RLock()


@pytest.fixture
def atomic_dynamodb(monkeypatch):
    """Make each moto DynamoDB request atomic, as every DynamoDB request is in AWS.

    moto evaluates a ConditionExpression and then writes without a lock, so two threads can
    both pass the same condition; real DynamoDB never allows that. Serialising moto's
    request dispatch restores the guarantee our concurrency tests rely on.
    """
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.call_action

    def locked(self):
        with _DDB_LOCK:
            return original(self)

    monkeypatch.setattr(DynamoHandler, "call_action", locked)


def make_aws() -> Aws:
    s3 = boto3.client("s3", region_name="us-east-1")
    ddb = boto3.client("dynamodb", region_name="us-east-1")
    events = boto3.client("events", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    s3.create_bucket(Bucket="tg-data")
    create_table(ddb, "tg-state")
    events.create_event_bus(Name="tg-bus")
    url = sqs.create_queue(QueueName="tg-capture")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(
        Name="capture", EventBusName="tg-bus", EventPattern=json.dumps({"source": ["trainguard"]})
    )
    events.put_targets(Rule="capture", EventBusName="tg-bus", Targets=[{"Id": "q", "Arn": arn}])
    return Aws(s3, ddb, events, sqs, "tg-data", "tg-state", "tg-bus", url)


@pytest.fixture
def aws(atomic_dynamodb) -> Iterator[Aws]:
    with mock_aws():
        yield make_aws()


@pytest.fixture
def aws_factory():
    """For tests that open their own ``mock_aws`` (e.g. one per hypothesis example)."""
    return make_aws


# --- the synthesized stack, once per session, for tests that read what the template says ---


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory):
    """(stack, template) of the default app with SageMaker stops enabled (stub layer, no nag)."""
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from aws_cdk.assertions import Template

    from infra.app import build_app

    layer = tmp_path_factory.mktemp("layer")
    (layer / "python" / "trainguard").mkdir(parents=True)
    (layer / "python" / "trainguard" / "__init__.py").write_text("")
    _app, stack = build_app(
        {"layerAsset": str(layer), "alertEmails": "ml@example.com", "sagemakerStop": "true"},
        outdir=str(tmp_path_factory.mktemp("cdk.out")),
        nag=False,
        config_dir=tmp_path_factory.mktemp("no-config"),
    )
    return stack, Template.from_stack(stack).to_json()

"""Fixtures of the service tests."""

from __future__ import annotations

import pytest
from trainguard import service as service_package


@pytest.fixture
def functions(aws, monkeypatch):
    """The functions' environment for the moto resources of ``aws``; yields the ingest DLQ's URL.

    The process's singletons (clients, the pipeline) are forgotten before and after, so no
    client made here (with moto's credentials) outlives the test.
    """
    dlq = aws.sqs.create_queue(QueueName="tg-ingest-dlq")["QueueUrl"]
    monkeypatch.setenv("TABLE_NAME", aws.table)
    monkeypatch.setenv("BUS_NAME", aws.bus)
    monkeypatch.setenv("BUCKET_NAME", aws.bucket)
    monkeypatch.setenv("INGEST_DLQ_URL", dlq)
    service_package.reset()
    yield dlq
    service_package.reset()

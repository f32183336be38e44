"""Fixtures for the hook tests: a moto S3 server on 127.0.0.1 (random port), fake stores."""

from __future__ import annotations

import time

import boto3
import pytest
from hook_fakes import FlakyStore
from moto.server import ThreadedMotoServer
from trainguard.hook.storage import LocalStore


@pytest.fixture(scope="session")
def moto_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, monkeypatch):
    """A fresh bucket; AWS_ENDPOINT_URL points at moto, as the local mode sets it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    name = f"bucket-{time.monotonic_ns()}"
    client.create_bucket(Bucket=name)
    return client, name


@pytest.fixture
def flaky_local(tmp_path):
    def make(**kwargs):
        return FlakyStore(LocalStore(tmp_path / "job"), **kwargs)

    return make

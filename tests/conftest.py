"""Shared fixtures: no test ever reaches real AWS."""

import os

import pytest

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

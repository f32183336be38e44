"""boto3 clients, created once per process (a warm Lambda reuses them)."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def client(service: str) -> Any:
    import boto3
    from botocore.config import Config

    # Short timeouts and standard retries: a slow dependency fails the record, SQS retries it.
    return boto3.client(
        service,
        config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=3, read_timeout=10),
    )


def reset() -> None:
    """Forget cached clients (the local mode changes the endpoint between runs)."""
    client.cache_clear()

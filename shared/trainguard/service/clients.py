"""boto3 clients, created once per process and identity (a warm Lambda reuses them).

``client(service)`` returns a thin handle that picks the real client at each call: the one of
the identity acting in this context (:func:`acting_as`), or the default credential chain. In
Lambda there is one identity, the function's role. The local mode runs every function in one
process, each with credentials limited to its own policy; services and stores keep the handle
they were given, so the credentials follow the function that is running, not the process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Credentials:
    """An access key pair, named after the identity it belongs to."""

    name: str
    access_key_id: str
    secret_access_key: str


_acting: ContextVar[Credentials | None] = ContextVar("trainguard_acting_identity", default=None)
_lock = threading.Lock()
#: an endpoint every client of this process uses (the local mode's moto server); None: AWS
_endpoint: str | None = None


def use_endpoint(url: str | None) -> None:
    """Point every client made from now on at ``url`` (None: back to AWS's endpoints)."""
    global _endpoint
    _endpoint = url
    reset()


@contextmanager
def acting_as(credentials: Credentials | None) -> Iterator[None]:
    """Every client call in this context (thread, task) uses ``credentials``."""
    token = _acting.set(credentials)
    try:
        yield
    finally:
        _acting.reset(token)


def acting() -> Credentials | None:
    return _acting.get()


@cache
def _session() -> Any:
    import boto3

    # one session per reset(): handlers registered with botocore since then apply to its clients
    return boto3.session.Session()


@cache
def _client(service: str, credentials: Credentials | None) -> Any:
    from botocore.config import Config

    keys: dict[str, str] = {}
    if _endpoint is not None:
        keys["endpoint_url"] = _endpoint
    if credentials is not None:
        keys["aws_access_key_id"] = credentials.access_key_id
        keys["aws_secret_access_key"] = credentials.secret_access_key
    with _lock:  # boto3 sessions are not thread-safe when creating clients
        # Short timeouts and standard retries: a slow dependency fails the record, SQS retries it.
        return _session().client(
            service,
            config=Config(
                retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=3, read_timeout=10
            ),
            **keys,
        )


class _Routed:
    """A client handle: each attribute comes from the acting identity's client."""

    __slots__ = ("_service",)

    def __init__(self, service: str) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(_client(self._service, _acting.get()), name)

    def __repr__(self) -> str:
        return f"<trainguard client {self._service}>"


@cache
def client(service: str) -> Any:
    return _Routed(service)


def reset() -> None:
    """Forget cached clients (the local mode changes the endpoint between runs)."""
    _client.cache_clear()
    _session.cache_clear()

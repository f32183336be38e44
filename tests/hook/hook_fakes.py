"""Fake stores for the hook tests: slow, failing, recording."""

from __future__ import annotations

import threading
import time

from trainguard.hook.storage import Store, StoreError


class FlakyStore(Store):
    """Wraps a store: PUTs fail while ``failing`` is set (or for keys matching ``fail_prefix``)
    and take ``delay_s``; every call is recorded."""

    def __init__(
        self, inner: Store, *, failing: bool = False, delay_s: float = 0.0, fail_prefix: str | None = None
    ):
        self.inner = inner
        self.url = inner.url
        self.failing = threading.Event()
        if failing:
            self.failing.set()
        self.delay_s = delay_s
        self.fail_prefix = fail_prefix
        self.puts: list[str] = []
        self.failed: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []

    def put(self, key, data):
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.failing.is_set() or (self.fail_prefix and key.startswith(self.fail_prefix)):
            self.failed.append(key)
            raise StoreError(f"PUT {key}: simulated outage")
        self.puts.append(key)
        self.inner.put(key, data)

    def get(self, key):
        return self.inner.get(key)

    def get_range(self, key, start, end):
        self.ranges.append((key, start, end))
        return self.inner.get_range(key, start, end)

    def exists(self, key):
        return self.inner.exists(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

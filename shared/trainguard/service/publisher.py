"""EventBridge adapter: rule-status events to the bus."""

from __future__ import annotations

from typing import Any

from trainguard.engine.events import EVENT_SOURCE, detail_type

#: PutEvents takes at most 10 entries per request
ENTRIES_PER_REQUEST = 10


class Publisher:
    """PutEvents in chunks of 10, failing loudly on any failed entry."""

    def __init__(self, client: Any, bus_name: str) -> None:
        self.client = client
        self.bus_name = bus_name
        self.requests = 0

    def publish(self, details: list[str]) -> None:
        for start in range(0, len(details), ENTRIES_PER_REQUEST):
            entries = [
                {
                    "Source": EVENT_SOURCE,
                    "DetailType": detail_type(d),
                    "Detail": d,
                    "EventBusName": self.bus_name,
                }
                for d in details[start : start + ENTRIES_PER_REQUEST]
            ]
            self.requests += 1
            resp = self.client.put_events(Entries=entries)
            if resp.get("FailedEntryCount", 0):
                codes = {e.get("ErrorCode") for e in resp.get("Entries", []) if e.get("ErrorCode")}
                raise RuntimeError(
                    f"PutEvents failed for {resp['FailedEntryCount']} entries: {sorted(codes)}"
                )

"""EventBridge adapter: rule-status events to the bus.

PutEvents takes at most 10 entries and 256 KB per request (entries counted as EventBridge
counts them: UTF-8 bytes of Source, DetailType and Detail). Requests are cut by both
bounds, so 20 rules at the documented name and details limits are two or more requests,
never one refused request after the state was committed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.events import EVENT_SOURCE, MAX_REQUEST_BYTES, detail_type, entry_bytes

#: PutEvents takes at most 10 entries per request
ENTRIES_PER_REQUEST = 10


class PublishError(RuntimeError):
    """Some events were not accepted; the others were (``published`` names them)."""

    def __init__(self, message: str, published: set[str]) -> None:
        super().__init__(message)
        self.published = published


@dataclass
class _Request:
    ids: list[str] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0


class Publisher:
    """PutEvents in requests bounded by count and bytes; failing loudly on any failed entry."""

    def __init__(self, client: Any, bus_name: str, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.client = client
        self.bus_name = bus_name
        self.max_request_bytes = max_request_bytes
        self.requests = 0

    def _requests(self, events: Mapping[str, str]) -> Iterator[_Request]:
        current = _Request()
        for event_id, detail in events.items():
            size = entry_bytes(detail)
            if size > self.max_request_bytes:
                raise PublishError(
                    f"event {event_id[:200]!r} is {size} bytes; a PutEvents entry holds at most "
                    f"{self.max_request_bytes}",
                    set(),
                )
            if current.ids and (
                len(current.ids) == ENTRIES_PER_REQUEST or current.size + size > self.max_request_bytes
            ):
                yield current
                current = _Request()
            current.ids.append(event_id)
            current.size += size
            current.entries.append(
                {
                    "Source": EVENT_SOURCE,
                    "DetailType": detail_type(detail),
                    "Detail": detail,
                    "EventBusName": self.bus_name,
                }
            )
        if current.ids:
            yield current

    def publish(self, events: Mapping[str, str]) -> set[str]:
        """Send every event (id -> detail JSON); return the ids sent.

        Raises :class:`PublishError` after trying them all if any entry failed; it names the
        ids that were accepted, so the caller keeps only the others for a retry.
        """
        published: set[str] = set()
        failures: list[str] = []
        for request in self._requests(events):
            self.requests += 1
            resp = self.client.put_events(Entries=request.entries)
            results = resp.get("Entries", [])
            for index, event_id in enumerate(request.ids):
                result = results[index] if index < len(results) else {}
                if result.get("ErrorCode") or (not result and resp.get("FailedEntryCount", 0)):
                    failures.append(f"{result.get('ErrorCode', 'unknown')}: {result.get('ErrorMessage', '')}")
                else:
                    published.add(event_id)
        if failures:
            raise PublishError(
                f"PutEvents failed for {len(failures)} of {len(events)} entries: {sorted(set(failures))[:5]}",
                published,
            )
        return published

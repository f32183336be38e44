"""DynamoDB adapter for job state: one partition per job, conditional writes on a version.

Items in partition ``JOB#<job>``:

- ``STATE``: ``version`` (N), ``doc`` (B: zlib JSON of ``JobState``), ``job``, ``updated``,
  ``training_status``, ``active`` (sparse index of running jobs) — rewritten only with
  ``version = <the version read>``.
- ``SEG#<first_step:012d>#<worker:05d>#<seq:012d>``: a buffered format-2 segment, as a
  pointer: ``last`` (its last step), ``prev`` (the worker's previous step, from its header),
  ``size`` (object bytes) and ``hdr`` (8 + its JSON header's length: the header is read
  again with one ranged GET of exactly that many bytes), or ``bad`` (why it could not be
  read). Deleted once every step of it was evaluated; a segment consumed only partly
  (another worker lags) stays. About 100 bytes whatever the model's size.
- ``STEP#<step:012d>#<worker:05d>``: a buffered format-1 step object, the same pointer
  (``prev``, ``size``, ``hdr`` or ``bad``).
- ``SYS#<worker:05d>#<seq:012d>``: a buffered system-monitor batch (``batch``: zlib JSON).
- ``OUTBOX#<event id>``: an event whose status change was committed but not yet
  published; written in the same transaction as ``STATE``, deleted after PutEvents. An event
  id too long for a sort key (a rule name of 256 four-byte characters) is keyed by its
  SHA-256 instead; the ``event`` attribute always holds the id.

Every item carries ``expires_at`` (``wiring.TABLE.ttl_attribute``): its last activity plus
``RETENTION_S``, so DynamoDB deletes what a crashed job or a lost invocation left behind. A
job that stays silent is ended by the clock long before (``stale_after_s``). Every item is
checked against DynamoDB's 400 KB item limit before it is written.

Buffered items sort by step, so a bounded read holds the lowest pending steps of every
worker. One consistent Query of the partition reads everything an evaluation needs.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.model import JobState, SegmentArrival, StepArrival, SystemArrival
from trainguard.format import stepfile
from trainguard.format.documents import StepHeader
from trainguard.format.layout import step_key
from trainguard.format.system import MAX_SYSTEM_BYTES, SystemBatch
from trainguard.wiring import TABLE

STATE_SK = "STATE"
STEP_PREFIX = "STEP#"
SEGMENT_PREFIX = "SEG#"
SYSTEM_PREFIX = "SYS#"
OUTBOX_PREFIX = "OUTBOX#"
ACTIVE = "1"
ACTIVE_INDEX = "active-jobs"  # declared in trainguard.wiring.TABLE
#: a buffered system batch above this is refused (DynamoDB items stop at 400 KB)
MAX_BUFFERED_HEADER_BYTES = 300 * 1024
#: at most this many items read per evaluation (bounded work per invocation)
MAX_ITEMS_PER_LOAD = 5_000
#: a ``bad`` reason stored with a pointer
MAX_REASON_CHARS = 1000
#: DynamoDB's item limit is 400 KB (names and values, UTF-8); a STATE item is refused above
#: this, leaving room for the key and the small attributes beside ``doc``
MAX_ITEM_BYTES = 400 * 1024 - 8 * 1024
#: DynamoDB's sort key limit: 1024 bytes of UTF-8
MAX_SORT_KEY_BYTES = 1024
#: how long an item is kept after its job's last activity (then DynamoDB's TTL deletes it)
RETENTION_S = 90 * 24 * 3600
TTL_ATTRIBUTE = TABLE.ttl_attribute


class VersionConflict(Exception):
    """Another writer committed first; re-read and try again."""


class HeaderTooLarge(ValueError):
    """A system batch too large to buffer in one DynamoDB item."""


class ItemTooLarge(ValueError):
    """The job's state would not fit one DynamoDB item (nothing was written)."""

    def __init__(self, job: str, nbytes: int) -> None:
        super().__init__(f"job {job}: the state item would be {nbytes:,} bytes; at most {MAX_ITEM_BYTES:,}")
        self.nbytes = nbytes


def expires(at: float) -> dict[str, str]:
    """The TTL attribute's value: ``at`` plus the retention, in whole epoch seconds."""
    return {"N": str(int(at) + RETENTION_S)}


def outbox_sk(event_id: str) -> str:
    """An outbox item's sort key; an id too long for a sort key is keyed by its digest."""
    sk = OUTBOX_PREFIX + event_id
    if len(sk.encode("utf-8", "surrogatepass")) <= MAX_SORT_KEY_BYTES:
        return sk
    return f"{OUTBOX_PREFIX}sha256:{hashlib.sha256(event_id.encode('utf-8', 'surrogatepass')).hexdigest()}"


@dataclass
class Loaded:
    state: JobState
    version: int
    arrivals: list[StepArrival | SegmentArrival] = field(default_factory=list)
    system: list[SystemArrival] = field(default_factory=list)
    #: event id -> (detail JSON, time the status change was committed)
    outbox: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: a bounded read stopped early: more items exist
    truncated: bool = False


def pk(job: str) -> str:
    return f"JOB#{job}"


def step_sk(step: int, worker: int) -> str:
    return f"{STEP_PREFIX}{step:012d}#{worker:05d}"


def segment_sk(first_step: int, worker: int, seq: int) -> str:
    return f"{SEGMENT_PREFIX}{first_step:012d}#{worker:05d}#{seq:012d}"


def system_sk(worker: int, seq: int) -> str:
    return f"{SYSTEM_PREFIX}{worker:05d}#{seq:012d}"


def _pack(obj: Any) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 6)


def _unpack(raw: bytes) -> Any:
    # zlib bombs: cap what a stored blob may expand to
    data = zlib.decompressobj().decompress(raw, 16 * 1024 * 1024)
    return json.loads(data)


class StateStore:
    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self.client = client
        self.requests = 0  # DynamoDB requests made (for the pipeline benchmark)

    # arrivals ---------------------------------------------------------------------------
    def put_arrival(self, job: str, arrival: StepArrival | SegmentArrival) -> None:
        """Buffer a pointer to an object that arrived (never its header: any model size fits)."""
        self.requests += 1
        self.client.put_item(TableName=self.table, Item=arrival_item(job, arrival))

    def put_system(self, job: str, arrival: SystemArrival) -> SystemArrival:
        """Buffer a system batch; one too large for an item is buffered as a bad arrival.

        Returns what was buffered (the arrival, or its bad form with the reason), so the
        worker's seq chain moves on either way.
        """
        item: dict[str, Any] = {
            "pk": {"S": pk(job)},
            "sk": {"S": system_sk(arrival.worker, arrival.seq)},
            "at": {"N": repr(arrival.at)},
            TTL_ATTRIBUTE: expires(arrival.at),
        }
        if arrival.batch is not None:
            blob = zlib.compress(arrival.batch.model_dump_json().encode(), 6)
            if len(blob) > MAX_BUFFERED_HEADER_BYTES:
                reason = (
                    f"system/worker-{arrival.worker:05d}/{arrival.seq:012d}.json: {len(blob):,} bytes "
                    f"compressed; a buffered system batch holds at most {MAX_BUFFERED_HEADER_BYTES:,}"
                )
                arrival = SystemArrival(arrival.worker, arrival.seq, None, bad=reason, at=arrival.at)
            else:
                item["batch"] = {"B": blob}
        if arrival.bad is not None:
            item["bad"] = {"S": arrival.bad[:MAX_REASON_CHARS]}
        self.requests += 1
        self.client.put_item(TableName=self.table, Item=item)
        return arrival

    # load / commit ----------------------------------------------------------------------
    def load(self, job: str) -> Loaded:
        state = JobState(job=job)
        version = 0
        arrivals: list[StepArrival | SegmentArrival] = []
        system: list[SystemArrival] = []
        outbox: dict[str, tuple[str, float]] = {}
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk(job)}},
            "ConsistentRead": True,
        }
        count = 0
        truncated = False
        seen_state = False
        while True:
            self.requests += 1
            page = self.client.query(**kwargs)
            for item in page.get("Items", []):
                count += 1
                sk = item["sk"]["S"]
                if sk == STATE_SK:
                    version = int(item["version"]["N"])
                    state = JobState.model_validate(_unpack(item["doc"]["B"]))
                    seen_state = True
                elif sk.startswith(SEGMENT_PREFIX):
                    arrivals.append(_segment_arrival(sk, item))
                elif sk.startswith(STEP_PREFIX):
                    arrivals.append(_arrival(sk, item))
                elif sk.startswith(SYSTEM_PREFIX):
                    system.append(_system_arrival(sk, item))
                elif sk.startswith(OUTBOX_PREFIX):
                    created = float(item["created"]["N"]) if "created" in item else 0.0
                    event_id = item["event"]["S"] if "event" in item else sk[len(OUTBOX_PREFIX) :]
                    outbox[event_id] = (item["detail"]["S"], created)
            if "LastEvaluatedKey" not in page:
                break
            if count >= MAX_ITEMS_PER_LOAD:
                truncated = True
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        if truncated and not seen_state:
            # the bounded read stopped before the STATE item (many buffered segments sort first)
            loaded = self.load_state(job)
            if loaded is not None:
                state, version = loaded
        return Loaded(state, version, arrivals, system, outbox, truncated)

    def load_state(self, job: str) -> tuple[JobState, int] | None:
        """The job's STATE item alone (a Query of one key: the functions may Query, not GetItem)."""
        self.requests += 1
        items = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk = :sk",
            ExpressionAttributeValues={":pk": {"S": pk(job)}, ":sk": {"S": STATE_SK}},
            ConsistentRead=True,
        ).get("Items", [])
        if not items:
            return None
        item = items[0]
        return JobState.model_validate(_unpack(item["doc"]["B"])), int(item["version"]["N"])

    def commit(self, state: JobState, version: int, outbox: dict[str, str], now: float) -> int:
        """Write ``state`` if nobody wrote since ``version``; add ``outbox`` events atomically.

        Raises :class:`ItemTooLarge` (nothing written) when the state would not fit an item.
        """
        new_version = version + 1
        doc = _pack(state.model_dump(mode="json"))
        if len(doc) > MAX_ITEM_BYTES:
            raise ItemTooLarge(state.job, len(doc))
        state_item = {
            "pk": {"S": pk(state.job)},
            "sk": {"S": STATE_SK},
            "job": {"S": state.job},
            "version": {"N": str(new_version)},
            "doc": {"B": doc},
            "updated": {"N": repr(now)},
            "training_status": {"S": state.training_status},
            TTL_ATTRIBUTE: expires(state.last_activity if state.last_activity is not None else now),
        }
        if not state.finished:
            # sparse index of running jobs, for the schedule's tick (finished jobs drop out)
            state_item["active"] = {"S": ACTIVE}
        if version == 0:
            condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(pk)"}
        else:
            condition = {
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": {":v": {"N": str(version)}},
            }
        self.requests += 1
        try:
            if not outbox:
                self.client.put_item(TableName=self.table, Item=state_item, **condition)
            else:
                items: list[dict[str, Any]] = [
                    {"Put": {"TableName": self.table, "Item": state_item, **condition}}
                ]
                for event_id, detail in outbox.items():
                    items.append(
                        {
                            "Put": {
                                "TableName": self.table,
                                "Item": {
                                    "pk": {"S": pk(state.job)},
                                    "sk": {"S": outbox_sk(event_id)},
                                    "event": {"S": event_id},
                                    "detail": {"S": detail},
                                    "created": {"N": repr(now)},
                                    TTL_ATTRIBUTE: expires(now),
                                },
                            }
                        }
                    )
                self.client.transact_write_items(TransactItems=items)
        except self.client.exceptions.ConditionalCheckFailedException:
            raise VersionConflict(state.job) from None
        except self.client.exceptions.TransactionCanceledException as exc:
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            if "ConditionalCheckFailed" in reasons:
                raise VersionConflict(state.job) from None
            raise
        return new_version

    def delete_steps(self, job: str, keys: Iterable[tuple[int, int]]) -> None:
        self._delete(job, [step_sk(s, w) for s, w in keys])

    def delete_segments(self, job: str, segments: Iterable[SegmentArrival]) -> None:
        self._delete(job, [segment_sk(a.first_step, a.worker, a.seq) for a in segments])

    def delete_system(self, job: str, keys: Iterable[tuple[int, int]]) -> None:
        self._delete(job, [system_sk(w, s) for w, s in keys])

    def delete_outbox(self, job: str, event_ids: Iterable[str]) -> None:
        self._delete(job, [outbox_sk(e) for e in event_ids])

    def _delete(self, job: str, sks: list[str]) -> None:
        for start in range(0, len(sks), 25):
            requests = [
                {"DeleteRequest": {"Key": {"pk": {"S": pk(job)}, "sk": {"S": sk}}}}
                for sk in sks[start : start + 25]
            ]
            pending: dict[str, Any] = {self.table: requests}
            for _ in range(5):
                self.requests += 1
                resp = self.client.batch_write_item(RequestItems=pending)
                pending = resp.get("UnprocessedItems") or {}
                if not pending:
                    break
            # anything still unprocessed is harmless: stale steps are ignored and re-deleted later

    def active_jobs(self, limit: int = 10_000) -> list[str]:
        """Jobs not finished yet, from the sparse ``active-jobs`` index (keys only)."""
        jobs: list[str] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": ACTIVE_INDEX,
            "KeyConditionExpression": "active = :a",
            "ExpressionAttributeValues": {":a": {"S": ACTIVE}},
        }
        while len(jobs) < limit:
            self.requests += 1
            page = self.client.query(**kwargs)
            jobs.extend(item["pk"]["S"][len("JOB#") :] for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return jobs

    def list_jobs(self, limit: int = 1000) -> list[JobState]:
        """Every job's state (for ``trainguard status``): a filtered scan, fine at CLI scale."""
        jobs: list[JobState] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "FilterExpression": "sk = :s",
            "ExpressionAttributeValues": {":s": {"S": STATE_SK}},
        }
        while len(jobs) < limit:
            page = self.client.scan(**kwargs)
            jobs.extend(JobState.model_validate(_unpack(i["doc"]["B"])) for i in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return jobs


def arrival_item(job: str, arrival: StepArrival | SegmentArrival) -> dict[str, Any]:
    """The pointer item of a buffered step object or segment."""
    if isinstance(arrival, SegmentArrival):
        sk = segment_sk(arrival.first_step, arrival.worker, arrival.seq)
        item: dict[str, Any] = {"pk": {"S": pk(job)}, "sk": {"S": sk}, "last": {"N": str(arrival.last_step)}}
    else:
        item = {"pk": {"S": pk(job)}, "sk": {"S": step_sk(arrival.step, arrival.worker)}}
    if arrival.prev_step is not None:
        item["prev"] = {"N": str(arrival.prev_step)}
    item["at"] = {"N": repr(arrival.at)}
    item[TTL_ATTRIBUTE] = expires(arrival.at)
    if arrival.bad is not None:
        item["bad"] = {"S": arrival.bad[:MAX_REASON_CHARS]}
    else:
        item["size"] = {"N": str(arrival.size)}
        item["hdr"] = {"N": str(arrival.header_end)}
    return item


def _pointer(item: dict[str, Any]) -> tuple[int | None, str | None, int, int]:
    prev = int(item["prev"]["N"]) if "prev" in item else None
    bad = item["bad"]["S"] if "bad" in item else None
    size = int(item["size"]["N"]) if "size" in item else 0
    header_end = int(item["hdr"]["N"]) if "N" in item.get("hdr", {}) else 0
    if bad is None and header_end <= 8:
        bad = "buffered without a header length: its header cannot be read again"
    return prev, bad, size, header_end


def _at(item: dict[str, Any]) -> float:
    return float(item["at"]["N"]) if "at" in item else 0.0


def _arrival(sk: str, item: dict[str, Any]) -> StepArrival:
    _, step, worker = sk.split("#")
    if "B" in item.get("hdr", {}):
        # buffered by an earlier trainguard: the header itself (zlib JSON), not a pointer
        prev = int(item["prev"]["N"]) if "prev" in item else None
        try:
            # a zlib bomb stops at the largest header the format allows
            raw = zlib.decompressobj().decompress(item["hdr"]["B"], stepfile.MAX_HEADER_BYTES + 1)
            header = StepHeader.model_validate_json(raw)
        except (zlib.error, ValueError) as exc:
            reason = f"{step_key(int(step), int(worker))}: buffered header unreadable: {exc}"[
                :MAX_REASON_CHARS
            ]
            return StepArrival(int(step), int(worker), prev, None, reason)
        return StepArrival(int(step), int(worker), prev, header)
    prev, bad, size, header_end = _pointer(item)
    return StepArrival(
        int(step), int(worker), prev, None, bad, size=size, header_end=header_end, at=_at(item)
    )


def _segment_arrival(sk: str, item: dict[str, Any]) -> SegmentArrival:
    _, first, worker, seq = sk.split("#")
    prev, bad, size, header_end = _pointer(item)
    last = int(item["last"]["N"])
    return SegmentArrival(
        int(worker),
        int(seq),
        int(first),
        last,
        prev,
        None,
        bad,
        size=size,
        header_end=header_end,
        at=_at(item),
    )


def _system_arrival(sk: str, item: dict[str, Any]) -> SystemArrival:
    _, worker, seq = sk.split("#")
    batch = None
    bad = item["bad"]["S"] if "bad" in item else None
    if "batch" in item:
        try:
            raw = zlib.decompressobj().decompress(item["batch"]["B"], MAX_SYSTEM_BYTES + 1)
            batch = SystemBatch.model_validate_json(raw)
        except (zlib.error, ValueError) as exc:  # never a stuck job: the batch keeps its place
            bad = f"system/worker-{int(worker):05d}/{int(seq):012d}.json: buffered batch unreadable: {exc}"
            bad = bad[:MAX_REASON_CHARS]
    return SystemArrival(int(worker), int(seq), batch, bad, at=_at(item))

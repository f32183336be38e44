"""The evaluate function's logic: SQS records of S3 notifications → the job pipeline.

Transient failures (throttling, conflicts past the retry budget, AWS errors) raise, so the
record is reported as a batch item failure and SQS redelivers it. Permanent failures (a
key outside the layout, a malformed object) are sent to the DLQ at once with the reason as
a message attribute, and the record succeeds: one bad object never fails the batch for
other jobs nor loops forever. A record on its last delivery (``ApproximateReceiveCount``
has reached the queue's ``maxReceiveCount``) that fails again is dead-lettered by us with
the reason, instead of by SQS without one: every message in the DLQ says why it is there.

Isolation: a batch mixes several jobs' records. Each record is ingested, and then each job
advanced once, under that job's time budget; a job that fails or runs out of time fails
only its own records.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import unquote_plus

from trainguard.engine.sources import ObjectError
from trainguard.service import metrics
from trainguard.service.budget import Deadline, JobTimeBudgetExceeded
from trainguard.service.clients import client
from trainguard.service.pipeline import JobPipeline, PermanentError
from trainguard.service.publisher import Publisher
from trainguard.service.settings import Settings
from trainguard.service.state_store import StateStore
from trainguard.text import clip_utf8, printable
from trainguard.wiring import WIRING

logger = logging.getLogger("trainguard.evaluate")
#: SQS's limit on one message: body and attributes (names, types and values) together
MAX_MESSAGE_BYTES = 256 * 1024
MAX_BODY_BYTES = MAX_MESSAGE_BYTES
#: a reason attribute is cut to this many characters
MAX_REASON_CHARS = 4000
#: the invocation stops starting jobs this long before its own timeout
SAFETY_MARGIN_S = 5.0


@lru_cache(maxsize=1)
def service() -> JobPipeline:
    """The process's pipeline (a warm Lambda keeps it, with its header cache)."""
    settings = Settings.from_env()
    return JobPipeline(
        StateStore(settings.table_name, client("dynamodb")),
        client("s3"),
        Publisher(client("events"), settings.bus_name),
        bucket=settings.bucket_name,
        ingest_prefix=settings.ingest_prefix,
        on_commit=lambda job, outcome, transitions: metrics.publish(job, outcome.scalars, transitions),
        stale_after_s=settings.stale_after_s,
    )


def deadline_of(context: Any) -> Deadline:
    """The invocation's deadline (its remaining time less a margin); none without a context."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return Deadline(None)
    return Deadline.after(max(0.0, remaining() / 1000 - SAFETY_MARGIN_S))


def s3_objects(body: str) -> list[tuple[str, str]]:
    """(bucket, key) of every ObjectCreated record in an S3 notification (keys URL-decoded)."""
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > MAX_BODY_BYTES:
        raise PermanentError(f"message body of {size} bytes is not an S3 notification")
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise PermanentError(f"message body is not JSON: {exc}") from None
    except RecursionError:
        raise PermanentError("message body is JSON nested too deeply to be an S3 notification") from None
    if not isinstance(doc, dict):
        raise PermanentError("message body is not a JSON object")
    if doc.get("Event") == "s3:TestEvent":
        return []
    if not isinstance(doc.get("Records"), list):
        raise PermanentError("message body has no S3 'Records' list")
    # Powertools' data class reads the slimmer records moto sends too (its strict parser
    # model does not); keys arrive URL-encoded.
    from aws_lambda_powertools.utilities.data_classes import S3Event

    out: list[tuple[str, str]] = []
    for record in S3Event(doc).records:
        try:
            if not record.event_name.startswith("ObjectCreated"):
                continue
            bucket, key = record.s3.bucket.name, record.s3.get_object.key
            if not isinstance(bucket, str) or not isinstance(key, str):
                raise TypeError("bucket and key must be strings")
            out.append((bucket, unquote_plus(key)))
        except (KeyError, TypeError, AttributeError):
            raise PermanentError("S3 record without s3.bucket.name / s3.object.key") from None
    return out


def ingest_body(body: str) -> set[str]:
    """Record the objects of one SQS message; return the jobs to advance.

    PermanentError names every object of the message that could not be used.
    """
    jobs: set[str] = set()
    problems: list[str] = []
    for bucket, key in s3_objects(body):
        try:
            job = service().ingest(bucket, key)
        except (PermanentError, ObjectError) as exc:
            problems.append(f"{printable(key[:300])}: {exc}")
            continue
        if job is not None:
            jobs.add(job)
    if problems:
        raise PermanentError("; ".join(problems)[:MAX_REASON_CHARS])
    return jobs


def ingest_record(body: str, message_id: str, receive_count: int = 1) -> set[str]:
    """Ingest one message: its jobs, or none when it was dead-lettered (with the reason)."""
    try:
        return ingest_body(body)
    except PermanentError as exc:
        dead_letter(body, str(exc), message_id)
        return set()
    except Exception as exc:
        if not last_delivery(receive_count):
            raise  # SQS redelivers it
        dead_letter(
            body, f"failed on its last delivery ({receive_count}): {type(exc).__name__}: {exc}", message_id
        )
        return set()


def last_delivery(receive_count: int) -> bool:
    """Whether SQS would move this message to the DLQ (without a reason) if it failed now."""
    return receive_count >= WIRING.queue("ingest").max_receive_count


@dataclass
class Message:
    message_id: str
    body: str
    receive_count: int = 1


@dataclass
class Batch:
    """One invocation's records: ingested one by one, then each touched job advanced once.

    ``deadline``: the invocation's (:func:`deadline_of`); each record and each job gets at
    most the pipeline's ``job_budget_s`` of what is left.
    """

    deadline: Deadline = field(default_factory=lambda: Deadline(None))
    touched: dict[str, list[Message]] = field(default_factory=dict)

    def _budget(self, pipeline: JobPipeline) -> float:
        remaining = self.deadline.remaining()
        return pipeline.job_budget_s if remaining is None else max(0.1, min(pipeline.job_budget_s, remaining))

    def ingest(self, body: str, message_id: str, receive_count: int = 1) -> None:
        """Ingest one record; raises for a transient failure (that record alone fails)."""
        pipeline = service()
        try:
            with pipeline.budget(f"message {message_id}", self._budget(pipeline)):
                jobs = ingest_record(body, message_id, receive_count)
        except JobTimeBudgetExceeded as exc:
            if not last_delivery(receive_count):
                raise RuntimeError(str(exc)) from None
            dead_letter(body, f"{exc} (on its last delivery)", message_id)
            return
        message = Message(message_id, body, receive_count)
        for job in jobs:
            self.touched.setdefault(job, []).append(message)

    def advance(self) -> list[str]:
        """Advance each job once, each within its budget; the message ids to report failed.

        Only the records of a job that failed (or was not reached before the invocation's
        deadline) are reported; on their last delivery they are dead-lettered with the reason.
        """
        pipeline = service()
        failed: list[str] = []
        for job, messages in self.touched.items():
            if self.deadline.passed():
                reason = "the invocation ran out of time before this job's turn"
            else:
                work = functools.partial(pipeline.advance_job, job)
                result = pipeline.isolated(job, "advance", work, self._budget(pipeline))
                if result.error is None:
                    continue
                reason = f"advancing job {printable(job)} failed: {result.error}"
            for message in messages:
                if last_delivery(message.receive_count):
                    dead_letter(message.body, f"{reason} (on its last delivery)", message.message_id)
                else:
                    failed.append(message.message_id)
        return list(dict.fromkeys(failed))


def dead_letter(message_body: str, reason: str, message_id: str) -> None:
    """Park a message in the ingest DLQ with the reason it cannot be processed.

    The copy fits SQS's limit (body and attributes together, 256 KiB): a body too large
    is cut, and the attributes say so with the original's size and SHA-256.
    """
    settings = Settings.from_env()
    logger.warning("dead-lettering message %s: %s", printable(message_id), printable(reason))
    if settings.ingest_dlq_url is None:
        return
    body, attributes = dlq_message(message_body, reason, message_id)
    client("sqs").send_message(
        QueueUrl=settings.ingest_dlq_url, MessageBody=body, MessageAttributes=attributes
    )


def dlq_message(message_body: str, reason: str, message_id: str) -> tuple[str, dict[str, dict[str, str]]]:
    """The DLQ copy of a message: body and attributes within ``MAX_MESSAGE_BYTES``."""
    attributes = {
        "reason": _string(printable(reason)[:MAX_REASON_CHARS] or "unknown"),
        "source_message_id": _string(printable(message_id)[:200] or "unknown"),
    }
    raw = message_body.encode("utf-8", "surrogatepass")
    if _message_bytes(raw, attributes) > MAX_MESSAGE_BYTES:
        attributes["body_truncated_from_bytes"] = {"DataType": "Number", "StringValue": str(len(raw))}
        attributes["body_sha256"] = _string(hashlib.sha256(raw).hexdigest())
        room = MAX_MESSAGE_BYTES - _message_bytes(b"", attributes)
        return clip_utf8(message_body, room), attributes
    return message_body, attributes


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def _message_bytes(body: bytes, attributes: dict[str, dict[str, str]]) -> int:
    """SQS's count: the body plus each attribute's name, data type and value, in bytes."""
    size = len(body)
    for name, attribute in attributes.items():
        size += (
            len(name.encode()) + len(attribute["DataType"].encode()) + len(attribute["StringValue"].encode())
        )
    return size

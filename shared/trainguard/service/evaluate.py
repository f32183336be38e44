"""The evaluate function's logic: SQS records of S3 notifications → the job pipeline.

Transient failures (throttling, conflicts past the retry budget, AWS errors) raise, so the
record is reported as a batch item failure and SQS redelivers it (then its DLQ after
``maxReceiveCount``). Permanent failures (a key outside the layout, a malformed object)
are sent to the DLQ at once with the reason as a message attribute, and the record
succeeds: one bad object never fails the batch for other jobs nor loops forever.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from urllib.parse import unquote_plus

from trainguard.engine.sources import ObjectError
from trainguard.service import metrics
from trainguard.service.clients import client
from trainguard.service.pipeline import JobPipeline, PermanentError
from trainguard.service.publisher import Publisher
from trainguard.service.settings import Settings
from trainguard.service.state_store import StateStore

logger = logging.getLogger("trainguard.evaluate")
MAX_BODY_BYTES = 256 * 1024  # the SQS maximum


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
    )


def s3_objects(body: str) -> list[tuple[str, str]]:
    """(bucket, key) of every ObjectCreated record in an S3 notification (keys URL-decoded)."""
    if len(body) > MAX_BODY_BYTES:
        raise PermanentError(f"message body of {len(body)} bytes is not an S3 notification")
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise PermanentError(f"message body is not JSON: {exc}") from None
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
            out.append((record.s3.bucket.name, unquote_plus(record.s3.get_object.key)))
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
            problems.append(f"{key}: {exc}")
            continue
        if job is not None:
            jobs.add(job)
    if problems:
        raise PermanentError("; ".join(problems)[:4000])
    return jobs


def ingest_record(body: str, message_id: str) -> set[str]:
    try:
        return ingest_body(body)
    except PermanentError as exc:
        dead_letter(body, str(exc), message_id)
        return set()


def advance_jobs(touched: dict[str, list[str]]) -> list[str]:
    """Advance each job once; return the message ids of jobs that could not be advanced."""
    failed: list[str] = []
    for job, message_ids in touched.items():
        try:
            service().advance_job(job)
        except Exception:
            logger.exception("advancing job %s failed; its messages will be redelivered", job)
            failed.extend(message_ids)
    return failed


def dead_letter(message_body: str, reason: str, message_id: str) -> None:
    """Park a message in the ingest DLQ with the reason it cannot be processed."""
    settings = Settings.from_env()
    logger.warning("dead-lettering message %s: %s", message_id, reason)
    if settings.ingest_dlq_url is None:
        return
    client("sqs").send_message(
        QueueUrl=settings.ingest_dlq_url,
        MessageBody=message_body[:MAX_BODY_BYTES],
        MessageAttributes={
            "reason": {"DataType": "String", "StringValue": reason[:4000] or "unknown"},
            "source_message_id": {"DataType": "String", "StringValue": message_id or "unknown"},
        },
    )

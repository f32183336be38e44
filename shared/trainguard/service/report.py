"""The report function's logic: the job-finished event → report/profiler-report.html in S3.

The event is sent once per job (from the evaluate function's outbox); writing the same
report twice is harmless, so no idempotency record is needed.
"""

from __future__ import annotations

from typing import Any

from trainguard.engine.events import JobStatusDetail
from trainguard.format.layout import job_prefix
from trainguard.service.settings import Settings


def handle_event(event: dict[str, Any]) -> dict[str, Any]:
    from trainguard.hook.storage import S3Store
    from trainguard.report import generate_report
    from trainguard.service.clients import client

    detail = JobStatusDetail.model_validate(event["detail"])
    settings = Settings.from_env()
    prefix = job_prefix(detail.TrainingJobName, settings.ingest_prefix).rstrip("/")
    url = f"s3://{settings.bucket_name}/{prefix}"
    # the service's own verdicts: the report need not evaluate the job's step objects again
    where = generate_report(
        url, store=S3Store(url, client=client("s3")), rule_statuses=detail.DebugRuleEvaluationStatuses
    )
    return {"job": detail.TrainingJobName, "report": where}

"""The stop-job function's logic.

Every job gets the cooperative stop signal (``control/stop.json``) that its hook polls.
A SageMaker job that opted in (``Hook(..., sagemaker_stop=True)``, recorded in the
manifest with its ``TRAINING_JOB_NAME``) is also stopped with ``StopTrainingJob`` — only
that exact job. Both are idempotent: a stopped job stays stopped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from trainguard.engine.events import RuleStatusDetail
from trainguard.format.documents import StopSignal, dump_document
from trainguard.format.layout import STOP_SIGNAL, job_prefix
from trainguard.service.clients import client
from trainguard.service.evaluate import service
from trainguard.service.settings import Settings

logger = logging.getLogger("trainguard.stop_job")


def handle_event(event: dict[str, Any]) -> dict[str, Any]:
    detail = RuleStatusDetail.model_validate(event["detail"])
    if detail.RuleEvaluationStatus != "IssuesFound" or "StopTraining" not in detail.Actions:
        return {"stopped": False, "reason": "event does not ask for StopTraining"}
    settings = Settings.from_env()
    job = detail.TrainingJobName
    actions: list[str] = []
    signal = StopSignal(
        job=job,
        rule=detail.RuleConfigurationName[:256],
        reason=detail.StatusDetails[:1024],
        requested_at=time.time(),
    )
    key = job_prefix(job, settings.ingest_prefix) + STOP_SIGNAL
    client("s3").put_object(
        Bucket=settings.bucket_name, Key=key, Body=dump_document(signal), ContentType="application/json"
    )
    actions.append(f"s3://{settings.bucket_name}/{key}")
    if detail.SageMakerTrainingJobName and detail.AllowSageMakerStop:
        sagemaker = client("sagemaker")
        try:
            sagemaker.stop_training_job(TrainingJobName=detail.SageMakerTrainingJobName)
            actions.append(f"StopTrainingJob({detail.SageMakerTrainingJobName})")
        except sagemaker.exceptions.ClientError as exc:
            # ValidationException: the job already finished or is stopping; stopping is idempotent
            if exc.response.get("Error", {}).get("Code") != "ValidationException":
                raise
            logger.info("StopTrainingJob(%s): %s", detail.SageMakerTrainingJobName, exc)
            actions.append(f"StopTrainingJob({detail.SageMakerTrainingJobName}): already stopping or stopped")
    service().request_stop(job)
    return {"stopped": True, "job": job, "actions": actions}

"""The stop-job function's logic.

Every job gets the cooperative stop signal (``control/stop.json``) that its hook polls.

StopTrainingJob is the operator's and the launcher's decision, never the job's: a job's own
manifest names its SageMaker training job and asks to be stopped (``Hook(...,
sagemaker_stop=True)``), but the call is made only when

1. the operator deployed the stack with ``sagemakerStop`` (``TRAINGUARD_SAGEMAKER_STOP``; the
   role has no SageMaker permission otherwise), and
2. the SageMaker job is proven to belong to this trainguard job: its launcher tagged it
   ``trainguard:job=<job>`` (``trainguard.service.ownership``; the IAM grant carries the same
   tag condition), and
3. it is still running (a Stopping, Stopped, Completed or Failed job is left alone).

Each outcome is in the result under ``sagemaker`` with its reason, and logged. Both stops are
idempotent: a stopped job stays stopped.
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
from trainguard.service.ownership import Verdict, check_ownership, is_not_found
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
    result: dict[str, Any] = {"stopped": True, "job": job, "actions": actions}
    sagemaker = stop_sagemaker_job(detail, settings)
    if sagemaker is not None:
        result["sagemaker"] = sagemaker
        if sagemaker["outcome"] == "stopped":
            actions.append(f"StopTrainingJob({sagemaker['job']})")
    service().request_stop(job)
    return result


def stop_sagemaker_job(detail: RuleStatusDetail, settings: Settings) -> dict[str, Any] | None:
    """StopTrainingJob when allowed; None when the job names no SageMaker job to stop.

    Returns ``{"job", "outcome", "reason"}``; ``outcome`` is one of ``stopped``,
    ``already-stopping`` (Stopping), ``not-running`` (Stopped, Completed, Failed, Deleting, or
    gone between the check and the call), ``not-owned``, ``not-found``, ``disabled`` (the
    operator did not enable SageMaker stops) or ``not-requested`` (the job did not opt in).
    """
    name = detail.SageMakerTrainingJobName
    if not name:
        return None
    job = detail.TrainingJobName

    def outcome(kind: str, reason: str) -> dict[str, Any]:
        log = logger.info if kind == "stopped" else logger.warning
        log("StopTrainingJob(%s) for trainguard job %s: %s: %s", name, job, kind, reason)
        return {"job": name, "outcome": kind, "reason": reason}

    if not detail.AllowSageMakerStop:
        return outcome("not-requested", "the job's hook did not opt in (Hook(..., sagemaker_stop=True))")
    if not settings.sagemaker_stop:
        return outcome(
            "disabled",
            "this stack was deployed without sagemakerStop: only the cooperative stop signal is written",
        )
    sagemaker = client("sagemaker")
    owner = check_ownership(sagemaker, name, job)
    if owner.verdict is Verdict.NOT_FOUND:
        return outcome("not-found", owner.reason)
    if not owner.owned:
        return outcome("not-owned", owner.reason)
    if owner.status == "Stopping":
        return outcome("already-stopping", f"SageMaker training job {name!r} is already Stopping")
    if not owner.stoppable:
        return outcome("not-running", f"SageMaker training job {name!r} is {owner.status}: nothing to stop")
    try:
        sagemaker.stop_training_job(TrainingJobName=name)
    except sagemaker.exceptions.ClientError as exc:
        if is_not_found(exc):
            return outcome("not-running", f"SageMaker training job {name!r} no longer exists")
        if exc.response.get("Error", {}).get("Code") == "ValidationException":
            # it finished or began stopping between DescribeTrainingJob and StopTrainingJob
            message = exc.response.get("Error", {}).get("Message", "")
            return outcome("not-running", f"SageMaker training job {name!r} cannot be stopped now: {message}")
        raise
    return outcome("stopped", owner.reason)

"""Proof that a SageMaker training job belongs to a trainguard job, before anything acts on it.

A trainguard job's own data (its manifest) names the SageMaker training job it runs in; a job
could name any other job of the account. So the name alone proves nothing: authority comes from
whoever *launched* the SageMaker job, who tags it::

    trainguard:job = <the trainguard job name>      (OWNER_TAG)

(``Estimator(..., tags=[{"Key": "trainguard:job", "Value": job}])``; docs/deploy.md). The
launcher's tag is the one proof: the stop_job role's StopTrainingJob grant carries an
``aws:ResourceTag/trainguard:job`` condition too, so an untagged job cannot be stopped even if
this check had a bug. A job whose tag names *another* trainguard job is not owned.

:func:`check_ownership` calls DescribeTrainingJob (status and ARN) and ListTags (the tag);
:func:`judge` is the pure decision on their answers.

Examples
--------
::

    result = check_ownership(client("sagemaker"), "resnet-2024-01-01", "resnet-run-7")
    if result.stoppable:
        client("sagemaker").stop_training_job(TrainingJobName=result.sagemaker_job)
    else:
        logger.warning(result.reason)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: the tag a launcher puts on a SageMaker training job to hand it to one trainguard job
OWNER_TAG = "trainguard:job"
#: SageMaker's TrainingJobName pattern (botocore's model): anything else names no job
TRAINING_JOB_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
#: statuses in which StopTrainingJob still has something to stop
STOPPABLE_STATUSES = frozenset({"InProgress"})
#: ListTags pages read at most (a training job has at most 50 tags: one page of 100)
MAX_TAG_PAGES = 5


class Verdict(str, Enum):
    OWNED = "owned"
    NOT_OWNED = "not-owned"
    NOT_FOUND = "not-found"


@dataclass(frozen=True)
class Ownership:
    """What :func:`check_ownership` found out about one SageMaker training job.

    Attributes
    ----------
    verdict
        ``owned``, ``not-owned`` (``reason`` says why) or ``not-found``.
    sagemaker_job
        The SageMaker training job name that was checked.
    trainguard_job
        The trainguard job that claims it.
    reason
        One sentence for logs and results; always set.
    status
        SageMaker's ``TrainingJobStatus`` when the job was described (``InProgress``,
        ``Stopping``, ``Stopped``, ``Completed``, ``Failed``, ``Deleting``).
    arn
        The training job's ARN when it was described.
    """

    verdict: Verdict
    sagemaker_job: str
    trainguard_job: str
    reason: str
    status: str | None = None
    arn: str | None = None

    @property
    def owned(self) -> bool:
        return self.verdict is Verdict.OWNED

    @property
    def stoppable(self) -> bool:
        """Owned and still running: StopTrainingJob has something to stop."""
        return self.owned and self.status in STOPPABLE_STATUSES


def judge(
    trainguard_job: str, description: Mapping[str, Any], tags: Iterable[Mapping[str, str]]
) -> Ownership:
    """The decision on DescribeTrainingJob's answer and the job's tags (no AWS call)."""
    name = str(description.get("TrainingJobName", ""))
    status = description.get("TrainingJobStatus")
    arn = description.get("TrainingJobArn")
    values = [t.get("Value", "") for t in tags if t.get("Key") == OWNER_TAG]

    def result(verdict: Verdict, reason: str) -> Ownership:
        return Ownership(verdict, name, trainguard_job, reason, status, arn)

    if not values:
        return result(
            Verdict.NOT_OWNED,
            f"SageMaker training job {name!r} has no {OWNER_TAG} tag; the launcher must tag it "
            f"{OWNER_TAG}={trainguard_job} for trainguard to stop it (docs/deploy.md)",
        )
    if values[0] != trainguard_job:
        return result(
            Verdict.NOT_OWNED,
            f"SageMaker training job {name!r} is tagged {OWNER_TAG}={values[0]!r}, "
            f"not {trainguard_job!r}: it belongs to another trainguard job",
        )
    return result(Verdict.OWNED, f"SageMaker training job {name!r} is tagged {OWNER_TAG}={trainguard_job!r}")


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _error_message(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


def is_not_found(exc: Exception) -> bool:
    """SageMaker's "no such job": ``ResourceNotFound``, or (older endpoints, moto) a
    ``ValidationException`` saying the resource was not found."""
    code = _error_code(exc)
    if code in ("ResourceNotFound", "ResourceNotFoundException"):
        return True
    message = _error_message(exc).lower()
    return code == "ValidationException" and ("not found" in message or "could not find" in message)


def is_access_denied(exc: Exception) -> bool:
    return _error_code(exc) in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")


def check_ownership(sagemaker: Any, sagemaker_job: str, trainguard_job: str) -> Ownership:
    """Whether ``sagemaker_job`` was launched for ``trainguard_job`` (tag :data:`OWNER_TAG`).

    Parameters
    ----------
    sagemaker
        A boto3 SageMaker client (needs ``sagemaker:DescribeTrainingJob`` and
        ``sagemaker:ListTags`` on the training job).
    sagemaker_job
        The SageMaker training job name, as the trainguard job's manifest gives it (untrusted).
    trainguard_job
        The trainguard job (the name its objects are stored under) that asks for the action.

    Returns
    -------
    Ownership
        Never raises for a job that does not exist, is not tagged, belongs to another job or
        that this role may not describe; raises on throttling and other transient errors (the
        caller's invocation is retried).
    """
    if not TRAINING_JOB_NAME.fullmatch(sagemaker_job):
        return Ownership(
            Verdict.NOT_FOUND,
            sagemaker_job,
            trainguard_job,
            f"{sagemaker_job[:80]!r} is not a SageMaker training job name",
        )
    try:
        description = sagemaker.describe_training_job(TrainingJobName=sagemaker_job)
    except Exception as exc:
        if is_not_found(exc):
            return Ownership(
                Verdict.NOT_FOUND,
                sagemaker_job,
                trainguard_job,
                f"SageMaker training job {sagemaker_job!r} does not exist in this account and region",
            )
        if is_access_denied(exc):
            return Ownership(
                Verdict.NOT_OWNED,
                sagemaker_job,
                trainguard_job,
                f"DescribeTrainingJob({sagemaker_job!r}) was denied: the job is not tagged "
                f"{OWNER_TAG}, or the stack was deployed without sagemakerStop ({_error_message(exc)})",
            )
        raise
    tags: list[Mapping[str, str]] = []
    kwargs: dict[str, Any] = {"ResourceArn": description["TrainingJobArn"], "MaxResults": 100}
    for _ in range(MAX_TAG_PAGES):
        try:
            page = sagemaker.list_tags(**kwargs)
        except Exception as exc:
            if is_access_denied(exc):
                return Ownership(
                    Verdict.NOT_OWNED,
                    sagemaker_job,
                    trainguard_job,
                    f"ListTags of {sagemaker_job!r} was denied ({_error_message(exc)})",
                    description.get("TrainingJobStatus"),
                    description.get("TrainingJobArn"),
                )
            if is_not_found(exc):  # deleted between the two calls
                return Ownership(
                    Verdict.NOT_FOUND,
                    sagemaker_job,
                    trainguard_job,
                    f"SageMaker training job {sagemaker_job!r} no longer exists",
                )
            raise
        tags.extend(page.get("Tags", []))
        if not page.get("NextToken"):
            break
        kwargs["NextToken"] = page["NextToken"]
    return judge(trainguard_job, description, tags)

"""The sagemaker_events function: trainguard's rule-status events → ``SageMaker Training Job State Change``.

For each trainguard event (a rule transition, or the job's end) it loads the job's
:class:`~trainguard.engine.sagemaker_events.JobView`, applies the change, commits the new
view with a conditional write on its version (the gate: of two concurrent changes, one
commits first and the other is re-applied on top of it), then sends the event to the
target bus (the account's default bus). The event to send is kept in the view's outbox
until PutEvents succeeded, so a crash between the commit and the send re-sends it on the
retry instead of losing it; an event already applied (EventBridge's at-least-once delivery)
is dropped by its transition number.

Ownership of the SageMaker training job a job claims is checked once per job
(DescribeTrainingJob + the launcher's tag, :func:`trainguard.service.ownership.check_ownership`)
and the answer kept in the view.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainguard.engine.events import (
    DETAIL_TYPE,
    EVENT_SOURCE,
    JOB_DETAIL_TYPE,
    JobStatusDetail,
    RuleStatusDetail,
)
from trainguard.engine.sagemaker_events import (
    DEFAULT_TARGET_BUS,
    SAGEMAKER_DETAIL_TYPE,
    JobView,
    SageMakerTrainingJobState,
    apply_job_end,
    apply_rule_change,
)
from trainguard.service.clients import client

logger = logging.getLogger("trainguard.sagemaker_events")

#: the function's own partition of the state table (its views, one item per job)
PARTITION = "idempotency#sagemaker_events"
#: the bus the SageMaker-shaped events go to (default: the account's default bus)
TARGET_BUS_ENV = "SAGEMAKER_EVENTS_BUS"
#: commits tried before the invocation fails (and is retried by Lambda)
MAX_ATTEMPTS = 8

#: (claimed SageMaker job, trainguard job) -> (owned, ARN, reason)
OwnershipCheck = Callable[[str, str], tuple[bool, str | None, str]]
#: sends one event; raises when EventBridge did not take it
Publisher = Callable[[SageMakerTrainingJobState], None]


class ViewStore:
    """The views in the state table: ``pk = PARTITION``, ``sk = view#<job>``, versioned."""

    def __init__(self, table: str, dynamodb: Any) -> None:
        self.table = table
        self.dynamodb = dynamodb

    def _key(self, job: str) -> dict[str, Any]:
        return {"pk": {"S": PARTITION}, "sk": {"S": f"view#{job}"}}

    def load(self, job: str) -> JobView:
        item = self.dynamodb.get_item(TableName=self.table, Key=self._key(job), ConsistentRead=True).get(
            "Item"
        )
        if item is None:
            return JobView(job=job)
        return JobView.model_validate_json(item["view"]["S"])

    def save(self, view: JobView, expected_version: int) -> bool:
        """Write ``view`` if the stored one still has ``expected_version``; False: someone else did."""
        condition = "attribute_not_exists(pk)" if expected_version == 0 else "version = :expected"
        values = {} if expected_version == 0 else {":expected": {"N": str(expected_version)}}
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item={
                    **self._key(view.job),
                    "version": {"N": str(view.version)},
                    "view": {"S": view.model_dump_json()},
                },
                ConditionExpression=condition,
                **({"ExpressionAttributeValues": values} if values else {}),
            )
        except self.dynamodb.exceptions.ConditionalCheckFailedException:
            return False
        return True


@dataclass(frozen=True)
class Outcome:
    published: bool
    reason: str
    job: str
    event_id: str
    detail: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "published": self.published,
            "reason": self.reason,
            "job": self.job,
            "event_id": self.event_id,
        }
        if self.detail is not None:
            out["TrainingJobName"] = self.detail["TrainingJobName"]
            out["TrainingJobStatus"] = self.detail["TrainingJobStatus"]
        return out


def convert(event: dict[str, Any], store: ViewStore, prove: OwnershipCheck, publish: Publisher) -> Outcome:
    """Turn one trainguard event into (at most) one SageMaker-shaped event."""
    detail_type = event.get("detail-type")
    raw = event.get("detail") or {}
    try:
        detail: RuleStatusDetail | JobStatusDetail
        if detail_type == DETAIL_TYPE:
            detail = RuleStatusDetail.model_validate(raw)
        elif detail_type == JOB_DETAIL_TYPE:
            detail = JobStatusDetail.model_validate(raw)
        else:
            return Outcome(
                False, f"not a trainguard status event (detail-type {str(detail_type)[:80]!r})", "?", "?"
            )
    except ValidationError as exc:
        raise ValueError(f"invalid trainguard event detail: {str(exc)[:400]}") from None
    job, event_id = detail.TrainingJobName, detail.EventId
    for _ in range(MAX_ATTEMPTS):
        view = store.load(job)
        pending = view.outbox.get(event_id)
        if pending is not None:  # committed earlier, not sent: send it now
            resent = SageMakerTrainingJobState.model_validate_json(pending)
            publish(resent)
            _clear_outbox(store, job, event_id)
            return Outcome(True, "re-sent after an interrupted attempt", job, event_id, resent.model_dump())
        claimed = detail.SageMakerTrainingJobName if isinstance(detail, RuleStatusDetail) else None
        if claimed and view.checked_name is None:
            owned, arn, reason = prove(claimed, job)
            view = view.model_copy(
                update={
                    "sagemaker_name": claimed,
                    "sagemaker_arn": arn if owned else None,
                    "proven": owned,
                    "ownership": reason[:500],
                    "checked_name": claimed,
                }
            )
            if not owned:
                logger.warning(
                    "job %s: %s; its events name trainguard's job and cannot stop anything", job, reason
                )
        if isinstance(detail, RuleStatusDetail):
            new, state, reason = apply_rule_change(view, detail)
        else:
            new, state, reason = apply_job_end(view, detail)
        if state is None:
            return Outcome(False, reason, job, event_id)
        new.outbox[event_id] = state.model_dump_json()
        if not store.save(new, expected_version=view.version):
            continue  # another change committed first: apply this one on top of it
        publish(state)
        _clear_outbox(store, job, event_id)
        return Outcome(True, reason, job, event_id, state.model_dump())
    raise RuntimeError(f"job {job}: {MAX_ATTEMPTS} conflicting commits in a row; retrying the event")


def _clear_outbox(store: ViewStore, job: str, event_id: str) -> None:
    for _ in range(MAX_ATTEMPTS):
        view = store.load(job)
        if event_id not in view.outbox:
            return
        new = view.model_copy(deep=True)
        del new.outbox[event_id]
        new.version += 1
        if store.save(new, expected_version=view.version):
            return
    # sent but still in the outbox: a retry would send it again, so say so loudly
    raise RuntimeError(f"job {job}: could not clear sent event {event_id} from the outbox")


def eventbridge_publisher(events: Any, bus: str) -> Publisher:
    def publish(state: SageMakerTrainingJobState) -> None:
        entry: dict[str, Any] = {
            "Source": EVENT_SOURCE,
            "DetailType": SAGEMAKER_DETAIL_TYPE,
            "Detail": state.model_dump_json(),
            "EventBusName": bus,
        }
        if state.TrainingJobArn:
            entry["Resources"] = [state.TrainingJobArn]
        response = events.put_events(Entries=[entry])
        if response.get("FailedEntryCount"):
            failed = response["Entries"][0]
            raise RuntimeError(
                f"PutEvents to {bus} failed: {failed.get('ErrorCode')}: {failed.get('ErrorMessage')}"
            )

    return publish


def sagemaker_ownership(sagemaker: Any) -> OwnershipCheck:
    """The launcher's proof, through DescribeTrainingJob and ListTags."""
    from trainguard.service.ownership import check_ownership

    def prove(sagemaker_job: str, trainguard_job: str) -> tuple[bool, str | None, str]:
        result = check_ownership(sagemaker, sagemaker_job, trainguard_job)
        return result.owned, result.arn, result.reason

    return prove


def handle_event(event: dict[str, Any]) -> dict[str, Any]:
    from trainguard.service.settings import Settings

    settings = Settings.from_env()
    outcome = convert(
        event,
        ViewStore(settings.table_name, client("dynamodb")),
        sagemaker_ownership(client("sagemaker")),
        eventbridge_publisher(client("events"), os.environ.get(TARGET_BUS_ENV) or DEFAULT_TARGET_BUS),
    )
    logger.info("%s", json.dumps(outcome.as_dict()))
    return outcome.as_dict()

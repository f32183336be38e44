"""The SageMaker-shaped event contract: ``SageMaker Training Job State Change``, sent by trainguard.

Lambdas written for SageMaker Debugger (AWS's documented auto-stop Lambda reads
``detail.DebugRuleEvaluationStatuses``, ``detail.TrainingJobStatus`` and
``detail.TrainingJobName``, and calls ``StopTrainingJob`` when a status is ``IssuesFound``
while the job is ``InProgress``) keep working with one change to their rule's pattern:
``"source": ["aws.sagemaker"]`` becomes ``"source": ["trainguard"]`` (AWS reserves
``aws.*`` for its own services). The events go to the account's default bus, where such
rules live.

Each trainguard rule-status event (``trainguard.engine.events``) becomes at most one
SageMaker-shaped event. A job's events form one sequence of snapshots (:class:`JobView`):
each adds exactly its own rule's change to the previous one, so two rules that fire at once
give two events, the first showing one IssuesFound, the second both. ``TrainingJobStatus``
never invites a second stop: it says ``InProgress`` alongside an IssuesFound in exactly one
event of a job (the first; a conditional write on the view is the gate), and ``Stopping``
in every later one until the job ends (``Completed`` or ``Stopped``).

``TrainingJobName`` is the SageMaker training job's name only when that job is proven to
belong to this trainguard job (its launcher tagged it, ``trainguard.service.ownership``);
otherwise it is trainguard's own job name, ``TrainingJobArn`` is null, ``Stoppable`` is
false, and no event of the job ever says ``InProgress`` alongside an IssuesFound (a job must
never make someone's Lambda stop a SageMaker job by naming it, or by being named like it).

Schema ``trainguard.sagemaker-training-job-state/1``; fixtures in
``tests/fixtures/events/``. Times: ``LastModifiedTime`` is epoch milliseconds (an integer),
as SageMaker's events carry it; each ``DebugRuleEvaluationStatuses[].LastModifiedTime`` is
an ISO 8601 timestamp in UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainguard.engine.events import JobStatusDetail, RuleStatusDetail, Status

SAGEMAKER_DETAIL_TYPE = "SageMaker Training Job State Change"
SAGEMAKER_SCHEMA = "trainguard.sagemaker-training-job-state/1"
#: where the events go unless the stack says otherwise: the account's default bus
DEFAULT_TARGET_BUS = "default"

TrainingJobStatus = Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"]
#: SecondaryStatus for each TrainingJobStatus (SageMaker's own pairs)
SECONDARY_STATUS = {
    "InProgress": "Training",
    "Stopping": "Stopping",
    "Stopped": "Stopped",
    "Completed": "Completed",
    "Failed": "Failed",
}
#: rules views keep at most this many entries (a job has at most 20 + 20 rules)
MAX_RULES = 50


class SageMakerRuleStatus(BaseModel):
    """One entry of ``DebugRuleEvaluationStatuses``, as DescribeTrainingJob gives it."""

    model_config = ConfigDict(extra="forbid")

    RuleConfigurationName: str
    RuleEvaluationStatus: Status
    StatusDetails: str = Field(default="", max_length=1024)
    #: ISO 8601, UTC, milliseconds: ``2024-05-01T12:00:00.000Z``
    LastModifiedTime: str


class SageMakerTrainingJobState(BaseModel):
    """``detail`` of a ``SageMaker Training Job State Change`` event sent by trainguard."""

    model_config = ConfigDict(extra="forbid")

    TrainingJobName: str
    TrainingJobArn: str | None
    TrainingJobStatus: TrainingJobStatus
    SecondaryStatus: str
    #: epoch milliseconds, as SageMaker's events give it
    LastModifiedTime: int
    DebugRuleEvaluationStatuses: list[SageMakerRuleStatus] = Field(default_factory=list, max_length=MAX_RULES)
    # trainguard's additions (consumers written for SageMaker ignore them)
    Schema: Literal["trainguard.sagemaker-training-job-state/1"] = "trainguard.sagemaker-training-job-state/1"
    #: trainguard's job (the data's folder), whatever TrainingJobName says
    TrainguardJobName: str
    #: the trainguard event this one was made from (``<job>/<rule>/<seq>``; consumers deduplicate on it)
    TrainguardEventId: str
    #: TrainingJobName is a SageMaker training job proven to be this job's (launcher's tag)
    Stoppable: bool


class RuleEntry(BaseModel):
    """A rule's newest change that was published, with its transition number."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    details: str = ""
    modified: float
    seq: int


class JobView(BaseModel):
    """What a job's SageMaker-shaped events have said so far (one item per job, versioned)."""

    model_config = ConfigDict(extra="forbid")

    job: str
    version: int = 0
    rules: dict[str, RuleEntry] = Field(default_factory=dict, max_length=MAX_RULES)
    #: the SageMaker training job this job claimed, and whether ownership was proven
    sagemaker_name: str | None = None
    sagemaker_arn: str | None = None
    proven: bool = False
    #: why the claim was (not) accepted; the name it was checked for (checked once)
    ownership: str = ""
    checked_name: str | None = None
    #: an event has said InProgress alongside an IssuesFound: the gate is closed
    stop_invited: bool = False
    #: the job's end ("Completed" or "Stopped") was published
    ended: TrainingJobStatus | None = None
    #: the trainguard event ids of published changes whose SageMaker-shaped event may not
    #: have been sent yet (sent, then removed): the outbox
    outbox: dict[str, str] = Field(default_factory=dict, max_length=8)


def iso_utc(epoch_s: float) -> str:
    """``2024-05-01T12:00:00.000Z``."""
    when = dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_seq(event_id: str) -> int:
    """The transition number at the end of ``<job>/<rule>/<seq>`` (0 when there is none)."""
    tail = event_id.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def apply_rule_change(
    view: JobView, detail: RuleStatusDetail
) -> tuple[JobView, SageMakerTrainingJobState | None, str]:
    """The next view, and the event to send for one rule transition (None, reason: nothing to send).

    Pure: the caller commits ``view`` with a conditional write (``version``) before sending,
    so of two concurrent changes only one can be the first to close the gate.
    """
    seq = event_seq(detail.EventId)
    current = view.rules.get(detail.RuleConfigurationName)
    if current is not None and current.seq >= seq:
        return view, None, f"already published: {detail.RuleConfigurationName} transition {current.seq}"
    if view.ended is not None:
        return view, None, f"job already ended ({view.ended})"
    new = view.model_copy(deep=True)
    new.version += 1
    new.rules[detail.RuleConfigurationName] = RuleEntry(
        status=detail.RuleEvaluationStatus,
        details=detail.StatusDetails,
        modified=detail.LastModifiedTime,
        seq=seq,
    )
    # rules that had no transition yet are evaluating: InProgress until their own event comes
    base = {e.RuleConfigurationName: e.LastModifiedTime for e in detail.DebugRuleEvaluationStatuses}
    if detail.TrainingJobStatus in ("Completed", "Stopped"):
        status: TrainingJobStatus = detail.TrainingJobStatus
    elif any(r.status == "IssuesFound" for r in new.rules.values()):
        if not new.stop_invited and new.proven:
            status = "InProgress"  # the one event that may lead to a stop
            new.stop_invited = True
        else:
            status = "Stopping"
    else:
        status = "InProgress"
    return new, _state(new, status, detail.EventId, detail.LastModifiedTime, base), "published"


def apply_job_end(
    view: JobView, detail: JobStatusDetail
) -> tuple[JobView, SageMakerTrainingJobState | None, str]:
    """The job's last event: every rule's final status, ``Completed`` or ``Stopped``."""
    if view.ended is not None:
        return view, None, f"job already ended ({view.ended})"
    new = view.model_copy(deep=True)
    new.version += 1
    for entry in detail.DebugRuleEvaluationStatuses:
        known = new.rules.get(entry.RuleConfigurationName)
        if known is None or known.status != entry.RuleEvaluationStatus:
            new.rules[entry.RuleConfigurationName] = RuleEntry(
                status=entry.RuleEvaluationStatus,
                details=entry.StatusDetails,
                modified=entry.LastModifiedTime,
                seq=(known.seq if known else 0),
            )
    new.ended = detail.TrainingJobStatus
    state = _state(new, detail.TrainingJobStatus, detail.EventId, detail.LastModifiedTime, {})
    return new, state, "published"


def _state(
    view: JobView, status: TrainingJobStatus, event_id: str, now: float, base: dict[str, float]
) -> SageMakerTrainingJobState:
    entries = [
        SageMakerRuleStatus(
            RuleConfigurationName=name,
            RuleEvaluationStatus=entry.status,
            StatusDetails=entry.details,
            LastModifiedTime=iso_utc(entry.modified),
        )
        for name, entry in view.rules.items()
    ]
    entries += [
        SageMakerRuleStatus(
            RuleConfigurationName=name, RuleEvaluationStatus="InProgress", LastModifiedTime=iso_utc(modified)
        )
        for name, modified in base.items()
        if name not in view.rules
    ]
    stoppable = view.proven and view.sagemaker_name is not None
    return SageMakerTrainingJobState(
        TrainingJobName=view.sagemaker_name if stoppable and view.sagemaker_name else view.job,
        TrainingJobArn=view.sagemaker_arn if stoppable else None,
        TrainingJobStatus=status,
        SecondaryStatus=SECONDARY_STATUS[status],
        LastModifiedTime=round(now * 1000),
        DebugRuleEvaluationStatuses=entries[:MAX_RULES],
        TrainguardJobName=view.job,
        TrainguardEventId=event_id,
        Stoppable=stoppable,
    )

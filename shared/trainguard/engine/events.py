"""The versioned EventBridge contract: one event per rule status transition.

``detail`` carries SageMaker's field names (``TrainingJobName``, ``RuleConfigurationName``,
``RuleEvaluationStatus``, ``StatusDetails``, ``LastModifiedTime``) so Lambdas written for
SageMaker Debugger keep working, and a ``DebugRuleEvaluationStatuses`` list of every rule
of the job, the shape AWS's documented stop-on-IssuesFound automation reads. trainguard's
own additions: ``Step``, ``Value``, ``Threshold``, ``Tensor``, ``Actions`` and ``EventId``
(``<job>/<rule>/<seq>``, unique per transition: consumers deduplicate on it).

The SageMaker-shaped ``SageMaker Training Job State Change`` events made from these (for
Lambdas written for SageMaker Debugger) are a contract of their own, in
:mod:`trainguard.engine.sagemaker_events`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EVENT_SOURCE = "trainguard"
DETAIL_TYPE = "Rule Evaluation Status Change"
SCHEMA = "trainguard.rule-status/1"
JOB_DETAIL_TYPE = "Training Job Evaluation Finished"
JOB_SCHEMA = "trainguard.job-status/1"

Status = Literal["InProgress", "NoIssuesFound", "IssuesFound", "Error", "Stopping", "Stopped"]
STATUSES: tuple[str, ...] = ("InProgress", "NoIssuesFound", "IssuesFound", "Error", "Stopping", "Stopped")
FINAL_STATUSES = frozenset({"NoIssuesFound", "IssuesFound", "Error", "Stopped"})


class RuleStatusEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    RuleConfigurationName: str
    RuleEvaluationStatus: Status
    StatusDetails: str = Field(default="", max_length=1024)
    LastModifiedTime: float


class RuleStatusDetail(BaseModel):
    """``detail`` of a trainguard event."""

    model_config = ConfigDict(extra="forbid")

    Schema: Literal["trainguard.rule-status/1"] = "trainguard.rule-status/1"
    EventId: str
    TrainingJobName: str
    RuleConfigurationName: str
    RuleName: str
    RuleEvaluationStatus: Status
    PreviousStatus: Status | None = None
    StatusDetails: str = Field(default="", max_length=1024)
    #: seconds since the epoch (float), as SageMaker's API returns it
    LastModifiedTime: float
    Step: int | None = None
    #: the mode of the global step ``Step`` and the loop's own count of that mode's steps
    #: (EVAL passes advance the global step: TRAIN step 62 can be global step 68)
    Mode: Literal["TRAIN", "EVAL", "PREDICT", "GLOBAL"] | None = None
    ModeStep: int | None = None
    Value: float | None = None
    #: the measured value as text when it is not a finite number ("inf", "nan"): JSON has none
    ValueText: str | None = Field(default=None, max_length=64)
    Threshold: float | None = None
    Tensor: str | None = None
    Actions: list[str] = Field(default_factory=list)
    #: the job's SageMaker name when it runs there, and whether it opted in to StopTrainingJob
    SageMakerTrainingJobName: str | None = None
    AllowSageMakerStop: bool = False
    TrainingJobStatus: Literal["InProgress", "Completed", "Stopped"] = "InProgress"
    DebugRuleEvaluationStatuses: list[RuleStatusEntry] = Field(default_factory=list, max_length=50)


class JobStatusDetail(BaseModel):
    """``detail`` of the one event sent when every step of a job was evaluated and it ended.

    The profiler report runs on it; users can hang their own end-of-job actions on it.
    """

    model_config = ConfigDict(extra="forbid")

    Schema: Literal["trainguard.job-status/1"] = "trainguard.job-status/1"
    EventId: str
    TrainingJobName: str
    TrainingJobStatus: Literal["Completed", "Stopped"]
    LastStep: int
    StepsEvaluated: int
    LastModifiedTime: float
    DebugRuleEvaluationStatuses: list[RuleStatusEntry] = Field(default_factory=list, max_length=50)
    #: values the hook could not record, by reason (segments and end markers); {} when none
    Dropped: dict[str, int] = Field(default_factory=dict, max_length=33)
    #: objects the hook's uploader could not deliver
    DroppedObjects: int = 0
    #: why the evaluation ended when the job did not end by itself (it went silent); None when
    #: every worker sent its end marker
    EndReason: str | None = Field(default=None, max_length=1024)


def detail_type(detail_json: str) -> str:
    """The DetailType of a stored detail, from its schema."""
    return JOB_DETAIL_TYPE if f'"Schema":"{JOB_SCHEMA}"' in detail_json else DETAIL_TYPE


#: PutEvents: each entry, and all entries of one request together, below 256 KB as EventBridge
#: counts them (UTF-8 bytes of Source, DetailType and Detail); kept with a margin for the
#: JSON envelope EventBridge adds around the detail
MAX_REQUEST_BYTES = 256_000
#: one event's detail is cut down to this before it is stored in the outbox
MAX_DETAIL_BYTES = 200 * 1024


def entry_bytes(detail_json: str) -> int:
    """The size of one PutEvents entry as EventBridge counts it (no Time, no Resources)."""
    return len(EVENT_SOURCE) + len(detail_type(detail_json).encode()) + len(detail_json.encode())


def fit_detail(detail: RuleStatusDetail | JobStatusDetail, limit: int = MAX_DETAIL_BYTES) -> str:
    """The detail as JSON, within ``limit`` bytes: what does not fit is the list of every rule.

    The rule's own fields always stay whole (its status, details, step, value); the other
    rules' ``StatusDetails`` in ``DebugRuleEvaluationStatuses`` are shortened (to 256, then 32
    characters, then none) until the event fits. Names are bounded (256 characters, 50
    rules), so the shortest form always fits.
    """
    text = detail.model_dump_json()
    if len(text.encode()) <= limit:
        return text
    for keep in (256, 32, 0):
        entries = [
            entry.model_copy(update={"StatusDetails": _clip(entry.StatusDetails, keep)})
            for entry in detail.DebugRuleEvaluationStatuses
        ]
        text = detail.model_copy(update={"DebugRuleEvaluationStatuses": entries}).model_dump_json()
        if len(text.encode()) <= limit:
            return text
    raise ValueError(f"event {detail.EventId[:200]!r} is {len(text.encode())} bytes; at most {limit}")


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else (text[: max(chars - 1, 0)] + "…" if chars else "")

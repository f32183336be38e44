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


def detail_type(detail_json: str) -> str:
    """The DetailType of a stored detail, from its schema."""
    return JOB_DETAIL_TYPE if f'"Schema":"{JOB_SCHEMA}"' in detail_json else DETAIL_TYPE

"""The one description of trainguard's topology, shared by the CDK stack and the local mode.

``infra/`` turns it into constructs; ``trainguard.local`` turns it into moto resources and
delivers to the same handlers itself (moto runs no Lambda code). Change the wiring here
and both runtimes change together: they cannot drift.

Data flow::

    S3 ObjectCreated (jobs/…) ──► SQS ingest (DLQ) ──► evaluate ──► DynamoDB state
                                                           │
                                                           ▼ status change
                                              EventBridge bus "trainguard"
                        ┌──────────────────────────┼──────────────────────────┐
                  notify (SNS email/SMS)     stop-job (StopTrainingJob      user actions
                                              or cooperative stop signal)   (their Lambdas)
                  sagemaker_events ──► default bus: "SageMaker Training Job State Change"
                                       (Lambdas written for SageMaker Debugger)
    Schedule (rate 1 min) ──► clock (StalledTrainingRule, MaxInitializationTime)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.events import DETAIL_TYPE, EVENT_SOURCE, JOB_DETAIL_TYPE
from trainguard.format.layout import INGEST_PREFIX


@dataclass(frozen=True)
class QueueSpec:
    id: str
    #: 6 times a function's timeout, as AWS recommends for an SQS trigger
    visibility_timeout_s: int
    max_receive_count: int = 5
    #: messages kept in the DLQ for inspection (14 days: the SQS maximum)
    dlq_retention_s: int = 14 * 24 * 3600


@dataclass(frozen=True)
class FunctionSpec:
    id: str
    #: "<module>.<function>" under functions/<id>/ (the Lambda handler string)
    handler: str
    timeout_s: int
    memory_mb: int
    description: str
    #: which resources the function touches, and how; the CDK stack grants exactly these
    grants: tuple[str, ...] = ()
    #: SQS trigger
    queue: str | None = None
    batch_size: int = 10
    max_batching_window_s: int = 0
    #: cap on concurrent executions from the trigger (protects DynamoDB from a burst)
    max_concurrency: int | None = None
    #: fixed-rate schedule in minutes (clock-driven rules)
    schedule_minutes: int | None = None


@dataclass(frozen=True)
class BusRuleSpec:
    id: str
    description: str
    pattern: dict[str, Any]
    #: the function that receives matching events
    target: str


@dataclass(frozen=True)
class IndexSpec:
    name: str
    partition_key: str
    sort_key: str


@dataclass(frozen=True)
class TableSpec:
    """The state table: one partition per job (see trainguard.service.state_store)."""

    partition_key: str = "pk"
    sort_key: str = "sk"
    #: Powertools idempotency records expire through this attribute
    ttl_attribute: str = "expires_at"
    #: sparse index of unfinished jobs, for the schedule's tick (KEYS_ONLY)
    indexes: tuple[IndexSpec, ...] = (IndexSpec("active-jobs", "active", "pk"),)


TABLE = TableSpec()


@dataclass(frozen=True)
class Wiring:
    ingest_prefix: str
    queues: tuple[QueueSpec, ...]
    functions: tuple[FunctionSpec, ...]
    bus_rules: tuple[BusRuleSpec, ...]
    #: S3 key prefix → queue id for ObjectCreated notifications
    notifications: tuple[tuple[str, str], ...] = field(default=())

    def function(self, fid: str) -> FunctionSpec:
        return next(f for f in self.functions if f.id == fid)

    def queue(self, qid: str) -> QueueSpec:
        return next(q for q in self.queues if q.id == qid)


def status_pattern(statuses: list[str], **detail: Any) -> dict[str, Any]:
    return {
        "source": [EVENT_SOURCE],
        "detail-type": [DETAIL_TYPE],
        "detail": {"RuleEvaluationStatus": statuses, **detail},
    }


EVALUATE_TIMEOUT_S = 60

WIRING = Wiring(
    ingest_prefix=INGEST_PREFIX,
    queues=(QueueSpec("ingest", visibility_timeout_s=6 * EVALUATE_TIMEOUT_S),),
    notifications=((INGEST_PREFIX, "ingest"),),
    functions=(
        FunctionSpec(
            "evaluate",
            handler="handler.handler",
            timeout_s=EVALUATE_TIMEOUT_S,
            memory_mb=1024,
            description="Evaluates rules incrementally on each job object and emits status changes",
            grants=("bucket:read", "table:readwrite", "bus:put", "ingest-dlq:send"),
            queue="ingest",
            batch_size=10,
            max_batching_window_s=1,
            max_concurrency=20,
        ),
        FunctionSpec(
            "notify",
            handler="handler.handler",
            timeout_s=30,
            memory_mb=256,
            description="Formats rule alerts and publishes them to SNS once per transition",
            grants=("topic:publish", "table:readwrite"),
        ),
        FunctionSpec(
            "clock",
            handler="handler.handler",
            timeout_s=60,
            memory_mb=512,
            description="Every minute: rules that fire on missing data (StalledTrainingRule) check the time",
            grants=("table:readwrite", "bus:put"),
            schedule_minutes=1,
        ),
        FunctionSpec(
            "report",
            handler="handler.handler",
            timeout_s=120,
            memory_mb=1024,
            description="Writes the HTML profiler report next to a finished job's data",
            grants=("bucket:read-job", "bucket:write-report"),
        ),
        FunctionSpec(
            "stop_job",
            handler="handler.handler",
            timeout_s=30,
            memory_mb=256,
            description="Stops a job whose rule fired: StopTrainingJob, or the cooperative stop signal",
            grants=("bucket:write-stop", "table:readwrite", "sagemaker:stop", "bus:put"),
        ),
        FunctionSpec(
            "sagemaker_events",
            handler="handler.handler",
            timeout_s=30,
            memory_mb=256,
            description=(
                "Turns rule-status events into SageMaker Training Job State Change events on the "
                "default bus, once per change, for Lambdas written for SageMaker Debugger"
            ),
            # its own views (pk idempotency#sagemaker_events); PutEvents to the default bus;
            # DescribeTrainingJob + ListTags to prove a claimed SageMaker job is the job's
            grants=("table:readwrite", "default-bus:put", "sagemaker:read"),
        ),
    ),
    bus_rules=(
        BusRuleSpec(
            "report",
            "Write the profiler report when a job's evaluation finishes",
            {"source": [EVENT_SOURCE], "detail-type": [JOB_DETAIL_TYPE]},
            target="report",
        ),
        BusRuleSpec(
            "alert",
            "Email/SMS on IssuesFound and Error",
            status_pattern(["IssuesFound", "Error"], Actions=["Email", "SMS"]),
            target="notify",
        ),
        BusRuleSpec(
            "stop",
            "Stop the job when a rule with the StopTraining action finds issues",
            status_pattern(["IssuesFound"], Actions=["StopTraining"]),
            target="stop_job",
        ),
        BusRuleSpec(
            "sagemaker-events",
            "Every rule-status change and job end, as SageMaker Training Job State Change events",
            {"source": [EVENT_SOURCE], "detail-type": [DETAIL_TYPE, JOB_DETAIL_TYPE]},
            target="sagemaker_events",
        ),
    ),
)

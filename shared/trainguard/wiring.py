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

Permissions are part of the wiring: each function lists grant tokens (``GRANTS``: token →
IAM statements over named resources, ``Ref``), and ``TRAINING_POLICY`` is what a training
job's role attaches. The CDK stack builds every role and the exported training policy from
these statements; the local mode gives each handler credentials limited to the same
statements, and the end-to-end tests check every AWS call a handler or the hook makes
against the synthesized template's policy for it (``trainguard.local.iam``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.events import DETAIL_TYPE, EVENT_SOURCE, JOB_DETAIL_TYPE
from trainguard.format.layout import INGEST_PREFIX, REPORT, STOP_SIGNAL
from trainguard.service.ownership import OWNER_TAG
from trainguard.service.settings import Env


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
    #: which resources the function touches, and how (tokens of ``GRANTS``); both runtimes
    #: grant exactly these
    grants: tuple[str, ...] = ()
    #: grants that exist only when the operator enables a feature: ((feature, (tokens...)), ...)
    feature_grants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: SQS trigger
    queue: str | None = None
    batch_size: int = 10
    max_batching_window_s: int = 0
    #: cap on concurrent executions from the trigger (protects DynamoDB from a burst)
    max_concurrency: int | None = None
    #: fixed-rate schedule in minutes (clock-driven rules)
    schedule_minutes: int | None = None

    @property
    def service_name(self) -> str:
        """POWERTOOLS_SERVICE_NAME: the ``service`` key of every log line."""
        return f"trainguard-{self.id.replace('_', '-')}"


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

    def grants(self) -> dict[str, tuple[Statement, ...]]:
        """Every grant token this wiring knows (GRANTS and one DLQ grant per queue)."""
        return {**GRANTS, **dict(queue_grant(q.id) for q in self.queues)}

    def tokens(self, fid: str, features: frozenset[str] = frozenset()) -> tuple[str, ...]:
        spec = self.function(fid)
        extra = [t for feature, tokens in spec.feature_grants if feature in features for t in tokens]
        return tuple(dict.fromkeys((*spec.grants, *extra)))

    def statements(self, fid: str, features: frozenset[str] = frozenset()) -> tuple[Statement, ...]:
        """The function's IAM statements (its tokens expanded; ``{function}`` filled in)."""
        known = self.grants()
        out: list[Statement] = []
        for token in self.tokens(fid, features):
            for st in known[token]:
                conditions = tuple(
                    Condition(c.operator, c.key, tuple(v.replace("{function}", fid) for v in c.values))
                    for c in st.conditions
                )
                out.append(Statement(st.sid, st.actions, st.resources, conditions, st.effect))
        return tuple(out)

    def environment(
        self,
        fid: str,
        resolve: Callable[[str], str],
        *,
        log_level: str,
        features: frozenset[str] = frozenset(),
    ) -> dict[str, str]:
        """The environment of one function; ``resolve("bucket:name")`` etc. gives each value."""
        spec = self.function(fid)
        env = {name: resolve(value) for name, value in ENVIRONMENT}
        ingest = dict(self.notifications).get(self.ingest_prefix)
        if ingest is not None:
            env[Env.INGEST_DLQ_URL] = resolve(f"{ingest}-dlq:url")
        env[Env.INGEST_PREFIX] = self.ingest_prefix
        env[Env.POWERTOOLS_SERVICE_NAME] = spec.service_name
        env[Env.POWERTOOLS_METRICS_NAMESPACE] = METRICS_NAMESPACE
        env[Env.POWERTOOLS_LOG_LEVEL] = log_level
        for feature, _ in spec.feature_grants:
            env[FEATURE_ENV[feature]] = "true" if feature in features else "false"
        return env


# ----------------------------------------------------------------------------- permissions


@dataclass(frozen=True)
class Ref:
    """An ARN of the deployment, named here and resolved by each runtime.

    ``resource`` is one of :data:`RESOURCES` (or ``<queue id>-dlq``); ``suffix`` is appended
    to its ARN (``/jobs/*`` for objects of the bucket, ``/index/<name>`` for a table index).
    """

    resource: str
    suffix: str = ""


#: resources a Ref may name (besides ``<queue id>-dlq``)
RESOURCES = ("bucket", "table", "bus", "default-bus", "alert-topic", "topic-key", "sagemaker-training-job")


@dataclass(frozen=True)
class Condition:
    """One IAM condition: ``{operator: {key: values}}``."""

    operator: str
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Statement:
    sid: str
    actions: tuple[str, ...]
    resources: tuple[Ref, ...]
    conditions: tuple[Condition, ...] = ()
    effect: str = "Allow"


#: the principal tag that binds a training job's role to its one job folder
TRAINING_JOB_TAG = "trainguard-job"
#: sort/partition key prefix of the job items (trainguard.engine.store.pk)
JOB_PARTITION_PREFIX = "JOB#"


def idempotency_partition(function_id: str) -> str:
    """The partition of a function's Powertools idempotency records (its ``static_pk_value``)."""
    return f"idempotency#{function_id}"


_OBJECTS = Ref("bucket", f"/{INGEST_PREFIX}*")
_JOB_ITEMS = Condition("ForAllValues:StringLike", "dynamodb:LeadingKeys", (f"{JOB_PARTITION_PREFIX}*",))
#: a SageMaker training job its launcher handed to a trainguard job (trainguard.service.ownership)
_LAUNCHER_TAGGED = Condition("Null", f"aws:ResourceTag/{OWNER_TAG}", ("false",))

#: grant token → statements. ``{function}`` in a condition value is the function's id.
GRANTS: dict[str, tuple[Statement, ...]] = {
    "bucket:read": (
        Statement("ReadJobObjects", ("s3:GetObject",), (_OBJECTS,)),
        # without ListBucket, S3 answers a GET of a missing key with 403 AccessDenied instead of
        # 404 NoSuchKey: a deleted object would look like a permission error
        Statement("ListBucketSoMissingObjectsAre404", ("s3:ListBucket",), (Ref("bucket"),)),
    ),
    "bucket:write-report": (
        Statement(
            "WriteJobReport",
            ("s3:PutObject",),
            (Ref("bucket", f"/{INGEST_PREFIX}*/{REPORT.split('/')[0]}/*"),),
        ),
    ),
    "bucket:write-stop": (
        Statement("WriteStopSignal", ("s3:PutObject",), (Ref("bucket", f"/{INGEST_PREFIX}*/{STOP_SIGNAL}"),)),
    ),
    # job partitions only (JOB#<job>): state, buffered arrivals, outbox; no idempotency records
    "table:jobs": (
        Statement(
            "ReadWriteJobItems",
            ("dynamodb:Query", "dynamodb:PutItem", "dynamodb:BatchWriteItem"),
            (Ref("table"),),
            (_JOB_ITEMS,),
        ),
    ),
    "table:active-jobs": (
        Statement("QueryActiveJobs", ("dynamodb:Query",), (Ref("table", f"/index/{TABLE.indexes[0].name}"),)),
    ),
    # the function's own idempotency partition (Powertools: put, get on conflict, update, delete)
    "table:idempotency": (
        Statement(
            "OwnIdempotencyRecords",
            ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
            (Ref("table"),),
            (Condition("ForAllValues:StringEquals", "dynamodb:LeadingKeys", ("idempotency#{function}",)),),
        ),
    ),
    # a function's own versioned items in its own partition: read, conditional put (sagemaker_events)
    "table:own-items": (
        Statement(
            "OwnPartitionItems",
            ("dynamodb:GetItem", "dynamodb:PutItem"),
            (Ref("table"),),
            (Condition("ForAllValues:StringEquals", "dynamodb:LeadingKeys", ("idempotency#{function}",)),),
        ),
    ),
    "bus:put": (
        Statement(
            "PutStatusEvents",
            ("events:PutEvents",),
            (Ref("bus"),),
            (Condition("StringEquals", "events:source", (EVENT_SOURCE,)),),
        ),
    ),
    # the account's default bus, where SageMaker's own job events arrive (sagemaker_events)
    "default-bus:put": (
        Statement(
            "PutSageMakerShapedEvents",
            ("events:PutEvents",),
            (Ref("default-bus"),),
            (Condition("StringEquals", "events:source", (EVENT_SOURCE,)),),
        ),
    ),
    "topic:publish": (
        Statement("PublishAlerts", ("sns:Publish",), (Ref("alert-topic"),)),
        Statement("EncryptForAlertTopic", ("kms:GenerateDataKey", "kms:Decrypt"), (Ref("topic-key"),)),
    ),
    # trainguard.service.ownership: DescribeTrainingJob (status, ARN) and ListTags (the owner tag)
    "sagemaker:read-owned": (
        Statement(
            "DescribeLauncherTaggedTrainingJobs",
            ("sagemaker:DescribeTrainingJob",),
            (Ref("sagemaker-training-job", "/*"),),
            (_LAUNCHER_TAGGED,),
        ),
        Statement("ReadTrainingJobTags", ("sagemaker:ListTags",), (Ref("sagemaker-training-job", "/*"),)),
    ),
    "sagemaker:stop-owned": (
        Statement(
            "StopLauncherTaggedTrainingJobs",
            ("sagemaker:StopTrainingJob",),
            (Ref("sagemaker-training-job", "/*"),),
            (_LAUNCHER_TAGGED,),
        ),
    ),
}


def queue_grant(queue_id: str) -> tuple[str, tuple[Statement, ...]]:
    """``<queue>-dlq:send``: park a message in that queue's DLQ (with the reason)."""
    sid = "SendTo" + "".join(p[:1].upper() + p[1:] for p in queue_id.replace("_", "-").split("-")) + "Dlq"
    return f"{queue_id}-dlq:send", (Statement(sid, ("sqs:SendMessage",), (Ref(f"{queue_id}-dlq"),)),)


_TAG = f"${{aws:PrincipalTag/{TRAINING_JOB_TAG}}}"
#: the role is tagged with one job name: present, non-empty, without "/" (which would reach
#: into another job's folder, e.g. "a/steps" → jobs/a/steps/...)
_ONE_JOB_TAG = (
    Condition("StringLike", f"aws:PrincipalTag/{TRAINING_JOB_TAG}", ("?*",)),
    Condition("StringNotLike", f"aws:PrincipalTag/{TRAINING_JOB_TAG}", ("*/*",)),
)
#: what a training job's role attaches (exported by the stack as TrainingJobPolicyArn)
TRAINING_POLICY: tuple[Statement, ...] = (
    Statement(
        "WriteOwnJobObjects", ("s3:PutObject",), (Ref("bucket", f"/{INGEST_PREFIX}{_TAG}/*"),), _ONE_JOB_TAG
    ),
    Statement(
        "ReadOwnStopSignal",
        ("s3:GetObject",),
        (Ref("bucket", f"/{INGEST_PREFIX}{_TAG}/{STOP_SIGNAL}"),),
        _ONE_JOB_TAG,
    ),
    Statement(
        "NeverWriteControlOrReport",
        ("s3:PutObject",),
        (
            Ref("bucket", f"/{INGEST_PREFIX}*/{STOP_SIGNAL.split('/')[0]}/*"),
            Ref("bucket", f"/{INGEST_PREFIX}*/{REPORT.split('/')[0]}/*"),
        ),
        effect="Deny",
    ),
)


def policy_document(
    statements: tuple[Statement, ...] | list[Statement], resolve: Callable[[Ref], Any]
) -> dict[str, Any]:
    """An IAM policy document, each Ref turned into an ARN by ``resolve``."""
    out: list[dict[str, Any]] = []
    for st in statements:
        doc: dict[str, Any] = {
            "Sid": st.sid,
            "Effect": st.effect,
            "Action": list(st.actions),
            "Resource": [resolve(r) for r in st.resources],
        }
        if st.conditions:
            conditions: dict[str, dict[str, list[str]]] = {}
            for c in st.conditions:
                conditions.setdefault(c.operator, {})[c.key] = list(c.values)
            doc["Condition"] = conditions
        out.append(doc)
    return {"Version": "2012-10-17", "Statement": out}


# ----------------------------------------------------------------------------- environment

#: the CloudWatch namespace of the functions' EMF metrics (alarms and dashboard query it)
METRICS_NAMESPACE = "trainguard"
#: what every function's environment holds: variable → the value each runtime resolves
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    (Env.TABLE_NAME, "table:name"),
    (Env.BUS_NAME, "bus:name"),
    (Env.BUCKET_NAME, "bucket:name"),
    (Env.TOPIC_ARN, "alert-topic:arn"),
)
#: operator-enabled features (stack config) and the variable that tells a function about one
SAGEMAKER_STOP = "sagemaker_stop"
FEATURE_ENV = {SAGEMAKER_STOP: Env.SAGEMAKER_STOP}
FEATURES = tuple(FEATURE_ENV)


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
            grants=("bucket:read", "table:jobs", "bus:put", "ingest-dlq:send"),
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
            grants=("topic:publish", "table:idempotency"),
        ),
        FunctionSpec(
            "clock",
            handler="handler.handler",
            timeout_s=60,
            memory_mb=512,
            description="Every minute: rules that fire on missing data (StalledTrainingRule) check the time",
            grants=("bucket:read", "table:jobs", "table:active-jobs", "bus:put"),
            schedule_minutes=1,
        ),
        FunctionSpec(
            "report",
            handler="handler.handler",
            timeout_s=120,
            memory_mb=1024,
            description="Writes the HTML profiler report next to a finished job's data",
            grants=("bucket:read", "bucket:write-report"),
        ),
        FunctionSpec(
            "stop_job",
            handler="handler.handler",
            timeout_s=30,
            memory_mb=256,
            description="Stops a job whose rule fired: StopTrainingJob, or the cooperative stop signal",
            grants=("bucket:read", "bucket:write-stop", "table:jobs", "bus:put"),
            # the operator's choice (stack config sagemakerStop), never the job's
            feature_grants=((SAGEMAKER_STOP, ("sagemaker:read-owned", "sagemaker:stop-owned")),),
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
            grants=("table:own-items", "default-bus:put", "sagemaker:read-owned"),
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

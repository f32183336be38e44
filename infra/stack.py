"""TrainguardStack: the whole service in one stack, built from ``trainguard.wiring.WIRING``.

Every queue, function, trigger, bus rule and IAM grant comes from the wiring (the same
description the local mode runs); this module only decides *how* each is deployed:
encryption, TLS-only policies, DLQs, alarms and least-privilege statements per grant token.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, CfnOutput, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct
from trainguard.engine.events import EVENT_SOURCE
from trainguard.format.layout import REPORT, STOP_SIGNAL
from trainguard.rules.config import DEFAULT_RULES_ENV
from trainguard.wiring import TABLE, WIRING, FunctionSpec, TableSpec, Wiring

from infra.config import StackConfig
from infra.layer import ARCHITECTURES, layer_code
from infra.nag import acknowledge, acknowledge_wildcard_resources
from infra.observability import build_dashboard, build_rule_alarms, rule_alarm_topic
from infra.rule_layer import build_rule_layer, check_rule_layer

REPO = Path(__file__).resolve().parent.parent
FUNCTIONS = REPO / "functions"

RUNTIME = lambda_.Runtime.PYTHON_3_12
METRICS_NAMESPACE = "trainguard"
#: SNS message attribute (String.Array) that routes an alert to email and/or SMS subscribers
ACTIONS_ATTRIBUTE = "actions"
#: DynamoDB actions behind "table:readwrite" (TransactWriteItems is authorized per item by these)
TABLE_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
)
#: EventBridge → Lambda delivery: retries for throttling/permission failures, then the target DLQ
TARGET_RETRY_ATTEMPTS = 4
TARGET_MAX_EVENT_AGE = Duration.hours(2)
#: Lambda async invocation: retries after a function error, then the function's DLQ
ASYNC_RETRY_ATTEMPTS = 2
#: functions that parse rule configurations get the custom-rules layer (``ruleModules``):
#: evaluate and clock run rules; notify reads a rule's ``advice`` for the alert text
RULE_MODULE_FUNCTIONS = ("evaluate", "clock", "notify")
#: the variable ``trainguard.rules.plugins`` reads (kept literal: infra does not import it)
RULE_MODULES_ENV = "TRAINGUARD_RULE_MODULES"
#: an ingest queue whose oldest message is this old is falling behind
QUEUE_AGE_ALARM_S = 15 * 60
_PATTERN_KEYS = {
    "source": "source",
    "detail-type": "detail_type",
    "detail": "detail",
    "account": "account",
    "region": "region",
    "resources": "resources",
    "id": "id",
    "time": "time",
    "version": "version",
}

_LOG_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}


def pascal(name: str) -> str:
    """``stop_job`` → ``StopJob`` (construct ids)."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part)


def event_pattern(pattern: dict[str, Any]) -> events.EventPattern:
    unknown = set(pattern) - set(_PATTERN_KEYS)
    if unknown:
        raise ValueError(f"event pattern keys not supported by the stack: {sorted(unknown)}")
    return events.EventPattern(**{_PATTERN_KEYS[k]: v for k, v in pattern.items()})


#: grant tokens every stack knows; each queue also adds "<queue id>-dlq:send"
STATIC_GRANTS = (
    "bucket:read",
    "bucket:read-job",
    "bucket:write-report",
    "bucket:write-stop",
    "table:readwrite",
    "bus:put",
    "topic:publish",
    "sagemaker:stop",
    "sagemaker:read",
    "default-bus:put",
)


def grant_tokens(wiring: Wiring) -> set[str]:
    return {*STATIC_GRANTS, *(f"{q.id}-dlq:send" for q in wiring.queues)}


def validate_wiring(wiring: Wiring, functions_root: Path, grant_tokens: set[str]) -> None:
    """Fail synth on a wiring that cannot deploy (a dangling reference, an unknown grant)."""
    queue_ids = {q.id for q in wiring.queues}
    function_ids = {f.id for f in wiring.functions}
    problems: list[str] = []
    for prefix, qid in wiring.notifications:
        if qid not in queue_ids:
            problems.append(f"notification {prefix!r} → unknown queue {qid!r}")
    for f in wiring.functions:
        if f.queue is not None and f.queue not in queue_ids:
            problems.append(f"function {f.id}: unknown queue {f.queue!r}")
        if f.queue is not None:
            vis = wiring.queue(f.queue).visibility_timeout_s
            if vis < 6 * f.timeout_s:
                problems.append(f"queue {f.queue}: visibility {vis}s < 6 x {f.id} timeout ({f.timeout_s}s)")
        if f.max_concurrency is not None and not 2 <= f.max_concurrency <= 1000:
            problems.append(f"function {f.id}: max_concurrency must be 2..1000 (an SQS trigger's range)")
        for token in f.grants:
            if token not in grant_tokens:
                problems.append(f"function {f.id}: unknown grant {token!r} (known: {sorted(grant_tokens)})")
        if not (functions_root / f.id).is_dir():
            problems.append(f"function {f.id}: no code folder {functions_root / f.id}")
    for rule in wiring.bus_rules:
        if rule.target not in function_ids:
            problems.append(f"bus rule {rule.id}: unknown target {rule.target!r}")
    if problems:
        raise ValueError("invalid wiring:\n  " + "\n  ".join(problems))


class TrainguardStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        wiring: Wiring = WIRING,
        table: TableSpec = TABLE,
        functions_root: Path = FUNCTIONS,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        validate_wiring(wiring, functions_root, grant_tokens(wiring))
        # custom rules first: a module that does not load fails synth before anything is built
        rule_layer_dir = build_rule_layer(config.rule_modules) if config.rule_modules else None
        if rule_layer_dir is not None:
            check_rule_layer(rule_layer_dir, [m.module for m in config.rule_modules])
        self.config = config
        self.wiring = wiring
        self.architecture = ARCHITECTURES[config.architecture]
        #: every DLQ of the stack, by a readable name (each gets a depth alarm)
        self.dlqs: dict[str, sqs.Queue] = {}
        Tags.of(self).add("project", "trainguard")

        self.log_bucket, self.bucket = self._buckets()
        self.queues = self._queues()
        for prefix, qid in wiring.notifications:
            self.bucket.add_event_notification(
                s3.EventType.OBJECT_CREATED,
                s3n.SqsDestination(self.queues[qid]),
                s3.NotificationKeyFilter(prefix=prefix),
            )
        self.table_spec = table
        self.table = self._table()
        self.bus = self._bus()
        self.topic_key, self.alert_topic, self.ops_topic = self._topics()
        grants = self._grant_factories()
        assert set(grants) == grant_tokens(wiring), "STATIC_GRANTS and _grant_factories disagree"
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=layer_code(config.architecture, config.layer_dir),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[self.architecture],
            description="trainguard + numpy + pydantic + aws-lambda-powertools (CPython 3.12)",
        )
        #: the custom-rules layer (``ruleModules``), on RULE_MODULE_FUNCTIONS
        self.rule_layer: lambda_.LayerVersion | None = None
        if rule_layer_dir is not None:
            self.rule_layer = lambda_.LayerVersion(
                self,
                "RuleLayer",
                code=lambda_.Code.from_asset(str(rule_layer_dir), exclude=[".complete"]),
                compatible_runtimes=[RUNTIME],
                compatible_architectures=[self.architecture],
                description=f"trainguard custom rules: {', '.join(self._rule_module_names())}"[:256],
            )
        self.functions = {f.id: self._function(f, functions_root, grants) for f in wiring.functions}
        self.rules = self._bus_rules()
        self.schedules = self._schedules()
        self.training_policy = self._training_policy()
        self.alarms = self._alarms()
        #: rule outcomes users subscribe to (not ops: see infra/observability.py)
        self.rule_alarm_topic = rule_alarm_topic(self, self.topic_key, config.rule_alarm_emails)
        self.allow_cloudwatch_alarms(self.rule_alarm_topic)
        self.rule_alarms = build_rule_alarms(self, self.rule_alarm_topic, METRICS_NAMESPACE)
        self.dashboard = build_dashboard(self, METRICS_NAMESPACE)
        self._outputs()
        self._acknowledge_cdk_internals()

    # ------------------------------------------------------------------ storage

    def _buckets(self) -> tuple[s3.Bucket, s3.Bucket]:
        log_bucket = s3.Bucket(
            self,
            "AccessLogBucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            encryption=s3.BucketEncryption.S3_MANAGED,  # log delivery supports SSE-S3 only
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-access-logs",
                    expiration=Duration.days(365),
                    noncurrent_version_expiration=Duration.days(30),
                )
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            log_bucket,
            "S1",
            "This bucket is the server-access-log target of the data bucket; logging it too would "
            "need yet another bucket (or recurse). It is private, TLS-only, versioned and expires logs.",
        )
        rules = [
            s3.LifecycleRule(
                id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(7)
            ),
            s3.LifecycleRule(
                id="expire-noncurrent-versions", noncurrent_version_expiration=Duration.days(30)
            ),
        ]
        if self.config.data_retention_days:
            rules.append(
                s3.LifecycleRule(
                    id="expire-job-objects",
                    prefix=self.wiring.ingest_prefix,
                    expiration=Duration.days(self.config.data_retention_days),
                )
            )
        bucket = s3.Bucket(
            self,
            "DataBucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            # SSE-S3: training jobs write many small objects; SSE-KMS would add a KMS call (and
            # cost, and kms:GenerateDataKey in every training role) per object
            encryption=s3.BucketEncryption.S3_MANAGED,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=log_bucket,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=rules,
            removal_policy=RemovalPolicy.RETAIN,
        )
        return log_bucket, bucket

    def _dlq(self, construct_id: str, name: str, retention: Duration, user: str | None = None) -> sqs.Queue:
        dlq = sqs.Queue(
            self,
            construct_id,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=retention,
        )
        self.dlqs[name] = dlq
        if user is not None:
            # cdk-nag recognizes a DLQ only through another queue's RedrivePolicy
            acknowledge(dlq, "SQS3", f"This queue IS a dead-letter queue: {user}. It has no DLQ of its own.")
        return dlq

    def _queues(self) -> dict[str, sqs.Queue]:
        queues: dict[str, sqs.Queue] = {}
        for spec in self.wiring.queues:
            p = pascal(spec.id)
            dlq = self._dlq(f"{p}Dlq", f"{spec.id}-dlq", Duration.seconds(spec.dlq_retention_s))
            queues[spec.id] = sqs.Queue(
                self,
                f"{p}Queue",
                encryption=sqs.QueueEncryption.SQS_MANAGED,  # S3 notifications can deliver to SSE-SQS
                enforce_ssl=True,
                visibility_timeout=Duration.seconds(spec.visibility_timeout_s),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=spec.max_receive_count),
            )
        return queues

    def _table(self) -> ddb.Table:
        spec = self.table_spec
        table = ddb.Table(
            self,
            "StateTable",
            partition_key=ddb.Attribute(name=spec.partition_key, type=ddb.AttributeType.STRING),
            sort_key=ddb.Attribute(name=spec.sort_key, type=ddb.AttributeType.STRING),
            billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=ddb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=ddb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=spec.ttl_attribute,
            removal_policy=RemovalPolicy.RETAIN,
        )
        for index in spec.indexes:
            table.add_global_secondary_index(
                index_name=index.name,
                partition_key=ddb.Attribute(name=index.partition_key, type=ddb.AttributeType.STRING),
                sort_key=ddb.Attribute(name=index.sort_key, type=ddb.AttributeType.STRING),
                projection_type=ddb.ProjectionType.KEYS_ONLY,
            )
        return table

    # ------------------------------------------------------------------ events and alerts

    def _bus(self) -> events.EventBus:
        bus = events.EventBus(
            self,
            "Bus",
            event_bus_name=self.config.bus_name,
            description="trainguard rule status changes (SageMaker Debugger-compatible detail)",
        )
        bus.archive(
            "Archive",
            description="trainguard rule status changes, for replay",
            event_pattern=events.EventPattern(source=[EVENT_SOURCE]),
            retention=Duration.days(30),
        )
        return bus

    def _topics(self) -> tuple[kms.Key, sns.Topic, sns.Topic]:
        key = kms.Key(
            self,
            "TopicKey",
            description="trainguard: encrypts the alert, ops and rule-alarm SNS topics",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,  # encrypts only transient notifications
            pending_window=Duration.days(7),
        )
        # CloudWatch alarms publish to the encrypted ops topic (AWS's documented key statement)
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublishToEncryptedTopics",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )
        alert_topic = sns.Topic(
            self, "AlertTopic", display_name="trainguard alerts", master_key=key, enforce_ssl=True
        )
        # Alarm notifications carry no message attributes, so the alert subscriptions' filter
        # policies would drop them: alarms go to a separate, unfiltered ops topic.
        ops_topic = sns.Topic(
            self, "OpsTopic", display_name="trainguard ops alarms", master_key=key, enforce_ssl=True
        )
        self.allow_cloudwatch_alarms(ops_topic)
        for email in self.config.alert_emails:
            alert_topic.add_subscription(
                subs.EmailSubscription(email, filter_policy=_actions_filter("Email"))
            )
        for phone in self.config.alert_phones:
            alert_topic.add_subscription(subs.SmsSubscription(phone, filter_policy=_actions_filter("SMS")))
        for email in self.config.ops_emails:
            ops_topic.add_subscription(subs.EmailSubscription(email))
        return key, alert_topic, ops_topic

    def allow_cloudwatch_alarms(self, topic: sns.Topic) -> None:
        """Let this account's CloudWatch alarms (only) publish to ``topic``."""
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsOfThisAccount",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions={
                    "ArnLike": {
                        "aws:SourceArn": self.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    }
                },
            )
        )

    # ------------------------------------------------------------------ functions

    def _grant_factories(self) -> dict[str, Callable[[], list[iam.PolicyStatement]]]:
        """Grant token (``FunctionSpec.grants``) → least-privilege statements."""
        prefix = self.wiring.ingest_prefix
        factories: dict[str, Callable[[], list[iam.PolicyStatement]]] = {
            "bucket:read": lambda: [
                _allow("ReadJobObjects", ["s3:GetObject"], [self.bucket.arn_for_objects(f"{prefix}*")])
            ],
            # the report function: list and read one job's objects, write only its report/ folder
            "bucket:read-job": lambda: [
                _allow(
                    "ListJobObjects",
                    ["s3:ListBucket"],
                    [self.bucket.bucket_arn],
                    # listing without a Prefix (or outside the ingest prefix) is denied
                    conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}},
                ),
                _allow("ReadJobObjects", ["s3:GetObject"], [self.bucket.arn_for_objects(f"{prefix}*")]),
            ],
            "bucket:write-report": lambda: [
                _allow(
                    "WriteJobReport",
                    ["s3:PutObject"],
                    [self.bucket.arn_for_objects(f"{prefix}*/{REPORT.split('/')[0]}/*")],
                )
            ],
            "bucket:write-stop": lambda: [
                _allow(
                    "WriteStopSignal",
                    ["s3:PutObject"],
                    [self.bucket.arn_for_objects(f"{prefix}*/{STOP_SIGNAL}")],
                )
            ],
            "table:readwrite": lambda: [
                _allow(
                    "ReadWriteState",
                    list(TABLE_ACTIONS),
                    # the table and its named indexes (Query on the active-jobs index), no wildcard
                    [
                        self.table.table_arn,
                        *(f"{self.table.table_arn}/index/{i.name}" for i in self.table_spec.indexes),
                    ],
                )
            ],
            "bus:put": lambda: [_allow("PutStatusEvents", ["events:PutEvents"], [self.bus.event_bus_arn])],
            "topic:publish": lambda: [
                _allow("PublishAlerts", ["sns:Publish"], [self.alert_topic.topic_arn]),
                _allow(
                    "EncryptForAlertTopic", ["kms:GenerateDataKey", "kms:Decrypt"], [self.topic_key.key_arn]
                ),
            ],
            "sagemaker:read": lambda: [
                _allow(
                    "ReadTrainingJobsAndTags",
                    ["sagemaker:DescribeTrainingJob", "sagemaker:ListTags"],
                    [self.format_arn(service="sagemaker", resource="training-job", resource_name="*")],
                )
            ],
            "default-bus:put": lambda: [
                _allow(
                    "PutSageMakerShapedEvents",
                    ["events:PutEvents"],
                    [self.format_arn(service="events", resource="event-bus", resource_name="default")],
                )
            ],
            "sagemaker:stop": lambda: [
                _allow(
                    "StopTrainingJobs",
                    ["sagemaker:StopTrainingJob", "sagemaker:DescribeTrainingJob"],
                    [self.format_arn(service="sagemaker", resource="training-job", resource_name="*")],
                )
            ],
        }
        for qid in self.queues:
            dlq = self.dlqs[f"{qid}-dlq"]
            factories[f"{qid}-dlq:send"] = lambda dlq=dlq, qid=qid: [
                _allow(f"SendTo{pascal(qid)}Dlq", ["sqs:SendMessage"], [dlq.queue_arn])
            ]
        return factories

    def _environment(self, spec: FunctionSpec) -> dict[str, str]:
        env = {
            "TABLE_NAME": self.table.table_name,
            "BUS_NAME": self.bus.event_bus_name,
            "TOPIC_ARN": self.alert_topic.topic_arn,
            "BUCKET_NAME": self.bucket.bucket_name,
            "INGEST_PREFIX": self.wiring.ingest_prefix,
            "POWERTOOLS_SERVICE_NAME": spec.id,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            "LOG_LEVEL": self.config.log_level,
        }
        ingest = dict(self.wiring.notifications).get(self.wiring.ingest_prefix)
        if ingest is not None:
            env["INGEST_DLQ_URL"] = self.dlqs[f"{ingest}-dlq"].queue_url
        if self.rule_layer is not None and spec.id in RULE_MODULE_FUNCTIONS:
            env[RULE_MODULES_ENV] = ",".join(self._rule_module_names())
        if self.config.default_rules is not None and spec.id in RULE_MODULE_FUNCTIONS:
            env[DEFAULT_RULES_ENV] = self.config.default_rules  # the stack's defaultRules
        return env

    def _rule_module_names(self) -> list[str]:
        return list(dict.fromkeys(m.module for m in self.config.rule_modules))

    def _layers(self, spec: FunctionSpec) -> list[lambda_.ILayerVersion]:
        if self.rule_layer is not None and spec.id in RULE_MODULE_FUNCTIONS:
            return [self.layer, self.rule_layer]
        return [self.layer]

    def _function(
        self,
        spec: FunctionSpec,
        functions_root: Path,
        grants: dict[str, Callable[[], list[iam.PolicyStatement]]],
    ) -> lambda_.Function:
        p = pascal(spec.id)
        is_async = spec.queue is None  # invoked by EventBridge (bus rules, schedules)
        role = iam.Role(
            self,
            f"{p}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"trainguard {spec.id} function",
        )
        log_group = logs.LogGroup(
            self,
            f"{p}Logs",
            retention=_LOG_RETENTION[self.config.log_retention_days],
            removal_policy=RemovalPolicy.DESTROY,
        )
        statements = [
            _allow("WriteOwnLogs", ["logs:CreateLogStream", "logs:PutLogEvents"], [log_group.log_group_arn])
        ]
        for token in spec.grants:
            statements += grants[token]()
        policy = iam.Policy(self, f"{p}Grants", roles=[role], statements=statements)
        acknowledge_wildcard_resources(
            policy,
            self,
            [r for s in statements for r in s.resources],
            f"{spec.id}: object/ARN wildcards confined to one key pattern of one bucket, or to "
            "SageMaker training jobs (StopTrainingJob has no narrower resource than training-job/*; "
            "the job name arrives in the event). Each one is a grant token of trainguard.wiring.",
        )
        async_dlq = None
        if is_async:
            # cdk-nag sees this one as a DLQ (through the function's DeadLetterConfig)
            async_dlq = self._dlq(f"{p}AsyncDlq", f"{spec.id}-async-dlq", Duration.days(14))
        fn = lambda_.Function(
            self,
            f"{p}Function",
            description=spec.description,
            runtime=RUNTIME,
            architecture=self.architecture,
            handler=spec.handler,
            code=lambda_.Code.from_asset(
                str(functions_root / spec.id), exclude=["__pycache__", "*.pyc", "tests", ".pytest_cache"]
            ),
            layers=self._layers(spec),
            timeout=Duration.seconds(spec.timeout_s),
            memory_size=spec.memory_mb,
            environment=self._environment(spec),
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            role=role,
            dead_letter_queue=async_dlq,
            retry_attempts=ASYNC_RETRY_ATTEMPTS if is_async else None,
            max_event_age=Duration.hours(6) if is_async else None,
        )
        fn.node.add_dependency(policy)  # no invocation before it may write logs
        acknowledge(
            fn,
            "L1",
            "Pinned to python3.12 on purpose: the layer's binary wheels and .pyc files are built for "
            "CPython 3.12 (layers/build_layer.py PYTHON_VERSION); bump both together.",
        )
        acknowledge(
            role,
            "IAM5",
            "X-Ray (tracing ACTIVE) PutTraceSegments/PutTelemetryRecords support no resource-level "
            "permissions: Resource '*' is the only form. Added by CDK to this role's default policy.",
            "Resource::*",
        )
        if spec.queue is not None:
            fn.add_event_source(
                sources.SqsEventSource(
                    self.queues[spec.queue],
                    batch_size=spec.batch_size,
                    max_batching_window=(
                        Duration.seconds(spec.max_batching_window_s) if spec.max_batching_window_s else None
                    ),
                    report_batch_item_failures=True,
                    max_concurrency=spec.max_concurrency,
                )
            )
        return fn

    def _lambda_target(self, fid: str, dlq: sqs.Queue, max_age: Duration) -> targets.LambdaFunction:
        return targets.LambdaFunction(
            self.functions[fid],
            dead_letter_queue=dlq,
            retry_attempts=TARGET_RETRY_ATTEMPTS,
            max_event_age=max_age,
        )

    def _bus_rules(self) -> dict[str, events.Rule]:
        rules: dict[str, events.Rule] = {}
        for spec in self.wiring.bus_rules:
            p = pascal(spec.id)
            dlq = self._dlq(
                f"{p}RuleDlq",
                f"{spec.id}-rule-dlq",
                Duration.days(14),
                user=f"events of bus rule {spec.id} that EventBridge could not deliver to {spec.target}",
            )
            rules[spec.id] = events.Rule(
                self,
                f"{p}Rule",
                event_bus=self.bus,
                description=spec.description,
                event_pattern=event_pattern(spec.pattern),
                targets=[self._lambda_target(spec.target, dlq, TARGET_MAX_EVENT_AGE)],
            )
        return rules

    def _schedules(self) -> dict[str, events.Rule]:
        schedules: dict[str, events.Rule] = {}
        for spec in self.wiring.functions:
            if spec.schedule_minutes is None:
                continue
            p = pascal(spec.id)
            dlq = self._dlq(
                f"{p}ScheduleDlq",
                f"{spec.id}-schedule-dlq",
                Duration.days(14),
                user=f"clock ticks that EventBridge could not deliver to {spec.id}",
            )
            # a tick older than its period is superseded by the next one
            max_age = Duration.seconds(max(60, 60 * spec.schedule_minutes))
            schedules[spec.id] = events.Rule(
                self,
                f"{p}Schedule",
                description=f"Runs {spec.id} every {spec.schedule_minutes} min",
                schedule=events.Schedule.rate(Duration.minutes(spec.schedule_minutes)),
                targets=[self._lambda_target(spec.id, dlq, max_age)],
            )
        return schedules

    # ------------------------------------------------------------------ training side

    def _training_policy(self) -> iam.ManagedPolicy:
        """What a training job's role attaches: write its job objects, read its stop signal."""
        prefix = self.wiring.ingest_prefix
        tag = "${aws:PrincipalTag/trainguard-job-prefix}"
        untagged = {"Null": {"aws:PrincipalTag/trainguard-job-prefix": "true"}}
        objects = self.bucket.arn_for_objects(f"{prefix}*")
        objects_tagged = self.bucket.arn_for_objects(f"{prefix}{tag}*")
        stop = self.bucket.arn_for_objects(f"{prefix}*/{STOP_SIGNAL}")
        stop_tagged = self.bucket.arn_for_objects(f"{prefix}{tag}*/{STOP_SIGNAL}")
        control = self.bucket.arn_for_objects(f"{prefix}*/{STOP_SIGNAL.split('/')[0]}/*")
        report = self.bucket.arn_for_objects(f"{prefix}*/{REPORT.split('/')[0]}/*")
        policy = iam.ManagedPolicy(
            self,
            "TrainingJobPolicy",
            description=(
                "trainguard: attach to a training job's role. Write job objects under "
                f"{prefix}<job>/ (only <trainguard-job-prefix tag>* when the role has that tag), "
                "read the job's stop signal; never write control/ or report/."
            ),
            statements=[
                iam.PolicyStatement(
                    sid="WriteJobObjects", actions=["s3:PutObject"], resources=[objects], conditions=untagged
                ),
                iam.PolicyStatement(
                    sid="WriteJobObjectsUnderTaggedPrefix",
                    actions=["s3:PutObject"],
                    resources=[objects_tagged],
                ),
                iam.PolicyStatement(
                    sid="ReadStopSignal", actions=["s3:GetObject"], resources=[stop], conditions=untagged
                ),
                iam.PolicyStatement(
                    sid="ReadStopSignalUnderTaggedPrefix", actions=["s3:GetObject"], resources=[stop_tagged]
                ),
                iam.PolicyStatement(
                    sid="NeverWriteControlOrReport",
                    effect=iam.Effect.DENY,
                    actions=["s3:PutObject"],
                    resources=[control, report],
                ),
            ],
        )
        acknowledge_wildcard_resources(
            policy,
            self,
            [objects, objects_tagged, stop, stop_tagged],
            "Training jobs are named at run time: the policy is scoped to the ingest prefix of the one "
            "data bucket (or to the role's trainguard-job-prefix tag), PutObject/GetObject only, with an "
            "explicit Deny on control/ and report/ so a job cannot forge a stop signal or a report.",
        )
        return policy

    # ------------------------------------------------------------------ operations

    def _alarm(
        self, construct_id: str, metric: cw.Metric, description: str, threshold: float = 0
    ) -> cw.Alarm:
        alarm = cw.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.ops_topic))
        alarm.add_ok_action(cw_actions.SnsAction(self.ops_topic))
        return alarm

    def _alarms(self) -> dict[str, cw.Alarm]:
        alarms: dict[str, cw.Alarm] = {}
        for name, dlq in self.dlqs.items():
            alarms[name] = self._alarm(
                f"{pascal(name)}DepthAlarm",
                dlq.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum"
                ),
                f"trainguard: messages in the {name} dead-letter queue (inspect, fix, redrive)",
            )
        for fid, fn in self.functions.items():
            alarms[f"{fid}-errors"] = self._alarm(
                f"{pascal(fid)}ErrorsAlarm",
                fn.metric_errors(period=Duration.minutes(5), statistic="Sum"),
                f"trainguard: the {fid} function raised errors",
            )
        for qid, queue in self.queues.items():
            alarms[f"{qid}-age"] = self._alarm(
                f"{pascal(qid)}AgeAlarm",
                queue.metric_approximate_age_of_oldest_message(
                    period=Duration.minutes(5), statistic="Maximum"
                ),
                f"trainguard: the {qid} queue is falling behind "
                f"(oldest message > {QUEUE_AGE_ALARM_S // 60} min)",
                threshold=QUEUE_AGE_ALARM_S,
            )
        return alarms

    def _outputs(self) -> None:
        CfnOutput(
            self,
            "TrainingJobPolicyArn",
            value=self.training_policy.managed_policy_arn,
            description="Attach to a training job's role (write job objects, read its stop signal)",
            export_name=f"{self.stack_name}-TrainingJobPolicyArn",
        )
        CfnOutput(
            self,
            "DataBucketName",
            value=self.bucket.bucket_name,
            description="out_dir: s3://<this>/jobs/<job>",
        )
        CfnOutput(self, "EventBusName", value=self.bus.event_bus_name)
        CfnOutput(self, "EventBusArn", value=self.bus.event_bus_arn)
        CfnOutput(self, "AlertTopicArn", value=self.alert_topic.topic_arn)
        CfnOutput(self, "OpsTopicArn", value=self.ops_topic.topic_arn)
        CfnOutput(self, "StateTableName", value=self.table.table_name)
        for qid, queue in self.queues.items():
            CfnOutput(self, f"{pascal(qid)}QueueUrl", value=queue.queue_url)
            CfnOutput(self, f"{pascal(qid)}DlqUrl", value=self.dlqs[f"{qid}-dlq"].queue_url)

    def _acknowledge_cdk_internals(self) -> None:
        """The S3 → SQS notification is configured by a CDK-provided custom resource Lambda."""
        for child in self.node.children:
            if not child.node.id.startswith("BucketNotificationsHandler"):
                continue
            acknowledge(
                child,
                "IAM4",
                "CDK's BucketNotificationsHandler (a deploy-time custom resource that sets the S3 "
                "notification) uses the AWS-managed basic execution role for its logs.",
                "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
            )
            acknowledge(
                child,
                "IAM5",
                "CDK's BucketNotificationsHandler needs s3:PutBucketNotification; CDK grants it on '*'. "
                "It runs only during deployment.",
                "Resource::*",
            )


def _allow(
    sid: str, actions: list[str], resources: list[str], conditions: dict[str, Any] | None = None
) -> iam.PolicyStatement:
    return iam.PolicyStatement(sid=sid, actions=actions, resources=resources, conditions=conditions)


def _actions_filter(action: str) -> dict[str, sns.SubscriptionFilter]:
    return {ACTIONS_ATTRIBUTE: sns.SubscriptionFilter.string_filter(allowlist=[action])}

"""Infrastructure tests: the synthesized TrainguardStack template, cdk-nag and cfn-lint.

The app is synthesized once per module (with a stub layer folder, so no pip runs here; the
real layer build is tested in test_layer.py). Every assertion that walks the wiring proves
that the stack is built from ``trainguard.wiring.WIRING`` and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import Stack  # noqa: E402
from aws_cdk.assertions import Annotations, Match, Template  # noqa: E402
from moto.events.models import EventPattern  # noqa: E402
from trainguard.engine.events import DETAIL_TYPE, EVENT_SOURCE, JOB_DETAIL_TYPE, JobStatusDetail  # noqa: E402
from trainguard.format.layout import REPORT, STOP_SIGNAL  # noqa: E402
from trainguard.wiring import TABLE, WIRING  # noqa: E402

from infra.app import build_app  # noqa: E402
from infra.config import ConfigError, StackConfig  # noqa: E402
from infra.nag import nag_text  # noqa: E402
from infra.stack import TABLE_ACTIONS, TrainguardStack, grant_tokens, validate_wiring  # noqa: E402

EMAILS = ["alice@example.com", "bob@example.org"]
PHONE = "+15555550100"
OPS = "ops@example.com"
CONTEXT = {"alertEmails": ",".join(EMAILS), "alertPhones": PHONE, "opsEmails": OPS}
PREFIX = WIRING.ingest_prefix
REPORT_DIR = REPORT.split("/")[0]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layer")
    (root / "python" / "trainguard").mkdir(parents=True)
    (root / "python" / "trainguard" / "__init__.py").write_text("")
    return root


@pytest.fixture(scope="module")
def synth(
    layer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainguardStack, dict[str, Any]]:
    _app, stack = build_app(
        {**CONTEXT, "layerAsset": str(layer_dir)},
        outdir=str(tmp_path_factory.mktemp("cdk.out")),
        nag=False,
        config_dir=tmp_path_factory.mktemp("no-config"),  # a developer's trainguard.config.json is ignored
    )
    return stack, Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def stack(synth: tuple[TrainguardStack, dict[str, Any]]) -> TrainguardStack:
    return synth[0]


@pytest.fixture(scope="module")
def template(synth: tuple[TrainguardStack, dict[str, Any]]) -> dict[str, Any]:
    return synth[1]


def resources(template: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == rtype}


def lid(stack: Stack, construct: Any) -> str:
    """The logical id of an L2 construct's resource."""
    return str(stack.resolve(stack.get_logical_id(construct.node.default_child)))


def props(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    return template["Resources"][logical_id].get("Properties", {})


def statements_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["Statement"]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def iam_statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every statement of every identity policy (inline, managed, role-inline)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for logical_id, res in template["Resources"].items():
        p = res.get("Properties", {})
        if res["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            out += [(logical_id, s) for s in statements_of(p["PolicyDocument"])]
        if res["Type"] == "AWS::IAM::Role":
            for inline in p.get("Policies", []):
                out += [(logical_id, s) for s in statements_of(inline["PolicyDocument"])]
    return out


def grants_statements(template: dict[str, Any], stack: TrainguardStack, fid: str) -> list[dict[str, Any]]:
    policy_id = next(
        k
        for k, v in resources(template, "AWS::IAM::Policy").items()
        if {"Ref": lid(stack, stack.functions[fid].role)} in v["Properties"]["Roles"] and "Grants" in k
    )
    return statements_of(props(template, policy_id)["PolicyDocument"])


def getatt_arn(stack: Stack, construct: Any) -> dict[str, Any]:
    return {"Fn::GetAtt": [lid(stack, construct), "Arn"]}


def object_arn(stack: TrainguardStack, suffix: str) -> dict[str, Any]:
    return {"Fn::Join": ["", [getatt_arn(stack, stack.bucket), suffix]]}


# ----------------------------------------------------------------------------- one description


def test_every_wiring_function_is_deployed_as_specified(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    layer_ref = {"Ref": lid(stack, stack.layer)}
    assert set(stack.functions) == {f.id for f in WIRING.functions}
    for spec in WIRING.functions:
        p = props(template, lid(stack, stack.functions[spec.id]))
        assert p["Handler"] == spec.handler
        assert p["Timeout"] == spec.timeout_s
        assert p["MemorySize"] == spec.memory_mb
        assert p["Description"] == spec.description
        assert p["Runtime"] == "python3.12"
        assert p["Architectures"] == ["x86_64"]
        assert p["TracingConfig"] == {"Mode": "Active"}
        assert p["Layers"] == [layer_ref]
        env = p["Environment"]["Variables"]
        assert {
            "TABLE_NAME",
            "BUS_NAME",
            "TOPIC_ARN",
            "BUCKET_NAME",
            "INGEST_DLQ_URL",
            "POWERTOOLS_SERVICE_NAME",
            "POWERTOOLS_METRICS_NAMESPACE",
            "LOG_LEVEL",
        } <= set(env)
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "trainguard"
        assert env["LOG_LEVEL"] == "INFO"
        assert env["INGEST_PREFIX"] == PREFIX
        assert env["TABLE_NAME"] == {"Ref": lid(stack, stack.table)}
        assert env["INGEST_DLQ_URL"] == {"Ref": lid(stack, stack.dlqs["ingest-dlq"])}
        # a log group with retention, not the default never-expiring one
        log_group = p["LoggingConfig"]["LogGroup"]["Ref"]
        assert props(template, log_group)["RetentionInDays"] == 30
    ours = [
        k
        for k, v in resources(template, "AWS::Lambda::Function").items()
        if "python3.12" == v["Properties"].get("Runtime")
    ]
    assert len(ours) == len(WIRING.functions)


def test_layer_is_python312_for_the_function_architecture(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    p = props(template, lid(stack, stack.layer))
    assert p["CompatibleRuntimes"] == ["python3.12"]
    assert p["CompatibleArchitectures"] == ["x86_64"]


def test_queues_and_sqs_triggers_follow_wiring(stack: TrainguardStack, template: dict[str, Any]) -> None:
    assert set(stack.queues) == {q.id for q in WIRING.queues}
    for spec in WIRING.queues:
        p = props(template, lid(stack, stack.queues[spec.id]))
        assert p["VisibilityTimeout"] == spec.visibility_timeout_s
        assert p["RedrivePolicy"] == {
            "deadLetterTargetArn": getatt_arn(stack, stack.dlqs[f"{spec.id}-dlq"]),
            "maxReceiveCount": spec.max_receive_count,
        }
        assert (
            props(template, lid(stack, stack.dlqs[f"{spec.id}-dlq"]))["MessageRetentionPeriod"]
            == spec.dlq_retention_s
        )
    mappings = resources(template, "AWS::Lambda::EventSourceMapping")
    triggered = [f for f in WIRING.functions if f.queue]
    assert len(mappings) == len(triggered)
    for spec in triggered:
        (m,) = [
            v["Properties"]
            for v in mappings.values()
            if v["Properties"]["FunctionName"] == {"Ref": lid(stack, stack.functions[spec.id])}
        ]
        assert m["EventSourceArn"] == getatt_arn(stack, stack.queues[spec.queue])
        assert m["BatchSize"] == spec.batch_size
        assert m.get("MaximumBatchingWindowInSeconds", 0) == spec.max_batching_window_s
        assert m["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        if spec.max_concurrency:
            assert m["ScalingConfig"] == {"MaximumConcurrency": spec.max_concurrency}


def test_s3_notifications_follow_wiring(stack: TrainguardStack, template: dict[str, Any]) -> None:
    (notif,) = resources(template, "Custom::S3BucketNotifications").values()
    assert notif["Properties"]["BucketName"] == {"Ref": lid(stack, stack.bucket)}
    configs = notif["Properties"]["NotificationConfiguration"]["QueueConfigurations"]
    assert sorted(
        (c["Filter"]["Key"]["FilterRules"][0]["Value"], c["QueueArn"]["Fn::GetAtt"][0], tuple(c["Events"]))
        for c in configs
    ) == sorted(
        (prefix, lid(stack, stack.queues[qid]), ("s3:ObjectCreated:*",))
        for prefix, qid in WIRING.notifications
    )
    # S3 may send to the queue, and only from this bucket
    queue_policies = resources(template, "AWS::SQS::QueuePolicy").values()
    s3_allows = [
        s
        for qp in queue_policies
        for s in statements_of(qp["Properties"]["PolicyDocument"])
        if s.get("Principal") == {"Service": "s3.amazonaws.com"}
    ]
    assert s3_allows
    assert all(
        s["Condition"]["ArnLike"]["aws:SourceArn"] == getatt_arn(stack, stack.bucket) for s in s3_allows
    )


def test_bus_rules_match_wiring_patterns(stack: TrainguardStack, template: dict[str, Any]) -> None:
    rules = resources(template, "AWS::Events::Rule")
    bus_rules = {k: v for k, v in rules.items() if "EventBusName" in v["Properties"]}
    assert len(bus_rules) == len(WIRING.bus_rules)
    for spec in WIRING.bus_rules:
        p = props(template, lid(stack, stack.rules[spec.id]))
        assert p["EventPattern"] == spec.pattern
        assert p["EventBusName"] == {"Ref": lid(stack, stack.bus)}
        assert p["Description"] == spec.description
        (target,) = p["Targets"]
        assert target["Arn"] == getatt_arn(stack, stack.functions[spec.target])
        assert target["DeadLetterConfig"] == {"Arn": getatt_arn(stack, stack.dlqs[f"{spec.id}-rule-dlq"])}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    # EventBridge may invoke each target, from its rule only
    permissions = resources(template, "AWS::Lambda::Permission").values()
    for spec in WIRING.bus_rules:
        assert any(
            v["Properties"]["FunctionName"] == getatt_arn(stack, stack.functions[spec.target])
            and v["Properties"]["Principal"] == "events.amazonaws.com"
            and v["Properties"]["SourceArn"] == getatt_arn(stack, stack.rules[spec.id])
            for v in permissions
        )


def test_bus_is_named_and_archived(stack: TrainguardStack, template: dict[str, Any]) -> None:
    assert props(template, lid(stack, stack.bus))["Name"] == "trainguard"
    (archive,) = resources(template, "AWS::Events::Archive").values()
    assert archive["Properties"]["SourceArn"] == getatt_arn(stack, stack.bus)
    assert archive["Properties"]["EventPattern"] == {"source": ["trainguard"]}


# ----------------------------------------------------------------------------- DLQs and retries


def dlq_references(template: dict[str, Any]) -> set[str]:
    refs: set[str] = set()
    for res in template["Resources"].values():
        p = res.get("Properties", {})
        if res["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in p:
            refs.add(p["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0])
        if res["Type"] == "AWS::Lambda::Function" and "DeadLetterConfig" in p:
            refs.add(p["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0])
        if res["Type"] == "AWS::Events::Rule":
            for t in p.get("Targets", []):
                if "DeadLetterConfig" in t:
                    refs.add(t["DeadLetterConfig"]["Arn"]["Fn::GetAtt"][0])
    return refs


def test_every_queue_has_a_dlq_or_is_one(template: dict[str, Any]) -> None:
    dlqs = dlq_references(template)
    for logical_id, q in resources(template, "AWS::SQS::Queue").items():
        assert "RedrivePolicy" in q["Properties"] or logical_id in dlqs, logical_id


def test_every_async_target_has_a_dlq_and_retries(stack: TrainguardStack, template: dict[str, Any]) -> None:
    invoke_configs = resources(template, "AWS::Lambda::EventInvokeConfig").values()
    for spec in WIRING.functions:
        if spec.queue is not None:
            continue
        fn_id = lid(stack, stack.functions[spec.id])
        p = props(template, fn_id)
        assert p["DeadLetterConfig"]["TargetArn"] == getatt_arn(stack, stack.dlqs[f"{spec.id}-async-dlq"])
        (cfg,) = [
            c["Properties"] for c in invoke_configs if c["Properties"]["FunctionName"] == {"Ref": fn_id}
        ]
        assert cfg["MaximumRetryAttempts"] == 2
    for rule in resources(template, "AWS::Events::Rule").values():
        for target in rule["Properties"]["Targets"]:
            assert "DeadLetterConfig" in target and "RetryPolicy" in target


# ----------------------------------------------------------------------------- encryption and TLS


def test_encryption_everywhere(template: dict[str, Any]) -> None:
    for logical_id, b in resources(template, "AWS::S3::Bucket").items():
        rule = b["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
        assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms"), logical_id
    for logical_id, q in resources(template, "AWS::SQS::Queue").items():
        p = q["Properties"]
        assert p.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in p, logical_id
    topics = resources(template, "AWS::SNS::Topic")
    assert len(topics) == 3  # alerts, ops alarms, rule alarms
    for t in topics.values():
        assert "KmsMasterKeyId" in t["Properties"]
    for table in resources(template, "AWS::DynamoDB::Table").values():
        assert table["Properties"]["SSESpecification"]["SSEEnabled"] is True
    for key in resources(template, "AWS::KMS::Key").values():
        assert key["Properties"]["EnableKeyRotation"] is True


def _denies_insecure_transport(doc: dict[str, Any]) -> bool:
    return any(
        s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        for s in statements_of(doc)
    )


def test_tls_only_policies_on_buckets_queues_and_topics(template: dict[str, Any]) -> None:
    covered: set[str] = set()
    for bp in resources(template, "AWS::S3::BucketPolicy").values():
        if _denies_insecure_transport(bp["Properties"]["PolicyDocument"]):
            covered.add(bp["Properties"]["Bucket"]["Ref"])
    for qp in resources(template, "AWS::SQS::QueuePolicy").values():
        if _denies_insecure_transport(qp["Properties"]["PolicyDocument"]):
            covered |= {q["Ref"] for q in qp["Properties"]["Queues"]}
    for tp in resources(template, "AWS::SNS::TopicPolicy").values():
        if _denies_insecure_transport(tp["Properties"]["PolicyDocument"]):
            covered |= {t["Ref"] for t in tp["Properties"]["Topics"]}
    for rtype in ("AWS::S3::Bucket", "AWS::SQS::Queue", "AWS::SNS::Topic"):
        missing = set(resources(template, rtype)) - covered
        assert not missing, f"{rtype} without a TLS-only policy: {missing}"


def test_buckets_are_private_versioned_logged_and_expire(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    for b in resources(template, "AWS::S3::Bucket").values():
        p = b["Properties"]
        assert p["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        assert p["VersioningConfiguration"] == {"Status": "Enabled"}
        assert p["LifecycleConfiguration"]["Rules"]
    data = props(template, lid(stack, stack.bucket))
    assert data["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": lid(stack, stack.log_bucket)}
    rules = {r["Id"]: r for r in data["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-job-objects"]["Prefix"] == PREFIX
    assert rules["expire-job-objects"]["ExpirationInDays"] == 90
    assert rules["abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}


def test_state_table(stack: TrainguardStack, template: dict[str, Any]) -> None:
    p = props(template, lid(stack, stack.table))
    assert p["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert {"AttributeName": "pk", "AttributeType": "S"} in p["AttributeDefinitions"]
    assert {"AttributeName": "sk", "AttributeType": "S"} in p["AttributeDefinitions"]
    assert p["BillingMode"] == "PAY_PER_REQUEST"
    assert p["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert p["TimeToLiveSpecification"] == {"AttributeName": TABLE.ttl_attribute, "Enabled": True}
    assert p["GlobalSecondaryIndexes"] == [
        {
            "IndexName": index.name,
            "KeySchema": [
                {"AttributeName": index.partition_key, "KeyType": "HASH"},
                {"AttributeName": index.sort_key, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
        for index in TABLE.indexes
    ]
    assert template["Resources"][lid(stack, stack.table)]["DeletionPolicy"] == "Retain"


# ----------------------------------------------------------------------------- IAM


def test_no_wildcard_actions_and_no_star_resources_except_xray(template: dict[str, Any]) -> None:
    statements = iam_statements(template)
    assert statements
    for logical_id, s in statements:
        for action in as_list(s["Action"]):
            assert "*" not in action, (logical_id, action)
        if "*" in as_list(s.get("Resource", [])):
            if logical_id.startswith("BucketNotificationsHandler"):  # CDK's deploy-time custom resource
                assert as_list(s["Action"]) == ["s3:PutBucketNotification"]
                continue
            assert set(as_list(s["Action"])) == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}, (
                logical_id
            )


EXPECTED_GRANTS: dict[str, list[tuple[set[str], Any]]] = {
    # token: [(actions, resource builder(stack)), ...]
    "bucket:read": [({"s3:GetObject"}, lambda st: [object_arn(st, f"/{PREFIX}*")])],
    "bucket:read-job": [
        ({"s3:ListBucket"}, lambda st: [getatt_arn(st, st.bucket)]),  # prefix condition: see below
        ({"s3:GetObject"}, lambda st: [object_arn(st, f"/{PREFIX}*")]),
    ],
    "bucket:write-report": [({"s3:PutObject"}, lambda st: [object_arn(st, f"/{PREFIX}*/{REPORT_DIR}/*")])],
    "bucket:write-stop": [({"s3:PutObject"}, lambda st: [object_arn(st, f"/{PREFIX}*/{STOP_SIGNAL}")])],
    "table:readwrite": [
        (
            set(TABLE_ACTIONS),
            lambda st: [
                getatt_arn(st, st.table),
                *(
                    {"Fn::Join": ["", [getatt_arn(st, st.table), f"/index/{index.name}"]]}
                    for index in TABLE.indexes
                ),
            ],
        )
    ],
    "bus:put": [({"events:PutEvents"}, lambda st: [getatt_arn(st, st.bus)])],
    "topic:publish": [
        ({"sns:Publish"}, lambda st: [{"Ref": lid(st, st.alert_topic)}]),
        ({"kms:GenerateDataKey", "kms:Decrypt"}, lambda st: [getatt_arn(st, st.topic_key)]),
    ],
    "sagemaker:stop": [
        (
            {"sagemaker:StopTrainingJob", "sagemaker:DescribeTrainingJob"},
            lambda st: [
                {
                    "Fn::Join": [
                        "",
                        [
                            "arn:",
                            {"Ref": "AWS::Partition"},
                            ":sagemaker:",
                            {"Ref": "AWS::Region"},
                            ":",
                            {"Ref": "AWS::AccountId"},
                            ":training-job/*",
                        ],
                    ]
                }
            ],
        )
    ],
    "ingest-dlq:send": [({"sqs:SendMessage"}, lambda st: [getatt_arn(st, st.dlqs["ingest-dlq"])])],
    "sagemaker:read": [
        (
            {"sagemaker:DescribeTrainingJob", "sagemaker:ListTags"},
            lambda st: [_arn(":sagemaker:", ":training-job/*")],
        )
    ],
    "default-bus:put": [({"events:PutEvents"}, lambda st: [_arn(":events:", ":event-bus/default")])],
}


def _arn(service: str, resource: str) -> dict[str, Any]:
    """``arn:<partition><service><region>:<account><resource>`` as CDK's format_arn writes it."""
    return {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                service,
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                resource,
            ],
        ]
    }


def test_each_grant_token_maps_to_exactly_its_least_privilege_statements(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    for spec in WIRING.functions:
        granted: dict[str, list[Any]] = {}
        for s in grants_statements(template, stack, spec.id):
            assert s["Effect"] == "Allow"
            for action in as_list(s["Action"]):
                granted.setdefault(action, []).extend(as_list(s["Resource"]))
        expected: dict[str, list[Any]] = {
            "logs:CreateLogStream": [getatt_arn(stack, stack.functions[spec.id].log_group)],
            "logs:PutLogEvents": [getatt_arn(stack, stack.functions[spec.id].log_group)],
        }
        for token in spec.grants:
            for actions, build in EXPECTED_GRANTS[token]:
                for a in actions:
                    expected.setdefault(a, []).extend(build(stack))
        assert {a: sorted(map(json.dumps, r)) for a, r in granted.items()} == {
            a: sorted(map(json.dumps, r)) for a, r in expected.items()
        }, spec.id


def role_statements(template: dict[str, Any], stack: TrainguardStack, fid: str) -> list[dict[str, Any]]:
    """Every statement of every policy attached to the function's role (grants + CDK's default)."""
    role_ref = {"Ref": lid(stack, stack.functions[fid].role)}
    return [
        s
        for p in resources(template, "AWS::IAM::Policy").values()
        if role_ref in p["Properties"]["Roles"]
        for s in statements_of(p["Properties"]["PolicyDocument"])
    ]


def test_report_reads_job_objects_and_writes_only_its_report_folder(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    assert WIRING.function("report").grants == ("bucket:read-job", "bucket:write-report")
    logs = getatt_arn(stack, stack.functions["report"].log_group)
    assert grants_statements(template, stack, "report") == [
        {
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Effect": "Allow",
            "Resource": logs,
            "Sid": "WriteOwnLogs",
        },
        {
            "Action": "s3:ListBucket",
            # listing only under the ingest prefix (the report lists jobs/<job>/...)
            "Condition": {"StringLike": {"s3:prefix": [f"{PREFIX}*"]}},
            "Effect": "Allow",
            "Resource": getatt_arn(stack, stack.bucket),
            "Sid": "ListJobObjects",
        },
        {
            "Action": "s3:GetObject",
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}*"),
            "Sid": "ReadJobObjects",
        },
        {
            "Action": "s3:PutObject",
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}*/{REPORT_DIR}/*"),
            "Sid": "WriteJobReport",
        },
    ]
    assert REPORT.startswith(f"{REPORT_DIR}/")  # where trainguard.report writes it
    everything = role_statements(template, stack, "report")
    actions = {a for s in everything for a in as_list(s["Action"])}
    # no state table, bus, topics, SageMaker, deletes; the only write is the report
    assert not {a for a in actions if a.split(":")[0] in ("dynamodb", "events", "sns", "kms", "sagemaker")}
    assert {a for a in actions if a.startswith("s3:")} == {"s3:ListBucket", "s3:GetObject", "s3:PutObject"}
    # SQS: only failed async invocations into its own DLQ (CDK's default policy)
    sqs = [s for s in everything if any(a.startswith("sqs:") for a in as_list(s["Action"]))]
    assert [(s["Action"], s["Resource"]) for s in sqs] == [
        ("sqs:SendMessage", getatt_arn(stack, stack.dlqs["report-async-dlq"]))
    ]
    for s in everything:
        if "s3:PutObject" in as_list(s["Action"]):
            assert as_list(s["Resource"]) == [object_arn(stack, f"/{PREFIX}*/{REPORT_DIR}/*")]
    table = json.dumps(getatt_arn(stack, stack.table))
    assert table not in json.dumps(everything)


def test_clock_has_table_and_bus_grants_and_a_one_minute_schedule(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    spec = WIRING.function("clock")
    assert spec.schedule_minutes == 1
    assert spec.grants == ("table:readwrite", "bus:put")
    table = getatt_arn(stack, stack.table)
    assert grants_statements(template, stack, "clock") == [
        {
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
            "Effect": "Allow",
            "Resource": getatt_arn(stack, stack.functions["clock"].log_group),
            "Sid": "WriteOwnLogs",
        },
        {
            "Action": sorted(TABLE_ACTIONS),
            "Effect": "Allow",
            # the tick queries the active-jobs index
            "Resource": [table, {"Fn::Join": ["", [table, "/index/active-jobs"]]}],
            "Sid": "ReadWriteState",
        },
        {
            "Action": "events:PutEvents",
            "Effect": "Allow",
            "Resource": getatt_arn(stack, stack.bus),
            "Sid": "PutStatusEvents",
        },
    ]
    schedule = props(template, lid(stack, stack.schedules["clock"]))
    assert schedule["ScheduleExpression"] == "rate(1 minute)"
    assert schedule["State"] == "ENABLED"
    (target,) = schedule["Targets"]
    assert target["Arn"] == getatt_arn(stack, stack.functions["clock"])


def test_report_rule_matches_exactly_the_job_finished_event(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    spec = next(r for r in WIRING.bus_rules if r.id == "report")
    assert spec.target == "report"
    p = props(template, lid(stack, stack.rules["report"]))
    assert p["EventPattern"] == spec.pattern == {"source": [EVENT_SOURCE], "detail-type": [JOB_DETAIL_TYPE]}
    (target,) = p["Targets"]
    assert target["Arn"] == getatt_arn(stack, stack.functions["report"])
    detail = JobStatusDetail(
        EventId="job-1/finished",
        TrainingJobName="job-1",
        TrainingJobStatus="Completed",
        LastStep=99,
        StepsEvaluated=100,
        LastModifiedTime=1.0,
    ).model_dump(mode="json")
    envelope = {"version": "0", "account": "123456789012", "region": "us-east-1", "resources": []}
    finished = {**envelope, "source": EVENT_SOURCE, "detail-type": JOB_DETAIL_TYPE, "detail": detail}
    status = {
        **envelope,
        "source": EVENT_SOURCE,
        "detail-type": DETAIL_TYPE,
        "detail": {"RuleEvaluationStatus": "IssuesFound", "Actions": ["Email", "StopTraining"]},
    }
    # the deployed patterns, as EventBridge (moto's implementation) matches them
    matching = {
        rid: EventPattern.load(json.dumps(props(template, lid(stack, rule))["EventPattern"]))
        for rid, rule in stack.rules.items()
    }
    # sagemaker_events turns every status event into a SageMaker-shaped one
    assert {rid for rid, pat in matching.items() if pat.matches_event(finished)} == {
        "report",
        "sagemaker-events",
    }
    assert {rid for rid, pat in matching.items() if pat.matches_event(status)} == {
        "alert",
        "stop",
        "sagemaker-events",
    }


def test_function_roles_trust_only_lambda_and_use_no_managed_policies(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    for spec in WIRING.functions:
        role = props(template, lid(stack, stack.functions[spec.id].role))
        assert "ManagedPolicyArns" not in role
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "lambda.amazonaws.com"}


def test_training_job_policy_grants_only_its_prefix_and_stop_signal(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    p = props(template, lid(stack, stack.training_policy))
    by_sid = {s["Sid"]: s for s in statements_of(p["PolicyDocument"])}
    tag = "${aws:PrincipalTag/trainguard-job-prefix}"
    untagged = {"Null": {"aws:PrincipalTag/trainguard-job-prefix": "true"}}
    control = STOP_SIGNAL.split("/")[0]
    assert by_sid == {
        "WriteJobObjects": {
            "Action": "s3:PutObject",
            "Condition": untagged,
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}*"),
            "Sid": "WriteJobObjects",
        },
        "WriteJobObjectsUnderTaggedPrefix": {
            "Action": "s3:PutObject",
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}{tag}*"),
            "Sid": "WriteJobObjectsUnderTaggedPrefix",
        },
        "ReadStopSignal": {
            "Action": "s3:GetObject",
            "Condition": untagged,
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}*/{STOP_SIGNAL}"),
            "Sid": "ReadStopSignal",
        },
        "ReadStopSignalUnderTaggedPrefix": {
            "Action": "s3:GetObject",
            "Effect": "Allow",
            "Resource": object_arn(stack, f"/{PREFIX}{tag}*/{STOP_SIGNAL}"),
            "Sid": "ReadStopSignalUnderTaggedPrefix",
        },
        "NeverWriteControlOrReport": {
            "Action": "s3:PutObject",
            "Effect": "Deny",
            "Resource": [
                object_arn(stack, f"/{PREFIX}*/{control}/*"),
                object_arn(stack, f"/{PREFIX}*/report/*"),
            ],
            "Sid": "NeverWriteControlOrReport",
        },
    }
    # not attached to anything here: the training job's role attaches it
    for key in ("Roles", "Users", "Groups"):
        assert key not in p
    out = template["Outputs"]["TrainingJobPolicyArn"]
    assert out["Value"] == {"Ref": lid(stack, stack.training_policy)}
    assert out["Export"] == {"Name": f"{stack.stack_name}-TrainingJobPolicyArn"}


# ----------------------------------------------------------------------------- alerts and alarms


def test_alert_subscriptions_from_context_with_filter_policies(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    subs = [s["Properties"] for s in resources(template, "AWS::SNS::Subscription").values()]
    alert = {"Ref": lid(stack, stack.alert_topic)}
    ops = {"Ref": lid(stack, stack.ops_topic)}
    email = sorted(
        (s["Endpoint"], json.dumps(s["FilterPolicy"]))
        for s in subs
        if s["TopicArn"] == alert and s["Protocol"] == "email"
    )
    assert email == sorted((e, json.dumps({"actions": ["Email"]})) for e in EMAILS)
    sms = [
        (s["Endpoint"], s["FilterPolicy"]) for s in subs if s["TopicArn"] == alert and s["Protocol"] == "sms"
    ]
    assert sms == [(PHONE, {"actions": ["SMS"]})]
    for s in subs:
        if s["TopicArn"] == alert:
            assert s.get("FilterPolicyScope", "MessageAttributes") == "MessageAttributes"
    ops_subs = [s for s in subs if s["TopicArn"] == ops]
    assert [(s["Protocol"], s["Endpoint"]) for s in ops_subs] == [("email", OPS)]
    assert "FilterPolicy" not in ops_subs[0]  # alarm notifications carry no message attributes


def test_alarms_on_every_dlq_and_function_go_to_the_ops_topic(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    everything = [a["Properties"] for a in resources(template, "AWS::CloudWatch::Alarm").values()]
    ops = {"Ref": lid(stack, stack.ops_topic)}
    rule_topic = {"Ref": lid(stack, stack.rule_alarm_topic)}
    # the rule-outcome alarms (tests/infra/test_observability.py) go to their own topic
    assert all(a["AlarmActions"] in ([ops], [rule_topic]) for a in everything)
    alarms = [a for a in everything if a["AlarmActions"] == [ops]]
    assert len(alarms) == len(stack.alarms)
    for a in alarms:
        assert a["OKActions"] == [ops]
        assert a["ComparisonOperator"] == "GreaterThanThreshold"

    def dims(a: dict[str, Any]) -> list[Any]:
        return [d["Value"] for d in a.get("Dimensions", [])]

    dlq_ids = dlq_references(template)
    assert len(dlq_ids) == len(stack.dlqs)
    for dlq_id in dlq_ids:
        name_ref = {"Fn::GetAtt": [dlq_id, "QueueName"]}
        assert any(
            a["MetricName"] == "ApproximateNumberOfMessagesVisible"
            and a["Threshold"] == 0
            and dims(a) == [name_ref]
            for a in alarms
        ), dlq_id
    for spec in WIRING.functions:
        fn_ref = {"Ref": lid(stack, stack.functions[spec.id])}
        assert any(
            a["MetricName"] == "Errors"
            and a["Namespace"] == "AWS/Lambda"
            and a["Threshold"] == 0
            and dims(a) == [fn_ref]
            for a in alarms
        ), spec.id


def test_topics_let_only_cloudwatch_alarms_of_this_account_publish_to_ops(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    policies = resources(template, "AWS::SNS::TopicPolicy").values()
    (ops_policy,) = [
        p["Properties"]
        for p in policies
        if p["Properties"]["Topics"] == [{"Ref": lid(stack, stack.ops_topic)}]
    ]
    (cw,) = [s for s in statements_of(ops_policy["PolicyDocument"]) if s["Effect"] == "Allow"]
    assert cw["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert "aws:SourceArn" in cw["Condition"]["ArnLike"]
    key_policy = props(template, lid(stack, stack.topic_key))["KeyPolicy"]
    assert any(
        s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"} for s in statements_of(key_policy)
    )


# ----------------------------------------------------------------------------- schedule, wiring, config


def test_scheduled_functions_get_a_rate_rule_with_dlq(
    stack: TrainguardStack, template: dict[str, Any]
) -> None:
    scheduled = [f for f in WIRING.functions if f.schedule_minutes]
    rules = [r["Properties"] for r in resources(template, "AWS::Events::Rule").values()]
    assert len([r for r in rules if "ScheduleExpression" in r]) == len(scheduled)
    for spec in scheduled:
        n = spec.schedule_minutes
        p = props(template, lid(stack, stack.schedules[spec.id]))
        assert p["ScheduleExpression"] == f"rate({n} minute{'s' if n != 1 else ''})"
        assert "EventBusName" not in p  # schedules live on the default bus
        (target,) = p["Targets"]
        assert target["Arn"] == getatt_arn(stack, stack.functions[spec.id])
        assert target["DeadLetterConfig"] == {"Arn": getatt_arn(stack, stack.dlqs[f"{spec.id}-schedule-dlq"])}
        # a tick older than its period is superseded by the next one
        assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == max(60, 60 * n)


def test_wiring_validation_rejects_dangling_references(tmp_path: Path) -> None:
    (tmp_path / "evaluate").mkdir()
    bad = dataclasses.replace(
        WIRING,
        functions=(
            dataclasses.replace(WIRING.function("evaluate"), grants=("bucket:everything",), timeout_s=120),
        ),
        notifications=(("jobs/", "nope"),),
    )
    with pytest.raises(ValueError) as err:
        validate_wiring(bad, tmp_path, {"bucket:read"})
    text = str(err.value)
    assert "unknown grant 'bucket:everything'" in text
    assert "unknown queue 'nope'" in text
    assert "visibility 360s < 6 x evaluate timeout (120s)" in text
    assert "bus rule alert: unknown target 'notify'" in text


def test_every_wiring_grant_token_is_known_and_tested(stack: TrainguardStack) -> None:
    tokens = {t for f in WIRING.functions for t in f.grants}
    assert tokens <= grant_tokens(WIRING) == set(stack._grant_factories())
    assert grant_tokens(WIRING) <= set(EXPECTED_GRANTS)  # each has its expectation above


def test_config_merges_file_and_context_and_validates(tmp_path: Path) -> None:
    (tmp_path / "trainguard.config.json").write_text(
        json.dumps(
            {"alertEmails": ["file@example.com"], "alertPhones": "+15555550100", "logRetentionDays": 14}
        )
    )
    ctx = {"alertEmails": "a@example.com, b@example.com"}
    cfg = StackConfig.load(ctx.get, tmp_path, environ={})
    assert cfg.alert_emails == ("a@example.com", "b@example.com")  # context wins over the file
    assert cfg.ops_emails == cfg.alert_emails  # defaults to the alert recipients
    assert cfg.alert_phones == ("+15555550100",)
    assert cfg.log_retention_days == 14
    assert cfg.rule_alarm_emails == ()  # rule alarms have no default subscriber
    cfg = StackConfig.load({"ruleAlarmEmails": "ml@example.com"}.get, tmp_path, environ={})
    assert cfg.rule_alarm_emails == ("ml@example.com",)
    assert StackConfig.load({}.get, tmp_path / "none", environ={}) == StackConfig()
    for bad in (
        {"alertEmails": "not-an-email"},
        {"alertPhones": "5555550100"},
        {"architecture": "sparc"},
        {"logRetentionDays": "13"},
        {"ruleAlarmEmails": "nope"},
    ):
        with pytest.raises(ConfigError):
            StackConfig.load(bad.get, tmp_path / "none", environ={})


def test_example_config_file_is_valid(tmp_path: Path) -> None:
    shutil.copy(REPO / "trainguard.config.example.json", tmp_path / "trainguard.config.json")
    cfg = StackConfig.load({}.get, tmp_path, environ={})
    assert cfg.alert_emails and cfg.alert_phones and cfg.ops_emails


def test_nag_text_renders_like_cdk_nag(stack: TrainguardStack) -> None:
    assert (
        nag_text(stack, stack.bucket.arn_for_objects("jobs/*")) == f"<{lid(stack, stack.bucket)}.Arn>/jobs/*"
    )
    assert (
        nag_text(stack, "arn:aws:s3:::b/jobs/${aws:PrincipalTag/x}*")
        == "arn:aws:s3:::b/jobs/<aws:PrincipalTag/x>*"
    )


# ----------------------------------------------------------------------------- cdk-nag and cfn-lint


def test_cdk_nag_aws_solutions_has_zero_unacknowledged_findings(layer_dir: Path, tmp_path: Path) -> None:
    app, stack = build_app(
        {**CONTEXT, "layerAsset": str(layer_dir)}, outdir=str(tmp_path / "out"), nag=True, config_dir=tmp_path
    )
    app.synth()  # raises ValidationFailed on any unacknowledged error
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    (nag,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    assert nag["conclusion"] == "success"
    assert nag["violations"] == []  # warnings land here too
    for suppressed in nag.get("suppressedViolations", []):
        assert len(suppressed["reason"]) > 40, suppressed["ruleName"]  # each one justified
    annotations = Annotations.from_stack(stack)
    assert annotations.find_error("*", Match.any_value()) == []
    assert annotations.find_warning("*", Match.any_value()) == []


def test_cfn_lint_is_clean(template: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "Trainguard.template.json"
    path.write_text(json.dumps(template))
    exe = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert exe, "cfn-lint is a dev dependency"
    proc = subprocess.run([exe, "--ignore-checks", "W3005", "--", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""The local mode runs with the deployed permissions, and every AWS call is checked against them.

One local cloud runs the real handlers and a real hook: a job whose rule fires (notify and
stop_job run), a clean job that ends (the report function runs), an object that does not parse
(the DLQ), a notification of an object that no longer exists (a 404), and clock ticks. moto
enforces each function's IAM user; afterwards every recorded call is checked against the
*synthesized template's* policy for its principal with trainguard.local.iam_policy.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from template_policies import template_policies
from trainguard.local.iam import Account, Call, check_calls, requests_for, used_actions
from trainguard.local.runtime import LocalCloud
from trainguard.local.synthetic import SyntheticJob, noisy_decreasing
from trainguard.service import clients
from trainguard.wiring import WIRING

ACCOUNT = Account(
    index_partition_keys={
        i.name: i.partition_key for i in __import__("trainguard.wiring").wiring.TABLE.indexes
    }
)
HOOK_JOB = "hooked-1"

#: granted actions a local run cannot exercise, and why (each stays tested elsewhere)
NOT_EXERCISED_LOCALLY = {
    # SNS in moto calls no KMS; AWS makes the publisher encrypt for the topic's key
    "kms:GenerateDataKey": "SNS to a KMS-encrypted topic (AWS only)",
    "kms:Decrypt": "SNS to a KMS-encrypted topic (AWS only)",
    # Powertools reads a record on a conflict and deletes it when the function fails
    "dynamodb:GetItem": "idempotency conflict path",
    "dynamodb:DeleteItem": "idempotency failure path",
    # the operator's sagemakerStop: tests/service/test_actions.py (Stubber) and below
    "sagemaker:DescribeTrainingJob": "sagemakerStop",
    "sagemaker:ListTags": "sagemakerStop",
    "sagemaker:StopTrainingJob": "sagemakerStop",
}
#: per function: granted, needed, but only on a path this run does not take
NOT_EXERCISED_BY = {
    # a tick or a stop that finds buffered steps evaluates them; a SimilarAcrossRuns rule then
    # reads the other job's steps from S3 (a 403 there instead of a 404 would be misread)
    "clock": {"s3:GetObject", "s3:ListBucket"},
    # ... and it deletes the steps it consumed, and publishes an outbox entry an invocation left
    # unpublished (EvaluateService._after), which this run does not produce either
    "stop_job": {"s3:GetObject", "s3:ListBucket", "dynamodb:BatchWriteItem", "events:PutEvents"},
}


def _put(key: str, body: bytes) -> None:
    clients.client("s3").put_object(Bucket=CLOUD.resources.bucket, Key=key, Body=body)


CLOUD: LocalCloud


@pytest.fixture(scope="module")
def run():
    """Everything the pipeline does in one local cloud; yields the cloud after it went idle."""
    global CLOUD
    with LocalCloud(name="tg-iam", clock_speedup=120) as cloud:
        CLOUD = cloud
        faulty = SyntheticJob(
            "faulty-iam",
            steps=list(range(0, 20, 2)),
            nan_steps=frozenset({10}),
            rules=[
                {
                    "RuleConfigurationName": "nan-check",
                    "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
                    "Actions": ["Email", "SMS", "StopTraining"],
                }
            ],
            loss=noisy_decreasing(1),
            ended=False,
        )
        clean = SyntheticJob("clean-iam", steps=list(range(0, 10)), loss=noisy_decreasing(2))
        # a job that stops writing: the clock's tick finds it stalled and publishes the change
        stall = [
            {
                "RuleConfigurationName": "stall",
                "RuleParameters": {"rule_to_invoke": "StalledTrainingRule", "threshold": "1"},
            }
        ]
        stalled = SyntheticJob("stalled-iam", steps=[0, 1], rules=stall, ended=False)
        for job in (faulty, clean, stalled):
            for rel, body in job.objects().items():
                _put(f"jobs/{job.job}/{rel}", body)
        _put("jobs/clean-iam/steps/000000000099/worker-00000.safetensors", b"not a step object")
        # a notification of an object that is gone by the time evaluate reads it
        record = {
            "Records": [
                {
                    "eventSource": "aws:s3",
                    "eventName": "ObjectCreated:Put",
                    "s3": {
                        "bucket": {"name": cloud.resources.bucket},
                        "object": {"key": "jobs/clean-iam/steps/000000000098/worker-00000.safetensors"},
                    },
                }
            ]
        }
        clients.client("sqs").send_message(
            QueueUrl=cloud.resources.queues["ingest"], MessageBody=json.dumps(record)
        )
        _hook_job(cloud)
        assert cloud.wait_idle(60)
        deadline = time.monotonic() + 60  # clock ticks every 0.5 s (120x speed-up)
        while time.monotonic() < deadline and not any(
            e["detail"].get("TrainingJobName") == "stalled-iam"
            and e["detail"].get("RuleEvaluationStatus") == "IssuesFound"
            for e in cloud.events
        ):
            time.sleep(0.2)
        assert cloud.wait_idle(30)
        yield cloud


def _hook_job(cloud: LocalCloud) -> None:
    """A real hook, in this process, with the training job's credentials (its uploader thread)."""
    import os

    import trainguard

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update({k: v for k, v in cloud.training_env(HOOK_JOB).items() if k.startswith("AWS_")})
    try:
        hook = trainguard.Hook(
            f"s3://{cloud.resources.bucket}/jobs/{HOOK_JOB}",
            rules=[
                {
                    "RuleConfigurationName": "LossNotDecreasing",
                    "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"},
                }
            ],
            raise_on_stop=False,
            stop_check_interval_s=0.05,
            profiler=False,
        )
        with hook:
            for step in range(5):
                hook.save_scalar("loss", 1.0 / (step + 1), step=step, collections=["losses"])
                hook.save_tensor("w", np.ones(4, np.float32) * step, step=step, collections=["weights"])
                time.sleep(0.05)
                _ = hook.should_stop
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


def test_every_call_is_one_the_template_allows(run, synthesized):
    stack, template = synthesized
    calls = run.authority.recorder.calls
    principals = {c.principal for c in calls}
    assert {"evaluate", "notify", "stop_job", "report", "clock", f"job:{HOOK_JOB}"} <= principals, principals
    mine = [c for c in calls if c.principal != "operator"]  # the runtime's own delivery calls
    denials = check_calls(
        mine,
        template_policies(template, stack, run),
        account=ACCOUNT,
        principal_context=run.authority.principal_context(),
        # trainguard.hook.storage.S3Store.exists reads AWS's 403 for a missing stop signal as
        # "no signal yet" (the training policy grants no ListBucket, on purpose)
        missing_as_403_ok={f"job:{HOOK_JOB}"},
    )
    assert not denials, "\n".join(map(str, denials))
    assert not [c for c in mine if c.error_code in ("AccessDenied", "AccessDeniedException", "403")]
    assert not run.errors, run.errors


def test_what_the_run_exercised(run):
    calls = run.authority.recorder.calls
    operations = {(c.principal, c.operation) for c in calls}
    # the hook wrote its objects and polled its own stop signal
    assert (f"job:{HOOK_JOB}", "PutObject") in operations
    assert (f"job:{HOOK_JOB}", "HeadObject") in operations or (f"job:{HOOK_JOB}", "GetObject") in operations
    # the missing object was a 404 for evaluate (it may list the bucket), and a reason in the DLQ
    missing = [c for c in run.authority.recorder.of("evaluate") if c.status == 404]
    assert missing and all(c.error_code in ("NoSuchKey", "404") for c in missing)
    assert ("evaluate", "SendMessage") in operations
    assert ("report", "PutObject") in operations and ("stop_job", "PutObject") in operations
    # the stalled job was caught by a tick, which published its status change
    assert ("clock", "PutEvents") in operations


def test_each_granted_action_is_one_the_code_calls(run):
    """Least privilege: nothing granted that the handlers never use (or a reason why)."""
    for fn in WIRING.functions:
        granted = {a for st in WIRING.statements(fn.id, frozenset({"sagemaker_stop"})) for a in st.actions}
        used = used_actions(run.authority.recorder.of(fn.id), ACCOUNT)
        unused = granted - used - set(NOT_EXERCISED_LOCALLY) - NOT_EXERCISED_BY.get(fn.id, set())
        assert not unused, f"{fn.id} is granted {sorted(unused)} but never calls it"


def test_moto_denies_what_a_function_is_not_granted(run):
    """The enforcement is real: notify's identity may not read job objects or write job state."""
    from botocore.exceptions import ClientError

    notify = run.authority.credentials("notify")
    with clients.acting_as(notify):
        with pytest.raises(ClientError) as denied:
            clients.client("s3").get_object(Bucket=run.resources.bucket, Key="jobs/clean-iam/manifest.json")
        assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403")
        with pytest.raises(ClientError):
            clients.client("sqs").send_message(QueueUrl=run.resources.dlqs["ingest"], MessageBody="x")


def test_a_training_job_can_write_only_its_own_folder(run):
    from botocore.exceptions import ClientError

    creds = run.authority.training_job("run-1")
    with clients.acting_as(creds):
        s3 = clients.client("s3")
        s3.put_object(Bucket=run.resources.bucket, Key="jobs/run-1/manifest.json", Body=b"{}")
        for key in ("jobs/run-10/manifest.json", "jobs/other/manifest.json", "jobs/run-1/control/stop.json"):
            with pytest.raises(ClientError):
                s3.put_object(Bucket=run.resources.bucket, Key=key, Body=b"{}")


# ----------------------------------------------------------------------------- denials fail tests


def _call(principal, service, operation, params, status=200, error=""):
    return Call(principal, service, operation, params, "us-east-1", status, error)


def test_calls_aws_would_deny_are_reported(run, synthesized):
    stack, template = synthesized
    policies = template_policies(template, stack, run)
    table, bucket = run.resources.table, run.resources.bucket
    denied = [
        # notify rewriting a job's state
        _call(
            "notify",
            "dynamodb",
            "PutItem",
            {"TableName": table, "Item": {"pk": {"S": "JOB#a"}, "sk": {"S": "STATE"}}},
        ),
        # evaluate writing another service's idempotency records
        _call(
            "evaluate",
            "dynamodb",
            "PutItem",
            {"TableName": table, "Item": {"pk": {"S": "idempotency#notify"}}},
        ),
        # a batch delete that strays out of job partitions (ForAllValues over every key)
        _call(
            "clock",
            "dynamodb",
            "BatchWriteItem",
            {
                "RequestItems": {
                    table: [
                        {"DeleteRequest": {"Key": {"pk": {"S": "JOB#a"}}}},
                        {"DeleteRequest": {"Key": {"pk": {"S": "idempotency#notify"}}}},
                    ]
                }
            },
        ),
        # evaluate scanning the whole table (the CLI's list_jobs)
        _call("evaluate", "dynamodb", "Scan", {"TableName": table}),
        # an event that pretends to be from another source
        _call(
            "evaluate",
            "events",
            "PutEvents",
            {"Entries": [{"Source": "aws.sagemaker", "EventBusName": run.resources.bus}]},
        ),
        # the report function writing outside report/
        _call("report", "s3", "PutObject", {"Bucket": bucket, "Key": "jobs/a/control/stop.json"}),
        # a training job reading another job's stop signal, or any of its data
        _call(
            f"job:{HOOK_JOB}", "s3", "GetObject", {"Bucket": bucket, "Key": "jobs/other/control/stop.json"}
        ),
        _call(
            f"job:{HOOK_JOB}", "s3", "GetObject", {"Bucket": bucket, "Key": f"jobs/{HOOK_JOB}/manifest.json"}
        ),
        # the hook's HEAD of a missing stop signal is a 403 in AWS (no ListBucket): allowed as
        # GetObject, and the 404 moto gave needs ListBucket, which the job does not have
        _call(
            f"job:{HOOK_JOB}",
            "s3",
            "HeadObject",
            {"Bucket": bucket, "Key": f"jobs/{HOOK_JOB}/control/stop.json"},
            404,
            "404",
        ),
    ]
    denials = check_calls(
        denied, policies, account=ACCOUNT, principal_context=run.authority.principal_context()
    )
    assert {id(d.call) for d in denials} == {id(c) for c in denied}, "\n".join(map(str, denials))


def test_sagemaker_stop_is_allowed_only_on_a_launcher_tagged_job(run, synthesized):
    stack, template = synthesized
    policies = template_policies(template, stack, run)
    arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/sm-job-7"
    calls = [
        _call("stop_job", "sagemaker", "DescribeTrainingJob", {"TrainingJobName": "sm-job-7"}),
        _call("stop_job", "sagemaker", "ListTags", {"ResourceArn": arn}),
        _call("stop_job", "sagemaker", "StopTrainingJob", {"TrainingJobName": "SM-job-7"}),
    ]
    tagged = Account(resource_tags={arn: {"trainguard:job": "faulty-iam"}})
    assert not check_calls(calls, policies, account=tagged)
    untagged = check_calls(calls, policies, account=Account())
    assert {d.request.action for d in untagged} == {
        "sagemaker:DescribeTrainingJob",
        "sagemaker:StopTrainingJob",
    }
    # only stop_job may, and only when the operator enabled it (the template here has it)
    assert check_calls(
        [_call("evaluate", "sagemaker", "StopTrainingJob", {"TrainingJobName": "sm-job-7"})],
        policies,
        account=tagged,
    )


def test_transactions_are_authorized_item_by_item():
    call = _call(
        "x",
        "dynamodb",
        "TransactWriteItems",
        {
            "TransactItems": [
                {"Put": {"TableName": "t", "Item": {"pk": {"S": "JOB#a"}}}},
                {"ConditionCheck": {"TableName": "t", "Key": {"pk": {"S": "JOB#a"}}}},
            ]
        },
    )
    assert [r.action for r in requests_for(call)] == ["dynamodb:PutItem", "dynamodb:ConditionCheckItem"]
    assert all(r.context == {"dynamodb:LeadingKeys": ("JOB#a",)} for r in requests_for(call))

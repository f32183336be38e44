"""The whole pipeline in local mode: moto server on 127.0.0.1, the real handlers.

S3 PUT → S3 notification → SQS → evaluate handler → DynamoDB → EventBridge → SQS target
→ notify / stop_job handlers → SNS and the stop signal.
"""

from __future__ import annotations

import json
import time

import pytest
from trainguard.local.runtime import LocalCloud
from trainguard.local.synthetic import SyntheticJob, noisy_decreasing
from trainguard.service import clients


@pytest.fixture(scope="module")
def cloud():
    with LocalCloud(name="tg-test") as c:
        yield c


def put(cloud: LocalCloud, job: str, objects: dict[str, bytes]) -> None:
    s3 = clients.client("s3")
    for rel, body in objects.items():
        s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/{job}/{rel}", Body=body)


def job_events(cloud: LocalCloud, job: str) -> list[dict]:
    return [
        e["detail"]
        for e in cloud.events
        if e["detail"]["TrainingJobName"] == job and "RuleName" in e["detail"]
    ]


def test_faulty_job_is_alerted_once_and_stopped(cloud):
    rules = [
        {
            "RuleConfigurationName": "nan-check",
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            "Actions": ["Email", "SMS", "StopTraining"],
        },
        {
            "RuleConfigurationName": "LossNotDecreasing",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"},
        },
    ]
    job = SyntheticJob(
        "faulty-1",
        steps=list(range(0, 60, 2)),
        nan_steps=frozenset({30}),
        rules=rules,
        loss=noisy_decreasing(1),
        ended=False,
    )
    put(cloud, job.job, job.objects())
    assert cloud.wait_idle(30)
    details = job_events(cloud, job.job)
    fired = [d for d in details if d["RuleEvaluationStatus"] == "IssuesFound"]
    assert [(d["RuleConfigurationName"], d["Step"]) for d in fired] == [("nan-check", 30)]
    assert "NaN" in fired[0]["StatusDetails"] or "nan" in fired[0]["StatusDetails"].lower()
    # SageMaker-shaped fields, for Lambdas written against SageMaker events
    for key in (
        "TrainingJobName",
        "RuleConfigurationName",
        "RuleEvaluationStatus",
        "StatusDetails",
        "LastModifiedTime",
    ):
        assert key in fired[0]
    assert {e["RuleConfigurationName"] for e in fired[0]["DebugRuleEvaluationStatuses"]} == {
        "nan-check",
        "LossNotDecreasing",
    }

    sent = [n for n in cloud.sent_notifications() if "faulty-1" in n["subject"]]
    assert len(sent) == 1, "one notification per transition, never one per step"
    assert set(sent[0]["channels"]) == {"Email", "SMS"}
    assert "Step:          30" in sent[0]["email"] and "What to do" in sent[0]["email"]
    assert len(sent[0]["sms"]) <= 140

    stop = clients.client("s3").get_object(
        Bucket=cloud.resources.bucket, Key="jobs/faulty-1/control/stop.json"
    )
    signal = json.loads(stop["Body"].read())
    assert signal["job"] == "faulty-1" and signal["rule"] == "nan-check"
    # the other rule became Stopping (the job is being stopped)
    assert any(
        d["RuleConfigurationName"] == "LossNotDecreasing" and d["RuleEvaluationStatus"] == "Stopping"
        for d in details
    )


def test_clean_job_ends_with_no_issues(cloud):
    train = noisy_decreasing(2)
    job = SyntheticJob(
        "clean-1",
        steps=list(range(0, 80, 2)),
        loss=train,
        # Overfit compares validation with training: without EVAL losses it cannot pass
        eval_loss=lambda s, w: 1.02 * train(s, w) if s % 10 == 0 else None,
    )
    put(cloud, job.job, job.objects())
    assert cloud.wait_idle(30)
    from trainguard.service.state_store import StateStore

    state, _ = StateStore(cloud.resources.table, clients.client("dynamodb")).load_state("clean-1")
    assert state.finished
    assert {r.name: r.status for r in state.rules} == {
        "LossNotDecreasing": "NoIssuesFound",
        "VanishingGradient": "NoIssuesFound",
        "ExplodingTensor": "NoIssuesFound",
        "DeadRelu": "NoIssuesFound",
        "Overfit": "NoIssuesFound",
        "LossDivergence": "NoIssuesFound",
    }
    assert not [n for n in cloud.sent_notifications() if "clean-1" in n["subject"]]
    # the job-finished event ran the report function: the report lies next to the job's data
    report = clients.client("s3").get_object(
        Bucket=cloud.resources.bucket, Key="jobs/clean-1/report/profiler-report.html"
    )
    assert report["ContentType"].startswith("text/html")
    assert b"<html" in report["Body"].read(2000).lower()


def test_bad_input_goes_to_the_dlq_with_a_reason_and_other_jobs_go_on(cloud):
    s3 = clients.client("s3")
    bucket = cloud.resources.bucket
    # rules that can judge a 3-step job (LossNotDecreasing and Overfit need more: they would
    # end Error, saying so, rather than pass)
    checkable = [
        {"RuleConfigurationName": n, "RuleParameters": {"rule_to_invoke": n}}
        for n in ("VanishingGradient", "ExplodingTensor", "DeadRelu")
    ]
    good = SyntheticJob("good-1", steps=[0, 1, 2], loss=lambda s, w: 1.0 - 0.1 * s, rules=checkable)
    objects = good.objects()
    # a truncated object at a valid key of another job, a hostile header, a key outside the layout
    s3.put_object(
        Bucket=bucket, Key="jobs/bad-1/steps/000000000001/worker-00000.safetensors", Body=b"\x10\x00"
    )
    s3.put_object(
        Bucket=bucket,
        Key="jobs/bad-1/steps/000000000002/worker-00000.safetensors",
        Body=(10**12).to_bytes(8, "little") + b"{}",
    )
    s3.put_object(Bucket=bucket, Key="jobs/bad-1/../../etc/passwd", Body=b"x")
    s3.put_object(
        Bucket=bucket, Key="jobs/bad-1/manifest.json", Body=b'{"format": "trainguard.manifest/1", "job": 5}'
    )
    put(cloud, "good-1", objects)
    assert cloud.wait_idle(30)
    reasons = []
    for _ in range(5):
        reasons += [m["MessageAttributes"]["reason"]["StringValue"] for m in cloud.dlq_messages()]
        time.sleep(0.1)
    joined = "\n".join(reasons)
    assert "truncated" in joined or "8-byte header length" in joined
    assert "declared header length" in joined
    assert "outside the trainguard layout" in joined
    assert "manifest.json" in joined
    from trainguard.service.state_store import StateStore

    state, _ = StateStore(cloud.resources.table, clients.client("dynamodb")).load_state("good-1")
    assert state.finished and all(r.status == "NoIssuesFound" for r in state.rules)


def test_unknown_rule_and_bad_parameter_are_error_statuses(cloud):
    rules = [
        {"RuleConfigurationName": "mystery", "RuleParameters": {"rule_to_invoke": "NoSuchRule"}},
        {
            "RuleConfigurationName": "typo",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "ten"},
        },
        {"RuleConfigurationName": "fine", "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}},
    ]
    job = SyntheticJob("cfg-1", steps=[0, 1, 2], rules=rules)
    put(cloud, job.job, job.objects())
    assert cloud.wait_idle(30)
    final = {}
    for d in job_events(cloud, "cfg-1"):
        final[d["RuleConfigurationName"]] = d
    assert final["mystery"]["RuleEvaluationStatus"] == "Error"
    assert "unknown rule 'NoSuchRule'" in final["mystery"]["StatusDetails"]
    assert final["typo"]["RuleEvaluationStatus"] == "Error"
    assert "num_steps" in final["typo"]["StatusDetails"]
    assert final["fine"]["RuleEvaluationStatus"] == "NoIssuesFound"

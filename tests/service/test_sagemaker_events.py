"""SageMaker-shaped events drive AWS's documented auto-stop Lambda to exactly one stop.

The trainguard events are real: a job's objects go through the evaluate service (moto), and
its rule-status events are captured from the bus as EventBridge delivers them. Each is
converted by the sagemaker_events function into a ``SageMaker Training Job State Change``
event on the default bus, where a rule with the documented pattern (``source`` changed to
``trainguard``) delivers it to a queue. The documented Lambda's logic then runs on each
delivered event against a SageMaker client whose StopTrainingJob is botocore's Stubber.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from trainguard.engine.events import DETAIL_TYPE, JOB_DETAIL_TYPE
from trainguard.engine.sagemaker_events import SAGEMAKER_DETAIL_TYPE, SageMakerTrainingJobState, iso_utc
from trainguard.local.synthetic import SyntheticJob
from trainguard.service.ownership import OWNER_TAG
from trainguard.service.sagemaker_events import (
    PARTITION,
    ViewStore,
    convert,
    eventbridge_publisher,
    sagemaker_ownership,
)
from trainguard.wiring import WIRING

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "events"
REGION = "us-east-1"
SM_JOB = "resnet-2026-12-01-08-00-00-000"
SM_ARN = f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{SM_JOB}"
#: AWS's documented pattern, with only its source changed
USER_PATTERN = {"source": ["trainguard"], "detail-type": ["SageMaker Training Job State Change"]}


def documented_stop_lambda(event: dict[str, Any], sagemaker: Any) -> None:
    """The logic of AWS's documented Debugger auto-stop Lambda (docs: "Set up Debugger for
    automated training job termination using CloudWatch and Lambda"), with its boto3
    client passed in: no statuses -> nothing; TrainingJobStatus other than InProgress ->
    nothing; else StopTrainingJob(TrainingJobName=detail.TrainingJobName) for every
    status that is IssuesFound, re-raising any error."""
    detail = event.get("detail")
    name = detail.get("TrainingJobName")
    statuses = detail.get("DebugRuleEvaluationStatuses", None)
    if statuses is None or len(statuses) == 0:
        return
    if detail.get("TrainingJobStatus", None) != "InProgress":
        return
    for status in statuses:
        if status.get("RuleEvaluationStatus") == "IssuesFound":
            try:
                sagemaker.stop_training_job(TrainingJobName=name)
            except Exception:
                logging.exception("stopping %s", name)
                raise


def two_rules(actions: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "RuleConfigurationName": "nan-a",
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            "Actions": actions,
        },
        {
            "RuleConfigurationName": "nan-b",
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            "Actions": actions,
        },
        {"RuleConfigurationName": "loss", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}},
    ]


def trainguard_events(aws, job: SyntheticJob) -> list[dict[str, Any]]:
    """The job's real trainguard events, as the bus delivers them."""
    service = aws.service()
    for key in aws.put_job(job.job, job.objects()):
        service.handle_object(aws.bucket, key)
    events = aws.drain_events()
    assert events, "the evaluate service sent no event"
    return [e for e in events if e["detail-type"] in (DETAIL_TYPE, JOB_DETAIL_TYPE)]


@pytest.fixture
def default_bus(aws):
    """A rule on the default bus with the user's pattern, delivering to a queue."""
    url = aws.sqs.create_queue(QueueName="user-lambda")["QueueUrl"]
    arn = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    aws.events.put_rule(Name="debugger-cw-event-rule", EventPattern=json.dumps(USER_PATTERN))
    aws.events.put_targets(Rule="debugger-cw-event-rule", Targets=[{"Id": "lambda", "Arn": arn}])

    def delivered() -> list[dict[str, Any]]:
        out = []
        while msgs := aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            for m in msgs:
                out.append(json.loads(m["Body"]))
                aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return out

    return delivered


def tagged_sagemaker(owner: str | None, calls: int = 1) -> tuple[Any, Stubber]:
    """A SageMaker client answering the ownership check (DescribeTrainingJob, ListTags)."""
    client = boto3.client("sagemaker", region_name=REGION)
    stub = Stubber(client)
    for _ in range(calls):
        stub.add_response(
            "describe_training_job",
            _description(),
            {"TrainingJobName": SM_JOB},
        )
        tags = [{"Key": OWNER_TAG, "Value": owner}] if owner else [{"Key": "team", "Value": "vision"}]
        stub.add_response("list_tags", {"Tags": tags}, {"ResourceArn": SM_ARN, "MaxResults": 100})
    stub.activate()
    return client, stub


def _description() -> dict[str, Any]:
    import datetime as dt

    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    return {
        "TrainingJobName": SM_JOB,
        "TrainingJobArn": SM_ARN,
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/model.tar.gz"},
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": now,
    }


def stopper(expected_stops: int) -> tuple[Any, Stubber]:
    client = boto3.client("sagemaker", region_name=REGION)
    stub = Stubber(client)
    for _ in range(expected_stops):
        stub.add_response("stop_training_job", {}, {"TrainingJobName": SM_JOB})
    stub.activate()
    return client, stub


def run_converter(aws, events, sagemaker, concurrent: bool = False) -> list[Any]:
    store = ViewStore(aws.table, aws.ddb)
    publish = eventbridge_publisher(aws.events, "default")
    prove = sagemaker_ownership(sagemaker)
    if not concurrent:
        return [convert(e, store, prove, publish) for e in events]
    results: list[Any] = []
    barrier = threading.Barrier(len(events))

    def one(e):
        barrier.wait()
        try:
            results.append(convert(e, store, prove, publish))
        except Exception as exc:  # surfaced below: a thread's error must fail the test
            results.append(exc)

    threads = [threading.Thread(target=one, args=(e,)) for e in events]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    return results


@pytest.mark.parametrize("concurrent", [False, True])
def test_two_rules_firing_at_once_stop_the_sagemaker_job_exactly_once(aws, default_bus, concurrent):
    job = SyntheticJob(
        "sm-job",
        steps=list(range(0, 40, 2)),
        nan_steps=frozenset({14}),
        rules=two_rules(["StopTraining"]),
        sagemaker_name=SM_JOB,
    )
    events = trainguard_events(aws, job)
    rule_events = [e for e in events if e["detail-type"] == DETAIL_TYPE]
    fired = [e for e in rule_events if e["detail"]["RuleEvaluationStatus"] == "IssuesFound"]
    assert {e["detail"]["RuleConfigurationName"] for e in fired} == {"nan-a", "nan-b"}  # the same step
    # concurrent: the two IssuesFound events are converted at the same moment, in two threads
    sagemaker, proof = tagged_sagemaker(owner="sm-job", calls=2 if concurrent else 1)
    if concurrent:
        first = events.index(fired[0])
        run_converter(aws, events[:first], sagemaker)
        run_converter(aws, fired, sagemaker, concurrent=True)
        run_converter(aws, [e for e in events[first:] if e not in fired], sagemaker)
    else:
        run_converter(aws, events, sagemaker)
        proof.assert_no_pending_responses()  # proven once per job, not per event
    delivered = default_bus()
    assert len(delivered) == len(events)  # once per change, and the job's end
    for e in delivered:
        assert e["source"] == "trainguard" and e["detail-type"] == SAGEMAKER_DETAIL_TYPE
        SageMakerTrainingJobState.model_validate(e["detail"])
        assert e["detail"]["TrainingJobName"] == SM_JOB and e["detail"]["TrainingJobArn"] == SM_ARN
    client, stops = stopper(expected_stops=1)
    for e in delivered:
        documented_stop_lambda(e, client)
    stops.assert_no_pending_responses()  # exactly one StopTrainingJob, none after it
    inviting = [
        e
        for e in delivered
        if e["detail"]["TrainingJobStatus"] == "InProgress"
        and any(
            s["RuleEvaluationStatus"] == "IssuesFound" for s in e["detail"]["DebugRuleEvaluationStatuses"]
        )
    ]
    assert len(inviting) == 1
    [gate] = inviting
    assert (
        sum(s["RuleEvaluationStatus"] == "IssuesFound" for s in gate["detail"]["DebugRuleEvaluationStatuses"])
        == 1
    )
    assert delivered[-1]["detail"]["TrainingJobStatus"] in ("Completed", "Stopped")
    assert delivered[-1]["detail"]["SecondaryStatus"] == delivered[-1]["detail"]["TrainingJobStatus"]


def test_a_job_cannot_make_the_lambda_stop_a_sagemaker_job_it_names(aws, default_bus):
    """The manifest names someone else's SageMaker job; its launcher tagged it for another job."""
    job = SyntheticJob(
        "intruder",
        steps=list(range(0, 20, 2)),
        nan_steps=frozenset({6}),
        rules=two_rules([]),
        sagemaker_name=SM_JOB,
    )
    events = trainguard_events(aws, job)
    sagemaker, proof = tagged_sagemaker(owner="victim-job")
    run_converter(aws, events, sagemaker)
    proof.assert_no_pending_responses()
    delivered = default_bus()
    assert delivered and all(e["detail"]["TrainingJobName"] == "intruder" for e in delivered)
    assert all(e["detail"]["TrainingJobArn"] is None and e["detail"]["Stoppable"] is False for e in delivered)
    client, stops = stopper(expected_stops=0)
    for e in delivered:
        documented_stop_lambda(e, client)  # a stop call would fail: the Stubber expects none
    stops.assert_no_pending_responses()


def test_a_job_without_a_sagemaker_job_keeps_its_own_name_and_invites_no_stop(aws, default_bus):
    job = SyntheticJob(
        "local-run", steps=list(range(0, 20, 2)), nan_steps=frozenset({6}), rules=two_rules([])
    )
    events = trainguard_events(aws, job)
    sagemaker, _ = tagged_sagemaker(owner=None, calls=0)  # no claim: no call
    run_converter(aws, events, sagemaker)
    delivered = default_bus()
    statuses = [e["detail"]["TrainingJobStatus"] for e in delivered]
    assert all(e["detail"]["TrainingJobName"] == "local-run" for e in delivered)
    assert "InProgress" not in [
        e["detail"]["TrainingJobStatus"]
        for e in delivered
        if any(s["RuleEvaluationStatus"] == "IssuesFound" for s in e["detail"]["DebugRuleEvaluationStatuses"])
    ]
    assert statuses[-1] == "Completed"


def test_a_repeated_delivery_is_sent_once_and_a_lost_send_is_retried(aws, default_bus):
    job = SyntheticJob(
        "dup-job",
        steps=list(range(0, 20, 2)),
        nan_steps=frozenset({6}),
        rules=two_rules([]),
        sagemaker_name=SM_JOB,
    )
    events = trainguard_events(aws, job)
    sagemaker, _ = tagged_sagemaker(owner="dup-job")
    store = ViewStore(aws.table, aws.ddb)
    prove = sagemaker_ownership(sagemaker)
    real = eventbridge_publisher(aws.events, "default")
    failures = [RuntimeError("PutEvents timed out")]

    def flaky(state):
        if failures:
            raise failures.pop()
        real(state)

    with pytest.raises(RuntimeError, match="timed out"):
        convert(events[0], store, prove, flaky)  # committed, not sent
    retried = convert(events[0], store, prove, flaky)
    assert retried.published and retried.reason == "re-sent after an interrupted attempt"
    again = convert(events[0], store, prove, real)
    assert not again.published and "already published" in again.reason
    assert len(default_bus()) == 1
    item = aws.ddb.get_item(TableName=aws.table, Key={"pk": {"S": PARTITION}, "sk": {"S": "view#dup-job"}})[
        "Item"
    ]
    assert json.loads(item["view"]["S"])["outbox"] == {}


def test_the_contract_fixture_is_what_the_converter_writes():
    example = json.loads((FIXTURES / "sagemaker_training_job_state_change.json").read_text())
    assert example["detail-type"] == SAGEMAKER_DETAIL_TYPE and example["source"] == "trainguard"
    state = SageMakerTrainingJobState.model_validate(example["detail"])
    assert isinstance(state.LastModifiedTime, int)
    assert state.DebugRuleEvaluationStatuses[0].LastModifiedTime.endswith("Z")
    assert iso_utc(1_800_000_000.5) == "2027-01-15T08:00:00.500Z"


def test_the_wiring_routes_every_status_event_to_the_converter():
    [rule] = [r for r in WIRING.bus_rules if r.target == "sagemaker_events"]
    assert rule.pattern == {"source": ["trainguard"], "detail-type": [DETAIL_TYPE, JOB_DETAIL_TYPE]}
    assert set(WIRING.function("sagemaker_events").grants) == {
        "table:readwrite",
        "default-bus:put",
        "sagemaker:read",
    }

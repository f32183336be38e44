"""notify and stop_job against moto; StopTrainingJob (which moto lacks) with botocore's Stubber."""

from __future__ import annotations

import json

import pytest
from botocore.stub import Stubber
from trainguard.engine.events import RuleStatusDetail
from trainguard.service import clients, notify, stop_job
from trainguard.service.alerts import SMS_MAX_CHARS, render


def detail(**overrides) -> RuleStatusDetail:
    base = dict(
        EventId="job-1/nan-check/2",
        TrainingJobName="job-1",
        RuleConfigurationName="nan-check",
        RuleName="ExplodingTensor",
        RuleEvaluationStatus="IssuesFound",
        PreviousStatus="InProgress",
        StatusDetails="RuleEvaluationConditionMet: Evaluation of the rule ExplodingTensor at step 30 "
        "resulted in "
        "the condition being met. fc1.weight_grad holds 3 NaN values.",
        LastModifiedTime=1_800_000_000.0,
        Step=30,
        Value=3.0,
        Threshold=0.0,
        Tensor="fc1.weight_grad",
        Actions=["Email", "SMS", "StopTraining"],
    )
    base.update(overrides)
    return RuleStatusDetail(**base)


@pytest.fixture
def env(aws, monkeypatch):
    sns = __import__("boto3").client("sns", region_name="us-east-1")
    topic = sns.create_topic(Name="alerts")["TopicArn"]
    monkeypatch.setenv("TABLE_NAME", aws.table)
    monkeypatch.setenv("BUS_NAME", aws.bus)
    monkeypatch.setenv("BUCKET_NAME", aws.bucket)
    monkeypatch.setenv("TOPIC_ARN", topic)
    clients.reset()
    notify._once.cache_clear()
    from trainguard.service import evaluate

    evaluate.service.cache_clear()
    yield topic
    clients.reset()
    notify._once.cache_clear()
    evaluate.service.cache_clear()


def sent(topic: str) -> list:
    from moto.sns.models import sns_backends

    return sns_backends["123456789012"]["us-east-1"].topics[topic].sent_notifications


def test_notify_publishes_once_per_event_id(env):
    event = {"detail": json.loads(detail().model_dump_json())}
    first = notify.handle_event(event)
    again = notify.handle_event(event)  # EventBridge may deliver twice
    assert first["published"] and again == first
    assert len(sent(env)) == 1
    message = json.loads(sent(env)[0][1])
    assert "Step:          30" in message["email"] and "fc1.weight_grad" in message["email"]
    assert message["sms"].startswith("trainguard job-1: nan-check IssuesFound at step 30 (global)")
    other = {"detail": json.loads(detail(EventId="job-1/nan-check/3").model_dump_json())}
    notify.handle_event(other)
    assert len(sent(env)) == 2


def test_notify_skips_rules_without_alert_actions(env):
    result = notify.handle_event({"detail": json.loads(detail(Actions=["StopTraining"]).model_dump_json())})
    assert result["published"] is False and not sent(env)


def test_sms_fits_one_message_even_for_long_names():
    alert = render(detail(TrainingJobName="j" * 120, RuleConfigurationName="r" * 200))
    assert len(alert.sms) <= SMS_MAX_CHARS and alert.sms.isascii()
    assert len(alert.subject) <= 100


def test_stop_writes_the_cooperative_signal_for_any_job(env, aws):
    result = stop_job.handle_event({"detail": json.loads(detail().model_dump_json())})
    assert result["stopped"]
    body = aws.s3.get_object(Bucket=aws.bucket, Key="jobs/job-1/control/stop.json")["Body"].read()
    assert json.loads(body)["rule"] == "nan-check"


SM_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-job/sm-job-7"


def describe(status: str = "InProgress") -> dict:
    import datetime as dt

    return {
        "TrainingJobName": "sm-job-7",
        "TrainingJobArn": SM_ARN,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"},
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training",
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
    }


def owned_by(stub: Stubber, job: str, status: str = "InProgress") -> None:
    stub.add_response("describe_training_job", describe(status), {"TrainingJobName": "sm-job-7"})
    stub.add_response(
        "list_tags",
        {"Tags": [{"Key": "trainguard:job", "Value": job}]},
        {"ResourceArn": SM_ARN, "MaxResults": 100},
    )


def stop_event(**overrides) -> dict:
    fields = {"SageMakerTrainingJobName": "sm-job-7", "AllowSageMakerStop": True, **overrides}
    return {"detail": json.loads(detail(**fields).model_dump_json())}


@pytest.fixture
def sagemaker_stop(env, monkeypatch):
    """The operator deployed with sagemakerStop (TRAINGUARD_SAGEMAKER_STOP=true)."""
    monkeypatch.setenv("TRAINGUARD_SAGEMAKER_STOP", "true")


def test_stop_calls_stop_training_job_for_the_job_its_launcher_tagged(sagemaker_stop, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        owned_by(stub, "job-1")
        stub.add_response("stop_training_job", {}, {"TrainingJobName": "sm-job-7"})
        result = stop_job.handle_event(stop_event())
        stub.assert_no_pending_responses()
    assert "StopTrainingJob(sm-job-7)" in result["actions"]
    assert result["sagemaker"]["outcome"] == "stopped"


def test_a_job_cannot_stop_another_jobs_sagemaker_job(sagemaker_stop, aws):
    """job-1's manifest names a SageMaker job launched for job-2: the tag says no."""
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:  # no stop_training_job response queued: a call would fail
        owned_by(stub, "job-2")
        result = stop_job.handle_event(stop_event())
        stub.assert_no_pending_responses()
    assert result["sagemaker"]["outcome"] == "not-owned"
    assert "another trainguard job" in result["sagemaker"]["reason"]
    assert not any("StopTrainingJob" in a for a in result["actions"])
    assert result["stopped"]  # the cooperative stop signal is still written


def test_an_untagged_sagemaker_job_is_not_stopped(sagemaker_stop, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_response("describe_training_job", describe(), {"TrainingJobName": "sm-job-7"})
        stub.add_response("list_tags", {"Tags": []}, {"ResourceArn": SM_ARN, "MaxResults": 100})
        result = stop_job.handle_event(stop_event())
    assert result["sagemaker"]["outcome"] == "not-owned"
    assert "no trainguard:job tag" in result["sagemaker"]["reason"]


def test_sagemaker_stops_are_off_unless_the_operator_enabled_them(env, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker):  # any SageMaker call would raise: no responses queued
        result = stop_job.handle_event(stop_event())
    assert result["sagemaker"]["outcome"] == "disabled"
    assert "sagemakerStop" in result["sagemaker"]["reason"]


def test_stop_does_not_call_sagemaker_without_opt_in(sagemaker_stop, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker):  # any call would raise: no responses queued
        result = stop_job.handle_event(stop_event(AllowSageMakerStop=False))
    assert not any("StopTrainingJob" in a for a in result["actions"])
    assert result["sagemaker"]["outcome"] == "not-requested"


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ("Stopping", "already-stopping"),
        ("Stopped", "not-running"),
        ("Completed", "not-running"),
        ("Failed", "not-running"),
    ],
)
def test_a_job_that_is_no_longer_running_is_left_alone(sagemaker_stop, aws, status, outcome):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:  # no stop_training_job queued
        owned_by(stub, "job-1", status)
        result = stop_job.handle_event(stop_event())
        stub.assert_no_pending_responses()
    assert result["sagemaker"]["outcome"] == outcome and status in result["sagemaker"]["reason"]


def test_a_job_that_does_not_exist_is_a_clear_outcome(sagemaker_stop, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_client_error("describe_training_job", "ResourceNotFound", "Requested resource not found")
        result = stop_job.handle_event(stop_event())
    assert result["sagemaker"]["outcome"] == "not-found" and result["stopped"]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("ResourceNotFound", "Requested resource not found"),
        ("ValidationException", "The job status is Completed"),
    ],
)
def test_a_job_that_ends_between_describe_and_stop_is_not_an_error(sagemaker_stop, aws, code, message):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        owned_by(stub, "job-1")
        stub.add_client_error("stop_training_job", code, message)
        result = stop_job.handle_event(stop_event())
        stub.assert_no_pending_responses()
    assert result["sagemaker"]["outcome"] == "not-running"


def test_a_throttled_stop_is_raised_for_a_retry(sagemaker_stop, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        owned_by(stub, "job-1")
        stub.add_client_error("stop_training_job", "ThrottlingException", "slow down")
        with pytest.raises(sagemaker.exceptions.ClientError):
            stop_job.handle_event(stop_event())


def test_stop_ignores_events_without_the_action(env):
    result = stop_job.handle_event({"detail": json.loads(detail(Actions=["Email"]).model_dump_json())})
    assert result == {"stopped": False, "reason": "event does not ask for StopTraining"}

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
    assert message["sms"].startswith("trainguard job-1: nan-check IssuesFound step 30")
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


def test_stop_calls_stop_training_job_only_for_the_opted_in_sagemaker_job(env, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_response("stop_training_job", {}, {"TrainingJobName": "sm-job-7"})
        result = stop_job.handle_event(
            {
                "detail": json.loads(
                    detail(SageMakerTrainingJobName="sm-job-7", AllowSageMakerStop=True).model_dump_json()
                )
            }
        )
        stub.assert_no_pending_responses()
    assert "StopTrainingJob(sm-job-7)" in result["actions"]


def test_stop_does_not_call_sagemaker_without_opt_in(env, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker):  # any call would raise: no responses queued
        result = stop_job.handle_event(
            {
                "detail": json.loads(
                    detail(SageMakerTrainingJobName="sm-job-7", AllowSageMakerStop=False).model_dump_json()
                )
            }
        )
    assert not any("StopTrainingJob" in a for a in result["actions"])


def test_stop_is_idempotent_for_an_already_stopped_sagemaker_job(env, aws):
    sagemaker = clients.client("sagemaker")
    with Stubber(sagemaker) as stub:
        stub.add_client_error("stop_training_job", "ValidationException", "The job is already stopped")
        result = stop_job.handle_event(
            {
                "detail": json.loads(
                    detail(SageMakerTrainingJobName="sm-job-7", AllowSageMakerStop=True).model_dump_json()
                )
            }
        )
    assert any("already" in a for a in result["actions"])


def test_stop_ignores_events_without_the_action(env):
    result = stop_job.handle_event({"detail": json.loads(detail(Actions=["Email"]).model_dump_json())})
    assert result == {"stopped": False, "reason": "event does not ask for StopTraining"}

"""check_ownership: DescribeTrainingJob + ListTags through botocore's Stubber (moto lacks ListTags
for training jobs in the shape AWS returns, and StopTrainingJob entirely)."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from botocore.stub import Stubber
from trainguard.service.ownership import OWNER_TAG, Verdict, check_ownership, judge

ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-job/sm-job-7"


def description(status: str = "InProgress", name: str = "sm-job-7") -> dict:
    return {
        "TrainingJobName": name,
        "TrainingJobArn": ARN,
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"},
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training",
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
    }


@pytest.fixture
def sagemaker():
    client = boto3.client(
        "sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def expect(stub, status="InProgress", tags=(), pages=None):
    stub.add_response("describe_training_job", description(status), {"TrainingJobName": "sm-job-7"})
    for page in pages or [{"Tags": list(tags)}]:
        params = {"ResourceArn": ARN, "MaxResults": 100}
        if "after" in page:
            params["NextToken"] = page.pop("after")
        stub.add_response("list_tags", page, params)


def test_a_job_tagged_for_this_trainguard_job_is_owned(sagemaker):
    client, stub = sagemaker
    expect(stub, tags=[{"Key": "team", "Value": "a"}, {"Key": OWNER_TAG, "Value": "run-1"}])
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.verdict is Verdict.OWNED and result.owned and result.stoppable
    assert (result.status, result.arn) == ("InProgress", ARN)


def test_the_tag_is_found_on_a_later_page(sagemaker):
    client, stub = sagemaker
    expect(
        stub,
        pages=[
            {"Tags": [{"Key": "a", "Value": "1"}], "NextToken": "t1"},
            {"Tags": [{"Key": OWNER_TAG, "Value": "run-1"}], "after": "t1"},
        ],
    )
    assert check_ownership(client, "sm-job-7", "run-1").owned


def test_an_untagged_job_is_not_owned_and_the_reason_says_how_to_opt_in(sagemaker):
    client, stub = sagemaker
    expect(stub, tags=[{"Key": "team", "Value": "a"}])
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.verdict is Verdict.NOT_OWNED and not result.stoppable
    assert f"no {OWNER_TAG} tag" in result.reason and f"{OWNER_TAG}=run-1" in result.reason


def test_a_job_tagged_for_another_trainguard_job_is_not_owned(sagemaker):
    """run-1's manifest names run-10's SageMaker job: the tag says whose it is."""
    client, stub = sagemaker
    expect(stub, tags=[{"Key": OWNER_TAG, "Value": "run-10"}])
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.verdict is Verdict.NOT_OWNED
    assert "'run-10'" in result.reason and "another trainguard job" in result.reason


def test_a_prefix_of_the_tag_value_is_not_a_match():
    tags = [{"Key": OWNER_TAG, "Value": "run-1"}]
    assert not judge("run-10", description(), tags).owned
    assert not judge("run-", description(), tags).owned
    assert not judge("", description(), tags).owned


@pytest.mark.parametrize("status", ["Stopping", "Stopped", "Completed", "Failed", "Deleting"])
def test_an_owned_job_that_is_no_longer_running_is_not_stoppable(sagemaker, status):
    client, stub = sagemaker
    expect(stub, status=status, tags=[{"Key": OWNER_TAG, "Value": "run-1"}])
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.owned and not result.stoppable and result.status == status


@pytest.mark.parametrize(
    ("code", "message"),
    [("ResourceNotFound", "Resource not found"), ("ValidationException", "Requested resource not found.")],
)
def test_a_job_that_does_not_exist_is_not_found(sagemaker, code, message):
    client, stub = sagemaker
    stub.add_client_error(
        "describe_training_job", code, message, expected_params={"TrainingJobName": "sm-job-7"}
    )
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.verdict is Verdict.NOT_FOUND and "does not exist" in result.reason


def test_a_denied_describe_is_not_owned_with_the_reason(sagemaker):
    """The grant is conditioned on the tag: AWS denies DescribeTrainingJob of an untagged job."""
    client, stub = sagemaker
    stub.add_client_error("describe_training_job", "AccessDeniedException", "not authorized", 400)
    result = check_ownership(client, "sm-job-7", "run-1")
    assert result.verdict is Verdict.NOT_OWNED and "denied" in result.reason


def test_a_job_deleted_between_describe_and_list_tags_is_not_found(sagemaker):
    client, stub = sagemaker
    stub.add_response("describe_training_job", description(), {"TrainingJobName": "sm-job-7"})
    stub.add_client_error("list_tags", "ResourceNotFound", "gone")
    assert check_ownership(client, "sm-job-7", "run-1").verdict is Verdict.NOT_FOUND


def test_throttling_is_raised_for_a_retry(sagemaker):
    client, stub = sagemaker
    stub.add_client_error("describe_training_job", "ThrottlingException", "slow down", 400)
    with pytest.raises(client.exceptions.ClientError):
        check_ownership(client, "sm-job-7", "run-1")


@pytest.mark.parametrize("name", ["", "-x", "a" * 64, "job/../other", "job\n", "jöb"])
def test_a_name_sagemaker_cannot_have_is_never_sent(sagemaker, name):
    client, _ = sagemaker  # no responses queued: any call would fail the test
    result = check_ownership(client, name, "run-1")
    assert result.verdict is Verdict.NOT_FOUND and "not a SageMaker training job name" in result.reason

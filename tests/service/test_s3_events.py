"""Parsing the S3 notification inside an SQS message: hostile bodies get a clear reason."""

import json

import pytest
from trainguard.service.evaluate import s3_objects
from trainguard.service.pipeline import PermanentError


def record(key: str, event: str = "ObjectCreated:Put") -> dict:
    return {"eventName": event, "s3": {"bucket": {"name": "b"}, "object": {"key": key}}}


def test_keys_are_url_decoded_and_only_object_created_counts():
    body = json.dumps(
        {
            "Records": [
                record("jobs/my+job/steps/000000000001/worker-00000.safetensors"),
                record("jobs/x/manifest.json", "ObjectRemoved:Delete"),
            ]
        }
    )
    assert s3_objects(body) == [("b", "jobs/my job/steps/000000000001/worker-00000.safetensors")]


def test_the_s3_test_event_is_ignored():
    assert s3_objects(json.dumps({"Event": "s3:TestEvent", "Bucket": "b"})) == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"foo": 1}', "no S3 'Records' list"),
        (json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": {}}]}), "s3.bucket.name"),
        ("x" * 300_000, "is not an S3 notification"),
    ],
)
def test_malformed_bodies_are_permanent_errors_with_a_reason(body, reason):
    with pytest.raises(PermanentError, match=reason):
        s3_objects(body)

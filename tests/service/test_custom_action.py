"""A user's own Lambda attached to the bus runs in local mode with the deployed event shape."""

import json
from pathlib import Path

from trainguard.local.runtime import CustomAction, LocalCloud
from trainguard.local.synthetic import SyntheticJob
from trainguard.service import clients

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_action"


def test_example_custom_action_receives_issues(tmp_path, monkeypatch):
    log = tmp_path / "actions.jsonl"
    monkeypatch.setenv("TRAINGUARD_ACTION_LOG", str(log))
    spec = json.loads((EXAMPLE / "actions.json").read_text())[0]
    action = CustomAction(spec["name"], spec["pattern"], str(EXAMPLE / "handler.py") + ":handler")
    with LocalCloud(name="tg-custom", custom_actions=[action]) as cloud:
        job = SyntheticJob("custom-1", steps=list(range(10)), nan_steps=frozenset({6}))
        s3 = clients.client("s3")
        for rel, body in job.objects().items():
            s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/custom-1/{rel}", Body=body)
        assert cloud.wait_idle(30)
        assert cloud.invocations.get("custom:record-issues") == 1
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [
        {
            "job": "custom-1",
            "rule": "ExplodingTensor",
            "status": "IssuesFound",
            "step": 6,
            "details": lines[0]["details"],
        }
    ]
    assert "NaN" in lines[0]["details"]

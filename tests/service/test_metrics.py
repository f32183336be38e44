"""The evaluate path publishes the job's scalars and rule statuses as EMF metrics."""

import json

from trainguard.local.synthetic import SyntheticJob


def test_scalars_and_status_changes_become_emf_metrics(aws, capsys, monkeypatch):
    from trainguard.service import metrics

    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "trainguard-test")
    service = aws.service()
    service.on_commit = lambda job, outcome, transitions: metrics.publish(job, outcome.scalars, transitions)
    job = SyntheticJob("emf-1", steps=[0, 1, 2], nan_steps=frozenset({2}), loss=lambda s, w: 1.0 - 0.1 * s)
    for key in aws.put_job("emf-1", job.objects()):
        service.handle_object(aws.bucket, key)
    blobs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    loss = [b for b in blobs if "TRAIN.loss" in b]
    assert [b["TRAIN.loss"] for b in loss][:2] == [[1.0], [0.9]]
    assert all(
        b["TrainingJobName"] == "emf-1"
        and b["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "trainguard-test"
        for b in loss
    )
    fired = [b for b in blobs if b.get("IssuesFound") == [1.0] and b.get("RuleName") == "ExplodingTensor"]
    assert len(fired) == 1
    assert any(b.get("RuleConfigurationName") == "ExplodingTensor" and "IssuesFound" in b for b in blobs)

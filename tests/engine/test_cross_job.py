"""SimilarAcrossRuns compares a job with another job's stored data, in replay and in the service."""

from __future__ import annotations

from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.local.synthetic import SyntheticJob

RULES = [
    {
        "RuleConfigurationName": "same-as-reference",
        "RuleParameters": {
            "rule_to_invoke": "SimilarAcrossRuns",
            "other_trials": "reference",
            "collection_names": "gradients",
        },
    }
]


def jobs(diverge_at: int | None):
    reference = SyntheticJob("reference", steps=list(range(10)))
    candidate = SyntheticJob(
        "candidate",
        steps=list(range(10)),
        rules=RULES,
        grad_mean_abs=lambda s, w: 1e-2 if diverge_at is None or s < diverge_at else 2e-2,
    )
    return reference, candidate


def write(root, job):
    for rel, body in job.objects().items():
        (root / job.job / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / job.job / rel).write_bytes(body)


def test_replay_finds_the_first_step_where_the_runs_differ(tmp_path):
    for job in jobs(diverge_at=6):
        write(tmp_path, job)
    result = replay(LocalJob.open(tmp_path / "candidate"))
    record = result.state.rule("same-as-reference")
    assert record.status == "IssuesFound" and record.step == 6
    assert "differs from job reference" in record.details


def test_identical_runs_end_without_issues(tmp_path):
    for job in jobs(diverge_at=None):
        write(tmp_path, job)
    assert (
        replay(LocalJob.open(tmp_path / "candidate")).state.rule("same-as-reference").status
        == "NoIssuesFound"
    )


def test_the_service_reads_the_reference_job_from_the_bucket(aws):
    reference, candidate = jobs(diverge_at=3)
    aws.put_job("reference", reference.objects())
    service = aws.service()
    for key in aws.put_job("candidate", candidate.objects()):
        service.handle_object(aws.bucket, key)
    state, _ = service.store.load_state("candidate")
    record = state.rule("same-as-reference")
    assert record.status == "IssuesFound" and record.step == 3

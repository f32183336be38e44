"""SimilarAcrossRuns compares a job with another job's stored data, in replay and in the service.

Naming another job is not permission to read it: the other job's manifest must allow the
comparison. A job that refused, or cannot be read, ends the rule Error with the reason (never
a silent pass), and the other job's values never reach this job's alert.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from trainguard.engine.replay import replay
from trainguard.engine.sources import ComparisonRefused, LocalJob, OtherJobs
from trainguard.local.synthetic import SyntheticJob
from trainguard.service.s3_objects import S3Job

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
#: the reference's gradient mean |g|: a value that must never appear in the candidate's alert
SECRET = 0.0123456


def jobs(diverge_at: int | None, allow: list[str] | None = None):
    reference = SyntheticJob(
        "reference",
        steps=list(range(10)),
        grad_mean_abs=lambda s, w: SECRET,
        allow_comparison_from=["candidate"] if allow is None else allow,
    )
    candidate = SyntheticJob(
        "candidate",
        steps=list(range(10)),
        rules=RULES,
        grad_mean_abs=lambda s, w: SECRET if diverge_at is None or s < diverge_at else 2 * SECRET,
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


@pytest.mark.parametrize("allow", [["candidate"], ["cand*"], ["*"]], ids=["name", "pattern", "anyone"])
def test_the_other_job_allows_by_name_or_pattern(tmp_path, allow):
    for job in jobs(diverge_at=4, allow=allow):
        write(tmp_path, job)
    record = replay(LocalJob.open(tmp_path / "candidate")).state.rule("same-as-reference")
    assert record.status == "IssuesFound" and record.step == 4


@pytest.mark.parametrize("allow", [[], ["someone-else"], ["candidate-*"]], ids=["nobody", "other", "near"])
def test_naming_a_job_that_did_not_allow_it_is_an_error_not_a_comparison(tmp_path, allow):
    for job in jobs(diverge_at=4, allow=allow):
        write(tmp_path, job)
    record = replay(LocalJob.open(tmp_path / "candidate")).state.rule("same-as-reference")
    assert record.status == "Error"
    assert "does not allow comparison from job 'candidate'" in record.details
    assert "allow_comparison_from" in record.details


def test_a_reference_without_a_manifest_has_not_allowed_anything(tmp_path):
    reference, candidate = jobs(diverge_at=None)
    write(tmp_path, reference)
    write(tmp_path, candidate)
    (tmp_path / "reference" / "manifest.json").unlink()
    record = replay(LocalJob.open(tmp_path / "candidate")).state.rule("same-as-reference")
    assert record.status == "Error" and "has no manifest.json" in record.details


def test_the_alert_never_carries_the_other_jobs_values(tmp_path):
    for job in jobs(diverge_at=2):
        write(tmp_path, job)
    result = replay(LocalJob.open(tmp_path / "candidate"))
    record = result.state.rule("same-as-reference")
    assert record.status == "IssuesFound" and record.step == 2
    # the candidate's own values are there; the reference's, and the difference, are not
    texts = [record.details, *(t.record.details for t in result.transitions)]
    assert all("0.0123" not in text and "1.23e-02" not in text for text in texts)
    assert record.value is None and "mean" in record.details


def test_the_service_reads_the_reference_job_from_the_bucket(aws):
    reference, candidate = jobs(diverge_at=3)
    aws.put_job("reference", reference.objects())
    service = aws.service()
    for key in aws.put_job("candidate", candidate.objects()):
        service.handle_object(aws.bucket, key)
    state, _ = service.store.load_state("candidate")
    record = state.rule("same-as-reference")
    assert record.status == "IssuesFound" and record.step == 3


def test_the_service_refuses_a_reference_that_did_not_allow_it(aws):
    reference, candidate = jobs(diverge_at=3, allow=[])
    aws.put_job("reference", reference.objects())
    service = aws.service()
    for key in aws.put_job("candidate", candidate.objects()):
        service.handle_object(aws.bucket, key)
    state, _ = service.store.load_state("candidate")
    record = state.rule("same-as-reference")
    assert record.status == "Error" and "does not allow comparison" in record.details
    assert state.finished  # the job itself went on and ended


def test_a_name_outside_the_stack_is_refused(aws):
    rules = [
        {
            "RuleConfigurationName": "elsewhere",
            "RuleParameters": {"rule_to_invoke": "SimilarAcrossRuns", "other_trials": "s3://other-bucket/x"},
        }
    ]
    candidate = SyntheticJob("candidate-2", steps=[0, 1], rules=rules)
    service = aws.service()
    for key in aws.put_job("candidate-2", candidate.objects()):
        service.handle_object(aws.bucket, key)
    state, _ = service.store.load_state("candidate-2")
    record = state.rule("elsewhere")
    assert record.status == "Error" and "is not a job of this stack" in record.details


def test_access_denied_is_reported_not_swallowed(aws):
    """An AccessDenied listing the other job ends the rule Error with the reason (it never passes)."""
    reference, _ = jobs(diverge_at=None)
    aws.put_job("reference", reference.objects())
    stubber = Stubber(aws.s3)
    stubber.add_client_error("get_object", service_error_code="AccessDenied", http_status_code=403)
    other = OtherJobs(lambda job: S3Job(aws.bucket, f"jobs/{job}", aws.s3, job=job))
    with stubber, pytest.raises(ComparisonRefused, match="'reference' is not readable: AccessDenied"):
        other.for_job("candidate")("reference", 0)
    # the reason is kept (a later call does not quietly try again within the cache's lifetime)
    with pytest.raises(ComparisonRefused, match="AccessDenied"):
        other.for_job("candidate")("reference", 1)


def test_the_service_reports_an_access_denied_reference_as_the_rules_error(aws):
    reference, candidate = jobs(diverge_at=None)
    aws.put_job("reference", reference.objects())

    def deny(params, **_):
        if params["Key"].startswith("jobs/reference/"):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    aws.s3.meta.events.register("before-parameter-build.s3.GetObject", deny)
    try:
        service = aws.service()
        for key in aws.put_job("candidate", candidate.objects()):
            service.handle_object(aws.bucket, key)
    finally:
        aws.s3.meta.events.unregister("before-parameter-build.s3.GetObject", deny)
    state, _ = service.store.load_state("candidate")
    record = state.rule("same-as-reference")
    assert record.status == "Error" and "AccessDenied" in record.details and "not readable" in record.details
    assert state.finished


def test_a_step_the_reference_lacks_is_counted_not_compared(tmp_path):
    reference = SyntheticJob("reference", steps=[0, 2, 4], allow_comparison_from=["candidate"])
    candidate = SyntheticJob("candidate", steps=[0, 1, 2, 3, 4], rules=RULES)
    write(tmp_path, reference)
    write(tmp_path, candidate)
    result = replay(LocalJob.open(tmp_path / "candidate"))
    record = result.state.rule("same-as-reference")
    assert record.status == "NoIssuesFound"
    assert record.state is not None
    assert record.state["steps_compared"] == 3 and record.state["steps_unmatched"] == 2


def test_a_job_cannot_compare_with_itself(tmp_path):
    rules = [dict(RULES[0], RuleParameters={**RULES[0]["RuleParameters"], "other_trials": "selfish"})]
    job = SyntheticJob("selfish", steps=[0, 1], rules=rules, allow_comparison_from=["*"])
    write(tmp_path, job)
    record = replay(LocalJob.open(tmp_path / "selfish")).state.rule("same-as-reference")
    assert record.status == "Error" and "cannot be compared with itself" in record.details

"""One job's failure or hang never delays another's evaluation or clock tick.

The clock's tick isolates each job (its error is its own result, the others go on) and
bounds its work; an SQS batch that mixes jobs fails only the records of the job that
failed; a job stuck in one step is stopped by its time budget (SIGALRM in the main thread,
as in Lambda) and the other jobs of the same batch or tick are judged.
"""

from __future__ import annotations

import time

import pytest
from service_env import HANGS, Clock, clocked_pipeline, dlq_messages, notification, use_hanging_rule
from trainguard.local.synthetic import SyntheticJob
from trainguard.service import evaluate
from trainguard.service.budget import Deadline, JobTimeBudgetExceeded, time_budget
from trainguard.service.pipeline import MAX_JOBS_PER_TICK, JobPipeline
from trainguard.service.state_store import pk

STALL = [
    {
        "RuleConfigurationName": "stall",
        "RuleParameters": {"rule_to_invoke": "StalledTrainingRule", "threshold": "60"},
    }
]


def pipeline(aws, clock: Clock, budget: float = 2.0) -> JobPipeline:
    return clocked_pipeline(aws, clock, job_budget_s=budget)


def start(aws, service: JobPipeline, job: SyntheticJob) -> None:
    for key in aws.put_job(job.job, job.objects()):
        service.handle_object(aws.bucket, key)


def test_a_job_that_fails_on_the_tick_does_not_stop_the_others(aws):
    clock = Clock(time.time())
    service = pipeline(aws, clock)
    for name in ("a-broken", "b-stalls"):
        start(aws, service, SyntheticJob(name, steps=[0, 1], rules=STALL, ended=False))
    # a state item that cannot be read (sorted first, so today's loop would stop at it)
    aws.ddb.update_item(
        TableName=aws.table,
        Key={"pk": {"S": pk("a-broken")}, "sk": {"S": "STATE"}},
        UpdateExpression="SET #d = :bad",
        ExpressionAttributeNames={"#d": "doc"},
        ExpressionAttributeValues={":bad": {"B": b"not zlib"}},
    )
    clock.now += 3600
    results = {r.job: r for r in service.tick()}
    assert results["a-broken"].error is not None and "error" in results["a-broken"].error.lower()
    assert results["b-stalls"].error is None and results["b-stalls"].transitions == 1
    state, _ = service.store.load_state("b-stalls")
    assert state.rule("stall").status == "IssuesFound"


def test_a_job_stuck_on_the_tick_is_cut_off_and_the_next_job_is_judged(aws, tmp_path, monkeypatch):
    use_hanging_rule(tmp_path, monkeypatch)
    clock = Clock(time.time())
    service = pipeline(aws, clock)  # 2 s: ample for the healthy job on a loaded machine
    start(aws, service, SyntheticJob("a-hangs", steps=[], rules=HANGS, ended=False))
    start(aws, service, SyntheticJob("b-stalls", steps=[0, 1], rules=STALL, ended=False))
    clock.now += 3600
    began = time.monotonic()
    results = {r.job: r for r in service.tick()}
    assert time.monotonic() - began < 30  # a safety net: the hang is cut at ~2-4 s
    assert results["a-hangs"].error is not None and "time budget" in results["a-hangs"].error
    state, _ = service.store.load_state("b-stalls")
    assert state.rule("stall").status == "IssuesFound"


def test_the_tick_stops_starting_jobs_at_its_deadline(aws):
    clock = Clock(time.time())
    service = pipeline(aws, clock)
    for name in ("j1", "j2", "j3"):
        start(aws, service, SyntheticJob(name, steps=[0], rules=STALL, ended=False))
    results = service.tick(Deadline(time.monotonic() - 1))
    assert len(results) == 3 and all(r.unfinished and r.error is None for r in results)


def test_the_tick_looks_at_a_bounded_number_of_jobs_and_rotates(aws, monkeypatch):
    from trainguard.service import pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "MAX_JOBS_PER_TICK", 2)
    clock = Clock(60.0 * 1000)
    service = pipeline(aws, clock)
    for name in ("j1", "j2", "j3", "j4", "j5"):
        start(aws, service, SyntheticJob(name, steps=[0], ended=False))
    seen: list[str] = []
    for minute in range(3):
        clock.now = 60.0 * (1000 + minute)
        ticked = [r.job for r in service.tick()]
        assert len(ticked) == 2
        seen += ticked
    assert set(seen) == {"j1", "j2", "j3", "j4", "j5"}  # every job within ceil(5 / 2) ticks
    assert MAX_JOBS_PER_TICK >= 100  # the real bound: what a 60 s tick can do


def test_a_batch_fails_only_the_records_of_the_job_that_hangs(aws, functions, tmp_path, monkeypatch):
    """Two jobs in one SQS batch: one's rule never returns; the other is judged, and only the
    hanging job's records are reported as failures (SQS redelivers them, not the others)."""
    use_hanging_rule(tmp_path, monkeypatch)
    evaluate.service().job_budget_s = 2.0  # ample for healthy work under load
    fine = SyntheticJob("fine", steps=[0, 1, 2, 3], nan_steps=frozenset({2}))
    stuck = SyntheticJob("stuck", steps=[0, 1], rules=HANGS)
    records = []
    for job in (fine, stuck):
        keys = aws.put_job(job.job, job.objects())
        records += [(f"{job.job}-{i}", key) for i, key in enumerate(sorted(keys, key=_manifest_first))]
    batch = evaluate.Batch()
    ingest_failed = []
    for message_id, key in records:
        try:
            batch.ingest(notification(aws.bucket, key), message_id)
        except RuntimeError as exc:  # what Powertools' BatchProcessor turns into a batch item failure
            assert "time budget" in str(exc)
            ingest_failed.append(message_id)
    failed = set(ingest_failed) | set(batch.advance())
    assert failed and all(m.startswith("stuck-") for m in failed)
    state, _ = evaluate.service().store.load_state("fine")
    assert state.finished and state.rule("ExplodingTensor").status == "IssuesFound"
    assert state.rule("ExplodingTensor").step == 2


def test_a_last_delivery_is_dead_lettered_with_its_reason(aws, functions, tmp_path, monkeypatch):
    use_hanging_rule(tmp_path, monkeypatch)
    dlq = functions
    evaluate.service().job_budget_s = 2.0  # ample for healthy work under load
    stuck = SyntheticJob("stuck", steps=[0], rules=HANGS, ended=False)
    keys = sorted(aws.put_job("stuck", stuck.objects()), key=_manifest_first)
    batch = evaluate.Batch()
    for i, key in enumerate(keys):
        batch.ingest(notification(aws.bucket, key), f"m{i}", receive_count=5)  # maxReceiveCount
    assert batch.advance() == []  # nothing left for SQS to redeliver: it is in the DLQ, with why
    (parked,) = dlq_messages(aws, dlq)
    reason = parked["MessageAttributes"]["reason"]["StringValue"]
    assert "advancing job stuck failed" in reason and "time budget" in reason and "last delivery" in reason


def test_a_hard_budget_interrupts_a_regex_that_backtracks():
    import re

    with pytest.raises(JobTimeBudgetExceeded, match="job slow"):
        with time_budget(0.2, "job slow"):
            re.match(r"(a+)+$", "a" * 40 + "b")


def test_a_budget_keeps_an_outer_timer(monkeypatch):
    import signal

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        with time_budget(0.1, "inner"):
            pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < remaining <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _manifest_first(key: str) -> tuple[bool, bool, str]:
    return (not key.endswith("manifest.json"), "/end/" in key, key)

"""Operations: a silent job ends with a clear status; dropped values are visible everywhere.

A crashed job (no end marker) no longer stays in ``active-jobs`` forever: after
``TRAINGUARD_STALE_JOB_DAYS`` without anything from it, the clock ends it, and every rule
still evaluating says exactly why. The ``dropped`` counts of segments and end markers are kept
in the job state and shown in ``trainguard status``, the final statuses and the job event.
"""

from __future__ import annotations

import time

import pytest
from service_env import Clock, clocked_pipeline
from trainguard.cli import print_store_status
from trainguard.format import documents as d
from trainguard.format import layout
from trainguard.format.convert import WindowRules, convert_objects
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules.config import DEFAULT_RULES
from trainguard.service.pipeline import JobPipeline
from trainguard.service.settings import Settings, stale_job_days
from trainguard.service.state_store import StateStore

DAY = 86400.0


def pipeline(aws, clock: Clock, stale_days: float = 7) -> JobPipeline:
    return clocked_pipeline(aws, clock, stale_after_s=stale_days * DAY)


def send(aws, service: JobPipeline, job: str, objects: dict[str, bytes]) -> None:
    keys = sorted(aws.put_job(job, objects), key=lambda k: (not k.endswith("manifest.json"), "/end/" in k, k))
    for key in keys:
        service.handle_object(aws.bucket, key)


def active(aws) -> set[str]:
    return {job for job in StateStore(aws.table, aws.ddb).active_jobs()}


def test_a_job_that_went_silent_ends_with_the_reason_in_each_rule(aws):
    clock = Clock(time.time())
    service = pipeline(aws, clock)
    send(
        aws, service, "crashed", SyntheticJob("crashed", world_size=2, steps=[0, 1, 2], ended=False).objects()
    )
    clock.now += 6 * DAY
    service.tick()
    assert "crashed" in active(aws)  # six days: not yet
    clock.now += 1.5 * DAY
    (result,) = service.tick()
    assert result.error is None and result.transitions == len(DEFAULT_RULES)
    state, _ = service.store.load_state("crashed")
    assert state.finished and "crashed" not in active(aws)
    assert "sent nothing for 7.5 days" in (state.end_reason or "")
    for record in state.rules:
        assert record.status == "Error" and record.details.startswith(
            "JobStale: the job sent nothing for 7.5 days"
        )
        assert "workers 0, 1 never sent an end marker" in record.details
        assert "evaluated 3 steps (last step 2)" in record.details
    finished = [e["detail"] for e in aws.drain_events() if "EndReason" in e["detail"]]
    assert len(finished) == 1 and "never sent an end marker" in finished[0]["EndReason"]


def test_a_job_whose_data_waits_for_a_worker_is_not_silent(aws):
    clock = Clock(time.time())
    service = pipeline(aws, clock, stale_days=1)
    job = SyntheticJob("waiting", world_size=2, steps=[0, 1, 2], ended=False, skipped={1: {0, 1, 2}})
    send(aws, service, "waiting", job.objects())
    clock.now += 0.9 * DAY
    more = SyntheticJob("waiting", world_size=2, steps=[0, 1, 2, 3], ended=False, skipped={1: {0, 1, 2, 3}})
    extra = {layout.step_key(3, 0): more.objects()[layout.step_key(3, 0)]}
    send(aws, service, "waiting", extra)  # buffered behind worker 1; the state does not change
    clock.now += 0.5 * DAY  # 1.4 days since the manifest, 0.5 since the last object
    service.tick()
    state, _ = service.store.load_state("waiting")
    assert not state.finished


def test_a_rule_that_already_found_issues_keeps_its_verdict(aws):
    clock = Clock(time.time())
    service = pipeline(aws, clock)
    send(
        aws,
        service,
        "half",
        SyntheticJob("half", steps=[0, 1, 2], nan_steps=frozenset({1}), ended=False).objects(),
    )
    clock.now += 8 * DAY
    service.tick()
    state, _ = service.store.load_state("half")
    assert state.rule("ExplodingTensor").status == "IssuesFound"
    assert state.rule("LossNotDecreasing").status == "Error"


def test_the_stale_days_setting(monkeypatch):
    for name, value in (("TABLE_NAME", "t"), ("BUS_NAME", "b"), ("BUCKET_NAME", "k")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TRAINGUARD_STALE_JOB_DAYS", raising=False)
    assert Settings.from_env().stale_after_s == 7 * DAY
    monkeypatch.setenv("TRAINGUARD_STALE_JOB_DAYS", "2.5")
    assert Settings.from_env().stale_after_s == 2.5 * DAY
    for bad in ("nan", "inf", "0", "-1", "soon"):
        with pytest.raises(RuntimeError, match="TRAINGUARD_STALE_JOB_DAYS"):
            stale_job_days(bad)


def dropped_segments(job: str) -> dict[str, bytes]:
    """Two segments that say the hook dropped values (as format 2 writers report it)."""
    objects = convert_objects(
        SyntheticJob(job, steps=list(range(8)), nan_steps=frozenset({6})).objects(),
        WindowRules(window_s=None, max_steps=4),
    )
    out: dict[str, bytes] = {}
    for key, body in objects.items():
        if key.startswith("segments/"):
            header, _ = d.decode_segment_header(body)
            header = header.model_copy(update={"dropped": {"queue_full": 3, "nonfinite_stats": 1}})
            body = d.encode_segment(header, {})
        elif key.startswith("end/"):
            marker = d.EndMarker.model_validate_json(body)
            body = d.dump_document(
                marker.model_copy(update={"dropped": {"queue_full": 2}, "dropped_objects": 1})
            )
        out[key] = body
    return out


def test_dropped_values_are_kept_shown_and_sent(aws, capsys):
    service = aws.service()
    objects = dropped_segments("lossy")
    segments = sum(1 for key in objects if key.startswith("segments/"))
    assert segments == 3  # steps 0-3, 4-6 (closed at once on the NaN at step 6), 7
    send(aws, service, "lossy", objects)
    state, _ = service.store.load_state("lossy")
    assert state.finished
    assert state.dropped == {"queue_full": 11, "nonfinite_stats": 3} and state.dropped_objects == 1
    # every final status says its verdict does not cover what was dropped (as known when it was given)
    fired = state.rule("ExplodingTensor")
    assert fired.status == "IssuesFound" and fired.step == 6
    assert fired.details.endswith(
        "The hook dropped 8 values (queue_full: 6, nonfinite_stats: 2): this verdict does not cover them."
    )
    for record in state.rules:
        assert len(record.details) <= 1024
        if record is not fired:
            assert (
                "The hook dropped 14 values (queue_full: 11, nonfinite_stats: 3) and 1 object not delivered"
                in record.details
            )
    finished = [
        e["detail"] for e in aws.drain_events() if e["detail"].get("Schema") == "trainguard.job-status/1"
    ]
    assert finished[0]["Dropped"] == {"queue_full": 11, "nonfinite_stats": 3}
    assert finished[0]["DroppedObjects"] == 1
    assert print_store_status(service.store, "lossy") == 0
    out = capsys.readouterr().out
    assert (
        "dropped by the hook: 14 values (queue_full: 11, nonfinite_stats: 3) and 1 object not delivered"
        in out
    )


def test_drop_reasons_are_bounded():
    from trainguard.engine.model import MAX_DROP_REASONS, JobState

    state = JobState(job="j")
    for i in range(100):
        state.add_dropped({f"reason-{i}": 1})
    assert len(state.dropped) == MAX_DROP_REASONS + 1 and state.dropped["other"] == 100 - MAX_DROP_REASONS

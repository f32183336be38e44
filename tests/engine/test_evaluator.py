"""The pure evaluator: completeness from worker chains, finishing, errors — no AWS."""

from __future__ import annotations

import math

import pytest
from trainguard.engine.evaluator import advance, apply_end, apply_manifest, build_event, request_stop
from trainguard.engine.model import JobState, StepArrival
from trainguard.format import documents as d
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules.config import DEFAULT_RULES
from trainguard.service.state_store import _pack, _unpack

NOW = 1_800_000_000.0


def arrivals_of(job: SyntheticJob) -> tuple[d.Manifest, list[StepArrival], list[d.EndMarker]]:
    from trainguard.engine.sources import read_end, read_manifest, step_arrival
    from trainguard.format.layout import parse_relative

    manifest, steps, ends = None, [], []
    for rel, body in job.objects().items():
        ref = parse_relative(job.job, rel)
        if ref.kind.value == "manifest":
            manifest = read_manifest(body)
        elif ref.kind.value == "step":
            steps.append(step_arrival(ref, body, len(body)))
        else:
            ends.append(read_end(body))
    return manifest, steps, ends


def run_incrementally(job: SyntheticJob, order: list[int] | None = None) -> JobState:
    """Deliver objects one at a time (in ``order``), as the service does."""
    manifest, steps, ends = arrivals_of(job)
    items: list = [("m", manifest)] + [("s", a) for a in steps] + [("e", e) for e in ends]
    if order is not None:
        items = [items[i] for i in order]
    state = JobState(job=job.job)
    buffer: dict[tuple[int, int], StepArrival] = {}
    for kind, item in items:
        if kind == "m":
            state = apply_manifest(state, item, NOW).state
        elif kind == "e":
            state = apply_end(state, item).state
        else:
            buffer[(item.step, item.worker)] = item
        out = advance(state, list(buffer.values()), NOW)
        state = out.state
        for key in out.consumed:
            buffer.pop(key, None)
    return state


def test_a_step_waits_for_every_worker_then_evaluates_in_order():
    job = SyntheticJob("w2", world_size=2, steps=[0, 10, 20], ended=False)
    manifest, steps, _ = arrivals_of(job)
    state = apply_manifest(JobState(job="w2"), manifest, NOW).state
    only_worker0 = [a for a in steps if a.worker == 0]
    out = advance(state, only_worker0, NOW)
    assert out.state.watermark == -1 and not out.consumed  # worker 1 has not written step 0
    out = advance(out.state, steps, NOW)
    assert out.state.watermark == 20 and out.state.steps_evaluated == 3
    assert sorted(out.consumed) == sorted((a.step, a.worker) for a in steps)


def test_a_worker_that_saves_less_often_does_not_block_the_others():
    # worker 1 skips step 10: its step-20 object says prev_step=0, so step 10 is complete without it
    job = SyntheticJob("skip", world_size=2, steps=[0, 10, 20], skipped={1: {10}}, ended=False)
    manifest, steps, _ = arrivals_of(job)
    state = apply_manifest(JobState(job="skip"), manifest, NOW).state
    out = advance(state, steps, NOW)
    assert out.state.watermark == 20 and out.state.steps_evaluated == 3


def test_a_missing_object_in_the_middle_blocks_until_it_arrives():
    job = SyntheticJob("gap", steps=[0, 1, 2, 3], ended=False)
    manifest, steps, _ = arrivals_of(job)
    state = apply_manifest(JobState(job="gap"), manifest, NOW).state
    without_1 = [a for a in steps if a.step != 1]
    out = advance(state, without_1, NOW)
    assert out.state.watermark == 0
    out = advance(out.state, steps, NOW)
    assert out.state.watermark == 3


def test_the_job_finishes_when_every_worker_ended_and_all_steps_were_evaluated():
    # long enough for LossNotDecreasing's blocks, with validation for Overfit: every rule checks
    job = SyntheticJob(
        "fin",
        world_size=2,
        steps=list(range(0, 120, 5)),
        loss=lambda s, w: 1.0 / (1 + s),
        eval_loss=lambda s, w: 1.02 / (1 + s) if s % 20 == 0 else None,
    )
    state = run_incrementally(job)
    assert state.finished and state.training_status == "Completed"
    assert {r.status for r in state.rules} == {"NoIssuesFound"}


@pytest.mark.parametrize("seed", range(6))
def test_any_delivery_order_gives_the_same_verdicts(seed):
    import random

    job = SyntheticJob(
        "perm",
        world_size=2,
        steps=list(range(0, 30, 3)),
        skipped={0: {9}},
        nan_steps=frozenset({18}),
        loss=lambda s, w: 1.0,
    )
    reference = run_incrementally(job)
    n = len(job.objects())
    order = list(range(n))
    random.Random(seed).shuffle(order)
    shuffled = run_incrementally(job, order)
    assert [(r.name, r.status, r.step, r.details) for r in shuffled.rules] == [
        (r.name, r.status, r.step, r.details) for r in reference.rules
    ]


def test_a_rule_that_raises_is_an_error_for_that_rule_only(monkeypatch):
    from trainguard.rules.dead_relu import DeadRelu

    def boom(self, state, step):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(DeadRelu, "update", boom)
    state = run_incrementally(SyntheticJob("boom", steps=[0, 1]))
    statuses = {r.name: r.status for r in state.rules}
    assert statuses["DeadRelu"] == "Error" and "ZeroDivisionError" in state.rule("DeadRelu").details
    assert statuses["ExplodingTensor"] == "NoIssuesFound"


def test_bad_object_keeps_the_chain_moving():
    job = SyntheticJob("bad", steps=[0, 1, 2], ended=True)
    manifest, steps, ends = arrivals_of(job)
    bad = StepArrival(1, 0, None, None, bad="steps/000000000001/worker-00000: truncated")
    steps = [a if a.step != 1 else bad for a in steps]
    state = apply_manifest(JobState(job="bad"), manifest, NOW).state
    state = apply_end(state, ends[0]).state
    out = advance(state, steps, NOW)
    assert out.state.watermark == 2 and out.state.finished


def test_stop_request_then_end_gives_stopped():
    job = SyntheticJob("stop", steps=[0, 1], ended=False)
    manifest, steps, _ = arrivals_of(job)
    state = apply_manifest(JobState(job="stop"), manifest, NOW).state
    out = request_stop(state, NOW)
    assert {t.record.status for t in out.transitions} == {"Stopping"}
    marker = d.EndMarker(job="stop", worker=0, world_size=1, last_step=1, wall_time=NOW, stopped=True)
    state = apply_end(out.state, marker).state
    final = advance(state, steps, NOW).state
    assert {r.status for r in final.rules} == {"Stopped"} and final.training_status == "Stopped"


def test_event_detail_carries_sagemaker_fields_and_all_rule_statuses():
    job = SyntheticJob(
        "evt", steps=[0, 1, 2], nan_steps=frozenset({1}), sagemaker_name="sm-evt", allow_sagemaker_stop=True
    )
    manifest, steps, _ = arrivals_of(job)
    state = apply_manifest(JobState(job="evt"), manifest, NOW).state
    out = advance(state, steps, NOW)
    fired = [t for t in out.transitions if t.record.status == "IssuesFound"]
    detail = build_event(out.state, fired[0])
    assert (
        detail.TrainingJobName == "evt"
        and detail.SageMakerTrainingJobName == "sm-evt"
        and detail.AllowSageMakerStop
    )
    assert detail.EventId == "evt/ExplodingTensor/2" and detail.Step == 1
    assert len(detail.DebugRuleEvaluationStatuses) == len(DEFAULT_RULES)
    assert len(detail.StatusDetails) <= 1024


def test_state_with_nan_survives_the_store_encoding():
    job = SyntheticJob("nan", steps=[0, 1], loss=lambda s, w: math.nan, ended=False)
    state = run_incrementally(job)
    restored = JobState.model_validate(_unpack(_pack(state.model_dump(mode="json"))))
    assert restored == state or repr(restored) == repr(state)


def test_state_stays_small_after_many_steps():
    steps = list(range(0, 20_000, 1))
    job = SyntheticJob("long", steps=steps, ended=False, loss=lambda s, w: 1.0 / (1 + s))
    manifest, _, _ = arrivals_of(SyntheticJob("long", steps=[0], ended=False))
    state = apply_manifest(JobState(job="long"), manifest, NOW).state
    for start in range(0, len(steps), 2000):
        chunk = steps[start : start + 2000]
        prev = state.frontier.get(0)
        arrivals = []
        for s in chunk:
            arrivals.append(StepArrival(s, 0, prev, job.header(s, 0, prev, NOW)))
            prev = s
        state = advance(state, arrivals, NOW, max_steps=None).state
    assert state.watermark == steps[-1]
    assert len(_pack(state.model_dump(mode="json"))) < 8 * 1024


def test_profiler_rules_are_configured_by_name_and_judge_system_batches():
    """A stalled data loader: step durations with outliers → StepOutlier, through replay's path."""
    from trainguard.engine.evaluator import advance, apply_end, apply_manifest
    from trainguard.engine.model import SystemArrival
    from trainguard.format.system import StepEvent, SystemBatch

    rules = [
        {
            "RuleConfigurationName": "outliers",
            "RuleParameters": {"rule_to_invoke": "StepOutlier", "n_outliers": "3"},
        }
    ]
    manifest = d.Manifest(job="prof", created=NOW, hook_version="t", world_size=1, rules=rules)
    state = apply_manifest(JobState(job="prof"), manifest, NOW).state
    assert state.rules[0].status == "InProgress"
    batches, t, step = [], NOW, 0
    for seq in range(4):
        events = []
        for _ in range(60):
            duration = 0.5 if step % 37 == 36 else 0.01  # the loader stalls every 37th step
            events.append(StepEvent(mode="TRAIN", step=step, start=t, end=t + duration))
            t += duration
            step += 1
        batches.append(
            SystemArrival(
                0,
                seq,
                SystemBatch(
                    job="prof",
                    worker=0,
                    world_size=1,
                    seq=seq,
                    start_time=events[0].start,
                    end_time=t,
                    interval_s=0.5,
                    steps=events,
                ),
            )
        )
    marker = d.EndMarker(job="prof", worker=0, world_size=1, last_step=None, wall_time=t, system_batches=4)
    state = apply_end(state, marker).state
    out = advance(state, [], NOW, system=list(reversed(batches)))  # any order: seq chains decide
    record = out.state.rules[0]
    assert record.status == "IssuesFound", record.details
    assert out.state.finished and sorted(out.consumed_system) == [(0, s) for s in range(4)]

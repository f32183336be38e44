"""Live evaluation under real delivery equals a sequential offline replay.

S3 notifications are at-least-once and unordered, several workers write the same steps,
and Lambdas run concurrently. Hypothesis draws jobs (1-3 workers that save different
steps, losses that do or do not stall, NaN gradients, dead units, bad rule configs,
jobs that never end), the format they are written in (version 1: one object per step;
version 2: segments, each worker with its own window), and a delivery schedule
(duplicates, any order, 1-4 concurrent workers); it runs every delivery through the real
JobPipeline against S3, DynamoDB and EventBridge on moto, and compares each job's final
statuses and alert transitions with ``trainguard replay`` of the version-1 objects.
"""

from __future__ import annotations

import math
import random
import threading
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.format.convert import WindowRules, convert_objects
from trainguard.local.synthetic import SyntheticJob
from trainguard.service.pipeline import PermanentError
from trainguard.service.state_store import VersionConflict


@st.composite
def synthetic_jobs(draw, name: str) -> SyntheticJob:
    world = draw(st.integers(1, 3))
    stride = draw(st.sampled_from([1, 2, 3, 5]))
    count = draw(st.integers(2, 18))
    steps = [i * stride for i in range(count)]
    skipped = {
        w: set(draw(st.lists(st.sampled_from(steps), max_size=count // 2)))
        for w in range(world)
        if draw(st.booleans())
    }
    stall_from = draw(st.one_of(st.none(), st.sampled_from(steps)))
    nan_steps = frozenset(draw(st.lists(st.sampled_from(steps), max_size=1)))
    dead = draw(st.sampled_from([0.0, 0.0, 0.8]))
    vanish_from = draw(st.one_of(st.none(), st.sampled_from(steps)))
    num_steps = draw(st.integers(2, 10))

    def loss(step: int, worker: int) -> float:
        if stall_from is not None and step >= stall_from:
            return 0.5 + 0.001 * (step % 3)
        return 1.0 / (1 + step) + 0.0001 * worker

    def grad(step: int, worker: int) -> float:
        return 1e-9 if vanish_from is not None and step >= vanish_from else 1e-2

    rules = [
        {
            "RuleConfigurationName": "loss",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": str(num_steps)},
        },
        {"RuleConfigurationName": "nan", "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}},
        {"RuleConfigurationName": "vanishing", "RuleParameters": {"rule_to_invoke": "VanishingGradient"}},
        {"RuleConfigurationName": "dead", "RuleParameters": {"rule_to_invoke": "DeadRelu"}},
    ]
    if draw(st.booleans()):
        rules.append(
            {
                "RuleConfigurationName": "typo",
                "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_step": "3"},
            }
        )
    return SyntheticJob(
        job=name,
        world_size=world,
        steps=steps,
        loss=loss,
        grad_mean_abs=grad,
        nan_steps=nan_steps,
        skipped=skipped,
        rules=rules,
        dead_fraction=dead,
        ended=draw(st.integers(0, 4)) > 0,
    )


def deliver(aws, keys: list[str], threads: int) -> None:
    """Each thread is a concurrently running Lambda; a conflict past the retry budget is redelivered."""
    queues = [keys[i::threads] for i in range(threads)]
    errors: list[BaseException] = []

    def run(queue: list[str]) -> None:
        service = aws.service()
        pending = list(queue)
        while pending:
            key = pending.pop(0)
            try:
                service.handle_object(aws.bucket, key)
            except VersionConflict:
                pending.append(key)  # SQS redelivery
            except PermanentError as exc:  # pragma: no cover - synthetic objects are valid
                errors.append(exc)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

    workers = [threading.Thread(target=run, args=(q,)) for q in queues]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors


def statuses(state) -> list[tuple]:
    return [(r.name, r.status, r.step, r.details) for r in state.rules]


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    jobs=st.lists(st.sampled_from(["job-a", "job-b", "job-c"]), min_size=1, max_size=2, unique=True).flatmap(
        lambda names: st.tuples(*[synthetic_jobs(n) for n in names])
    ),
    seed=st.integers(0, 2**32 - 1),
    duplicate_rate=st.sampled_from([0.0, 0.3, 1.0]),
    threads=st.integers(1, 4),
    segments=st.booleans(),
    windows=st.lists(st.integers(1, 7), min_size=3, max_size=3),
)
def test_live_evaluation_equals_replay(
    tmp_path_factory, atomic_dynamodb, aws_factory, jobs, seed, duplicate_rate, threads, segments, windows
):
    rng = random.Random(seed)
    with mock_aws():
        aws = aws_factory()
        keys: list[str] = []
        for job in jobs:
            objects = job.objects()
            if segments:  # format 2, each worker cutting its steps into its own windows
                objects = convert_objects(objects, lambda w: WindowRules(window_s=None, max_steps=windows[w]))
            keys += aws.put_job(job.job, objects)
        keys += [k for k in keys if rng.random() < duplicate_rate]
        rng.shuffle(keys)
        deliver(aws, keys, threads)

        events = aws.drain_events()
        store = aws.service().store
        for job in jobs:
            folder = tmp_path_factory.mktemp("replay") / job.job
            for rel, body in job.objects().items():
                path = folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
            expected = replay(LocalJob.open(folder))
            live = store.load_state(job.job)
            assert live is not None
            assert statuses(live[0]) == statuses(expected.state)
            assert live[0].finished == expected.state.finished == job.ended

            job_events = [
                e["detail"]
                for e in events
                if e["detail"]["TrainingJobName"] == job.job and "RuleName" in e["detail"]
            ]
            finished = [
                e
                for e in events
                if e["detail-type"] == "Training Job Evaluation Finished"
                and e["detail"]["TrainingJobName"] == job.job
            ]
            assert len(finished) == (1 if job.ended else 0)
            ids = Counter(d["EventId"] for d in job_events)
            assert all(n == 1 for n in ids.values()), f"an event was published twice: {ids.most_common(3)}"
            live_alerts = Counter(
                (d["RuleConfigurationName"], d["RuleEvaluationStatus"], d["StatusDetails"])
                for d in job_events
                if d["RuleEvaluationStatus"] in ("IssuesFound", "Error")
            )
            assert live_alerts == Counter(expected.alerts())
            # every transition replay makes is an event, once
            assert len(job_events) == len(expected.transitions)


def test_replay_of_a_job_is_deterministic(tmp_path):
    job = SyntheticJob(
        "det", world_size=2, steps=list(range(0, 40, 4)), skipped={1: {8, 12}}, nan_steps=frozenset({20})
    )
    for rel, body in job.objects().items():
        (tmp_path / "det" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "det" / rel).write_bytes(body)
    first = replay(LocalJob.open(tmp_path / "det"))
    second = replay(LocalJob.open(tmp_path / "det"))
    assert statuses(first.state) == statuses(second.state)
    nan_rule = first.state.rule("ExplodingTensor")
    assert nan_rule.status == "IssuesFound" and nan_rule.step == 20
    assert not math.isnan(first.state.watermark)

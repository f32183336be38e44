"""The evaluator on format-2 segments: multi-worker completion with different windows, partial
consumption, bad and missing segments, a NaN judged at once, and version 1 = version 2."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from trainguard.engine.evaluator import advance, apply_end, apply_manifest
from trainguard.engine.model import JobState, SegmentArrival, UnreadableObject
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob, read_end, read_manifest, segment_arrival
from trainguard.format import layout
from trainguard.format.convert import WindowRules, convert_objects
from trainguard.local.synthetic import SyntheticJob, noisy_decreasing

NOW = 1_800_000_000.0


def by_steps(n: int) -> WindowRules:
    return WindowRules(window_s=None, max_steps=n)


def segments_of(objects: dict[str, bytes], job: str) -> list[SegmentArrival]:
    out = []
    for key, data in sorted(objects.items()):
        ref = layout.parse_relative(job, key)
        if ref.kind is layout.ObjectKind.SEGMENT:
            out.append(segment_arrival(ref, data, len(data)))
    return out


def started(job: SyntheticJob, objects: dict[str, bytes]) -> JobState:
    return apply_manifest(JobState(job=job.job), read_manifest(objects["manifest.json"]), NOW).state


def ended(state: JobState, objects: dict[str, bytes]) -> JobState:
    for key, data in objects.items():
        if key.startswith("end/"):
            state = apply_end(state, read_end(data)).state
    return state


def write(folder: Path, objects: dict[str, bytes]) -> Path:
    for rel, body in objects.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    return folder


def verdicts(state: JobState) -> list[tuple]:
    return [(r.name, r.status, r.step, r.details) for r in state.rules]


class Headers:
    """A header reader over a dict of objects (what the live service's S3 reader does)."""

    def __init__(self, objects: dict[str, bytes], job: str, missing: set[str] = frozenset()) -> None:
        self.objects, self.job, self.missing, self.reads = objects, job, missing, 0

    def step(self, arrival):  # pragma: no cover - these tests buffer segments only
        raise AssertionError("no step objects here")

    def segment(self, arrival):
        self.reads += 1
        if arrival.key in self.missing:
            raise UnreadableObject(f"{arrival.key}: no longer exists (NoSuchKey)")
        data = self.objects[arrival.key]
        full = segment_arrival(layout.parse_relative(self.job, arrival.key), data, len(data))
        assert full.header is not None
        return full.header


def pointers(arrivals: list[SegmentArrival]) -> list[SegmentArrival]:
    """What the state table gives back: pointers without headers."""
    return [
        SegmentArrival(
            a.worker, a.seq, a.first_step, a.last_step, a.prev_step, size=a.size, header_end=a.header_end
        )
        for a in arrivals
    ]


def test_a_step_is_complete_when_every_worker_with_its_own_window_reached_it():
    job = SyntheticJob("w3", world_size=3, steps=list(range(20)), ended=False)
    objects = convert_objects(job.objects(), {0: by_steps(2), 1: by_steps(7), 2: by_steps(20)})
    segs = segments_of(objects, "w3")
    state = started(job, objects)
    fast = [a for a in segs if a.worker in (0, 1)]
    out = advance(state, fast, NOW)
    assert out.state.watermark == -1 and not out.consumed_segments  # worker 2 has not written step 0
    worker2 = [a for a in segs if a.worker == 2]
    first_of_each = [a for a in segs if a.seq == 0]
    out = advance(state, first_of_each, NOW)
    # worker 0's first segment ends at step 1, worker 1's at 6, worker 2's at 19: step 0 and 1 are complete
    assert out.state.watermark == 1 and out.state.steps_evaluated == 2
    done = {(a.worker, a.seq) for a in out.consumed_segments}
    assert done == {(0, 0)}  # workers 1 and 2 are consumed partly: their segments stay buffered
    assert out.state.frontier == {0: 1, 1: 1, 2: 1} and out.state.segment_frontier == {0: 0}
    out = advance(out.state, fast + worker2, NOW)
    assert out.state.watermark == 19 and out.state.steps_evaluated == 20
    # every segment is now consumed (worker 0's first again: a stale duplicate, deleted again)
    assert {(a.worker, a.seq) for a in out.consumed_segments} == {(a.worker, a.seq) for a in segs}


def test_workers_that_skip_steps_and_use_different_windows_complete_the_same_steps():
    job = SyntheticJob(
        "skip", world_size=2, steps=list(range(0, 60, 3)), skipped={1: {9, 12, 30}}, nan_steps=frozenset({33})
    )
    objects = convert_objects(job.objects(), {0: by_steps(4), 1: WindowRules(window_s=0.1)})
    state = ended(started(job, objects), objects)
    out = advance(state, segments_of(objects, "skip"), NOW)
    assert out.state.finished and out.state.steps_evaluated == 20
    nan = out.state.rule("ExplodingTensor")
    assert nan.status == "IssuesFound" and nan.step == 33


@pytest.mark.parametrize("seed", range(5))
def test_segments_in_any_order_with_duplicates_give_the_verdicts_of_one_pass(seed):
    rng = random.Random(seed)
    job = SyntheticJob(
        "perm",
        world_size=3,
        steps=list(range(0, 80, 2)),
        skipped={2: {10, 12, 14}},
        loss=noisy_decreasing(seed),
        nan_steps=frozenset({rng.choice(range(0, 80, 2))}),
    )
    objects = convert_objects(job.objects(), lambda w: by_steps(rng.randint(1, 9)))
    segs = segments_of(objects, "perm")
    reference = advance(ended(started(job, objects), objects), segs, NOW).state
    headers = Headers(objects, "perm")
    state = started(job, objects)
    buffered: dict[tuple[int, int], SegmentArrival] = {}
    deliveries = pointers(segs) + rng.sample(pointers(segs), len(segs) // 2)
    rng.shuffle(deliveries)
    ends = [read_end(v) for k, v in objects.items() if k.startswith("end/")]
    for item in deliveries + ends:
        if isinstance(item, SegmentArrival):
            buffered[(item.worker, item.seq)] = item
        else:
            state = apply_end(state, item).state
        out = advance(state, list(buffered.values()), NOW, headers=headers)
        state = out.state
        for gone in out.consumed_segments:
            buffered.pop((gone.worker, gone.seq), None)
    assert state.finished and verdicts(state) == verdicts(reference)
    assert not buffered


def test_a_nan_segment_is_judged_as_soon_as_it_arrives():
    job = SyntheticJob("nan", steps=list(range(30)), nan_steps=frozenset({17}), ended=False)
    objects = convert_objects(job.objects(), WindowRules(window_s=None, max_steps=50))
    keys = sorted(k for k in objects if k.startswith("segments/"))
    # the window closed at once on the NaN: the first segment ends at step 17
    assert keys[0] == layout.segment_key(0, 0, 0, 17)
    first = segments_of({keys[0]: objects[keys[0]]}, "nan")
    assert first[0].header.reason == "nonfinite"
    out = advance(started(job, objects), first, NOW)
    fired = [t.record for t in out.transitions if t.record.status == "IssuesFound"]
    assert [(r.name, r.step) for r in fired] == [("ExplodingTensor", 17)]


def test_a_bad_segment_keeps_the_chain_moving_and_its_reason_is_recorded():
    job = SyntheticJob("bad", world_size=2, steps=list(range(12)))
    objects = convert_objects(job.objects(), {0: by_steps(3), 1: by_steps(5)})
    key = layout.segment_key(1, 1, 5, 9)
    objects[key] = objects[key][:-7]  # truncated
    segs = segments_of(objects, "bad")
    bad = next(a for a in segs if a.bad is not None)
    assert (bad.worker, bad.seq, bad.first_step, bad.last_step) == (1, 1, 5, 9) and "truncated" in bad.bad
    out = advance(ended(started(job, objects), objects), segs, NOW)
    assert out.state.finished and out.state.watermark == 11
    assert out.state.steps_evaluated == 12  # worker 0 wrote every step; worker 1's 5..9 contribute nothing


def test_a_segment_missing_when_it_is_evaluated_is_a_bad_arrival():
    job = SyntheticJob("gone", world_size=2, steps=list(range(10)))
    objects = convert_objects(job.objects(), {0: by_steps(4), 1: by_steps(10)})
    missing = layout.segment_key(0, 1, 4, 7)
    headers = Headers(objects, "gone", missing={missing})
    out = advance(
        ended(started(job, objects), objects), pointers(segments_of(objects, "gone")), NOW, headers=headers
    )
    assert out.state.finished and out.state.frontier == {0: 9, 1: 9}
    assert any(missing in r and "NoSuchKey" in r for r in out.state.invalid_objects)


def test_a_gap_in_a_workers_chain_waits_for_the_missing_segment():
    job = SyntheticJob("gap", steps=list(range(9)), ended=False)
    objects = convert_objects(job.objects(), by_steps(3))
    segs = segments_of(objects, "gap")
    state = started(job, objects)
    out = advance(state, [segs[0], segs[2]], NOW)
    assert out.state.watermark == 2 and [a.seq for a in out.consumed_segments] == [0]
    out = advance(out.state, [segs[1], segs[2], segs[0]], NOW)
    assert out.state.watermark == 8 and sorted(a.seq for a in out.consumed_segments) == [0, 1, 2]


def test_a_segment_from_a_rank_outside_the_world_is_refused_with_a_reason():
    job = SyntheticJob("world", steps=[0, 1], ended=False)
    objects = convert_objects(job.objects(), by_steps(2))
    stray = SegmentArrival(worker=5, seq=0, first_step=0, last_step=1, bad=None)
    out = advance(started(job, objects), [*segments_of(objects, "world"), stray], NOW)
    assert out.state.watermark == 1 and stray in out.consumed_segments
    assert any("worker 5 is outside the job's world size 1" in r for r in out.state.invalid_objects)


@pytest.mark.parametrize(
    "job",
    [
        SyntheticJob("clean", world_size=2, steps=list(range(0, 90, 3)), loss=noisy_decreasing(3)),
        SyntheticJob("stall", steps=list(range(60)), loss=lambda s, w: 0.5 + 0.001 * (s % 3)),
        SyntheticJob(
            "mixed",
            world_size=3,
            steps=list(range(0, 40, 2)),
            skipped={0: {4, 6}, 2: {20}},
            nan_steps=frozenset({24}),
            dead_fraction=0.8,
            eval_loss=lambda s, w: 1.0 / (1 + s),
        ),
        SyntheticJob("running", world_size=2, steps=list(range(25)), ended=False),
    ],
    ids=lambda j: j.job,
)
def test_a_version_1_and_a_version_2_job_of_the_same_run_replay_to_the_same_verdicts(tmp_path, job):
    v1 = job.objects()
    v2 = convert_objects(v1, {0: WindowRules(window_s=0.05), 1: by_steps(4), 2: by_steps(1)})
    one = replay(LocalJob.open(write(tmp_path / "v1" / job.job, v1)), now=NOW)
    two = replay(LocalJob.open(write(tmp_path / "v2" / job.job, v2)), now=NOW)
    assert verdicts(two.state) == verdicts(one.state)
    assert [(t.record.name, t.record.status, t.record.details) for t in two.transitions] == [
        (t.record.name, t.record.status, t.record.details) for t in one.transitions
    ]
    assert (two.state.watermark, two.state.steps_evaluated, two.state.finished) == (
        one.state.watermark,
        one.state.steps_evaluated,
        one.state.finished,
    )
    assert not two.warnings and not one.warnings

"""The job pipeline on format-2 segments, against S3, DynamoDB and EventBridge on moto.

What is buffered is a pointer of about a hundred bytes whatever the model size; DynamoDB
requests per segment do not grow with its number of steps; a segment or step object that is
missing or broken keeps the worker's chain moving with its reason recorded; a record naming
another bucket is refused.
"""

from __future__ import annotations

import pytest
from trainguard.format import layout
from trainguard.format.convert import WindowRules, convert_objects
from trainguard.local.synthetic import SyntheticJob
from trainguard.service.pipeline import JobPipeline, PermanentError
from trainguard.service.publisher import Publisher
from trainguard.service.state_store import StateStore, pk


def by_steps(n: int) -> WindowRules:
    """Windows of ``n`` steps, however large their header (past 256 KiB: a second ranged GET)."""
    return WindowRules(window_s=None, max_steps=n, header_target_bytes=15 * 1024 * 1024)


def deliver(service: JobPipeline, bucket: str, keys: list[str]) -> list[str]:
    """handle_object for each key; the reasons of those that went to the DLQ."""
    reasons = []
    for key in keys:
        try:
            service.handle_object(bucket, key)
        except PermanentError as exc:
            reasons.append(str(exc))
    return reasons


def buffered(aws, job: str) -> list[dict]:
    items = aws.ddb.query(
        TableName=aws.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk(job)}},
        ConsistentRead=True,
    )["Items"]
    return [i for i in items if i["sk"]["S"].startswith(("SEG#", "STEP#"))]


def ordered(keys: list[str]) -> list[str]:
    """Manifest first, end markers last (any order works; this one is easy to reason about)."""
    return sorted(keys, key=lambda k: (not k.endswith("manifest.json"), "/end/" in k, k))


def fresh(aws) -> JobPipeline:
    """A new process: an empty header cache."""
    return JobPipeline(
        StateStore(aws.table, aws.ddb), aws.s3, Publisher(aws.events, aws.bus), bucket=aws.bucket
    )


@pytest.mark.parametrize("steps_per_segment", [1, 10, 1000])
def test_dynamodb_requests_per_segment_do_not_grow_with_its_steps(aws, steps_per_segment):
    job = SyntheticJob("count", steps=list(range(1000)), ended=False)
    v2 = convert_objects(job.objects(), by_steps(steps_per_segment))
    keys = ordered(aws.put_job("count", v2))
    service = aws.service()
    service.handle_object(aws.bucket, keys[0])  # the manifest
    segment = keys[1]
    before = service.store.requests
    service.handle_object(aws.bucket, segment)
    per_segment = service.store.requests - before
    state, _ = service.store.load_state("count")
    assert state.steps_evaluated == steps_per_segment
    # put the pointer, query the job, write the state, delete the pointer, query again (no lost wake-up)
    assert per_segment == 5

    v1_keys = ordered(aws.put_job("count-v1", SyntheticJob("count-v1", steps=[0, 1], ended=False).objects()))
    service.handle_object(aws.bucket, v1_keys[0])
    before = service.store.requests
    service.handle_object(aws.bucket, v1_keys[1])
    assert service.store.requests - before == per_segment  # what one format-1 step object costs


def test_what_is_buffered_is_a_small_pointer_and_a_new_process_reads_the_header_once(aws):
    # 1,500 steps with 9 tensors each: the header is megabytes, far past one DynamoDB item
    job = SyntheticJob("big", world_size=2, steps=list(range(1500)), layers=4, ended=False)
    v2 = convert_objects(job.objects(), {0: by_steps(1500), 1: by_steps(500)})
    keys = ordered(aws.put_job("big", v2))
    first = layout.segment_key(0, 0, 0, 1499)
    assert len(v2[first]) > 2 * 1024 * 1024
    service = aws.service()
    deliver(service, aws.bucket, [keys[0], f"jobs/big/{first}"])
    (item,) = buffered(aws, "big")  # worker 1 has written nothing yet: worker 0's segment waits
    assert item["sk"]["S"] == "SEG#000000000000#00000#000000000000"
    assert sum(len(k) + len(str(v)) for k, v in item.items()) < 400

    ranges: list[str] = []
    later = fresh(aws)
    later.s3.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: ranges.append(params.get("Range", "all"))
    )
    try:
        deliver(
            later, aws.bucket, [f"jobs/big/{k}" for k in sorted(v2) if k.startswith("segments/worker-00001")]
        )
    finally:
        later.s3.meta.events.unregister("before-parameter-build.s3.GetObject")
    state, _ = later.store.load_state("big")
    assert state.watermark == 1499 and state.steps_evaluated == 1500
    header_end = int(item["hdr"]["N"])
    # worker 1's three segments were read at ingest (a probe, then the rest of each header);
    # worker 0's buffered one was read again with one GET of exactly its header
    assert ranges.count(f"bytes=0-{header_end - 1}") == 1
    assert all(r != "all" for r in ranges)
    assert not buffered(aws, "big")


def test_a_segment_deleted_before_it_is_read_keeps_the_chain_moving(aws):
    job = SyntheticJob("deleted", steps=list(range(12)), nan_steps=frozenset({10}))
    v2 = convert_objects(job.objects(), by_steps(4))
    keys = ordered(aws.put_job("deleted", v2))
    gone = "jobs/deleted/" + layout.segment_key(0, 1, 4, 7)
    aws.s3.delete_object(Bucket=aws.bucket, Key=gone)
    reasons = deliver(aws.service(), aws.bucket, keys)
    assert len(reasons) == 1 and "segments/worker-00000/000000000001-000000000004-000000000007" in reasons[0]
    assert "NoSuchKey" in reasons[0]
    state, _ = aws.service().store.load_state("deleted")
    assert state.finished and state.watermark == 11 and state.steps_evaluated == 8
    assert state.rule("ExplodingTensor").status == "IssuesFound" and state.rule("ExplodingTensor").step == 10
    assert any("NoSuchKey" in r for r in state.invalid_objects)


def test_a_segment_deleted_while_it_waits_for_another_worker_is_a_bad_arrival(aws):
    job = SyntheticJob("waits", world_size=2, steps=list(range(8)))
    v2 = convert_objects(job.objects(), {0: by_steps(4), 1: by_steps(8)})
    keys = ordered(aws.put_job("waits", v2))
    waiting = "jobs/waits/" + layout.segment_key(0, 1, 4, 7)
    worker0 = [k for k in keys if "worker-00000" in k and "segments/" in k]
    deliver(aws.service(), aws.bucket, [keys[0], *worker0])
    aws.s3.delete_object(Bucket=aws.bucket, Key=waiting)
    rest = [k for k in keys if k != keys[0] and k not in worker0]
    assert deliver(fresh(aws), aws.bucket, rest) == []  # a new process: the header is not cached
    state, _ = aws.service().store.load_state("waits")
    assert state.finished and state.frontier == {0: 7, 1: 7}
    assert any("no longer exists (NoSuchKey) when it was to be evaluated" in r for r in state.invalid_objects)


def test_a_step_object_deleted_before_it_is_read_no_longer_blocks_its_job(aws):
    job = SyntheticJob("v1-deleted", steps=[0, 1, 2, 3])
    keys = ordered(aws.put_job("v1-deleted", job.objects()))
    gone = "jobs/v1-deleted/" + layout.step_key(2, 0)
    aws.s3.delete_object(Bucket=aws.bucket, Key=gone)
    reasons = deliver(aws.service(), aws.bucket, keys)
    assert len(reasons) == 1 and "steps/000000000002/worker-00000.safetensors" in reasons[0]
    state, _ = aws.service().store.load_state("v1-deleted")
    assert state.finished and state.watermark == 3


def test_a_malformed_segment_is_dead_lettered_with_its_reason_and_skipped(aws):
    job = SyntheticJob("broken", world_size=2, steps=list(range(6)))
    v2 = convert_objects(job.objects(), by_steps(3))
    key = layout.segment_key(1, 0, 0, 2)
    v2[key] = b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"
    reasons = deliver(aws.service(), aws.bucket, ordered(aws.put_job("broken", v2)))
    assert len(reasons) == 1 and key in reasons[0] and "not valid UTF-8 JSON" in reasons[0]
    state, _ = aws.service().store.load_state("broken")
    assert state.finished and state.steps_evaluated == 6


def test_a_partly_consumed_segment_stays_buffered_until_its_last_step_is_evaluated(aws):
    job = SyntheticJob("partial", world_size=2, steps=list(range(10)), ended=False)
    v2 = convert_objects(job.objects(), {0: by_steps(10), 1: by_steps(3)})
    keys = ordered(aws.put_job("partial", v2))
    service = aws.service()
    deliver(service, aws.bucket, [keys[0], "jobs/partial/" + layout.segment_key(0, 0, 0, 9)])
    deliver(service, aws.bucket, ["jobs/partial/" + layout.segment_key(1, 0, 0, 2)])
    state, _ = service.store.load_state("partial")
    assert state.watermark == 2 and state.frontier == {0: 2, 1: 2}
    assert [i["sk"]["S"] for i in buffered(aws, "partial")] == ["SEG#000000000000#00000#000000000000"]
    deliver(service, aws.bucket, [k for k in keys if "worker-00001" in k])
    state, _ = service.store.load_state("partial")
    assert state.watermark == 9 and not buffered(aws, "partial")


def test_a_record_naming_another_bucket_is_refused_not_judged(aws):
    job = SyntheticJob("elsewhere", steps=[0, 1], nan_steps=frozenset({1}))
    keys = aws.put_job("elsewhere", job.objects())
    aws.s3.create_bucket(Bucket="someone-else")
    for key in keys:
        aws.s3.copy_object(Bucket="someone-else", Key=key, CopySource={"Bucket": aws.bucket, "Key": key})
    reasons = deliver(aws.service(), "someone-else", keys)
    assert len(reasons) == len(keys) and all("this stack evaluates only 'tg-data'" in r for r in reasons)
    assert aws.service().store.load_state("elsewhere") is None


@pytest.mark.parametrize(
    "relative",
    [
        "segments/worker-00000/000000000000-000000000000-000000000001.safetensors\n",
        "segments/worker-0000\uff10/000000000000-000000000000-000000000001.safetensors",
    ],
    ids=["trailing-newline", "fullwidth-digit"],
)
def test_keys_outside_the_ascii_layout_are_refused_with_a_reason(aws, relative):
    with pytest.raises(PermanentError, match="outside the trainguard layout"):
        aws.service().ingest(aws.bucket, f"jobs/odd/{relative}")


def test_replay_of_a_version_2_job_in_s3_equals_the_version_1_job(aws, tmp_path):
    from trainguard.engine.replay import replay
    from trainguard.engine.sources import LocalJob
    from trainguard.service.s3_objects import S3Job

    job = SyntheticJob("s3-v2", world_size=2, steps=list(range(0, 60, 2)), nan_steps=frozenset({40}))
    v1 = job.objects()
    aws.put_job("s3-v2", convert_objects(v1, {0: by_steps(5), 1: WindowRules(window_s=0.07)}))
    for rel, body in v1.items():
        (tmp_path / "s3-v2" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "s3-v2" / rel).write_bytes(body)
    live = replay(S3Job.from_uri(f"s3://{aws.bucket}/jobs/s3-v2", aws.s3))
    local = replay(LocalJob.open(tmp_path / "s3-v2"))
    assert [(r.name, r.status, r.step, r.details) for r in live.state.rules] == [
        (r.name, r.status, r.step, r.details) for r in local.state.rules
    ]
    assert live.state.rule("ExplodingTensor").step == 40 and not live.warnings


@pytest.mark.slow
def test_local_mode_judges_a_nan_segment_and_stops_the_job_with_the_real_handlers():
    import json

    from trainguard.local.runtime import LocalCloud
    from trainguard.service import clients

    rules = [
        {
            "RuleConfigurationName": "nan-check",
            "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            "Actions": ["Email", "StopTraining"],
        }
    ]
    job = SyntheticJob("seg-nan", world_size=2, steps=list(range(40)), nan_steps=frozenset({23}), rules=rules)
    v2 = convert_objects(job.objects(), {0: by_steps(6), 1: WindowRules(window_s=0.15)})
    with LocalCloud(name="tg-seg") as cloud:
        s3 = clients.client("s3")
        for rel, body in ordered_items(v2):
            s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/seg-nan/{rel}", Body=body)
        assert cloud.wait_idle(60)
        fired = [
            e["detail"]
            for e in cloud.events
            if e["detail"].get("RuleEvaluationStatus") == "IssuesFound"
            and e["detail"]["TrainingJobName"] == "seg-nan"
        ]
        assert [(d["RuleConfigurationName"], d["Step"]) for d in fired] == [("nan-check", 23)]
        assert len([n for n in cloud.sent_notifications() if "seg-nan" in n["subject"]]) == 1
        stop = s3.get_object(Bucket=cloud.resources.bucket, Key="jobs/seg-nan/control/stop.json")
        assert json.loads(stop["Body"].read())["rule"] == "nan-check"
        assert not cloud.errors and not cloud.dlq_messages()


def ordered_items(objects: dict[str, bytes]) -> list[tuple[str, bytes]]:
    return [(k, objects[k]) for k in ordered(list(objects))]


def test_a_step_buffered_by_an_earlier_trainguard_with_its_header_is_still_evaluated(aws):
    import zlib

    from trainguard.format import documents as d

    job = SyntheticJob("upgrade", steps=[0, 1], nan_steps=frozenset({1}))
    objects = job.objects()
    keys = ordered(aws.put_job("upgrade", objects))
    service = aws.service()
    service.handle_object(aws.bucket, keys[0])  # the manifest
    header, _ = d.decode_step_header(objects[layout.step_key(0, 0)])
    aws.ddb.put_item(  # what the previous version buffered: the header itself, zlib JSON
        TableName=aws.table,
        Item={
            "pk": {"S": pk("upgrade")},
            "sk": {"S": "STEP#000000000000#00000"},
            "hdr": {"B": zlib.compress(header.model_dump_json().encode())},
        },
    )
    deliver(service, aws.bucket, [keys[2], keys[3]])  # step 1 and the end marker
    state, _ = service.store.load_state("upgrade")
    assert state.finished and state.steps_evaluated == 2 and not state.invalid_objects
    assert state.rule("ExplodingTensor").step == 1

"""Sizes are checked in bytes before anything is read, stored or sent (issue 9, item 6).

PutEvents requests are cut by count and bytes; an event id too long for a DynamoDB sort key
still gets an outbox item; rule configurations too large for the state item end each rule
Error when the manifest arrives; a rule state that outgrows the item is shed with a reason;
the DLQ copy of a message fits SQS's limit; documents are read with one bounded ranged GET;
every item carries a TTL.
"""

from __future__ import annotations

import random
import string
import textwrap

import pytest
from trainguard.engine.events import MAX_REQUEST_BYTES, entry_bytes
from trainguard.format import layout
from trainguard.format.documents import MAX_DOCUMENT_BYTES, Manifest, dump_document
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules import plugins
from trainguard.service import evaluate
from trainguard.service.pipeline import PermanentError
from trainguard.service.state_store import MAX_ITEM_BYTES, RETENTION_S, TTL_ATTRIBUTE, pk
from trainguard.wiring import TABLE


def deliver(service, bucket: str, keys: list[str]) -> list[str]:
    reasons = []
    for key in keys:
        try:
            service.handle_object(bucket, key)
        except PermanentError as exc:
            reasons.append(str(exc))
    return reasons


def items(aws, job: str) -> list[dict]:
    return aws.ddb.query(
        TableName=aws.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk(job)}},
        ConsistentRead=True,
    )["Items"]


def long_name(i: int) -> str:
    """256 four-byte characters (1,024 bytes of UTF-8): SageMaker's longest RuleConfigurationName."""
    return "\U0001d538" * 255 + chr(0x1D400 + i)


def twenty_rules_at_the_limits() -> list[dict]:
    # an unknown rule named with 1,000 characters: its Error details are the full 1,024 characters
    return [
        {"RuleConfigurationName": long_name(i), "RuleParameters": {"rule_to_invoke": "R" * 1000}}
        for i in range(20)
    ]


def test_twenty_rules_at_the_name_and_details_limits_are_all_published(aws):
    requests: list[list[dict]] = []
    aws.events.meta.events.register(
        "before-parameter-build.events.PutEvents", lambda params, **_: requests.append(params["Entries"])
    )
    job = SyntheticJob("limits", steps=[0, 1], rules=twenty_rules_at_the_limits())
    service = aws.service()
    assert deliver(service, aws.bucket, sorted(aws.put_job("limits", job.objects()))) == []
    state, _ = service.store.load_state("limits")
    assert [r.status for r in state.rules] == ["Error"] * 20
    assert all(len(r.details) == 1024 for r in state.rules)
    sizes = [sum(entry_bytes(e["Detail"]) for e in entries) for entries in requests]
    assert all(len(entries) <= 10 for entries in requests)
    assert max(sizes) <= MAX_REQUEST_BYTES < 256 * 1024  # one request of 10 would be ~430 KB
    fired = [e["detail"] for e in aws.drain_events() if e["detail"].get("RuleEvaluationStatus") == "Error"]
    assert sorted(d["RuleConfigurationName"] for d in fired) == sorted(long_name(i) for i in range(20))
    # the event ids (rule name / transition) do not fit a sort key as text: hashed, and gone once sent
    assert not [i for i in items(aws, "limits") if i["sk"]["S"].startswith("OUTBOX#")]


def test_rule_configurations_too_large_for_the_state_item_end_each_rule_error(aws):
    rng = random.Random(9)
    noise = "".join(rng.choices(string.ascii_letters + string.digits, k=420))
    rules = [
        {
            "RuleConfigurationName": f"big-{i}",
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", **{f"p{j}": noise for j in range(99)}},
        }
        for i in range(20)
    ]
    job = SyntheticJob("huge-manifest", steps=[0, 1], rules=rules)
    objects = job.objects()
    assert 800_000 < len(objects[layout.MANIFEST]) <= MAX_DOCUMENT_BYTES  # valid, and 846 KB-ish
    service = aws.service()
    assert deliver(service, aws.bucket, sorted(aws.put_job("huge-manifest", objects))) == []
    state, _ = service.store.load_state("huge-manifest")
    assert len(state.rules) == 20 and state.finished
    for record in state.rules:
        assert record.status == "Error" and record.rule == "LossNotDecreasing"
        assert "rule configurations are" in record.details and "400 KB" in record.details


HOARDING_RULES = """
import os

from pydantic import Field
from trainguard.rules.base import Rule, RuleConfig, RuleState


class HoardsConfig(RuleConfig):
    pass


class HoardsState(RuleState):
    kept: list[str] = Field(default_factory=list)


class Hoards(Rule[HoardsConfig, HoardsState]):
    '''A badly written custom rule: its state grows by 60 KB of noise per step.'''

    name = "Hoards"
    Config = HoardsConfig
    State = HoardsState
    summary = "Keeps everything (tests)."
    advice = ""

    def update(self, state, step):
        state.kept.append(os.urandom(45_000).hex())
        return state, []


RULES = [Hoards]
"""


def test_a_rule_state_that_outgrows_the_item_is_shed_with_a_reason(aws, tmp_path, monkeypatch):
    (tmp_path / "hoarding_rules.py").write_text(textwrap.dedent(HOARDING_RULES))
    monkeypatch.setenv(plugins.ENV_VAR, f"{tmp_path}:hoarding_rules")
    plugins.reset()
    rules = [
        {"RuleConfigurationName": "hoards", "RuleParameters": {"rule_to_invoke": "Hoards"}},
        {"RuleConfigurationName": "nan", "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}},
    ]
    job = SyntheticJob("hoarder", steps=list(range(12)), rules=rules, nan_steps=frozenset({11}))
    service = aws.service()
    keys = sorted(aws.put_job("hoarder", job.objects()), key=lambda k: (not k.endswith("manifest.json"), k))
    assert deliver(service, aws.bucket, keys) == []
    state, _ = service.store.load_state("hoarder")
    hoards = state.rule("hoards")
    assert hoards.status == "Error" and "RuleStateTooLarge" in hoards.details and hoards.state is None
    assert f"at most {MAX_ITEM_BYTES:,}" in hoards.details
    assert state.rule("nan").status == "IssuesFound" and state.rule("nan").step == 11
    assert state.finished


def test_the_dlq_copy_of_a_full_size_message_fits_sqs(aws, functions):
    body = "x" * (256 * 1024)
    reason = "r\x1b[2J" * 2000  # long, and with an escape byte SQS would refuse raw
    evaluate.dead_letter(body, reason, "m-1")
    (parked,) = aws.sqs.receive_message(QueueUrl=functions, MessageAttributeNames=["All"])["Messages"]
    attributes = parked["MessageAttributes"]
    total = len(parked["Body"].encode()) + sum(
        len(name) + len(a["DataType"]) + len(a["StringValue"].encode()) for name, a in attributes.items()
    )
    assert total <= 256 * 1024
    assert attributes["body_truncated_from_bytes"]["StringValue"] == str(256 * 1024)
    assert len(attributes["body_sha256"]["StringValue"]) == 64
    shown = attributes["reason"]["StringValue"]
    assert "\x1b" not in shown and "\\x1b" in shown


def test_a_small_message_goes_to_the_dlq_whole(functions, aws):
    evaluate.dead_letter('{"not": "s3"}', "message body has no S3 'Records' list", "m-2")
    (parked,) = aws.sqs.receive_message(QueueUrl=functions, MessageAttributeNames=["All"])["Messages"]
    assert parked["Body"] == '{"not": "s3"}'
    assert "body_truncated_from_bytes" not in parked["MessageAttributes"]


def test_a_manifest_past_its_bound_is_refused_after_one_bounded_read(aws):
    ranges: list[str] = []
    aws.s3.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: ranges.append(params.get("Range", "all"))
    )
    manifest = Manifest(job="big-doc", created=1.0, hook_version="x", world_size=1)
    body = dump_document(manifest) + b" " * (MAX_DOCUMENT_BYTES + 10)  # valid JSON, too large
    (key,) = aws.put_job("big-doc", {layout.MANIFEST: body})
    with pytest.raises(PermanentError, match=rf"manifest\.json is {len(body):,} bytes; at most"):
        aws.service().ingest(aws.bucket, key)
    assert ranges == [f"bytes=0-{MAX_DOCUMENT_BYTES}"]


def test_a_huge_local_manifest_is_never_read_whole(tmp_path):
    import tracemalloc

    from trainguard.engine.replay import replay
    from trainguard.engine.sources import LocalJob

    folder = tmp_path / "sparse"
    folder.mkdir()
    with (folder / "manifest.json").open("wb") as handle:
        handle.truncate(256 * 1024 * 1024)  # sparse: costs no disk, would cost 256 MB to read
    tracemalloc.start()
    try:
        result = replay(LocalJob.open(folder))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024
    assert any("larger than" in w for w in result.warnings)


def test_the_trial_and_the_report_read_documents_bounded(tmp_path):
    import tracemalloc

    from trainguard.hook.storage import LocalStore
    from trainguard.report.data import load_job_data
    from trainguard.trial import Trial

    with (tmp_path / "manifest.json").open("wb") as handle:
        handle.truncate(256 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="a trainguard document has at most"):
            _ = Trial(LocalStore(tmp_path)).manifest
        data = load_job_data(str(tmp_path), store=LocalStore(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024
    assert any("manifest" in note for note in data.notes)


def test_every_item_carries_a_ttl_from_its_last_activity(aws):
    assert TTL_ATTRIBUTE == TABLE.ttl_attribute
    job = SyntheticJob("ttl", world_size=2, steps=[0, 1], ended=False, skipped={1: {0, 1}})
    service = aws.service()
    deliver(service, aws.bucket, sorted(aws.put_job("ttl", job.objects())))
    found = items(aws, "ttl")
    kinds = {i["sk"]["S"].split("#")[0] for i in found}
    assert {"STATE", "STEP"} <= kinds  # worker 1 wrote nothing yet: worker 0's steps wait
    state, _ = service.store.load_state("ttl")
    for item in found:
        expires = int(item[TTL_ATTRIBUTE]["N"])
        at = float(item["at"]["N"]) if "at" in item else state.last_activity
        assert expires == int(at) + RETENTION_S


def test_a_system_batch_too_large_to_buffer_is_a_bad_arrival_with_a_reason(aws):
    from trainguard.format.system import SystemBatch, SystemSample, dump_system_batch

    rng = random.Random(3)
    samples = [
        SystemSample(
            t=1000.0 + i,
            cpu_percent=[rng.uniform(0, 100) for _ in range(300)],
            cpu_total=50.0,
            iowait_percent=1.0,
            mem_used_percent=10.0,
        )
        for i in range(600)
    ]
    batch = SystemBatch(
        job="sysbig", worker=0, world_size=1, seq=0, start_time=1000.0, end_time=1600.0, interval_s=1.0,
        samples=samples,
    )  # fmt: skip
    raw = dump_system_batch(batch)
    assert 1024 * 1024 < len(raw) < 8 * 1024 * 1024  # a valid batch, past what one item buffers
    job = SyntheticJob("sysbig", steps=[0, 1])
    objects = {**job.objects(), layout.system_key(0, 0): raw}
    reasons = deliver(aws.service(), aws.bucket, sorted(aws.put_job("sysbig", objects)))
    assert len(reasons) == 1 and "a buffered system batch holds at most" in reasons[0]
    assert [i for i in items(aws, "sysbig") if i["sk"]["S"].startswith("SYS#") and "bad" in i]


def test_an_empty_object_is_a_clear_error(aws):
    (manifest,) = aws.put_job("empty", {layout.MANIFEST: b""})
    with pytest.raises(PermanentError, match=r"manifest\.json"):
        aws.service().ingest(aws.bucket, manifest)
    job = SyntheticJob("empty", steps=[0, 1, 2], nan_steps=frozenset({1}))
    objects = job.objects()
    objects[layout.step_key(2, 0)] = b""
    reasons = deliver(aws.service(), aws.bucket, sorted(aws.put_job("empty", objects)))
    assert any("steps/000000000002" in r and "8-byte header length" in r for r in reasons)
    state, _ = aws.service().store.load_state("empty")
    assert state.finished and state.rule("ExplodingTensor").step == 1

"""The hostile-input corpus: everything read from S3 (or a notification) may be wrong or malicious.

Each case sends a job in which something is hostile (an object, a document, a key, a
notification body, a rule parameter, a buffered item) and asserts three things:

1. a clear error: the reason is in a DLQ reason (``PermanentError``), the job's recorded
   invalid objects, or the status details of the rule it concerns; never another exception
   (which would be retried, then dead-lettered without a reason), never a stuck job;
2. the same job still gets judged: its valid objects (sent with or after the hostile one)
   are evaluated and ExplodingTensor finds the NaN at step 6 (or, where the hostile part is
   the rule configuration itself, the job still finishes with the reason in each rule);
3. another job sent afterwards is judged correctly.

One moto account serves the whole module (each case has its own job names); the corpus
runs in seconds.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
from trainguard.engine.sources import ObjectError
from trainguard.format import documents as d
from trainguard.format import layout
from trainguard.format.convert import WindowRules, convert_objects
from trainguard.format.stepfile import TensorBlob
from trainguard.local.synthetic import SyntheticJob
from trainguard.service import evaluate
from trainguard.service.pipeline import JobPipeline, PermanentError
from trainguard.service.state_store import pk
from trainguard.text import printable

#: the NaN every valid job holds, and where ExplodingTensor must find it
NAN_STEP = 6
STEPS = list(range(8))
NAN_RULE = {"RuleConfigurationName": "nan", "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}}
DEEP = 100_000
#: the key of the second segment (steps 3..5) of a valid job: the place hostile segments take
SEGMENT = layout.segment_key(0, 1, 3, 5)


def valid_objects(
    job: str, rules: list[dict[str, Any]] | None = None, format1: bool = False, **manifest: Any
) -> dict[str, bytes]:
    """A valid format-2 job: segments of steps 0-2, 3-5, 6 (closed on its NaN), 7 (or format 1)."""
    objects = dict(_valid(job, json.dumps(rules or [NAN_RULE]), format1))
    if manifest:
        doc = json.loads(objects[layout.MANIFEST])
        doc.update(manifest)
        objects[layout.MANIFEST] = json.dumps(doc).encode()
    return objects


@lru_cache(maxsize=256)
def _valid(job: str, rules: str, format1: bool) -> dict[str, bytes]:
    synthetic = SyntheticJob(job, steps=STEPS, nan_steps=frozenset({NAN_STEP}), rules=json.loads(rules))
    objects = synthetic.objects()
    if not format1:
        objects = convert_objects(objects, WindowRules(window_s=None, max_steps=3))
    return objects


def segment_doc(job: str) -> dict[str, Any]:
    """The JSON document of the valid job's second segment (to be broken)."""
    header, _ = d.decode_segment_header(valid_objects(job)[SEGMENT])
    doc: dict[str, Any] = json.loads(header.model_dump_json())
    return doc


def framed(header: dict[str, Any] | bytes, body: bytes = b"") -> bytes:
    """A safetensors object: 8-byte length, the JSON header as given, then the body."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def with_doc(doc: dict[str, Any], tensors: dict[str, Any] | None = None, body: bytes = b"") -> bytes:
    return framed({"__metadata__": {"trainguard": json.dumps(doc)}, **(tensors or {})}, body)


def changed(name: str, **fields: Any) -> bytes:
    doc = segment_doc(name)
    doc.update(fields)
    return with_doc(doc)


def deep_json(inner: str = "0") -> str:
    return "[" * DEEP + inner + "]" * DEEP


def cut(job: str, at: Callable[[bytes], int]) -> bytes:
    data = valid_objects(job)[SEGMENT]
    return data[: at(data)]


def with_tensor(job: str) -> bytes:
    """The second segment with a full tensor in its body (so a cut can land inside the data)."""
    header, _ = d.decode_segment_header(valid_objects(job)[SEGMENT])
    blob = TensorBlob.from_numpy(np.arange(64, dtype=np.float32))
    return d.encode_segment(header, {d.segment_tensor_key(4, "TRAIN", "w"): blob})


def header_length(data: bytes) -> int:
    return 8 + int(struct.unpack("<Q", data[:8])[0])


@dataclass
class Case:
    id: str
    #: the clear error: a substring of a DLQ reason, an invalid-object reason or a rule's details
    expect: str
    #: hostile objects under the job: they replace the valid job's objects of the same key
    #: (None: that object is not sent)
    objects: Callable[[str], dict[str, bytes | None]] = lambda job: {}
    #: hostile documents delivered first and refused; the valid ones (same keys) follow
    refused_first: Callable[[str], dict[str, bytes]] = lambda job: {}
    #: records (bucket, key) delivered before the job (the objects need not exist)
    records: Callable[[str, str], list[tuple[str, str]]] = lambda bucket, job: []
    #: raw SQS message bodies ingested before the job
    bodies: Callable[[str, str], list[str]] = lambda bucket, job: []
    #: the job's rules (the hostile part may be a rule's configuration)
    rules: list[dict[str, Any]] | None = None
    #: fields added to the valid manifest (accepted ones: the hostile part is inside)
    manifest: dict[str, Any] = field(default_factory=dict)
    #: the valid part of the job still finds the NaN at step 6 (False: the rules themselves
    #: were refused; the job still finishes with the reason in each rule)
    judged: bool = True
    #: a buffered item written into the state table before the job's objects arrive
    item: Callable[[str], dict[str, Any]] | None = None
    #: the valid job in format 1 (one object per step) instead of segments
    format1: bool = False
    #: other jobs' objects stored in the bucket (not delivered): job -> objects
    stored: Callable[[str], dict[str, dict[str, bytes]]] = lambda job: {}


def legacy_bomb(job: str) -> dict[str, Any]:
    """What an earlier trainguard buffered (the header itself, zlib JSON), as a zlib bomb."""
    bomb = zlib.compress(b"{" + b" " * (32 * 1024 * 1024), 9)  # 32 MB of spaces in 32 KB: past any header
    item = {"pk": {"S": pk(job)}, "sk": {"S": "STEP#000000000003#00000"}, "hdr": {"B": bomb}}
    return {**item, "prev": {"N": "2"}}


CASES: list[Case] = [
    # ---- truncated objects at every boundary, lengths outside bounds
    Case("empty-segment", "8-byte header length", objects=lambda j: {SEGMENT: b""}),
    Case("cut-in-length", "8-byte header length", objects=lambda j: {SEGMENT: cut(j, lambda b: 5)}),
    Case("cut-after-length", "truncated", objects=lambda j: {SEGMENT: cut(j, lambda b: 8)}),
    Case("cut-in-header", "truncated", objects=lambda j: {SEGMENT: cut(j, lambda b: header_length(b) // 2)}),
    Case(
        "cut-before-data",
        "truncated",
        objects=lambda j: {SEGMENT: with_tensor(j)[: header_length(with_tensor(j))]},
    ),
    Case("cut-in-data", "truncated", objects=lambda j: {SEGMENT: with_tensor(j)[:-7]}),
    Case(
        "trailing-bytes", "trailing bytes", objects=lambda j: {SEGMENT: valid_objects(j)[SEGMENT] + b"\0" * 9}
    ),
    Case("header-length-zero", "outside 1..", objects=lambda j: {SEGMENT: struct.pack("<Q", 0) + b"{}"}),
    Case("header-length-huge", "outside 1..", objects=lambda j: {SEGMENT: struct.pack("<Q", 2**40) + b"{}"}),
    Case("header-length-past-end", "truncated", objects=lambda j: {SEGMENT: struct.pack("<Q", 5000) + b"{}"}),
    # ---- the safetensors header itself
    Case("header-not-json", "not valid UTF-8 JSON", objects=lambda j: {SEGMENT: framed(b"{not json")}),
    Case("header-not-utf8", "not valid UTF-8 JSON", objects=lambda j: {SEGMENT: framed(b'{"\xff\xfe": 1}')}),
    Case("header-not-object", "not a JSON object", objects=lambda j: {SEGMENT: framed(b"[1, 2]")}),
    Case(
        "header-100000-deep", "nested too deeply", objects=lambda j: {SEGMENT: framed(deep_json().encode())}
    ),
    Case(
        "overlapping-offsets",
        "contiguous and non-overlapping",
        objects=lambda j: {
            SEGMENT: with_doc(
                segment_doc(j),
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                },
                b"\0" * 12,
            )
        },
    ),
    Case(
        "unknown-dtype",
        "unsupported dtype 'F128'",
        objects=lambda j: {
            SEGMENT: with_doc(segment_doc(j), {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}})
        },
    ),
    Case(
        "10^12-elements",
        "exceeds the",
        objects=lambda j: {
            SEGMENT: with_doc(
                segment_doc(j),
                {"a": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}},
            )
        },
    ),
    Case(
        "negative-offset",
        "two non-negative ints",
        objects=lambda j: {
            SEGMENT: with_doc(segment_doc(j), {"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})
        },
    ),
    Case(
        "no-trainguard-metadata",
        "not a trainguard segment",
        objects=lambda j: {SEGMENT: framed({"__metadata__": {}})},
    ),
    # ---- the segment document
    Case(
        "doc-100000-deep",
        "recursion limit",
        objects=lambda j: {SEGMENT: framed({"__metadata__": {"trainguard": deep_json()}})},
    ),
    Case("doc-nan-wall-time", "finite number", objects=lambda j: {SEGMENT: changed(j, opened="NaN")}),
    Case(
        "doc-infinite-wall-time", "finite number", objects=lambda j: {SEGMENT: changed(j, closed="Infinity")}
    ),
    Case("doc-other-job", "key says job", objects=lambda j: {SEGMENT: changed(j, job="someone-else")}),
    Case(
        "doc-absurd-world-size",
        "less than or equal to 100000",
        objects=lambda j: {SEGMENT: changed(j, world_size=10**9)},
    ),
    Case(
        "doc-steps-out-of-range",
        "do not match the steps",
        objects=lambda j: {SEGMENT: changed(j, first_step=2)},
    ),
    Case(
        "doc-unknown-field",
        "Extra inputs are not permitted",
        objects=lambda j: {SEGMENT: changed(j, code="rm -rf /")},
    ),
    Case(
        "doc-10^6-steps",
        "at most 100000 items",
        objects=lambda j: {SEGMENT: changed(j, steps=[{}] * 100_001)},
    ),
    Case(
        "worker-outside-world",
        "outside the job's world size 1",
        objects=lambda j: {layout.segment_key(3, 0, 0, 7): valid_objects(j)[layout.segment_key(0, 0, 0, 2)]},
    ),
    # ---- manifests (refused, then the valid one is accepted)
    Case(
        "manifest-100000-deep",
        "recursion limit",
        refused_first=lambda j: {layout.MANIFEST: deep_json().encode()},
    ),
    Case("manifest-not-json", "Invalid JSON", refused_first=lambda j: {layout.MANIFEST: b"\x89PNG\r\n"}),
    Case("manifest-empty", "Invalid JSON", refused_first=lambda j: {layout.MANIFEST: b""}),
    Case(
        "manifest-10^6-rules",
        "bytes; at most",
        refused_first=lambda j: {
            layout.MANIFEST: json.dumps(
                {"job": j, "created": 1.0, "hook_version": "x", "world_size": 1, "rules": [{}] * 10**6}
            ).encode()
        },
    ),
    Case(
        "manifest-51-rules",
        "at most 50 items",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, rules=[NAN_RULE] * 51)},
    ),
    Case(
        "manifest-world-10^9",
        "less than or equal to 100000",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, world_size=10**9)},
    ),
    Case(
        "manifest-world-zero",
        "greater than or equal to 1",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, world_size=0)},
    ),
    Case(
        "manifest-created-nan",
        "finite number",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, created="NaN")},
    ),
    Case(
        "manifest-created-inf",
        "finite number",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, created="Infinity")},
    ),
    Case(
        "manifest-of-another-job",
        "manifest names job",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes("victim")},
    ),
    Case(
        "manifest-job-with-dots", "no '..'", refused_first=lambda j: {layout.MANIFEST: manifest_bytes("a..b")}
    ),
    Case(
        "manifest-unknown-field",
        "Extra inputs are not permitted",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, admin=True)},
    ),
    Case(
        "manifest-over-1mb",
        "bytes; at most",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j) + b" " * (d.MAX_DOCUMENT_BYTES + 1)},
    ),
    Case(
        "manifest-bad-comparison-pattern",
        "String should match pattern",
        refused_first=lambda j: {layout.MANIFEST: manifest_bytes(j, allow_comparison_from=["../*"])},
    ),
    # ---- end markers (refused, then the valid one)
    Case(
        "end-100000-deep",
        "recursion limit",
        refused_first=lambda j: {layout.end_key(0): deep_json().encode()},
    ),
    Case(
        "end-nan-wall-time",
        "finite number",
        refused_first=lambda j: {layout.end_key(0): end_bytes(j, wall_time="NaN")},
    ),
    Case(
        "end-other-worker",
        "lies under",
        refused_first=lambda j: {layout.end_key(0): end_bytes(j, worker=1, world_size=2)},
    ),
    Case(
        "end-negative-last-step",
        "greater than or equal to 0",
        refused_first=lambda j: {layout.end_key(0): end_bytes(j, last_step=-5)},
    ),
    # ---- system batches
    Case(
        "system-100000-deep",
        "recursion limit",
        objects=lambda j: {layout.system_key(0, 0): deep_json().encode()},
    ),
    Case(
        "system-nan-sample-time",
        "finite number",
        objects=lambda j: {layout.system_key(0, 0): system_bytes(j, start_time="NaN")},
    ),
    # ---- keys and records
    Case(
        "key-dot-dot",
        "outside the trainguard layout",
        records=lambda b, j: [(b, f"jobs/{j}/../victim/manifest.json")],
    ),
    Case("key-dot-dot-job", "invalid job name", records=lambda b, j: [(b, "jobs/../manifest.json")]),
    Case(
        "key-non-ascii-digits",
        "outside the trainguard layout",
        records=lambda b, j: [
            (b, f"jobs/{j}/segments/worker-0000\uff10/000000000000-000000000000-000000000002.safetensors")
        ],
    ),
    Case(
        "key-arabic-indic-digits",
        "outside the trainguard layout",
        records=lambda b, j: [(b, f"jobs/{j}/steps/00000000000\u0663/worker-00000.safetensors")],
    ),
    Case(
        "key-trailing-newline",
        "outside the trainguard layout",
        records=lambda b, j: [(b, f"jobs/{j}/manifest.json\n")],
    ),
    Case("key-too-long", "longer than 1024", records=lambda b, j: [(b, f"jobs/{j}/" + "a" * 2000)]),
    Case(
        "key-outside-prefix",
        "not under the ingest prefix",
        records=lambda b, j: [(b, f"other/{j}/manifest.json")],
    ),
    Case(
        "key-escape-bytes",
        "outside the trainguard layout",
        records=lambda b, j: [(b, f"jobs/{j}/\x1b[2J.json")],
    ),
    Case(
        "another-buckets-record",
        "this stack evaluates only",
        records=lambda b, j: [("someone-elses", f"jobs/{j}/manifest.json")],
    ),
    # ---- notification bodies
    Case("body-100000-deep", "nested too deeply", bodies=lambda b, j: [deep_json()]),
    Case("body-not-json", "not JSON", bodies=lambda b, j: ["\x00\x01binary"]),
    Case("body-not-an-object", "not a JSON object", bodies=lambda b, j: ["[1, 2, 3]"]),
    Case("body-no-records", "no S3 'Records' list", bodies=lambda b, j: ['{"Records": "all of them"}']),
    Case(
        "body-record-without-key",
        "without s3.bucket.name",
        bodies=lambda b, j: [json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": {}}]})],
    ),
    Case("body-over-256-kib", "is not an S3 notification", bodies=lambda b, j: ["x" * (300 * 1024)]),
    # ---- rule configurations: the hostile rule ends Error, the others judge
    # an infinite threshold silences a rule (nothing is ever above it): refused like NaN
    Case(
        "threshold-infinity",
        "Input should be a finite number",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "init",
                "RuleParameters": {"rule_to_invoke": "MaxInitializationTime", "threshold": "Infinity"},
            },
        ],
    ),
    Case(
        "stddev-inf",
        "Input should be a finite number",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "outlier",
                "RuleParameters": {"rule_to_invoke": "StepOutlier", "stddev": "inf"},
            },
        ],
    ),
    Case(
        "threshold-overflows-to-infinity",
        "Input should be a finite number",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "loader",
                "RuleParameters": {"rule_to_invoke": "Dataloader", "max_threshold": "1e999"},
            },
        ],
    ),
    Case(
        "threshold-nan",
        "Input should be a finite number",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "imbalance",
                "RuleParameters": {"rule_to_invoke": "ClassImbalance", "threshold_imbalance": "NaN"},
            },
        ],
    ),
    Case(
        "other-job-without-permission",
        "does not allow comparison from job",
        stored=lambda j: {"h-reference": valid_objects("h-reference")},
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "same",
                "RuleParameters": {"rule_to_invoke": "SimilarAcrossRuns", "other_trials": "h-reference"},
            },
        ],
    ),
    Case(
        "other-job-in-another-bucket",
        "is not a job of this stack",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "same",
                "RuleParameters": {
                    "rule_to_invoke": "SimilarAcrossRuns",
                    "other_trials": "s3://someone-elses/jobs/x",
                },
            },
        ],
    ),
    Case(
        "other-job-path",
        "is not a job of this stack",
        rules=[
            NAN_RULE,
            {
                "RuleConfigurationName": "same",
                "RuleParameters": {"rule_to_invoke": "SimilarAcrossRuns", "other_trials": "../../etc"},
            },
        ],
    ),
    Case(
        "escape-bytes-in-names",
        "IssuesFound",  # accepted: stored as sent, escaped wherever it is shown (checked below)
        rules=[
            {
                "RuleConfigurationName": "nan\x1b[2J\x1b]8;;http://x/\x07",
                "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            }
        ],
    ),
    Case(
        "rule-names-of-256-four-byte-characters",
        "IssuesFound",  # accepted: the outbox keys its event by digest
        rules=[
            {
                "RuleConfigurationName": "\U0001d538" * 256,
                "RuleParameters": {"rule_to_invoke": "ExplodingTensor"},
            }
        ],
    ),
    Case(
        "rules-846-kb",
        "rule configurations are",
        rules=[
            {
                "RuleConfigurationName": f"r{i}",
                "RuleParameters": {
                    "rule_to_invoke": "ExplodingTensor",
                    **{f"p{k}": f"{i}-{k}-" + "%08x" % (i * 7919 + k) * 52 for k in range(99)},
                },
            }
            for i in range(20)
        ],
        judged=False,
    ),
    # ---- buffered items
    Case(
        "legacy-buffered-zlib-bomb",
        "buffered header unreadable",
        item=legacy_bomb,
        format1=True,
        objects=lambda j: {layout.step_key(3, 0): None},  # the bomb stands where step 3 would be
    ),
]


def manifest_bytes(job: str, **fields: Any) -> bytes:
    doc: dict[str, Any] = {
        "job": job,
        "created": 1_800_000_000.0,
        "hook_version": "x",
        "world_size": 1,
        "rules": [NAN_RULE],
    }
    doc.update(fields)
    return json.dumps(doc).encode()


def end_bytes(job: str, **fields: Any) -> bytes:
    doc: dict[str, Any] = {
        "job": job,
        "worker": 0,
        "world_size": 1,
        "last_step": 7,
        "wall_time": 1_800_000_100.0,
    }
    doc.update(fields)
    return json.dumps(doc).encode()


def system_bytes(job: str, **fields: Any) -> bytes:
    doc: dict[str, Any] = {"job": job, "worker": 0, "world_size": 1, "seq": 0}
    doc.update({"start_time": 1.0, "end_time": 2.0, "interval_s": 1.0})
    doc.update(fields)
    return json.dumps(doc).encode()


def order(keys: list[str]) -> list[str]:
    return sorted(keys, key=lambda k: (not k.endswith(layout.MANIFEST), "/end/" in k, k))


class Sender:
    """Delivers objects like the evaluate function does; collects every DLQ reason."""

    def __init__(self, cloud: Any, pipeline: JobPipeline) -> None:
        self.cloud = cloud
        self.pipeline = pipeline
        self.reasons: list[str] = []

    def put(self, job: str, objects: dict[str, bytes]) -> list[str]:
        keys = []
        for rel, body in objects.items():
            key = f"jobs/{job}/{rel}"
            self.cloud.s3.put_object(Bucket=self.cloud.bucket, Key=key, Body=body)
            keys.append(key)
        return order(keys)

    def record(self, bucket: str, key: str) -> None:
        try:
            job = self.pipeline.ingest(bucket, key)
            if job is not None:
                self.pipeline.advance_job(job)
        except (PermanentError, ObjectError) as exc:
            self.reasons.append(str(exc))

    def body(self, body: str) -> None:
        try:
            for bucket, key in evaluate.s3_objects(body):
                self.record(bucket, key)
        except PermanentError as exc:
            self.reasons.append(str(exc))

    def job(self, job: str, objects: dict[str, bytes]) -> None:
        """As one SQS batch: every object ingested, then each job touched advanced once."""
        touched: set[str] = set()
        for key in self.put(job, objects):
            try:
                touched.add(self.pipeline.ingest(self.cloud.bucket, key) or job)
            except (PermanentError, ObjectError) as exc:
                self.reasons.append(str(exc))
        for name in sorted(touched):
            self.pipeline.advance_job(name)


def judged(pipeline: JobPipeline, job: str, rule: str = "nan", step: int = NAN_STEP) -> Any:
    loaded = pipeline.store.load_state(job)
    assert loaded is not None, f"{job}: no state"
    state = loaded[0]
    assert state.finished, f"{job}: not finished (watermark {state.watermark}, frontier {state.frontier})"
    record = state.rule(rule)
    assert (record.status, record.step) == ("IssuesFound", step), (record.status, record.details)
    return state


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_gets_a_clear_error_and_loses_nothing(cloud, case: Case):
    job = f"h-{case.id.replace('^', '')}"
    pipeline = cloud.pipeline()
    send = Sender(cloud, pipeline)
    if case.item is not None:
        cloud.ddb.put_item(TableName=cloud.table, Item=case.item(job))
    for bucket, key in case.records(cloud.bucket, job):
        send.record(bucket, key)
    for body in case.bodies(cloud.bucket, job):
        send.body(body)
    first = case.refused_first(job)
    for key in send.put(job, first):
        send.record(cloud.bucket, key)
    refused = list(send.reasons)
    for name, objects in case.stored(job).items():
        send.put(name, objects)
    valid = valid_objects(job, case.rules, case.format1, **case.manifest)
    mixed = {**valid, **case.objects(job)}
    send.job(job, {key: body for key, body in mixed.items() if body is not None})

    # 1. a clear error, said where the user sees it
    loaded = pipeline.store.load_state(job)
    state = loaded[0] if loaded is not None else None
    said = send.reasons + (state.invalid_objects if state else [])
    said += [r.details for r in state.rules] if state else []
    said += [r.status for r in state.rules] if state else []
    assert any(case.expect in text for text in said), f"{case.expect!r} not in {said}"
    if first:
        assert refused, "the hostile document was accepted"
    for text in send.reasons:
        assert printable(text) == text or "\\" in printable(text)  # reasons are text, shown escaped

    # 2. the same job is still judged
    if case.judged:
        rule = next(
            r["RuleConfigurationName"]
            for r in (case.rules or [NAN_RULE])
            if r["RuleParameters"]["rule_to_invoke"] == "ExplodingTensor"
        )
        judged(pipeline, job, rule)
    else:
        assert state is not None and state.finished and all(r.status == "Error" for r in state.rules)

    # 3. and another job after it
    other = f"o-{case.id.replace('^', '')}"
    send.job(
        other,
        convert_objects(
            SyntheticJob(other, steps=[0, 1, 2], nan_steps=frozenset({2}), rules=[NAN_RULE]).objects(),
            WindowRules(window_s=None, max_steps=8),
        ),
    )
    judged(pipeline, other, step=2)


def test_the_corpus_covers_every_kind_of_hostile_input():
    ids = " ".join(c.id for c in CASES)
    for kind in (
        "cut-", "header-length", "overlapping", "unknown-dtype", "10^12", "dot-dot", "non-ascii-digits",
        "trailing-newline", "zlib-bomb", "10^6-rules", "world", "100000-deep", "nan", "inf",
        "escape-bytes", "another-buckets", "other-job",
    ):  # fmt: skip
        assert kind in ids, kind
    assert len(CASES) >= 60


def test_nan_in_a_step_is_found_not_refused(cloud):
    """NaN values are data (ExplodingTensor's input), not hostile: only times must be finite."""
    pipeline = cloud.pipeline()
    send = Sender(cloud, pipeline)
    send.job("h-nan-is-data", valid_objects("h-nan-is-data"))
    assert not send.reasons
    state = judged(pipeline, "h-nan-is-data")
    assert math.isnan(float("nan")) and not state.invalid_objects

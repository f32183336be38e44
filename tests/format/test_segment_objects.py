"""Format 2: segments round-trip (every dtype, no tensors, very large), cut or hostile ones are
rejected clearly, and the converter turns a version-1 job into the same steps in segments."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from trainguard.engine.sources import LocalJob, segment_arrival
from trainguard.format import documents as d
from trainguard.format import layout, stepfile
from trainguard.format.convert import (
    ConversionError,
    MemoryFolder,
    SegmentWriter,
    WindowRules,
    convert_job,
    convert_objects,
)
from trainguard.format.stepfile import StepFormatError, TensorBlob
from trainguard.local.synthetic import SyntheticJob

RNG = np.random.default_rng(5)

ARRAYS = {
    "float16": RNG.normal(size=(3, 5)).astype(np.float16),
    "float32": RNG.normal(size=(7,)).astype(np.float32),
    "float64": RNG.normal(size=(2, 2, 2)),
    "bool": np.array([[True, False], [False, True]]),
    "int8": np.arange(-4, 4, dtype=np.int8),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "int16": np.arange(-3, 3, dtype=np.int16),
    "uint16": np.array([0, 65535], dtype=np.uint16),
    "int32": np.arange(-3, 3, dtype=np.int32),
    "uint32": np.array([2**32 - 1], dtype=np.uint32),
    "int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "zero-d": np.array(2.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


def mode(step: int, loss: float = 0.5) -> dict:
    return {
        "TRAIN": d.ModeRecord(
            mode_step=step, scalars={"loss": d.ScalarRecord(value=loss, collections=["losses"])}
        )
    }


def segment(
    steps: list[int], seq: int = 0, prev: int | None = None, worker: int = 0, **extra
) -> d.SegmentHeader:
    return d.SegmentHeader(
        job="job",
        worker=worker,
        world_size=1,
        seq=seq,
        prev_step=prev,
        first_step=steps[0],
        last_step=steps[-1],
        opened=100.0,
        closed=101.0,
        reason="time",
        steps=[d.SegmentStep(step=s, wall_time=100.0 + s / 10, modes=mode(s)) for s in steps],
        **extra,
    )


def ref_of(header: d.SegmentHeader) -> layout.ObjectRef:
    key = layout.segment_key(header.worker, header.seq, header.first_step, header.last_step)
    return layout.parse_relative(header.job, key)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_every_dtype_round_trips_through_a_segment(name):
    array = ARRAYS[name]
    header = segment([3, 4])
    key = d.segment_tensor_key(4, "TRAIN", f"w/{name}")
    data = d.encode_segment(header, {key: TensorBlob.from_numpy(array)})
    doc, parsed = d.decode_segment_header(data, object_size=len(data))
    assert doc == header and key == f"000000000004/TRAIN/w/{name}"
    got = stepfile.tensor_from_object(data, parsed, key)
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_bfloat16_round_trips_through_a_segment_exactly():
    t = torch.tensor([1.0, -2.5, 3.140625, 0.0, float("inf")], dtype=torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16)
    key = d.segment_tensor_key(0, "TRAIN", "b")
    data = d.encode_segment(segment([0]), {key: TensorBlob.bfloat16_bits(bits)})
    _, parsed = d.decode_segment_header(data)
    np.testing.assert_array_equal(stepfile.tensor_from_object(data, parsed, key), t.float().numpy())


def test_a_segment_of_steps_without_tensors_is_its_header_alone():
    header = segment(list(range(0, 50, 5)), seq=3, prev=None)
    data = d.encode_segment(header, {})
    doc, parsed = d.decode_segment_header(data, object_size=len(data))
    assert doc == header and parsed.tensors == {} and parsed.data_start == len(data)
    arrival = segment_arrival(ref_of(header), data, len(data))
    assert arrival.bad is None and arrival.header_end == len(data) and arrival.seq == 3


def test_a_very_large_segment_is_read_with_a_second_bounded_read(tmp_path):
    """A header past the first probe (a window of many steps) and a 16 MB tensor body."""
    steps = list(range(4000))
    header = segment(steps, seq=0)
    big = np.arange(4 * 1024 * 1024, dtype=np.float32)
    key = d.segment_tensor_key(3999, "TRAIN", "fc.weight")
    data = d.encode_segment(header, {key: TensorBlob.from_numpy(big)})
    _, parsed = d.decode_segment_header(data)
    assert parsed.data_start > stepfile.SEGMENT_PROBE_BYTES  # the header alone is over 256 KiB
    rel = layout.segment_key(0, 0, 0, 3999)
    (tmp_path / "job" / rel).parent.mkdir(parents=True)
    (tmp_path / "job" / rel).write_bytes(data)
    source = LocalJob(tmp_path / "job", "job")
    ref = layout.parse_relative("job", rel)
    head, size = source.head(ref)
    assert len(head) == parsed.data_start and size == len(data)  # the header, not the body
    arrival = segment_arrival(ref, head, size)
    assert arrival.bad is None and len(arrival.header.steps) == 4000
    np.testing.assert_array_equal(stepfile.tensor_from_object(data, parsed, key), big)


def test_a_segment_cut_at_every_byte_boundary_is_rejected_with_a_clear_error():
    header = segment([0, 1, 2])
    data = d.encode_segment(
        header,
        {
            d.segment_tensor_key(1, "TRAIN", "a"): TensorBlob.from_numpy(np.ones(5, np.float32)),
            d.segment_tensor_key(2, "EVAL", "b"): TensorBlob.from_numpy(np.arange(3, dtype=np.int64)),
        },
    )
    ref = ref_of(header)
    for cut in range(len(data)):
        part = data[:cut]
        with pytest.raises(StepFormatError) as info:
            d.decode_segment_header(part, object_size=cut)
        message = str(info.value)
        assert "truncated" in message or "8-byte header length" in message, (cut, message)
        arrival = segment_arrival(ref, part, cut)  # what the service makes of it: a bad arrival
        assert arrival.header is None and arrival.bad.startswith(layout.segment_key(0, 0, 0, 2))
        assert (arrival.worker, arrival.seq, arrival.first_step, arrival.last_step) == (0, 0, 0, 2)
    d.decode_segment_header(data, object_size=len(data))  # and the whole object is fine


def raw(meta: dict, tensors: dict | None = None) -> bytes:
    text = json.dumps({"__metadata__": meta, **(tensors or {})}).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"steps": []}, "at least 1 item"),
        ({"steps": "reorder"}, "strictly increasing"),
        ({"first_step": 1}, "do not match the steps"),
        ({"prev_step": 5}, "not before first_step"),
        ({"closed": 50.0}, "cannot close before it opened"),
        ({"opened": "NaN"}, "finite number"),
        ({"reason": "whenever"}, "'time', 'size', 'full', 'nonfinite' or 'close'"),
        ({"format": "trainguard.segment/3"}, "trainguard.segment/2"),
        ({"extra": 1}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_segment_documents_are_rejected_with_the_reason(doc, message):
    base = json.loads(segment([2, 3, 4]).model_dump_json())
    if doc.get("steps") == "reorder":
        base["steps"] = [base["steps"][1], base["steps"][0], base["steps"][2]]
        doc = {}
    base.update(doc)
    data = raw({"trainguard": json.dumps(base)})
    with pytest.raises(StepFormatError, match="invalid segment document") as info:
        d.decode_segment_header(data, object_size=len(data))
    assert message in str(info.value)


def test_a_segment_whose_header_disagrees_with_its_key_is_a_bad_arrival():
    header = segment([0, 1], worker=0)
    data = d.encode_segment(header, {})
    ref = layout.parse_relative("job", layout.segment_key(0, 1, 0, 1))  # the key says seq 1
    arrival = segment_arrival(ref, data, len(data))
    assert arrival.bad is not None and "key says job 'job' worker 0 seq 1" in arrival.bad
    assert arrival.seq == 1


@pytest.mark.parametrize(
    "key",
    [
        "segments/worker-00000/000000000000-000000000000-000000000001.safetensors\n",
        "segments/worker-0000\uff11/000000000000-000000000000-000000000001.safetensors",
        "segments/worker-00000/000000000000-00000000000\u0661-000000000001.safetensors",
        "segments/worker-00000/000000000000-000000000002-000000000001.safetensors",
        "segments/worker-00000/00000000000-000000000000-000000000001.safetensors",
    ],
    ids=["trailing-newline", "fullwidth-digit", "arabic-indic-digit", "last-before-first", "short-seq"],
)
def test_segment_keys_parse_only_ascii_digits_and_the_whole_key(key):
    with pytest.raises(layout.LayoutError):
        layout.parse_relative("job", key)


def test_relative_key_inverts_parsing_for_every_kind():
    keys = [
        "manifest.json",
        layout.step_key(12, 3),
        layout.segment_key(3, 7, 100, 250),
        layout.system_key(2, 9),
        layout.end_key(4),
        "control/stop.json",
        "report/profiler-report.html",
    ]
    for key in keys:
        assert layout.relative_key(layout.parse_relative("job", key)) == key


def test_step_views_of_a_segment_are_the_step_documents_of_format_1():
    job = SyntheticJob("views", world_size=2, steps=list(range(0, 30, 3)), skipped={1: {6, 9}}, ended=False)
    v1 = job.objects()
    v2 = convert_objects(v1, WindowRules(window_s=None, max_steps=4))
    views = {}
    for key, data in v2.items():
        if key.startswith("segments/"):
            header, _ = d.decode_segment_header(data, len(data))
            for view in header.step_headers():
                views[(view.step, view.worker)] = view
    originals = {}
    for key, data in v1.items():
        if key.startswith("steps/"):
            header, _ = d.decode_step_header(data, len(data))
            originals[(header.step, header.worker)] = header
    assert views == originals  # prev_step chains through and across segments like format 1's


def test_the_converter_keeps_everything_and_counts_segments_in_the_end_markers():
    job = SyntheticJob("conv", world_size=2, steps=list(range(0, 40, 2)), skipped={1: {4}}, ended=True)
    v1 = job.objects()
    source, target = MemoryFolder(v1), MemoryFolder()
    report = convert_job(source, target, {0: WindowRules(window_s=None, max_steps=3), 1: WindowRules(0.05)})
    assert report.steps == 39 and report.copied == 1  # the manifest
    assert target.get("manifest.json") == v1["manifest.json"]
    assert not target.list("steps/")
    for worker in (0, 1):
        keys = target.list(f"segments/worker-{worker:05d}/")
        assert len(keys) == report.segments[worker]
        headers = [d.decode_segment_header(target.get(k))[0] for k in keys]
        assert [h.seq for h in headers] == list(range(len(headers)))
        assert [h.prev_step for h in headers] == [None] + [h.last_step for h in headers[:-1]]
        marker = d.parse_document(d.EndMarker, target.get(layout.end_key(worker)))
        assert marker.segments == len(headers) and marker.last_step == headers[-1].last_step
    worker0 = [d.decode_segment_header(target.get(k))[0] for k in target.list("segments/worker-00000/")]
    assert {len(h.steps) for h in worker0[:-1]} == {3} and worker0[-1].reason == "close"


def test_full_tensors_move_into_the_segment_body_and_close_their_window():
    header = d.StepHeader(job="full", step=0, worker=0, world_size=1, wall_time=10.0, modes=mode(0))
    v1 = {}
    weights = {}
    for step in range(4):
        arr = RNG.normal(size=(3, 3)).astype(np.float32)
        tensors = {d.tensor_key("TRAIN", "fc.weight"): TensorBlob.from_numpy(arr)} if step == 2 else {}
        if tensors:
            weights[step] = arr
        h = header.model_copy(update={"step": step, "prev_step": step - 1 if step else None})
        v1[layout.step_key(step, 0)] = d.encode_step(h, tensors)
    v2 = convert_objects(v1, WindowRules(window_s=None))
    keys = sorted(k for k in v2 if k.startswith("segments/"))
    assert keys == [layout.segment_key(0, 0, 0, 2), layout.segment_key(0, 1, 3, 3)]
    first, parsed = d.decode_segment_header(v2[keys[0]])
    assert first.reason == "full"
    got = stepfile.tensor_from_object(v2[keys[0]], parsed, d.segment_tensor_key(2, "TRAIN", "fc.weight"))
    np.testing.assert_array_equal(got, weights[2])


def test_window_rules_close_on_time_size_nonfinite_and_close():
    writer = SegmentWriter("w", 0, 1, WindowRules(window_s=1.0, header_target_bytes=4096))
    closed = []
    for step, (t, loss) in enumerate([(0.0, 1.0), (0.5, 1.0), (1.2, 1.0), (1.3, math.nan), (1.4, 1.0)]):
        closed += writer.add(step, 100.0 + t, mode(step, loss))
    assert [(c.header.reason, c.header.first_step, c.header.last_step) for c in closed] == [
        ("time", 0, 1),
        ("nonfinite", 2, 3),
    ]
    assert closed[0].header.closed == pytest.approx(101.0)
    many = {f"t{i}": d.TensorRecord(collections=["c"], dtype="float32", shape=[4]) for i in range(20)}
    big = {"TRAIN": d.ModeRecord(mode_step=5, tensors=many)}
    sized = writer.add(5, 101.45, big) + writer.add(6, 101.5, big) + writer.add(7, 101.55, big)
    assert [c.header.reason for c in sized][:1] == ["size"]
    assert all(len(c.data) < 8 + 4096 + 1024 for c in sized)
    final = writer.close()
    assert final is not None and final.header.reason == "close" and writer.close() is None
    seqs = [c.header.seq for c in [*closed, *sized, final]]
    assert seqs == list(range(len(seqs)))


def test_the_converter_refuses_a_bad_step_object_naming_it():
    v1 = SyntheticJob("bad", steps=[0, 1]).objects()
    key = layout.step_key(1, 0)
    v1[key] = v1[key][:-5]
    with pytest.raises(ConversionError, match=f"{key}: truncated"):
        convert_objects(v1)


def test_window_rules_are_checked():
    with pytest.raises(ValueError, match="window_s"):
        WindowRules(window_s=0)
    with pytest.raises(ValueError, match="max_steps"):
        WindowRules(max_steps=0)
    with pytest.raises(ValidationError):
        d.SegmentStep(step=0, wall_time=math.inf, modes={})


def test_the_documented_ranged_get_recipe_reads_one_tensor_of_a_segment():
    """docs/format.md's recipe, run as written against S3 on moto."""
    import re
    from pathlib import Path

    import boto3
    from moto import mock_aws

    text = (Path(__file__).parents[2] / "docs" / "format.md").read_text()
    section = text.split("### One tensor of a segment with ranged GETs", 1)[1]
    recipe = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    steps = list(range(120, 162))
    header = segment(steps, seq=41, prev=119)
    weight = RNG.normal(size=(64, 20)).astype(np.float32)
    tensors = {d.segment_tensor_key(150, "TRAIN", "fc1.weight"): TensorBlob.from_numpy(weight)}
    tensors[d.segment_tensor_key(121, "TRAIN", "other")] = TensorBlob.from_numpy(np.ones(7, np.float32))
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="docs")
        key = "jobs/my-job/" + layout.segment_key(0, 41, 120, 161)
        s3.put_object(Bucket="docs", Key=key, Body=d.encode_segment(header, tensors))
        scope = {"b": "docs"}
        exec(recipe, scope)
    assert scope["segment"]["format"] == "trainguard.segment/2"
    np.testing.assert_array_equal(np.frombuffer(scope["raw"], "<f4").reshape(64, 20), weight)


def test_fast_construct_builds_what_model_construct_builds():
    """The writer's ``construct`` gives the same document as pydantic's ``model_construct``,
    and falls back to it for models with mutable defaults or a missing required field."""
    from trainguard.format.documents import ModeRecord, ScalarRecord, TensorRecord, TensorStats, construct

    stats = dict(numel=4, l1=2.0, mean_abs=0.5, nan=0, inf=0, unit_active=[0.5, 1.0])
    a, b = construct(TensorStats, **stats), TensorStats.model_construct(**stats)
    assert a.model_dump_json() == b.model_dump_json() and a.model_fields_set == b.model_fields_set
    assert a == b and a.std is None
    rec = dict(collections=["gradients"], dtype="float32", shape=[2, 2], stats=a, stored=False)
    assert (
        construct(TensorRecord, **rec).model_dump_json()
        == TensorRecord.model_construct(**rec).model_dump_json()
    )
    scalar = construct(ScalarRecord, value=float("nan"), collections=["losses"])
    assert (
        scalar.model_dump_json()
        == ScalarRecord.model_construct(value=float("nan"), collections=["losses"]).model_dump_json()
    )
    first, second = construct(ModeRecord, mode_step=1), construct(ModeRecord, mode_step=2)
    assert first.scalars is not second.scalars  # mutable defaults are not shared
    partial = construct(TensorRecord, dtype="float32")  # required fields absent: pydantic's behaviour
    assert partial.dtype == "float32" and "shape" not in partial.__dict__

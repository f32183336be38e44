"""Step objects: every dtype round-trips (codec and hook -> trial), hostile objects are rejected clearly."""

import json
import re
import struct

import numpy as np
import pytest
import torch
import trainguard
from trainguard.format import stepfile
from trainguard.format.documents import StepHeader, decode_step_header, encode_step
from trainguard.format.stepfile import StepFormatError, TensorBlob

RNG = np.random.default_rng(3)

ARRAYS = {
    "float16": RNG.normal(size=(3, 5)).astype(np.float16),
    "float32": RNG.normal(size=(7,)).astype(np.float32),
    "float64": RNG.normal(size=(2, 2, 2)),
    "bool": np.array([[True, False], [False, True]]),
    "int8": np.arange(-4, 4, dtype=np.int8),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "int32": np.arange(-3, 3, dtype=np.int32),
    "int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "zero-d": np.array(2.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
    "large": RNG.normal(size=(1024, 1024)).astype(np.float32),
}


def header(**extra) -> StepHeader:
    return StepHeader(job="job", step=1, worker=0, world_size=1, wall_time=0.0, modes={}, **extra)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_codec_round_trip(name):
    array = ARRAYS[name]
    data = encode_step(header(), {"TRAIN/x": TensorBlob.from_numpy(array)})
    doc, parsed = decode_step_header(data, object_size=len(data))
    assert doc.step == 1
    got = stepfile.tensor_from_object(data, parsed, "TRAIN/x")
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_bfloat16_round_trip_is_exact():
    t = torch.tensor([1.0, -2.5, 3.140625, 0.0, float("inf")], dtype=torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16)
    data = encode_step(header(), {"TRAIN/b": TensorBlob.bfloat16_bits(bits)})
    _, parsed = decode_step_header(data)
    got = stepfile.tensor_from_object(data, parsed, "TRAIN/b")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, t.float().numpy())


TORCH_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
]


def test_every_dtype_through_hook_and_trial(tmp_path):
    """Full tensors saved by the hook (numpy and torch) come back bit-exact through the trial API."""
    full = trainguard.Collection("weights", trainguard.SaveConfig(save_interval=1), save_full=True)
    expected = {}
    with trainguard.Hook(tmp_path / "dt", include_collections=[], collections=[full]) as hook:
        for name, array in ARRAYS.items():
            assert hook.save_tensor(f"np/{name}", array, step=0, collections=["weights"])
            expected[f"np/{name}"] = array
        for dtype in TORCH_DTYPES:
            t = (torch.randn(4, 3) * 10).to(dtype)
            name = f"torch/{str(dtype).removeprefix('torch.')}"
            assert hook.save_tensor(name, t, step=0, collections=["weights"])
            expected[name] = t.float().numpy() if dtype == torch.bfloat16 else t.numpy()
        assert hook.save_tensor(
            "torch/zero-d", torch.tensor(7, dtype=torch.int64), step=0, collections=["weights"]
        )
        expected["torch/zero-d"] = np.array(7, np.int64)
    trial = trainguard.create_trial(tmp_path / "dt")
    for name, want in expected.items():
        got = trial.tensor(name).value(0)
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        record = trial.tensor(name).record(0)
        assert record.stored and list(record.shape) == list(want.shape)
    assert trial.tensor("torch/bfloat16").record(0).dtype == "bfloat16"
    assert trial.tensor("np/large").stats(0).numel == 1024 * 1024


def read_with_numpy_alone(data: bytes, name: str) -> np.ndarray:
    """The recipe in docs/format.md: json + numpy, no trainguard."""
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8 : 8 + n])
    meta = json.loads(head["__metadata__"]["trainguard"])
    assert meta["format"] == "trainguard.step/1"
    spec = head[name]
    begin, end = spec["data_offsets"]
    dtypes = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "BOOL": "?"}
    return np.frombuffer(data[8 + n + begin : 8 + n + end], dtype=dtypes[spec["dtype"]]).reshape(
        spec["shape"]
    )


def test_documented_numpy_only_reader():
    array = ARRAYS["float32"]
    data = encode_step(
        header(), {"TRAIN/w": TensorBlob.from_numpy(array), "TRAIN/a": TensorBlob.from_numpy(ARRAYS["bool"])}
    )
    np.testing.assert_array_equal(read_with_numpy_alone(data, "TRAIN/w"), array)


# ----------------------------------------------------------------------------- hostile objects


def raw_object(head: dict, body: bytes = b"", length: int | None = None) -> bytes:
    text = json.dumps(head).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + body


GOOD_META = {"trainguard": header().model_dump_json()}


def good() -> bytes:
    return encode_step(header(), {"TRAIN/a": TensorBlob.from_numpy(np.ones(4, np.float32))})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "8-byte header length"),
        (b"\x01\x02", "8-byte header length"),
        (struct.pack("<Q", 0), "outside 1.."),
        (struct.pack("<Q", 2**63) + b"{}", "outside 1.."),
        (struct.pack("<Q", 100) + b"{}", "truncated: header declares 100 bytes"),
        (good()[:-3], "truncated: header implies"),
        (good() + b"xx", "trailing bytes"),
        (raw_object({"__metadata__": GOOD_META}, length=None)[:-1] + b"\xff", "not valid UTF-8 JSON"),
        (raw_object([1, 2]), "not a JSON object"),
        (raw_object({"__metadata__": {"trainguard": 5}}), "must map strings to strings"),
        (
            raw_object(
                {"__metadata__": GOOD_META, "t": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}},
                b"x",
            ),
            "unsupported dtype 'F8_E4M3'",
        ),
        (
            raw_object(
                {"__metadata__": GOOD_META, "t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                b"\0" * 4,
            ),
            "4 bytes for shape [2] of F32",
        ),
        (
            raw_object(
                {"__metadata__": GOOD_META, "t": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}},
                b"\0" * 8,
            ),
            "bytes for shape",
        ),
        (
            raw_object(
                {"__metadata__": GOOD_META, "t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
                b"\0" * 8,
            ),
            "contiguous and non-overlapping",
        ),
        (
            raw_object(
                {
                    "__metadata__": GOOD_META,
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                },
                b"\0" * 8,
            ),
            "contiguous and non-overlapping",
        ),
        (
            raw_object(
                {"__metadata__": GOOD_META, "t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}
            ),
            "shape must be a list",
        ),
        (
            raw_object(
                {
                    "__metadata__": GOOD_META,
                    "t": {"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]},
                }
            ),
            "exceeds the",
        ),
        (
            raw_object(
                {
                    "__metadata__": GOOD_META,
                    "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1},
                },
                b"\0" * 4,
            ),
            "exactly dtype, shape, data_offsets",
        ),
        (raw_object({"__metadata__": {}}), "not a trainguard step object"),
        (raw_object({"__metadata__": {"trainguard": "{not json"}}), "invalid step document"),
        (
            raw_object({"__metadata__": {"trainguard": json.dumps({"format": "trainguard.step/9"})}}),
            "invalid step document",
        ),
    ],
    ids=[
        "empty",
        "short",
        "zero-length",
        "huge-length",
        "header-truncated",
        "body-truncated",
        "trailing",
        "not-utf8",
        "not-object",
        "bad-metadata",
        "unknown-dtype",
        "size-mismatch",
        "reversed-offsets",
        "gap",
        "overlap",
        "negative-shape",
        "too-large",
        "extra-key",
        "no-trainguard",
        "bad-json-doc",
        "wrong-version",
    ],
)
def test_malformed_objects_rejected_with_clear_errors(data, message):
    with pytest.raises(StepFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_step_header(data, object_size=len(data) if len(data) > 8 else None)


def test_trial_names_the_object_in_errors(tmp_path):
    with trainguard.Hook(tmp_path / "bad") as hook:
        hook.save_scalar("loss", 1.0, step=0, collections=["losses"])
    [path] = sorted((tmp_path / "bad/segments/worker-00000").glob("*.safetensors"))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(StepFormatError, match=re.escape(path.name) + ": truncated"):
        trainguard.create_trial(tmp_path / "bad").header(0)


def test_decode_tensor_checks_buffer_length():
    data = good()
    _, parsed = decode_step_header(data)
    entry = parsed.tensors["TRAIN/a"]
    with pytest.raises(StepFormatError, match="got 3 bytes, expected 16"):
        stepfile.decode_tensor(entry, b"abc")

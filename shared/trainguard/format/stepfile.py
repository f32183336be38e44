"""The step-object codec: safetensors-compatible, bounded, numpy-only.

Layout (the safetensors layout, byte for byte)::

    [8 bytes: little-endian u64 N][N bytes: UTF-8 JSON header, space padded][raw tensor buffers]

The JSON header maps tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the first byte after the header) and carries ``"__metadata__"``, a
``{str: str}`` map. trainguard puts its step document (``StepHeader``) in
``__metadata__["trainguard"]`` as a JSON string, so the rule engine needs only the header,
which one ranged GET of the first ``HEADER_PROBE_BYTES`` usually covers.

Why safetensors: it is the ML field's safe standard (no code execution, no pickle), any
safetensors reader can open our objects, the header gives every tensor's byte range so one
tensor can be fetched with a ranged GET, and a reader needs nothing but JSON and numpy.

Every length read from the object is checked before anything is allocated; a malformed,
truncated or hostile object raises ``StepFormatError`` with a message naming the problem.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Largest JSON header we accept (the safetensors reference reader uses 100 MB; step
#: headers are kilobytes, so a much lower cap bounds what a hostile object can cost us).
MAX_HEADER_BYTES = 16 * 1024 * 1024
#: How many bytes the rule engine fetches first; most step headers fit.
HEADER_PROBE_BYTES = 64 * 1024
#: Format 2: the hook closes a segment's window before its header passes this, so the
#: service reads a segment's header with one ranged GET of ``SEGMENT_PROBE_BYTES``. A single
#: step larger than this still gets a segment of its own; its header (at most
#: ``MAX_HEADER_BYTES``) is then completed with a second, bounded GET.
SEGMENT_HEADER_TARGET_BYTES = 256 * 1024
SEGMENT_PROBE_BYTES = SEGMENT_HEADER_TARGET_BYTES + 8
MAX_TENSORS = 100_000
MAX_NDIM = 16
MAX_NAME_CHARS = 512
#: Largest single tensor a reader will materialise (bytes).
MAX_TENSOR_BYTES = 8 * 1024 * 1024 * 1024

METADATA_KEY = "trainguard"

# safetensors dtype name -> (numpy dtype used for the raw buffer, item size)
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # no numpy bfloat16: raw bits, widened to float32 on read
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}
_NUMPY_TO_NAME = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.float32): "F32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float64): "F64",
}
SUPPORTED_DTYPES = frozenset(_DTYPES)


class StepFormatError(ValueError):
    """The bytes are not a valid trainguard/safetensors object; the message says why."""


@dataclass(frozen=True)
class TensorBlob:
    """A tensor ready to be written: safetensors dtype name, shape and raw little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview

    @staticmethod
    def from_numpy(array: np.ndarray[Any, Any]) -> TensorBlob:
        arr = np.asarray(array)
        name = _NUMPY_TO_NAME.get(arr.dtype.newbyteorder("=")) if arr.dtype.byteorder != "|" else None
        if name is None:
            name = _NUMPY_TO_NAME.get(arr.dtype)
        if name is None:
            raise StepFormatError(
                f"cannot store numpy dtype {arr.dtype}; supported: {sorted(SUPPORTED_DTYPES)}"
            )
        little = np.ascontiguousarray(arr, dtype=_DTYPES[name])
        return TensorBlob(name, tuple(int(d) for d in arr.shape), little.tobytes())

    @staticmethod
    def bfloat16_bits(bits: np.ndarray[Any, Any]) -> TensorBlob:
        """A bfloat16 tensor given as its raw uint16 bit patterns (what torch's ``view(int16)`` gives)."""
        raw = np.ascontiguousarray(bits).view("<u2")
        return TensorBlob("BF16", tuple(int(d) for d in raw.shape), raw.tobytes())


@dataclass(frozen=True)
class TensorEntry:
    """Where a tensor lives inside an object (offsets are absolute in the object)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class ParsedHeader:
    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]
    #: Absolute offset where the tensor buffers begin (8 + header length).
    data_start: int
    #: Total object size the header implies.
    total_size: int


def encode(tensors: Mapping[str, TensorBlob], metadata: Mapping[str, str]) -> bytes:
    """Serialise tensors and a ``{str: str}`` metadata map into one safetensors object."""
    if len(tensors) > MAX_TENSORS:
        raise StepFormatError(f"{len(tensors)} tensors in one object; at most {MAX_TENSORS}")
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    # Sorted by name: a stable, reproducible byte layout.
    ordered = sorted(tensors.items())
    for name, blob in ordered:
        _check_name(name)
        if blob.dtype not in _DTYPES:
            raise StepFormatError(f"tensor {name!r}: unsupported dtype {blob.dtype!r}")
        expected = _DTYPES[blob.dtype].itemsize * math.prod(blob.shape)
        if len(blob.data) != expected:
            raise StepFormatError(
                f"tensor {name!r}: {len(blob.data)} bytes for shape {blob.shape} {blob.dtype}"
            )
        header[name] = {
            "dtype": blob.dtype,
            "shape": list(blob.shape),
            "data_offsets": [offset, offset + expected],
        }
        offset += expected
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # align buffers to 8 bytes, as safetensors does
    if len(raw) > MAX_HEADER_BYTES:
        raise StepFormatError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    parts: list[bytes | memoryview] = [struct.pack("<Q", len(raw)), raw]
    parts.extend(blob.data for _, blob in ordered)
    return b"".join(parts)


def header_length(prefix: bytes) -> int:
    """The declared JSON header length from the first 8 bytes, checked against the cap."""
    if len(prefix) < 8:
        raise StepFormatError(
            f"object is {len(prefix)} bytes; a step object starts with an 8-byte header length"
        )
    (length,) = struct.unpack("<Q", prefix[:8])
    if length == 0 or length > MAX_HEADER_BYTES:
        raise StepFormatError(f"declared header length {length} is outside 1..{MAX_HEADER_BYTES}")
    return int(length)


def parse_header(data: bytes, object_size: int | None = None) -> ParsedHeader:
    """Parse and validate the header from ``data`` (the object, or at least its first 8+N bytes).

    ``object_size`` is the whole object's size when known (e.g. from S3's ContentLength);
    without it, ``len(data)`` is taken as the object size only if ``data`` goes past the header.
    """
    length = header_length(data)
    if len(data) < 8 + length:
        raise StepFormatError(f"truncated: header declares {length} bytes, only {len(data) - 8} present")
    try:
        doc = json.loads(bytes(data[8 : 8 + length]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StepFormatError(f"header is not valid UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise StepFormatError("header JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise StepFormatError("header is not a JSON object")
    if len(doc) > MAX_TENSORS + 1:
        raise StepFormatError(f"header lists {len(doc)} entries; at most {MAX_TENSORS}")
    metadata_raw = doc.pop("__metadata__", {})
    if not isinstance(metadata_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata_raw.items()
    ):
        raise StepFormatError("__metadata__ must map strings to strings")
    data_start = 8 + length
    entries: list[TensorEntry] = []
    for name, spec in doc.items():
        entries.append(_parse_entry(name, spec, data_start))
    entries.sort(key=lambda e: e.begin)
    cursor = data_start
    for entry in entries:
        if entry.begin != cursor:
            raise StepFormatError(f"tensor {entry.name!r}: buffers must be contiguous and non-overlapping")
        cursor = entry.end
    total = cursor
    if object_size is None and len(data) > data_start:
        object_size = len(data)
    if object_size is not None and object_size != total:
        problem = "truncated" if object_size < total else "trailing bytes"
        raise StepFormatError(f"{problem}: header implies {total} bytes, object has {object_size}")
    return ParsedHeader(dict(metadata_raw), {e.name: e for e in entries}, data_start, total)


def _parse_entry(name: str, spec: Any, data_start: int) -> TensorEntry:
    _check_name(name)
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise StepFormatError(f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in _DTYPES:
        raise StepFormatError(f"tensor {name!r}: unsupported dtype {dtype!r}; supported: {sorted(_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_count(d) for d in shape):
        raise StepFormatError(
            f"tensor {name!r}: shape must be a list of at most {MAX_NDIM} non-negative ints"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise StepFormatError(f"tensor {name!r}: data_offsets must be two non-negative ints")
    begin, end = offsets
    nbytes = _DTYPES[dtype].itemsize * math.prod(shape)  # python ints: no overflow
    if end < begin or end - begin != nbytes:
        raise StepFormatError(
            f"tensor {name!r}: {end - begin} bytes for shape {shape} of {dtype} ({nbytes} needed)"
        )
    if nbytes > MAX_TENSOR_BYTES:
        raise StepFormatError(f"tensor {name!r}: {nbytes} bytes exceeds the {MAX_TENSOR_BYTES}-byte limit")
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)


def decode_tensor(entry: TensorEntry, buffer: bytes | memoryview) -> np.ndarray[Any, Any]:
    """Turn the raw bytes of one tensor (exactly ``entry.nbytes``) into a numpy array.

    bfloat16 is widened to float32, which is exact.
    """
    if len(buffer) != entry.nbytes:
        raise StepFormatError(f"tensor {entry.name!r}: got {len(buffer)} bytes, expected {entry.nbytes}")
    arr = np.frombuffer(buffer, dtype=_DTYPES[entry.dtype]).reshape(entry.shape)
    if entry.dtype == "BF16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.copy()


def tensor_from_object(data: bytes, parsed: ParsedHeader, name: str) -> np.ndarray[Any, Any]:
    entry = parsed.tensors.get(name)
    if entry is None:
        raise KeyError(name)
    return decode_tensor(entry, memoryview(data)[entry.begin : entry.end])


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or name == "__metadata__":
        raise StepFormatError(f"invalid tensor name {str(name)[:80]!r}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

"""A job folder read back through the format-2 contract only (the hook's tests do not depend on
the trial API): segments decoded with ``decode_segment_header``, full tensors with ``stepfile``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    EndMarker,
    Manifest,
    ModeRecord,
    SegmentHeader,
    SegmentStep,
    TensorRecord,
    TensorStats,
    decode_segment_header,
    parse_document,
    segment_tensor_key,
)
from trainguard.hook.storage import ObjectNotFound, Store, open_store


@dataclass
class Segment:
    key: str
    ref: layout.ObjectRef
    header: SegmentHeader
    parsed: stepfile.ParsedHeader
    size: int


class JobView:
    def __init__(self, where: Any) -> None:
        self.store: Store = where if isinstance(where, Store) else open_store(str(where))
        self._segments: list[Segment] | None = None

    # ------------------------------------------------------------------ objects
    def keys(self) -> list[str]:
        return self.store.list()

    def segments(self, worker: int | None = None) -> list[Segment]:
        if self._segments is None:
            out = []
            for key in self.store.list("segments/"):
                ref = layout.parse_relative("job", key)
                assert ref.kind is layout.ObjectKind.SEGMENT, key
                data = self.store.get(key)
                header, parsed = decode_segment_header(data, object_size=len(data))
                out.append(Segment(key, ref, header, parsed, len(data)))
            self._segments = sorted(out, key=lambda s: (s.header.worker, s.header.seq))
        return [s for s in self._segments if worker is None or s.header.worker == worker]

    @property
    def manifest(self) -> Manifest | None:
        try:
            return parse_document(Manifest, self.store.get(layout.MANIFEST))
        except ObjectNotFound:
            return None

    def end_markers(self) -> dict[int, EndMarker]:
        out = {}
        for key in self.store.list("end/"):
            ref = layout.parse_relative("job", key)
            assert ref.worker is not None
            out[ref.worker] = parse_document(EndMarker, self.store.get(key))
        return out

    # ------------------------------------------------------------------ steps
    def workers(self) -> list[int]:
        return sorted({s.header.worker for s in self.segments()} | set(self.end_markers()))

    def _steps(self, worker: int | None = None) -> list[tuple[int, SegmentStep, Segment]]:
        return [(st.step, st, seg) for seg in self.segments(worker) for st in seg.header.steps]

    def steps(self, mode: str | None = None, worker: int | None = None) -> list[int]:
        return sorted({s for s, st, _ in self._steps(worker) if mode is None or mode in st.modes})

    def step(self, step: int, worker: int = 0) -> SegmentStep:
        for s, st, _ in self._steps(worker):
            if s == step:
                return st
        raise KeyError(f"step {step} not written by worker {worker}")

    header = step  # the trial API's name for one step's document

    def tensor(self, name: str) -> _Tensor:
        return _Tensor(self, name)

    def mode(self, step: int, mode: str = "TRAIN", worker: int = 0) -> ModeRecord:
        return self.step(step, worker).modes[mode]  # type: ignore[index]

    # ------------------------------------------------------------------ values
    def scalar(self, name: str, step: int, mode: str = "TRAIN", worker: int = 0) -> float:
        return self.mode(step, mode, worker).scalars[name].value

    def scalars(self, mode: str = "TRAIN", worker: int = 0, collection: str | None = None) -> dict:
        out: dict[str, dict[int, float]] = {}
        for s, st, _ in self._steps(worker):
            record = st.modes.get(mode)  # type: ignore[call-overload]
            if record is None:
                continue
            for name, scalar in record.scalars.items():
                if collection is None or collection in scalar.collections:
                    out.setdefault(name, {})[s] = scalar.value
        return out

    def record(self, name: str, step: int, mode: str = "TRAIN", worker: int = 0) -> TensorRecord:
        return self.mode(step, mode, worker).tensors[name]

    def stats(self, name: str, step: int, mode: str = "TRAIN", worker: int = 0) -> TensorStats:
        stats = self.record(name, step, mode, worker).stats
        assert stats is not None
        return stats

    def tensor_steps(self, name: str, mode: str = "TRAIN", worker: int = 0) -> list[int]:
        return [
            s
            for s, st, _ in self._steps(worker)
            if mode in st.modes and name in st.modes[mode].tensors  # type: ignore[index]
        ]

    def tensor_names(
        self, step: int | None = None, mode: str | None = None, collection: str | None = None
    ) -> list[str]:
        names = set()
        for s, st, _ in self._steps():
            if step is not None and s != step:
                continue
            for m, record in st.modes.items():
                if mode is not None and m != mode:
                    continue
                for name, tensor in record.tensors.items():
                    if collection is None or collection in tensor.collections:
                        names.add(name)
                for name, scalar in record.scalars.items():
                    if collection is None or collection in scalar.collections:
                        names.add(name)
        return sorted(names)

    def value(self, name: str, step: int, mode: str = "TRAIN", worker: int = 0) -> np.ndarray:
        for s, _st, seg in self._steps(worker):
            if s != step:
                continue
            entry = seg.parsed.tensors.get(segment_tensor_key(step, mode, name))
            if entry is None:
                raise KeyError(f"{name!r}: no full tensor at step {step} {mode}")
            raw, _ = self.store.get_range(seg.key, entry.begin, entry.end)
            return stepfile.decode_tensor(entry, raw)
        raise KeyError(f"step {step} not written by worker {worker}")


@dataclass
class _Tensor:
    job: JobView
    name: str

    def stats(self, step: int, mode: str = "TRAIN", worker: int = 0) -> TensorStats:
        return self.job.stats(self.name, step, mode, worker)

    def steps(self, mode: str = "TRAIN", worker: int = 0) -> list[int]:
        return self.job.tensor_steps(self.name, mode, worker)

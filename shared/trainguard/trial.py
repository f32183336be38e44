"""Read a job back: ``trainguard.create_trial("s3://bucket/jobs/my-job")`` (or a local folder).

smdebug-like, but with global steps everywhere (``trial.steps()`` lists the step object
keys; ``trial.mode_step(step, mode)`` gives smdebug's per-mode step)::

    trial = trainguard.create_trial("runs/my-job")
    trial.steps()                                   # [0, 1, 2, ...]
    trial.tensor_names(collection="gradients")
    trial.tensor("gradient/fc1.weight").stats(10)   # TensorStats
    trial.tensor("fc1.weight").value(10)            # numpy array, when the full tensor was saved
    trial.tensor("CrossEntropyLoss_output_0").value(3)   # scalars: the float
    trial.scalars(mode="EVAL")                      # {name: {step: value}}

Reads are lazy and bounded: a step object's header is fetched with one ranged GET of its
first ``HEADER_PROBE_BYTES`` (a second one if the header is longer), a full tensor with one
ranged GET of its byte range. Every object is validated (``StepFormatError``,
pydantic's ``ValidationError``) before anything is trusted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    EndMarker,
    Manifest,
    ScalarRecord,
    StepHeader,
    StopSignal,
    TensorRecord,
    TensorStats,
    decode_step_header,
    parse_document,
    read_bounded_document,
    tensor_key,
)
from trainguard.hook.storage import ObjectNotFound, Store, open_store

MODE_ORDER = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


class TensorUnavailable(LookupError):
    """The tensor was not saved at that step/mode/worker, or only its statistics were."""


def create_trial(path: str | os.PathLike[str], store: Store | None = None) -> Trial:
    """Open a job folder (``s3://bucket/prefix/<job>`` or a local directory)."""
    return Trial(store or open_store(path))


class Trial:
    """A job's saved data: manifest, step objects per worker, end markers."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._objects: dict[int, set[int]] | None = None
        self._headers: dict[tuple[int, int], tuple[StepHeader, stepfile.ParsedHeader]] = {}
        self._manifest: Manifest | None = None

    @property
    def path(self) -> str:
        return self.store.url

    # ------------------------------------------------------------------ listing
    def refresh(self) -> None:
        """Forget the listing (new steps written since are seen at the next call)."""
        self._objects = None

    def _index(self) -> dict[int, set[int]]:
        if self._objects is None:
            objects: dict[int, set[int]] = {}
            for key in self.store.list("steps/"):
                try:
                    ref = layout.parse_relative("job", key)
                except layout.LayoutError:
                    continue
                if ref.kind is layout.ObjectKind.STEP and ref.step is not None and ref.worker is not None:
                    objects.setdefault(ref.step, set()).add(ref.worker)
            self._objects = objects
        return self._objects

    @property
    def manifest(self) -> Manifest | None:
        """The job manifest (None if rank 0 has not written it)."""
        if self._manifest is None:
            try:
                raw = read_bounded_document(self.store, layout.MANIFEST)
            except ObjectNotFound:
                return None
            self._manifest = parse_document(Manifest, raw)
        return self._manifest

    def workers(self) -> list[int]:
        """Ranks that wrote step objects or end markers."""
        ranks = {w for ws in self._index().values() for w in ws}
        ranks.update(self.end_markers())
        return sorted(ranks)

    def steps(self, mode: str | None = None, worker: int | None = None) -> list[int]:
        """Global steps with an object (of ``worker``, if given) holding ``mode`` (if given)."""
        out = []
        for step, workers in sorted(self._index().items()):
            ranks = sorted(workers) if worker is None else ([worker] if worker in workers else [])
            if not ranks:
                continue
            if mode is None or any(_mode(mode) in self.header(step, w).modes for w in ranks):
                out.append(step)
        return out

    def end_markers(self) -> dict[int, EndMarker]:
        markers: dict[int, EndMarker] = {}
        for key in self.store.list("end/"):
            try:
                ref = layout.parse_relative("job", key)
            except layout.LayoutError:
                continue
            if ref.kind is layout.ObjectKind.END and ref.worker is not None:
                markers[ref.worker] = parse_document(EndMarker, read_bounded_document(self.store, key))
        return markers

    def stop_signal(self) -> StopSignal | None:
        try:
            raw = read_bounded_document(self.store, layout.STOP_SIGNAL)
        except ObjectNotFound:
            return None
        result: StopSignal = parse_document(StopSignal, raw)
        return result

    # ------------------------------------------------------------------ step objects
    def header(self, step: int, worker: int = 0) -> StepHeader:
        """The step document of one worker's object (fetched once, then cached)."""
        return self._header(step, worker)[0]

    def _header(self, step: int, worker: int) -> tuple[StepHeader, stepfile.ParsedHeader]:
        cached = self._headers.get((step, worker))
        if cached is not None:
            return cached
        key = layout.step_key(step, worker)
        try:
            data, size = self.store.get_range(key, 0, stepfile.HEADER_PROBE_BYTES)
        except ObjectNotFound:
            raise TensorUnavailable(f"no object for step {step} of worker {worker} in {self.path}") from None
        length = stepfile.header_length(data)
        if len(data) < 8 + length and size >= 8 + length:
            rest, _ = self.store.get_range(key, len(data), 8 + length)
            data += rest
        try:
            result = decode_step_header(data[: 8 + length], object_size=size)
        except stepfile.StepFormatError as exc:
            raise stepfile.StepFormatError(f"{self.path}/{key}: {exc}") from None
        self._headers[(step, worker)] = result
        return result

    def mode_step(self, step: int, mode: str, worker: int = 0) -> int:
        """smdebug's per-mode step of a global step."""
        record = self.header(step, worker).modes.get(_mode(mode))
        if record is None:
            raise TensorUnavailable(f"step {step} of worker {worker} has no {_mode(mode)} data")
        return record.mode_step

    def tensor_names(
        self,
        step: int | None = None,
        mode: str | None = None,
        collection: str | None = None,
        regex: str | None = None,
        worker: int | None = None,
    ) -> list[str]:
        """Names of tensors and scalars saved (at ``step``, in ``mode``, in ``collection``,
        matching ``regex``)."""
        pattern = re.compile(regex) if regex else None
        names: set[str] = set()
        for _, _, _, name, record in self._records(step, mode, worker):
            if collection is not None and collection not in record.collections:
                continue
            if pattern is not None and not pattern.match(name):
                continue
            names.add(name)
        return sorted(names)

    def _records(
        self, step: int | None, mode: str | None, worker: int | None
    ) -> Iterator[tuple[int, int, str, str, TensorRecord | ScalarRecord]]:
        index = self._index()
        steps = [step] if step is not None else sorted(index)
        for s in steps:
            for w in sorted(index.get(s, ())):
                if worker is not None and w != worker:
                    continue
                header = self.header(s, w)
                for m, record in header.modes.items():
                    if mode is not None and m != _mode(mode):
                        continue
                    for name, scalar in record.scalars.items():
                        yield s, w, m, name, scalar
                    for name, tensor in record.tensors.items():
                        yield s, w, m, name, tensor

    def tensor(self, name: str) -> TrialTensor:
        return TrialTensor(self, name)

    def scalars(
        self, mode: str | None = None, worker: int = 0, collection: str | None = None
    ) -> dict[str, dict[int, float]]:
        """Every scalar of ``worker``: ``{name: {step: value}}``.

        ``mode`` None: a scalar saved in several modes at one step gives its first mode's value
        (TRAIN, EVAL, PREDICT, GLOBAL)."""
        out: dict[str, dict[int, float]] = {}
        seen: set[tuple[str, int]] = set()
        for s, _, _, name, record in sorted(
            self._records(None, mode, worker), key=lambda r: (r[0], MODE_ORDER.index(r[2]))
        ):
            if not isinstance(record, ScalarRecord) or (name, s) in seen:
                continue
            if collection is not None and collection not in record.collections:
                continue
            seen.add((name, s))
            out.setdefault(name, {})[s] = record.value
        return out

    def _read_tensor(self, step: int, worker: int, mode: str, name: str) -> np.ndarray[Any, Any]:
        _, parsed = self._header(step, worker)
        entry = parsed.tensors.get(tensor_key(mode, name))
        if entry is None:
            raise TensorUnavailable(
                f"{name!r}: no full tensor in the {mode} data of step {step}, worker {worker}"
            )
        raw, _ = self.store.get_range(layout.step_key(step, worker), entry.begin, entry.end)
        return stepfile.decode_tensor(entry, raw)


class TrialTensor:
    """One tensor (or scalar) name across steps, modes and workers."""

    def __init__(self, trial: Trial, name: str) -> None:
        self.trial = trial
        self.name = name

    def __repr__(self) -> str:
        return f"TrialTensor({self.name!r})"

    def _find(self, step: int, mode: str | None, worker: int) -> tuple[str, TensorRecord | ScalarRecord]:
        header = self.trial.header(step, worker)
        modes = [_mode(mode)] if mode is not None else [m for m in MODE_ORDER if m in header.modes]
        for m in modes:
            record = header.modes.get(m)  # type: ignore[call-overload]
            if record is None:
                continue
            if self.name in record.scalars:
                return m, record.scalars[self.name]
            if self.name in record.tensors:
                return m, record.tensors[self.name]
        where = f" in mode {_mode(mode)}" if mode is not None else ""
        raise TensorUnavailable(f"{self.name!r} was not saved at step {step}{where} by worker {worker}")

    def steps(self, mode: str | None = None, worker: int = 0) -> list[int]:
        out = []
        for step in self.trial.steps(mode=mode, worker=worker):
            try:
                self._find(step, mode, worker)
            except TensorUnavailable:
                continue
            out.append(step)
        return out

    def collections(self, step: int, mode: str | None = None, worker: int = 0) -> list[str]:
        return list(self._find(step, mode, worker)[1].collections)

    def value(self, step: int, mode: str | None = None, worker: int = 0) -> Any:
        """The saved value: a float for a scalar, a numpy array for a stored tensor.

        Raises ``TensorUnavailable`` when the tensor was not saved there, or when only its
        statistics were (then use ``stats``).
        """
        m, record = self._find(step, mode, worker)
        if isinstance(record, ScalarRecord):
            return record.value
        if not record.stored:
            raise TensorUnavailable(
                f"{self.name!r} at step {step}: only statistics were saved (use .stats(step)); "
                "store full tensors with a collection's save_full=True"
            )
        return self.trial._read_tensor(step, worker, m, self.name)

    def stats(self, step: int, mode: str | None = None, worker: int = 0) -> TensorStats:
        _, record = self._find(step, mode, worker)
        if isinstance(record, ScalarRecord) or record.stats is None:
            raise TensorUnavailable(f"{self.name!r} at step {step} has no statistics")
        return record.stats

    def record(self, step: int, mode: str | None = None, worker: int = 0) -> TensorRecord | ScalarRecord:
        return self._find(step, mode, worker)[1]

    def values(self, mode: str | None = None, worker: int = 0) -> dict[int, Any]:
        return {s: self.value(s, mode, worker) for s in self.steps(mode, worker)}


def _mode(mode: Any) -> Any:
    value = getattr(mode, "value", mode)
    text = str(value).upper()
    if text not in MODE_ORDER:
        raise ValueError(f"unknown mode {mode!r}; one of {MODE_ORDER}")
    return text

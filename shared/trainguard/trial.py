"""Read a job back: ``trainguard.create_trial("s3://bucket/jobs/my-job")`` (or a local folder).

smdebug's trial API with smdebug's semantics, so analysis scripts written for smdebug work
with only the import changed::

    trial = trainguard.create_trial("runs/my-job", name="baseline")
    trial.steps()                                   # global steps [0, 1, 2, ...]
    trial.steps(mode=modes.EVAL)                    # EVAL's own step numbers [0, 1, ...]
    trial.modes(); trial.workers()                  # [ModeKeys.TRAIN, ...]; ["worker_0", ...]
    trial.tensor_names(collection="gradients", regex="fc1")
    t = trial.tensor("gradient/Net_fc1.weight")     # smdebug's names, or the names on disk
    t.reduction_value(10, "mean", abs=True)         # from the saved statistics
    t.value(10)                                     # numpy array (full tensor) or float (scalar)
    t.value(3, mode=modes.EVAL)                     # step 3 *of EVAL*, as in smdebug
    trial.collection("weights").tensor_names
    trial.has_passed_step(50)                       # StepState.AVAILABLE / NOT_YET_AVAILABLE / ...

Steps: with ``mode`` None or ``GLOBAL`` a step number is the global step; with a mode it is
that mode's step (smdebug's ``mode_step``). A global step may hold several modes here
(smdebug's one mode per step is a special case). trainguard's own additions:
``trial.scalars()`` (global steps), ``trial.header(step, worker)``, ``tensor.stats(step)``,
``trial.ranks()``, ``trial.end_markers()``, ``trial.stop_signal()``.

Both formats are read: format 1 (one object per step and worker, ``steps/...``) and format 2
(one object per worker and flush window, ``segments/...``). Reads are lazy and bounded: a
header is fetched with one ranged GET (a second one if it is longer), a full tensor with
one ranged GET of its byte range, every document is validated before it is trusted, and
parsed headers are kept in an LRU cache bounded in bytes (``cache_bytes``), so reading a
long job never holds more than that. What the trial learns once per object (its steps, their
modes, the tensor names) is kept in a small index.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from trainguard.format import layout, stepfile
from trainguard.format.documents import (
    EndMarker,
    Manifest,
    ModeRecord,
    ScalarRecord,
    SegmentHeader,
    StepHeader,
    StopSignal,
    TensorRecord,
    TensorStats,
    decode_segment_header,
    decode_step_header,
    parse_document,
    read_bounded_document,
    segment_tensor_key,
    tensor_key,
)
from trainguard.hook.storage import ObjectNotFound, Store, open_store
from trainguard.modes import ModeKeys

MODE_ORDER = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")
#: memory the cache of parsed headers may take per trial (a bound, not a target)
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
#: a parsed header takes about this many bytes of memory per byte of its JSON (measured: a
#: 9 MB header of many small tensors parses to ~85 MB of pydantic objects)
PARSED_BYTES_PER_HEADER_BYTE = 10
#: collections whose tensors are parameters (smdebug prefixes them with the model's class name)
PARAMETER_COLLECTIONS = frozenset({"weights", "biases", "gradients"})
_ALIAS = re.compile(r"(?P<gradient>gradient/)?(?P<prefix>[A-Za-z_][A-Za-z0-9_]*?)_(?P<rest>[^/]*\.[^/]*)\Z")


class TensorUnavailable(LookupError):
    """No tensor of that name was saved in this job (or not at that step/mode/worker)."""


class TensorUnavailableForStep(TensorUnavailable):
    """The tensor exists, but was not saved at that step/mode/worker (or only its statistics were)."""


class StepUnavailable(TensorUnavailable):
    """That step was never written (and will not be: later steps are complete)."""


class StepState(Enum):
    """smdebug's ``trial.has_passed_step`` answer."""

    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


def create_trial(
    path: str | os.PathLike[str],
    name: str | None = None,
    store: Store | None = None,
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    **smdebug_options: Any,
) -> Trial:
    """Open a job folder (``s3://bucket/prefix/<job>`` or a local directory).

    ``name`` defaults to the folder's last component, as in smdebug. smdebug's other
    options (``range_steps``, ``check``, ``index_mode``, ``cache``, ``parallel``) are
    accepted; ``range_steps=(begin, end)`` limits the steps, the others have no effect here.
    """
    text = os.fspath(path).strip()
    unknown = set(smdebug_options) - {"range_steps", "check", "index_mode", "cache", "parallel"}
    if unknown:
        raise TypeError(f"create_trial() got unexpected options {sorted(unknown)}")
    trial = Trial(store or open_store(text), name=name, cache_bytes=cache_bytes)
    trial.range_steps = smdebug_options.get("range_steps")
    return trial


@dataclass
class _Location:
    """Where one worker's data for one global step lives."""

    key: str
    segment: bool
    #: (mode, that mode's step) in MODE_ORDER, as the header said; None until it was read
    modes: tuple[tuple[str, int], ...] | None = None


@dataclass
class TrialCollection:
    """A collection as smdebug's ``trial.collection(name)`` returns it."""

    name: str
    include_regex: list[str] = field(default_factory=list)
    reductions: list[str] = field(default_factory=list)
    save_full: bool = False
    save_config: dict[str, Any] = field(default_factory=dict)
    #: names of the tensors saved in this collection
    tensor_names: set[str] = field(default_factory=set)

    @property
    def tensors(self) -> set[str]:
        return self.tensor_names


class Trial:
    """A job's saved data: manifest, step or segment objects per worker, end markers."""

    def __init__(self, store: Store, name: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.store = store
        self.name = name or store.url.rstrip("/").rsplit("/", 1)[-1]
        self.range_steps: tuple[int | None, int | None] | None = None
        self.cache_bytes = max(0, int(cache_bytes))
        self._lock = threading.RLock()
        self._index: dict[int, dict[int, _Location]] | None = None
        #: tensor or scalar name -> collections it was saved in (learned as headers are read)
        self._names: dict[str, set[str]] = {}
        self._names_by_mode: dict[str, set[str]] = {}
        self._cache: OrderedDict[str, tuple[Any, stepfile.ParsedHeader, int]] = OrderedDict()
        self._cached_bytes = 0
        self._manifest: Manifest | None = None
        self._ends: dict[int, EndMarker] | None = None

    def __repr__(self) -> str:
        return f"<trainguard Trial {self.name!r} at {self.path}>"

    @property
    def path(self) -> str:
        return self.store.url

    # ------------------------------------------------------------------ listing
    def refresh(self) -> None:
        """Forget the listing (objects written since are seen at the next call)."""
        with self._lock:
            self._index = None
            self._ends = None

    def _steps_index(self) -> dict[int, dict[int, _Location]]:
        with self._lock:
            if self._index is None:
                self._index = self._build_index()
            return self._index

    def _build_index(self) -> dict[int, dict[int, _Location]]:
        index: dict[int, dict[int, _Location]] = {}
        for key in self.store.list("steps/"):
            ref = _ref(key)
            if ref is not None and ref.kind is layout.ObjectKind.STEP:
                assert ref.step is not None and ref.worker is not None
                if self._in_range(ref.step):  # format 1: the key says it all; the header is read on demand
                    index.setdefault(ref.step, {})[ref.worker] = _Location(key, segment=False)
        for key in self.store.list("segments/"):
            ref = _ref(key)
            if ref is None or ref.kind is not layout.ObjectKind.SEGMENT:
                continue
            assert ref.step is not None and ref.last_step is not None and ref.worker is not None
            if not self._overlaps(ref.step, ref.last_step):
                continue
            # format 2: a segment's steps are in its header (one ranged GET per segment)
            for step, location in self._learn(key, segment=True).items():
                if self._in_range(step):
                    index.setdefault(step, {})[ref.worker] = location
        return index

    def _learn(self, key: str, segment: bool) -> dict[int, _Location]:
        """Read one object's header once: its steps, their modes and names go in the index."""
        doc, _ = self._header_of(key, segment)
        out: dict[int, _Location] = {}
        steps = doc.steps if segment else [doc]
        for entry in steps:
            modes = tuple((m, rec.mode_step) for m, rec in sorted(entry.modes.items(), key=_mode_order))
            out[entry.step] = _Location(key, segment, modes)
            for m, rec in entry.modes.items():
                seen = self._names_by_mode.setdefault(m, set())
                for name, record in (*rec.scalars.items(), *rec.tensors.items()):
                    seen.add(name)
                    self._names.setdefault(name, set()).update(record.collections)
        return out

    def _modes(self, step: int, rank: int) -> dict[str, int]:
        """Mode -> mode step of one worker's data at one global step (reads the header once)."""
        location = self._location(step, rank)
        if location.modes is None:
            location.modes = self._learn(location.key, location.segment)[step].modes
        return dict(location.modes or ())

    def _learn_all(self) -> None:
        for step, workers in sorted(self._steps_index().items()):
            for rank, location in workers.items():
                if location.modes is None:
                    self._modes(step, rank)

    def _in_range(self, step: int) -> bool:
        if self.range_steps is None:
            return True
        begin, end = self.range_steps
        return (begin is None or step >= begin) and (end is None or step < end)

    def _overlaps(self, first: int, last: int) -> bool:
        if self.range_steps is None:
            return True
        begin, end = self.range_steps
        return (begin is None or last >= begin) and (end is None or first < end)

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

    def ranks(self) -> list[int]:
        """Ranks (ints) that wrote step data or end markers."""
        ranks = {w for ws in self._steps_index().values() for w in ws}
        ranks.update(self.end_markers())
        return sorted(ranks)

    def workers(self) -> list[str]:
        """Worker names as smdebug gives them: ``["worker_0", "worker_1", ...]``."""
        return [worker_name(r) for r in self.ranks()]

    def end_markers(self) -> dict[int, EndMarker]:
        """Each closed worker's end marker (read once per ``refresh``)."""
        with self._lock:
            if self._ends is not None:
                return dict(self._ends)
        markers: dict[int, EndMarker] = {}
        for key in self.store.list("end/"):
            ref = _ref(key)
            if ref is not None and ref.kind is layout.ObjectKind.END and ref.worker is not None:
                markers[ref.worker] = parse_document(EndMarker, read_bounded_document(self.store, key))
        with self._lock:
            self._ends = markers
        return dict(markers)

    def stop_signal(self) -> StopSignal | None:
        try:
            raw = read_bounded_document(self.store, layout.STOP_SIGNAL)
        except ObjectNotFound:
            return None
        result: StopSignal = parse_document(StopSignal, raw)
        return result

    # ------------------------------------------------------------------ steps and modes
    def steps(
        self,
        mode: Any = None,
        show_incomplete_steps: bool = False,
        worker: int | str | None = None,
    ) -> list[int]:
        """Steps with data (of ``worker``, if given): global steps, or ``mode``'s own steps.

        Without ``show_incomplete_steps``, a step only some workers wrote is left out until
        the job ended or every worker wrote a later step (smdebug's "complete" steps).
        """
        m = _mode_or_none(mode)
        rank = _rank(worker)
        out: list[int] = []
        complete = None if show_incomplete_steps else self.last_complete_step
        world = len(self._writers())
        for step, workers in sorted(self._steps_index().items()):
            ranks = sorted(workers) if rank is None else ([rank] if rank in workers else [])
            if not ranks:
                continue
            if complete is not None and len(workers) < world and step > complete:
                continue
            if m is None:
                out.append(step)
                continue
            found = [self._modes(step, r).get(m) for r in ranks]
            out.extend(sorted({s for s in found if s is not None}))
        return sorted(dict.fromkeys(out)) if m is not None else out

    def world_size(self) -> int:
        manifest = self.manifest
        if manifest is not None:
            return manifest.world_size
        return max(1, len(self.ranks()))

    @property
    def loaded_all_steps(self) -> bool:
        """Every worker closed (wrote its end marker): no more steps will come."""
        return len(self.end_markers()) >= self.world_size()

    def is_training_job_complete(self) -> bool:
        return self.loaded_all_steps

    def _writers(self) -> set[int]:
        """Ranks that wrote step data (smdebug counts the workers that wrote, too)."""
        return {w for ws in self._steps_index().values() for w in ws}

    @property
    def last_complete_step(self) -> int:
        """The newest step that no worker will still add to (-1: none yet).

        A step is complete when every worker that writes steps wrote it, or wrote a later
        one (a worker's objects come in step order), or the job ended.
        """
        index = self._steps_index()
        if not index:
            return -1
        if self.loaded_all_steps:
            return max(index)
        newest: dict[int, int] = {}
        for step, workers in index.items():
            for rank in workers:
                newest[rank] = max(newest.get(rank, -1), step)
        return min(newest.values())

    def modes(self) -> list[ModeKeys]:
        """Modes with data (not GLOBAL), in smdebug's ``ModeKeys``."""
        self._learn_all()
        seen = {
            m
            for workers in self._steps_index().values()
            for loc in workers.values()
            for m, _ in loc.modes or ()
        }
        return [ModeKeys(m) for m in MODE_ORDER if m in seen and m != "GLOBAL"]

    def global_step(self, mode: Any, mode_step: int) -> int | None:
        """The global step of ``mode``'s step ``mode_step`` (None: no such step)."""
        m = _mode_or_none(mode)
        if m is None:
            return mode_step if mode_step in self._steps_index() else None
        for step, workers in sorted(self._steps_index().items()):
            if any(self._modes(step, r).get(m) == mode_step for r in workers):
                return step
        return None

    def mode_modestep(self, global_step: int) -> tuple[ModeKeys | None, int | None]:
        """The first mode of a global step and its step in that mode (smdebug's order)."""
        workers = self._steps_index().get(global_step)
        if not workers:
            return None, None
        modes = self._modes(global_step, min(workers))
        if not modes:
            return ModeKeys.GLOBAL, global_step
        m, s = next(iter(modes.items()))
        return ModeKeys(m), s

    def mode(self, global_step: int) -> ModeKeys | None:
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step: int, mode: Any = None, worker: int | str | None = None) -> int:
        """``mode``'s step of a global step (``mode`` None: its first mode, as smdebug)."""
        m = _mode_or_none(mode)
        workers = self._steps_index().get(global_step, {})
        rank = _rank(worker)
        for r in [rank] if rank is not None and rank in workers else sorted(workers):
            modes = self._modes(global_step, r)
            if m is None and modes:
                return next(iter(modes.values()))
            if m is not None and m in modes:
                return modes[m]
        raise StepUnavailable(f"global step {global_step} has no {m or 'data'} in {self.path}")

    def has_passed_step(self, step: int, mode: Any = None) -> StepState:
        """Whether ``step`` (of ``mode``) is written by every worker, still to come, or will never be."""
        m = _mode_or_none(mode)
        all_steps = self.steps(mode=m, show_incomplete_steps=True)
        done = self.loaded_all_steps
        if step in all_steps:
            global_step = self.global_step(m, step) if m is not None else step
            workers = self._steps_index().get(global_step or 0, {})
            if done or len(workers) >= len(self._writers()) or (global_step or 0) <= self.last_complete_step:
                return StepState.AVAILABLE
            return StepState.NOT_YET_AVAILABLE
        if done:
            return StepState.UNAVAILABLE
        later = bisect.bisect_right(all_steps, step) < len(all_steps)
        if later and (m is not None or step < self.last_complete_step):
            return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE

    def wait_for_steps(
        self, required_steps: Iterable[int], mode: Any = None, timeout_s: float = 600.0
    ) -> None:
        """Block until every step is available (smdebug's call); polls every 2 s, up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for step in required_steps:
            while True:
                state = self.has_passed_step(step, mode)
                if state is StepState.AVAILABLE:
                    break
                if state is StepState.UNAVAILABLE:
                    raise StepUnavailable(f"step {step} ({_mode_or_none(mode) or 'GLOBAL'}) was not written")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"step {step} not written after {timeout_s:.0f} s")
                time.sleep(2.0)
                self.refresh()

    # ------------------------------------------------------------------ headers
    def header(self, step: int, worker: int | str = 0) -> StepHeader:
        """One worker's record of one global step (format 2 segments are shown per step too)."""
        location = self._location(step, _rank(worker) or 0)
        doc, _ = self._header_of(location.key, location.segment)
        if not location.segment:
            result: StepHeader = doc
            return result
        segment: SegmentHeader = doc
        previous = segment.prev_step
        for entry in segment.steps:
            if entry.step == step:
                return StepHeader.model_construct(
                    job=segment.job,
                    step=step,
                    worker=segment.worker,
                    world_size=segment.world_size,
                    prev_step=previous,
                    wall_time=entry.wall_time,
                    modes=entry.modes,
                )
            previous = entry.step
        raise TensorUnavailableForStep(f"step {step} is not in segment {location.key}")

    def _location(self, step: int, worker: int) -> _Location:
        location = self._steps_index().get(step, {}).get(worker)
        if location is None:
            raise StepUnavailable(f"no data for step {step} of worker {worker} in {self.path}")
        return location

    def _header_of(self, key: str, segment: bool) -> tuple[Any, stepfile.ParsedHeader]:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached[0], cached[1]
        probe = stepfile.SEGMENT_PROBE_BYTES if segment else stepfile.HEADER_PROBE_BYTES
        try:
            data, size = self.store.get_range(key, 0, probe)
        except ObjectNotFound:
            raise StepUnavailable(f"{self.path}/{key} is listed but cannot be read (deleted?)") from None
        length = stepfile.header_length(data)
        if len(data) < 8 + length and size >= 8 + length:
            rest, _ = self.store.get_range(key, len(data), 8 + length)
            data += rest
        try:
            decode = decode_segment_header if segment else decode_step_header
            doc, parsed = decode(data[: 8 + length], object_size=size)
        except stepfile.StepFormatError as exc:
            raise stepfile.StepFormatError(f"{self.path}/{key}: {exc}") from None
        cost = (8 + length) * PARSED_BYTES_PER_HEADER_BYTE
        with self._lock:
            if key not in self._cache:
                self._cache[key] = (doc, parsed, cost)
                self._cached_bytes += cost
            while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                _, (_, _, cost) = self._cache.popitem(last=False)
                self._cached_bytes -= cost
        return doc, parsed

    @property
    def cached_header_bytes(self) -> int:
        """Estimated memory of the parsed headers cached now (at most ``cache_bytes``, or one header)."""
        return self._cached_bytes

    def _records(
        self, step: int | None, mode: str | None, worker: int | None
    ) -> Iterator[tuple[int, int, str, str, TensorRecord | ScalarRecord]]:
        index = self._steps_index()
        steps = [step] if step is not None else sorted(index)
        for s in steps:
            for w in sorted(index.get(s, ())):
                if worker is not None and w != worker:
                    continue
                header = self.header(s, w)
                for m, record in header.modes.items():
                    if mode is not None and m != mode:
                        continue
                    for name, scalar in record.scalars.items():
                        yield s, w, m, name, scalar
                    for name, tensor in record.tensors.items():
                        yield s, w, m, name, tensor

    # ------------------------------------------------------------------ names
    def _catalog(self) -> dict[str, set[str]]:
        self._learn_all()
        return self._names

    def tensor_names(
        self,
        step: int | None = None,
        mode: Any = None,
        regex: str | list[str] | None = None,
        collection: Any = None,
        worker: int | str | None = None,
    ) -> list[str]:
        """Names of tensors and scalars saved (at ``step`` of ``mode``, in ``collection``,
        matching any of ``regex`` by ``re.search``, as smdebug matches; a regex also matches a
        parameter's smdebug-style name, ``Net_fc1.weight`` for ``fc1.weight`` and back)."""
        m = _mode_or_none(mode)
        coll = getattr(collection, "name", collection)
        regexes = [regex] if isinstance(regex, str) else list(regex or [])
        patterns = [re.compile(r) for r in regexes]
        # smdebug prefixes parameters with the model's class name ("Net_conv1.weight"); for
        # parameters saved without it, the regex is also tried without that literal prefix
        unprefixed = [re.compile(r) for r in (_strip_class_prefix(r) for r in regexes) if r is not None]
        catalog = self._catalog()
        if step is None and worker is None:
            names = set(catalog) if m is None else set(self._names_by_mode.get(m, ()))
            candidates = {n: catalog.get(n, set()) for n in names}
        else:
            global_step = None if step is None else (self.global_step(m, step) if m is not None else step)
            if step is not None and global_step is None:
                return []
            candidates = {}
            for *_, name, record in self._records(global_step, m, _rank(worker)):
                candidates.setdefault(name, set()).update(record.collections)
        out = []
        for name, collections in candidates.items():
            if coll is not None and coll not in collections:
                continue
            if patterns and not any(p.search(n) for p in patterns for n in _spellings(name)):
                is_parameter = bool(self._names.get(name, set()) & PARAMETER_COLLECTIONS)
                if not (is_parameter and any(p.search(name) for p in unprefixed)):
                    continue
            out.append(name)
        return sorted(out)

    def has_tensor(self, name: str) -> bool:
        return self._resolve(name) is not None

    def _resolve(self, name: str) -> str | None:
        """The name on disk for ``name``: itself, or its smdebug/trainguard spelling."""
        catalog = self._catalog()
        if name in catalog:
            return name
        match = _ALIAS.match(name)
        if match:  # smdebug's "<Model>_fc1.weight" for trainguard's "fc1.weight"
            body = name[len(match.group("gradient") or "") :]
            for i, char in enumerate(body):
                if char == "_" and "." not in body[:i]:
                    candidate = (match.group("gradient") or "") + body[i + 1 :]
                    if candidate in catalog:
                        return candidate
        gradient = "gradient/" if name.startswith("gradient/") else ""
        body = name[len(gradient) :]
        matches = [
            disk
            for disk in catalog
            if disk.startswith(gradient)
            and (m := _ALIAS.match(disk)) is not None
            and (m.group("gradient") or "") == gradient
            and disk[len(gradient) :].endswith("_" + body)
            and "." not in disk[len(gradient) : -len(body) - 1]
        ]
        return matches[0] if len(matches) == 1 else None

    def tensor(self, name: str) -> TrialTensor:
        """The tensor (or scalar) ``name``; raises ``TensorUnavailable`` if no such name was saved."""
        disk = self._resolve(name)
        if disk is None:
            close = sorted(n for n in self._catalog() if name.rsplit("/", 1)[-1].split("_")[-1] in n)[:5]
            hint = f"; similar names: {close}" if close else ""
            raise TensorUnavailable(f"no tensor {name!r} was saved in {self.path}{hint}")
        return TrialTensor(self, disk, requested=name)

    def collections(self) -> dict[str, TrialCollection]:
        """Every collection: the manifest's definitions, with the names saved in each."""
        out: dict[str, TrialCollection] = {}
        manifest = self.manifest
        for c in manifest.collections if manifest is not None else []:
            out[c.name] = TrialCollection(
                c.name,
                list(c.include_regex),
                list(c.reductions),
                c.save_full,
                {m: cfg.model_dump() for m, cfg in c.save_config.items()},
            )
        for name, colls in self._catalog().items():
            for coll in colls:
                out.setdefault(coll, TrialCollection(coll)).tensor_names.add(name)
        return out

    def collection(self, name: str) -> TrialCollection:
        found = self.collections().get(name)
        if found is None:
            raise KeyError(
                f"no collection {name!r} in {self.path}; collections: {sorted(self.collections())}"
            )
        return found

    # ------------------------------------------------------------------ values
    def scalars(
        self, mode: Any = None, worker: int | str = 0, collection: str | None = None
    ) -> dict[str, dict[int, float]]:
        """Every scalar of ``worker``: ``{name: {global step: value}}``.

        ``mode`` None: a scalar saved in several modes at one step gives its first mode's value
        (TRAIN, EVAL, PREDICT, GLOBAL)."""
        out: dict[str, dict[int, float]] = {}
        seen: set[tuple[str, int]] = set()
        m = _mode_or_none(mode)
        for s, _, _, name, record in sorted(
            self._records(None, m, _rank(worker)), key=lambda r: (r[0], MODE_ORDER.index(r[2]))
        ):
            if not isinstance(record, ScalarRecord) or (name, s) in seen:
                continue
            if collection is not None and collection not in record.collections:
                continue
            seen.add((name, s))
            out.setdefault(name, {})[s] = record.value
        return out

    def _read_tensor(self, step: int, worker: int, mode: str, name: str) -> np.ndarray[Any, Any]:
        location = self._location(step, worker)
        _, parsed = self._header_of(location.key, location.segment)
        inner = segment_tensor_key(step, mode, name) if location.segment else tensor_key(mode, name)
        entry = parsed.tensors.get(inner)
        if entry is None:
            raise TensorUnavailableForStep(
                f"{name!r}: no full tensor in the {mode} data of step {step}, worker {worker}"
            )
        raw, _ = self.store.get_range(location.key, entry.begin, entry.end)
        return stepfile.decode_tensor(entry, raw)


class TrialTensor:
    """One tensor (or scalar) name across steps, modes and workers (smdebug's ``Tensor``)."""

    def __init__(self, trial: Trial, name: str, requested: str | None = None) -> None:
        self.trial = trial
        self.name = name
        #: the name the caller asked for (an smdebug-style alias of ``name``, or ``name``)
        self.original_name = requested or name

    def __repr__(self) -> str:
        return f"TrialTensor({self.name!r})"

    def _where(self, step_num: int, mode: Any) -> tuple[int, str | None]:
        """(global step, mode or None) of a step number given in ``mode`` (None: global)."""
        m = _mode_or_none(mode)
        if m is None:
            return step_num, None
        global_step = self.trial.global_step(m, step_num)
        if global_step is None:
            raise StepUnavailable(f"{m} has no step {step_num} in {self.trial.path}")
        return global_step, m

    def _find(
        self, step_num: int, mode: Any, worker: int | str | None
    ) -> tuple[int, int, str, TensorRecord | ScalarRecord]:
        step, m = self._where(step_num, mode)
        workers = self.trial._steps_index().get(step)
        if not workers:
            raise StepUnavailable(f"step {step} was not written in {self.trial.path}")
        rank = _rank(worker)
        if rank is not None and rank not in workers:
            raise TensorUnavailableForStep(f"worker {worker_name(rank)} wrote nothing at step {step}")
        for r in [rank] if rank is not None else sorted(workers):
            header = self.trial.header(step, r)
            modes = [m] if m is not None else [x for x in MODE_ORDER if x in header.modes]
            for x in modes:
                record: ModeRecord | None = header.modes.get(x)  # type: ignore[call-overload]
                if record is None:
                    continue
                if self.name in record.scalars:
                    return step, r, x, record.scalars[self.name]
                if self.name in record.tensors:
                    return step, r, x, record.tensors[self.name]
        where = f" in mode {m}" if m is not None else ""
        who = f" by {worker_name(rank)}" if rank is not None else ""
        raise TensorUnavailableForStep(f"{self.original_name!r} was not saved at step {step_num}{where}{who}")

    def steps(
        self, mode: Any = None, show_incomplete_steps: bool = False, worker: int | str | None = None
    ) -> list[int]:
        """Steps (global, or ``mode``'s own) at which this tensor was saved (by ``worker``)."""
        m = _mode_or_none(mode)
        out: set[int] = set()
        complete = None if show_incomplete_steps else self.trial.last_complete_step
        for step, r, x, name, _ in self.trial._records(None, m, _rank(worker)):
            if name != self.name:
                continue
            if complete is not None and step > complete and not self.trial.loaded_all_steps:
                continue
            out.add(step if m is None else self.trial._modes(step, r)[x])
        return sorted(out)

    def prev_steps(self, step: int, n: int | None = None, mode: Any = None) -> list[int]:
        steps = self.steps(mode=mode)
        earlier = steps[: bisect.bisect_right(steps, step)]
        return earlier[-n:] if n else earlier

    def workers(self, step_num: int, mode: Any = None) -> list[str]:
        """Workers that saved this tensor at that step (smdebug names, ``worker_0``...)."""
        step, _ = self._where(step_num, mode)
        out = []
        for r in sorted(self.trial._steps_index().get(step, {})):
            try:
                self._find(step_num, mode, r)
            except TensorUnavailableForStep:
                continue
            out.append(worker_name(r))
        if not out:
            raise TensorUnavailableForStep(f"{self.original_name!r} was not saved at step {step_num}")
        return out

    def collections(
        self, step: int | None = None, mode: Any = None, worker: int | str | None = None
    ) -> list[str]:
        if step is None:
            return sorted(self.trial._catalog().get(self.name, ()))
        return list(self._find(step, mode, worker)[3].collections)

    def value(self, step_num: int, mode: Any = None, worker: int | str | None = None) -> Any:
        """The saved value: a float for a scalar, a numpy array for a stored tensor.

        Raises ``TensorUnavailableForStep`` when the tensor was not saved there, or when only
        its statistics were (then use ``reduction_value`` or ``stats``).
        """
        step, r, m, record = self._find(step_num, mode, worker)
        if isinstance(record, ScalarRecord):
            return record.value
        if not record.stored:
            raise TensorUnavailableForStep(
                f"{self.original_name!r} at step {step_num}: only statistics were saved (use "
                ".reduction_value or .stats); store full tensors with a collection's save_full=True"
            )
        return self.trial._read_tensor(step, r, m, self.name)

    def values(self, mode: Any = None, worker: int | str | None = None) -> dict[int, Any]:
        return {s: self.value(s, mode, worker) for s in self.steps(mode, worker=worker)}

    def shape(self, step_num: int, mode: Any = None, worker: int | str | None = None) -> tuple[int, ...]:
        record = self._find(step_num, mode, worker)[3]
        return () if isinstance(record, ScalarRecord) else tuple(record.shape)

    def stats(self, step: int, mode: Any = None, worker: int | str | None = None) -> TensorStats:
        record = self._find(step, mode, worker)[3]
        if isinstance(record, ScalarRecord) or record.stats is None:
            raise TensorUnavailableForStep(f"{self.original_name!r} at step {step} has no statistics")
        return record.stats

    def record(
        self, step: int, mode: Any = None, worker: int | str | None = None
    ) -> TensorRecord | ScalarRecord:
        return self._find(step, mode, worker)[3]

    def reduction_value(
        self,
        step_num: int,
        reduction_name: str,
        mode: Any = None,
        worker: int | str | None = None,
        abs: bool = False,
    ) -> float:
        """smdebug's reductions (min, max, mean, std, variance, sum, l1, l2), with ``abs``.

        Computed from the saved statistics, or from the full tensor when it was stored;
        raises ``TensorUnavailableForStep`` for a reduction neither can give.
        """
        step, r, m, record = self._find(step_num, mode, worker)
        if isinstance(record, ScalarRecord):
            return float(_numpy_reduction(reduction_name, np.asarray(record.value), abs))
        if record.stats is not None:
            value = _stats_reduction(record.stats, reduction_name, abs)
            if value is not None:
                return value
        if record.stored:
            return float(
                _numpy_reduction(reduction_name, self.trial._read_tensor(step, r, m, self.name), abs)
            )
        raise TensorUnavailableForStep(
            f"{self.original_name!r} at step {step_num}: reduction {reduction_name!r} (abs={abs}) "
            "cannot be computed from the saved statistics and the full tensor was not saved"
        )

    def reduction_values(
        self, step_num: int, mode: Any = None, worker: int | str | None = None
    ) -> dict[tuple[str, bool], float]:
        """Every reduction available at that step: ``{(name, abs): value}``."""
        out = {}
        for name in REDUCTIONS:
            for absolute in (False, True):
                try:
                    out[(name, absolute)] = self.reduction_value(step_num, name, mode, worker, abs=absolute)
                except TensorUnavailableForStep:
                    continue  # not computable from what was saved: left out, as smdebug leaves it
        return out


#: smdebug's reduction names (``ALLOWED_REDUCTIONS`` and ``ALLOWED_NORMS``)
REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2")


def _stats_reduction(stats: TensorStats, name: str, absolute: bool) -> float | None:
    """A reduction from saved statistics (None: they do not determine it, or were not computed)."""
    n = stats.numel
    if name in ("l1", "l2"):  # norms: abs makes no difference
        return stats.l1 if name == "l1" else stats.l2
    if not absolute:
        if name == "variance":
            return None if stats.std is None else stats.std * stats.std
        if name == "sum":
            return None if stats.mean is None or n is None else stats.mean * n
        plain = {"min": stats.min, "max": stats.max, "mean": stats.mean, "std": stats.std}
        return plain.get(name)
    if name == "mean":
        return stats.mean_abs
    if name == "sum":
        return stats.l1
    lo, hi = stats.min, stats.max
    if name == "max":
        return None if lo is None or hi is None else max(math.fabs(lo), math.fabs(hi))
    if name == "min" and stats.zeros is not None and stats.zeros > 0:
        return 0.0
    if name == "min" and lo is not None and lo >= 0.0:
        return lo
    if name == "min" and hi is not None and hi <= 0.0:
        return math.fabs(hi)
    return None


def _numpy_reduction(name: str, value: np.ndarray[Any, Any], absolute: bool) -> Any:
    data = np.abs(value) if absolute else value
    data = data.astype(np.float64)
    functions: dict[str, Callable[[np.ndarray[Any, Any]], Any]] = {
        "min": np.min,
        "max": np.max,
        "mean": np.mean,
        "std": np.std,
        "variance": np.var,
        "sum": np.sum,
        "prod": np.prod,
        "l1": lambda a: np.linalg.norm(a.ravel(), 1),
        "l2": lambda a: np.linalg.norm(a.ravel(), 2),
    }
    if name not in functions:
        raise ValueError(f"unknown reduction {name!r}; one of {list(functions)}")
    return functions[name](data)


def worker_name(rank: int) -> str:
    """smdebug's name of a worker: ``worker_<rank>``."""
    return f"worker_{rank}"


def _rank(worker: int | str | None) -> int | None:
    if worker is None or isinstance(worker, int):
        return worker
    text = str(worker)
    if text.startswith("worker_") and text[len("worker_") :].isdigit():
        return int(text[len("worker_") :])
    if text.isdigit():
        return int(text)
    raise ValueError(f"unknown worker {worker!r}: give a rank or a name like 'worker_0'")


def _spellings(name: str) -> tuple[str, ...]:
    """The name, and its smdebug-less spelling for ``Net_fc1.weight``-style parameters."""
    match = _ALIAS.match(name)
    if not match:
        return (name,)
    return (name, (match.group("gradient") or "") + match.group("rest"))


_CLASS_PREFIX = re.compile(r"(?P<anchor>\^?)(?P<gradient>gradient/)?[A-Z][A-Za-z0-9]*_")


def _strip_class_prefix(regex: str) -> str | None:
    """``Net_conv[0-9]+.weight`` -> ``conv[0-9]+.weight`` (None: no literal class prefix)."""
    match = _CLASS_PREFIX.match(regex)
    if match is None:
        return None
    return match.group("anchor") + (match.group("gradient") or "") + regex[match.end() :]


def _ref(key: str) -> layout.ObjectRef | None:
    try:
        return layout.parse_relative("job", key)
    except layout.LayoutError:
        return None  # not part of the layout (a temp file, a user's own object): not job data


def _mode_order(item: tuple[str, Any]) -> int:
    return MODE_ORDER.index(item[0])


def _mode_or_none(mode: Any) -> str | None:
    """A mode name, or None for "global" (None or GLOBAL, smdebug's default)."""
    if mode is None:
        return None
    value = getattr(mode, "value", mode)
    text = str(value).upper()
    if text not in MODE_ORDER:
        raise ValueError(f"unknown mode {mode!r}; one of {MODE_ORDER}")
    return None if text == "GLOBAL" else text

"""The persisted state of one job's evaluation, and what arrives for it.

One ``JobState`` per job is the unit of every conditional write: rule states, statuses,
the per-worker frontier and the end markers seen all change together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trainguard.engine.events import Status
from trainguard.format.documents import (
    MAX_STRUCTURE_CHARS,
    MAX_STRUCTURE_TENSORS,
    Manifest,
    Mode,
    SegmentHeader,
    StepHeader,
)
from trainguard.format.layout import segment_key, step_key
from trainguard.format.system import SystemBatch

#: distinct drop reasons kept per job (a hostile hook could invent a new one per segment)
MAX_DROP_REASONS = 32
#: the reason under which drops beyond ``MAX_DROP_REASONS`` reasons are counted
OTHER_DROP_REASON = "other"


class RuleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    name: str  # RuleConfigurationName
    rule: str  # rule_to_invoke
    status: Status = "InProgress"
    details: str = ""
    step: int | None = None
    #: the mode of ``step`` and its mode step, when the step's data said (model rules)
    mode: Mode | None = None
    mode_step: int | None = None
    value: float | None = None
    #: the value as text when it was not finite (``value`` is then None)
    value_text: str | None = None
    threshold: float | None = None
    tensor: str | None = None
    actions: list[str] = Field(default_factory=list)
    #: the rule's own state (RuleState JSON), None before the first step
    state: dict[str, Any] | None = None
    #: profiler rules keep one state per worker (its system batches, in seq order)
    worker_states: dict[int, dict[str, Any]] = Field(default_factory=dict)
    #: number of status transitions so far; the n-th transition's event id ends in /n
    transitions: int = 0
    modified: float = 0.0


class JobInfo(BaseModel):
    """What the evaluation needs from the manifest."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    world_size: int
    rules: list[dict[str, Any]] | None = None
    sagemaker_training_job_name: str | None = None
    allow_sagemaker_stop: bool = False
    #: the manifest's structure: parameter name -> kind (``ModelStructure``)
    structure: dict[str, str] = Field(default_factory=dict)

    @staticmethod
    def from_manifest(manifest: Manifest) -> JobInfo:
        return JobInfo(
            world_size=manifest.world_size,
            rules=manifest.rules,
            sagemaker_training_job_name=manifest.sagemaker_training_job_name,
            allow_sagemaker_stop=manifest.allow_sagemaker_stop,
            structure=_bounded({}, manifest),
        )

    def with_structure(self, manifest: Manifest) -> JobInfo | None:
        """This info with a rewritten manifest's new structure entries (None: nothing new).

        Entries are only added, first kind kept, so the order the rewrites are read in does
        not matter; the bound is the manifest's.
        """
        merged = _bounded(self.structure, manifest)
        return None if merged == self.structure else self.model_copy(update={"structure": merged})


def _bounded(known: dict[str, str], manifest: Manifest) -> dict[str, str]:
    """``known`` plus the manifest's new structure entries, within the manifest's bounds (a
    hostile manifest must not outgrow the state item)."""
    merged = dict(known)
    if manifest.structure is None:
        return merged
    chars = sum(len(n) + len(k) for n, k in merged.items())
    for name, kind in manifest.structure.tensors.items():
        if name in merged:
            continue
        if len(merged) >= MAX_STRUCTURE_TENSORS or chars + len(name) + len(kind) > MAX_STRUCTURE_CHARS:
            break
        merged[name] = kind
        chars += len(name) + len(kind)
    return merged


class JobState(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    job: str
    info: JobInfo | None = None
    rules: list[RuleRecord] = Field(default_factory=list)
    #: last global step evaluated (-1: none yet)
    watermark: int = -1
    #: worker -> last step of that worker that was evaluated (absent: none yet)
    frontier: dict[int, int] = Field(default_factory=dict)
    #: format 2: worker -> seq of its last segment whose every step was evaluated (absent:
    #: none yet). The segment after it is the worker's current one; its steps up to
    #: ``frontier`` are done (a segment is consumed partly while other workers lag).
    segment_frontier: dict[int, int] = Field(default_factory=dict)
    #: worker -> the last step it wrote, from its end marker (None: it wrote no step)
    ended: dict[int, int | None] = Field(default_factory=dict)
    #: worker -> last system batch seq evaluated (profiling)
    system_frontier: dict[int, int] = Field(default_factory=dict)
    #: worker -> how many system batches it wrote, from its end marker
    system_batches: dict[int, int] = Field(default_factory=dict)
    #: an end marker said the hook obeyed a stop signal
    stopped: bool = False
    #: the stop-job action ran for this job
    stop_requested: bool = False
    finished: bool = False
    steps_evaluated: int = 0
    #: when the job started (its manifest's time): clock rules measure from here before any step
    created: float | None = None
    #: wall time of the newest data seen (for clock-driven rules)
    last_data_time: float | None = None
    #: objects that could not be read, with the reason (bounded)
    invalid_objects: list[str] = Field(default_factory=list, max_length=20)
    #: values the hook could not record, by reason, summed over the segments evaluated and
    #: the end markers (at most ``MAX_DROP_REASONS`` reasons; the rest count as "other")
    dropped: dict[str, int] = Field(default_factory=dict, max_length=MAX_DROP_REASONS + 1)
    #: objects the hook's uploader could not deliver (end markers' ``dropped_objects``)
    dropped_objects: int = 0
    #: the service's clock when data last arrived for the job (manifest, end marker, a step
    #: evaluated); with the buffered items' arrival times, it decides when a job went silent
    last_activity: float | None = None
    #: why the job ended when it did not end by itself (every worker's end marker)
    end_reason: str | None = None

    def rule(self, name: str) -> RuleRecord:
        return next(r for r in self.rules if r.name == name)

    def add_dropped(self, counts: dict[str, int]) -> None:
        """Add a segment's or end marker's drop counts (bounded in reasons)."""
        for reason, count in counts.items():
            if count <= 0:
                continue
            key = (
                reason
                if reason in self.dropped or len(self.dropped) < MAX_DROP_REASONS
                else OTHER_DROP_REASON
            )
            self.dropped[key] = self.dropped.get(key, 0) + count

    def dropped_summary(self) -> str:
        """``"120 values (queue_full: 100, nonfinite_stats: 20) and 2 objects"``, or "" when none."""
        return dropped_text(self.dropped, self.dropped_objects)

    @property
    def training_status(self) -> str:
        if self.finished:
            return "Stopped" if self.stopped or self.stop_requested else "Completed"
        return "InProgress"


def dropped_text(dropped: dict[str, int], objects: int = 0) -> str:
    """Drop counts as a person reads them (the three largest reasons, then how many more)."""
    parts: list[str] = []
    values = sum(dropped.values())
    if values:
        ranked = sorted(dropped.items(), key=lambda i: (-i[1], i[0]))
        reasons = ", ".join(f"{r[:40]}: {n:,}" for r, n in ranked[:3])
        if len(ranked) > 3:
            reasons += f", {len(ranked) - 3} more reasons"
        parts.append(f"{values:,} value{'' if values == 1 else 's'} ({reasons})")
    if objects:
        parts.append(f"{objects:,} object{'' if objects == 1 else 's'} not delivered")
    return " and ".join(parts)


class UnreadableObject(ValueError):
    """A buffered object could not be read again (gone, changed, malformed): the reason."""


@dataclass(frozen=True)
class StepArrival:
    """A format-1 step object that has arrived (or could not be read, with ``bad`` saying why).

    What the state table buffers is a pointer: ``prev_step`` (the worker's chain), the
    object's ``size`` and ``header_end`` (8 + the JSON header's length: the one bounded
    ranged GET that reads the header again). ``header`` is set when the header is in memory
    (just read, or read by replay); otherwise the evaluator asks its :class:`HeaderReader`.
    """

    step: int
    worker: int
    prev_step: int | None
    header: StepHeader | None
    bad: str | None = None
    size: int = 0
    header_end: int = 0
    #: the service's clock when it arrived (0: unknown)
    at: float = 0.0

    @property
    def key(self) -> str:
        return step_key(self.step, self.worker)


@dataclass(frozen=True)
class SegmentArrival:
    """A format-2 segment that has arrived: a pointer (its key alone gives worker, seq and
    step range, so even an unreadable segment keeps its place in the worker's chain).

    ``bad``: why it could not be read; its steps then contribute nothing, and the worker's
    chain moves past ``last_step``.
    """

    worker: int
    seq: int
    first_step: int
    last_step: int
    prev_step: int | None = None
    header: SegmentHeader | None = None
    bad: str | None = None
    size: int = 0
    header_end: int = 0
    #: the service's clock when it arrived (0: unknown)
    at: float = 0.0

    @property
    def key(self) -> str:
        return segment_key(self.worker, self.seq, self.first_step, self.last_step)


class HeaderReader(Protocol):
    """Reads a buffered object's header again (the live service: a per-process cache, else one
    bounded ranged GET of ``header_end`` bytes; replay: the job folder).

    Raises :class:`UnreadableObject` with the reason when the object is gone or no longer
    what the pointer says; the evaluator then treats it as a bad arrival.
    """

    def step(self, arrival: StepArrival) -> StepHeader: ...

    def segment(self, arrival: SegmentArrival) -> SegmentHeader: ...


@dataclass(frozen=True)
class SystemArrival:
    """A system-monitor batch that has arrived (or could not be read: ``bad``)."""

    worker: int
    seq: int
    batch: SystemBatch | None
    bad: str | None = None
    #: the service's clock when it arrived (0: unknown)
    at: float = 0.0


@dataclass(frozen=True)
class Transition:
    """A status change made by one evaluation; becomes exactly one event."""

    job: str
    record: RuleRecord  # the record after the change
    previous: Status | None

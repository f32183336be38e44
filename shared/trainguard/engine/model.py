"""The persisted state of one job's evaluation, and what arrives for it.

One ``JobState`` per job is the unit of every conditional write: rule states, statuses,
the per-worker frontier and the end markers seen all change together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trainguard.engine.events import Status
from trainguard.format.documents import Manifest, Mode, SegmentHeader, StepHeader
from trainguard.format.layout import segment_key, step_key
from trainguard.format.system import SystemBatch


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

    @staticmethod
    def from_manifest(manifest: Manifest) -> JobInfo:
        return JobInfo(
            world_size=manifest.world_size,
            rules=manifest.rules,
            sagemaker_training_job_name=manifest.sagemaker_training_job_name,
            allow_sagemaker_stop=manifest.allow_sagemaker_stop,
        )


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

    def rule(self, name: str) -> RuleRecord:
        return next(r for r in self.rules if r.name == name)

    @property
    def training_status(self) -> str:
        if self.finished:
            return "Stopped" if self.stopped or self.stop_requested else "Completed"
        return "InProgress"


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


@dataclass(frozen=True)
class Transition:
    """A status change made by one evaluation; becomes exactly one event."""

    job: str
    record: RuleRecord  # the record after the change
    previous: Status | None

"""The system-monitor document: one JSON object per batch of samples and step-timing events.

Each worker's monitor writes ``system/worker-<rank:05d>/<seq:012d>.json`` (see
:func:`trainguard.format.layout.system_key`) every ``flush_s`` seconds. ``seq`` counts from 0
without gaps per worker, so the service can evaluate a worker's batches in order.

A batch carries:

* ``samples``: host metrics sampled every ``interval_s`` seconds (CPU per core and in total,
  I/O wait, memory, disk and network rates, and per-GPU utilisation and memory). ``gpus`` is
  ``None`` when the monitor could not see GPUs (no NVML, no device): *absent* is not *zero*,
  and GPU rules do not judge a job they cannot see.
* ``steps``: one event per finished training step (mode, step, start, end, and the time the
  loop waited for data before or during the step).
* ``init`` and ``dataloader``: what the hook knows about initialisation and data loading,
  repeated in every batch so that any single batch is self-describing.

Like every document read from S3, the models forbid unknown fields, bound every list and
reject non-finite numbers; :func:`parse_system_batch` checks the byte size before parsing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from trainguard.format.documents import JobName, Mode

SYSTEM_FORMAT: Literal["trainguard.system/1"] = "trainguard.system/1"

#: Largest system object a reader accepts.
MAX_SYSTEM_BYTES = 8 * 1024 * 1024
#: Samples in one batch (60 s flushes at the 100 ms minimum interval need 600).
MAX_SAMPLES = 1200
#: Step events in one batch; the monitor flushes early long before this.
MAX_EVENTS = 10_000
MAX_CORES = 1024
MAX_GPUS = 64
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0

Percent = Annotated[float, Field(ge=0.0, le=100.0)]
Rate = Annotated[float, Field(ge=0.0)]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GpuSample(_Doc):
    """One GPU at one instant (NVML's view: every GPU of the host)."""

    index: int = Field(ge=0, lt=MAX_GPUS)
    util_percent: Percent
    mem_used_percent: Percent
    mem_used_bytes: int = Field(ge=0)


class SystemSample(_Doc):
    """The host at one instant; rates are averages since the previous sample."""

    t: float
    cpu_percent: list[Percent] = Field(max_length=MAX_CORES)
    cpu_total: Percent
    iowait_percent: Percent
    mem_used_percent: Percent
    disk_read_bytes_s: Rate = 0.0
    disk_write_bytes_s: Rate = 0.0
    net_rx_bytes_s: Rate = 0.0
    net_tx_bytes_s: Rate = 0.0
    #: None: GPUs are absent (not measurable); [] never appears
    gpus: list[GpuSample] | None = Field(default=None, max_length=MAX_GPUS)


class StepEvent(_Doc):
    """One finished step of one worker."""

    mode: Mode
    step: int = Field(ge=0)
    start: float
    end: float
    #: seconds the loop waited for data (``next()`` of the loader) since the previous step ended
    data_wait_s: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> StepEvent:
        if self.end < self.start:
            raise ValueError(f"step {self.step} ends ({self.end}) before it starts ({self.start})")
        return self

    @property
    def duration(self) -> float:
        return self.end - self.start


class InitInfo(_Doc):
    """Initialisation as the hook saw it (wall-clock seconds)."""

    hook_start: float
    #: the hook finished registering the model (``mark_initialized``)
    initialized: float | None = None
    first_step_start: float | None = None


class DataloaderInfo(_Doc):
    num_workers: int = Field(ge=0, le=100_000)
    cpu_count: int = Field(ge=1, le=100_000)


class SystemBatch(_Doc):
    format: Literal["trainguard.system/1"] = SYSTEM_FORMAT
    job: JobName
    worker: int = Field(ge=0, lt=100_000)
    world_size: int = Field(ge=1, le=100_000)
    seq: int = Field(ge=0)
    host: Annotated[str, StringConstraints(max_length=256)] | None = None
    #: wall-clock range the batch covers
    start_time: float
    end_time: float
    interval_s: float = Field(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    samples: list[SystemSample] = Field(default_factory=list, max_length=MAX_SAMPLES)
    steps: list[StepEvent] = Field(default_factory=list, max_length=MAX_EVENTS)
    init: InitInfo | None = None
    dataloader: DataloaderInfo | None = None
    #: samples / events the monitor could not keep (never silently)
    dropped_samples: int = Field(default=0, ge=0)
    dropped_events: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _range(self) -> SystemBatch:
        if self.end_time < self.start_time:
            raise ValueError("end_time is before start_time")
        return self


def parse_system_batch(raw: bytes) -> SystemBatch:
    """Parse a system object with a size bound; raises ValueError with a clear message."""
    if len(raw) > MAX_SYSTEM_BYTES:
        raise ValueError(f"system batch is {len(raw)} bytes; at most {MAX_SYSTEM_BYTES}")
    try:
        return SystemBatch.model_validate_json(raw)
    except RecursionError:
        raise ValueError("system batch: JSON nested too deeply") from None


def dump_system_batch(batch: SystemBatch) -> bytes:
    return batch.model_dump_json(exclude_defaults=False).encode()


def check_interval(interval_s: float) -> float:
    """The sampling interval SageMaker allows: 100 ms to 60 s."""
    if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool):
        raise ValueError(f"interval_s must be a number of seconds, got {interval_s!r}")
    value = float(interval_s)
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        raise ValueError(
            f"system monitor interval_s must be between {MIN_INTERVAL_S} s (100 ms) and "
            f"{MAX_INTERVAL_S} s, got {interval_s!r}"
        )
    return value

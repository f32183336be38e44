"""The versioned documents a job writes: segment and step headers, manifest, end marker, stop signal.

Every model forbids unknown fields and bounds its sizes: these documents come from S3,
where anything may be wrong or hostile. Non-finite floats (a NaN loss is exactly what
ExplodingTensor looks for) are carried as the strings "NaN", "Infinity", "-Infinity".
"""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from trainguard.format import stepfile
from trainguard.format.layout import validate_job_name

STEP_FORMAT = "trainguard.step/1"
SEGMENT_FORMAT = "trainguard.segment/2"
MANIFEST_FORMAT = "trainguard.manifest/1"
END_FORMAT = "trainguard.end/1"
STOP_FORMAT = "trainguard.stop/1"
STRUCTURE_FORMAT = "trainguard.structure/1"

MAX_DOCUMENT_BYTES = 1024 * 1024  # manifests, end markers and stop signals are tiny
MAX_UNITS = 65_536
MAX_BINS = 256
MAX_VALUES = 4096
MAX_VALUE_COUNTS = 256
#: steps in one segment: a window closes before this (a tight loop at 5,000 steps/s with a
#: 1 s window stays well under it); the hook also closes a window on its header's size
MAX_SEGMENT_STEPS = 100_000

_M = TypeVar("_M", bound=BaseModel)

Mode = Literal["TRAIN", "EVAL", "PREDICT", "GLOBAL"]
Name = Annotated[str, StringConstraints(min_length=1, max_length=stepfile.MAX_NAME_CHARS)]
JobName = Annotated[str, AfterValidator(validate_job_name)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Count = Annotated[int, Field(ge=0)]
#: a time: NaN or Infinity would silence every clock rule (StalledTrainingRule)
FiniteTime = Annotated[float, Field(allow_inf_nan=False, ge=0.0)]
#: a job name, or a pattern of job names where ``*`` matches any characters
JobPattern = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.*-]{1,128}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


_IMMUTABLE_DEFAULTS = (type(None), bool, int, float, str, tuple, frozenset)
#: per model: (immutable defaults, required fields), or None where ``model_construct`` is needed
_construct_plans: dict[type[BaseModel], tuple[dict[str, Any], frozenset[str]] | None] = {}


def _construct_plan(cls: type[BaseModel]) -> tuple[dict[str, Any], frozenset[str]] | None:
    if cls.model_config.get("extra") == "allow":
        return None
    defaults: dict[str, Any] = {}
    required: set[str] = set()
    for name, info in cls.model_fields.items():
        if info.is_required():
            required.add(name)
        elif info.default_factory is None and isinstance(info.default, _IMMUTABLE_DEFAULTS):
            defaults[name] = info.default
        else:
            return None  # a mutable default: each object needs its own copy
    return defaults, frozenset(required)


def construct(cls: type[_M], **values: Any) -> _M:
    """``cls.model_construct(**values)`` (no validation: the values are the hook's own) at
    about half its cost, which the writer thread pays for every tensor of every step.

    Pydantic's ``model_construct`` resolves and deep-copies every default on every call;
    where a model's defaults are all immutable they are taken once from a per-class plan.
    Models with a mutable default or a default factory, and calls that lack a required
    field or name an unknown one, go through ``model_construct``.
    """
    if cls not in _construct_plans:
        _construct_plans[cls] = _construct_plan(cls)
    plan = _construct_plans[cls]
    fields = cls.model_fields
    if plan is None or not plan[1] <= values.keys() or any(k not in fields for k in values):
        return cls.model_construct(**values)
    defaults = plan[0]
    obj = cls.__new__(cls)
    data = {name: values[name] if name in values else defaults[name] for name in fields}  # field order
    object.__setattr__(obj, "__dict__", data)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


class Histogram(_Strict):
    """Fixed-bin histogram: ``len(edges) == len(counts) + 1``."""

    edges: list[float] = Field(max_length=MAX_BINS + 1)
    counts: list[int] = Field(max_length=MAX_BINS)


class TensorStats(_Strict):
    """Reductions computed where the tensor lives. Every field is present only when asked for.

    None means "not computed", never zero: the hook computes only what the configured rules
    declare they read (``Rule.reads()``), and a rule treats an absent statistic as an input it
    did not receive. Version-1 documents always carry the base fields (``numel`` ... ``inf``);
    making them optional is a compatible change (every v1 document still validates).
    """

    numel: int | None = Field(default=None, ge=0)
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    mean_abs: float | None = None
    l1: float | None = None
    l2: float | None = None
    zeros: int | None = Field(default=None, ge=0)
    nan: int | None = Field(default=None, ge=0)
    inf: int | None = Field(default=None, ge=0)
    #: percentile (as a string, "5", "95"...) -> value
    percentiles: dict[str, float] | None = Field(default=None, max_length=16)
    histogram: Histogram | None = None
    #: activations: per unit (last dim of a dense output, channel of a conv output), the
    #: fraction of samples in which the unit is > 0 (DeadRelu)
    unit_active: list[float] | None = Field(default=None, max_length=MAX_UNITS)
    #: activation inputs: per unit, the fraction of samples inside ``band`` (SaturatedActivation)
    unit_in_band: list[float] | None = Field(default=None, max_length=MAX_UNITS)
    band: tuple[float, float] | None = None
    #: samples in the batch the statistics came from (first dimension)
    samples: int | None = Field(default=None, ge=0)
    #: weights: L2 norm of the change since this worker last saved the same tensor,
    #: ``||W_step - W_prev_saved||`` (WeightUpdateRatio); None on the first save
    update_l2: float | None = None
    #: small tensors only (labels, predictions, XGBoost importances): every element,
    #: flattened row-major (``TensorRecord.shape`` gives the layout) (ClassImbalance, Confusion)
    values: list[float] | None = Field(default=None, max_length=MAX_VALUES)
    #: integer-valued inputs (token ids): element value (as a decimal string) -> count, for at
    #: most MAX_VALUE_COUNTS of the most frequent values (NLPSequenceRatio)
    value_counts: dict[str, Count] | None = Field(default=None, max_length=MAX_VALUE_COUNTS)


class TensorRecord(_Strict):
    collections: list[ShortText] = Field(max_length=32)
    dtype: ShortText
    shape: list[int] = Field(max_length=stepfile.MAX_NDIM)
    stats: TensorStats | None = None
    #: the full tensor is in the object's body under "<MODE>/<name>"
    stored: bool = False


class ScalarRecord(_Strict):
    value: float
    collections: list[ShortText] = Field(max_length=32)


class ModeRecord(_Strict):
    mode_step: int = Field(ge=0)
    scalars: dict[Name, ScalarRecord] = Field(default_factory=dict, max_length=10_000)
    tensors: dict[Name, TensorRecord] = Field(default_factory=dict, max_length=10_000)


class StepHeader(_Strict):
    """The step document in ``__metadata__["trainguard"]`` of a step object."""

    format: Literal["trainguard.step/1"] = "trainguard.step/1"
    job: JobName
    step: int = Field(ge=0)
    worker: int = Field(ge=0)
    world_size: int = Field(ge=1, le=100_000)
    #: the previous step this worker wrote (None for its first): each worker's objects form
    #: a chain, so the service knows exactly which steps a worker skipped.
    prev_step: int | None = Field(default=None, ge=0)
    wall_time: FiniteTime
    modes: dict[Mode, ModeRecord] = Field(max_length=4)


def tensor_key(mode: str, name: str) -> str:
    """Name of a full tensor inside a step object's body."""
    return f"{mode}/{name}"


class SegmentStep(_Strict):
    """One step of a segment: what the worker recorded at that global step, in every mode."""

    step: int = Field(ge=0)
    #: the worker's clock (Unix seconds) when the step began
    wall_time: FiniteTime
    modes: dict[Mode, ModeRecord] = Field(max_length=4)


class SegmentHeader(_Strict):
    """The segment document in ``__metadata__["trainguard"]`` of a segment object (format 2).

    A segment holds every step one worker recorded during one flush window, in step order.
    A worker's segments form a chain by ``seq`` (0, 1, 2, ... without gaps), and
    ``prev_step`` is the last step of the previous segment, so the service knows exactly
    which steps a worker wrote, whatever order segments arrive in. The key repeats worker,
    seq and step range (``layout.segment_key``), so even an unreadable segment keeps its
    place in the chain.
    """

    format: Literal["trainguard.segment/2"] = "trainguard.segment/2"
    job: JobName
    worker: int = Field(ge=0)
    world_size: int = Field(ge=1, le=100_000)
    seq: int = Field(ge=0)
    #: the last step of this worker's previous segment (None: nothing was written before)
    prev_step: int | None = Field(default=None, ge=0)
    first_step: int = Field(ge=0)
    last_step: int = Field(ge=0)
    #: when the window opened and closed (the worker's clock)
    opened: FiniteTime
    closed: FiniteTime
    #: why the window closed: its time ran out, its size cap, full tensors were due, a
    #: saved value was not finite (flushed at once), or the hook closed
    reason: Literal["time", "size", "full", "nonfinite", "close"]
    steps: list[SegmentStep] = Field(min_length=1, max_length=MAX_SEGMENT_STEPS)
    #: values the hook could not record in this window, by reason (never silently)
    dropped: dict[ShortText, Count] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _chain(self) -> SegmentHeader:
        steps = [s.step for s in self.steps]
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError("segment steps must be strictly increasing")
        if (steps[0], steps[-1]) != (self.first_step, self.last_step):
            raise ValueError(
                f"first_step/last_step {self.first_step}..{self.last_step} do not match the steps "
                f"{steps[0]}..{steps[-1]}"
            )
        if self.prev_step is not None and self.prev_step >= self.first_step:
            raise ValueError(f"prev_step {self.prev_step} is not before first_step {self.first_step}")
        if self.closed < self.opened:
            raise ValueError("a segment cannot close before it opened")
        return self

    def step_header(self, index: int) -> StepHeader:
        """Step ``index`` of the segment as the step document a format-1 object of it would carry.

        The segment was validated as a whole, so the view is built without validating again
        (``model_construct``): cheap enough to evaluate thousands of steps a second.
        ``prev_step`` chains through the segment and into the previous one.
        """
        entry = self.steps[index]
        return StepHeader.model_construct(
            job=self.job,
            step=entry.step,
            worker=self.worker,
            world_size=self.world_size,
            prev_step=self.steps[index - 1].step if index > 0 else self.prev_step,
            wall_time=entry.wall_time,
            modes=entry.modes,
        )

    def step_headers(self) -> list[StepHeader]:
        """Every step of the segment as a format-1 step document (see :meth:`step_header`)."""
        return [self.step_header(i) for i in range(len(self.steps))]


def segment_tensor_key(step: int, mode: str, name: str) -> str:
    """Name of a full tensor inside a segment object's body: ``<step:012d>/<MODE>/<name>``."""
    return f"{step:012d}/{mode}/{name}"


class FrameworkInfo(_Strict):
    name: ShortText
    version: ShortText | None = None


class ManifestSaveConfig(_Strict):
    save_interval: int
    start_step: int = 0
    end_step: int | None = None
    save_steps: list[int] = Field(default_factory=list, max_length=10_000)


class ManifestCollection(_Strict):
    name: ShortText
    include_regex: list[ShortText] = Field(default_factory=list, max_length=64)
    save_config: dict[Mode, ManifestSaveConfig] = Field(default_factory=dict)
    reductions: list[ShortText] = Field(default_factory=list, max_length=32)
    save_full: bool = False


#: structure kinds (``ModelStructure.tensors`` values); a reader ignores a kind it does not know
#: a conv/linear bias whose output feeds only a normalisation that subtracts it (BatchNorm):
#: its gradient is zero by construction
NORM_FED_BIAS = "norm_fed_bias"
#: an attention key projection's bias: softmax ignores a constant added to every logit
ATTENTION_KEY_BIAS = "attention_key_bias"
#: a fused q/k/v bias (``nn.MultiheadAttention.in_proj_bias``) whose key third is such a bias
ATTENTION_KEY_BIAS_SLICE = "attention_key_bias_slice"
#: ``requires_grad`` False when the model was traced
FROZEN = "frozen"
#: trainable, but the first backward the hook recorded gave it no gradient (unused)
NO_GRADIENT = "no_gradient"
#: entries a manifest's structure holds, and characters of their names and kinds (the
#: service keeps them in the job's state item, one DynamoDB item of 400 KB)
MAX_STRUCTURE_TENSORS = 1024
MAX_STRUCTURE_CHARS = 32 * 1024


class ModelStructure(_Strict):
    """What the hook knows about the registered model: parameters that are zero or constant
    by construction, frozen or unused. Keys are parameter names as saved (``Net_conv1.bias``);
    their gradients (``gradient/<name>``) share the entry. ``omitted`` counts entries left out
    at the bound."""

    format: Literal["trainguard.structure/1"] = "trainguard.structure/1"
    tensors: dict[Name, ShortText] = Field(default_factory=dict, max_length=MAX_STRUCTURE_TENSORS)
    omitted: Count = 0


class Manifest(_Strict):
    format: Literal["trainguard.manifest/1"] = "trainguard.manifest/1"
    job: JobName
    created: FiniteTime
    hook_version: ShortText
    frameworks: list[FrameworkInfo] = Field(default_factory=list, max_length=16)
    python: ShortText | None = None
    host: ShortText | None = None
    world_size: int = Field(ge=1, le=100_000)
    collections: list[ManifestCollection] = Field(default_factory=list, max_length=64)
    #: SageMaker ``DebugRuleConfigurations`` entries, kept raw: a bad entry must become an
    #: Error status for that rule, not a rejected manifest.
    rules: list[dict[str, Any]] | None = Field(default=None, max_length=50)
    #: SageMaker's TRAINING_JOB_NAME when the job runs there (enables StopTrainingJob)
    sagemaker_training_job_name: ShortText | None = None
    #: the job opted in to being stopped with StopTrainingJob
    allow_sagemaker_stop: bool = False
    #: system monitor interval in seconds when profiling is on
    system_interval_s: float | None = Field(default=None, allow_inf_nan=False)
    #: jobs that may compare themselves with this one (SimilarAcrossRuns's ``other_trials``):
    #: job names, or patterns where ``*`` matches any characters (``candidate-*``). A job
    #: naming this one in its own rules is not enough: this job must allow it.
    allow_comparison_from: list[JobPattern] = Field(default_factory=list, max_length=64)
    #: the model's structure (None: the hook knows none, or an older hook); a manifest
    #: rewritten with more entries adds them (the first manifest counts for everything else)
    structure: ModelStructure | None = None


class EndMarker(_Strict):
    format: Literal["trainguard.end/1"] = "trainguard.end/1"
    job: JobName
    worker: int = Field(ge=0)
    world_size: int = Field(ge=1, le=100_000)
    #: the last step this worker wrote (None if it wrote none): closes the worker's chain
    last_step: int | None = Field(default=None, ge=0)
    wall_time: FiniteTime
    #: the hook saw the service's stop signal before closing
    stopped: bool = False
    #: objects the uploader could not deliver (never silently)
    dropped_objects: int = Field(default=0, ge=0)
    steps_written: int = Field(default=0, ge=0)
    #: system-monitor batches this worker wrote (seq 0..n-1); None: profiling was off
    system_batches: int | None = Field(default=None, ge=0)
    #: format 2: segments this worker wrote (seq 0..n-1); None: a format-1 writer
    segments: int | None = Field(default=None, ge=0)
    #: values not recorded, by reason (format 2 writers); ``dropped_objects`` counts objects
    dropped: dict[ShortText, Count] = Field(default_factory=dict, max_length=32)


class StopSignal(_Strict):
    format: Literal["trainguard.stop/1"] = "trainguard.stop/1"
    job: JobName
    rule: ShortText
    reason: Annotated[str, StringConstraints(max_length=1024)]
    requested_at: FiniteTime


def parse_document(model: type[Any], raw: bytes) -> Any:
    """Parse a JSON document with a size bound; raises ValueError with a clear message."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{model.__name__} is {len(raw)} bytes; at most {MAX_DOCUMENT_BYTES}")
    try:
        return model.model_validate_json(raw)
    except RecursionError:
        raise ValueError(f"{model.__name__}: JSON nested too deeply") from None


class RangeReader(Protocol):
    """What a bounded read needs of a job folder (``trainguard.hook.storage.Store`` has it)."""

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int]: ...


def read_bounded_document(store: RangeReader, key: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """A JSON document of a job folder, refused past ``limit`` bytes before more is read.

    One ranged read of ``limit + 1`` bytes: a 3 GB object named ``manifest.json`` costs
    a megabyte, not a MemoryError. Raises ValueError naming the key and its size.
    """
    raw, size = store.get_range(key, 0, limit + 1)
    if len(raw) > limit or size > limit:
        raise ValueError(f"{key} is {size} bytes; a trainguard document has at most {limit}")
    return raw


def dump_document(doc: BaseModel) -> bytes:
    return doc.model_dump_json(exclude_none=False).encode()


def step_metadata(header: StepHeader) -> dict[str, str]:
    return {stepfile.METADATA_KEY: header.model_dump_json()}


def header_from_metadata(metadata: dict[str, str]) -> StepHeader:
    raw = metadata.get(stepfile.METADATA_KEY)
    if raw is None:
        raise stepfile.StepFormatError(
            f"no {stepfile.METADATA_KEY!r} entry in __metadata__: not a trainguard step object"
        )
    try:
        return StepHeader.model_validate_json(raw)
    except ValueError as exc:
        raise stepfile.StepFormatError(f"invalid step document: {_first_lines(str(exc))}") from None


def _first_lines(text: str, n: int = 6) -> str:
    return " | ".join(text.splitlines()[:n])


def encode_step(header: StepHeader, tensors: dict[str, stepfile.TensorBlob]) -> bytes:
    return stepfile.encode(tensors, step_metadata(header))


def encode_segment(header: SegmentHeader, tensors: dict[str, stepfile.TensorBlob]) -> bytes:
    """A segment object: the segment document in the metadata, full tensors in the body."""
    return stepfile.encode(tensors, {stepfile.METADATA_KEY: header.model_dump_json()})


def segment_from_metadata(metadata: dict[str, str]) -> SegmentHeader:
    raw = metadata.get(stepfile.METADATA_KEY)
    if raw is None:
        raise stepfile.StepFormatError(
            f"no {stepfile.METADATA_KEY!r} entry in __metadata__: not a trainguard segment object"
        )
    try:
        return SegmentHeader.model_validate_json(raw)
    except ValueError as exc:
        raise stepfile.StepFormatError(f"invalid segment document: {_first_lines(str(exc))}") from None


def decode_segment_header(
    data: bytes, object_size: int | None = None
) -> tuple[SegmentHeader, stepfile.ParsedHeader]:
    """Parse a segment object's header (``data``: the object, or at least its first 8+N bytes)."""
    parsed = stepfile.parse_header(data, object_size)
    return segment_from_metadata(parsed.metadata), parsed


def decode_step_header(
    data: bytes, object_size: int | None = None
) -> tuple[StepHeader, stepfile.ParsedHeader]:
    parsed = stepfile.parse_header(data, object_size)
    return header_from_metadata(parsed.metadata), parsed


def loads_json_bounded(raw: bytes) -> Any:
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"document is {len(raw)} bytes; at most {MAX_DOCUMENT_BYTES}")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("document: JSON nested too deeply") from None

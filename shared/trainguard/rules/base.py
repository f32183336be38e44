"""The rule contract: a pydantic config, a small serialisable state, a pure update.

A rule never touches AWS. The evaluate Lambda, ``trainguard replay`` and the tests all
drive rules through the same calls::

    rule = SomeRule(SomeRule.Config.model_validate(parameters))
    state = rule.initial_state()
    for step in steps_in_order:                  # StepData, all workers of one step
        state, findings = rule.update(state, step)
    findings = rule.finish(state)                # the job ended

A rule that returns a finding has fired: its status becomes IssuesFound and it is not
updated again for that job (SageMaker's rule jobs end at the first IssuesFound too).
``state`` must stay small (a bounded window, counters, a fixed-bin histogram): it is
stored in one DynamoDB item with every other rule of the job.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from trainguard.format.documents import Mode, ScalarRecord, StepHeader, TensorRecord, TensorStats
from trainguard.format.system import SystemBatch
from trainguard.rules.regex import Matcher, compile_bounded

MODES: tuple[Mode, ...] = ("TRAIN", "EVAL", "PREDICT", "GLOBAL")


class RuleConfig(BaseModel):
    """Base of every rule's parameters.

    SageMaker passes every parameter as a string ("10", "0.1", "True", "None"); pydantic's
    lax mode turns numbers and booleans into their types, and "None"/"" becomes None here.
    Unknown parameters are an error, so a typo is an Error status, not a silent default.
    Numbers must be finite: a threshold of NaN or Infinity would silence the rule (every
    comparison with NaN is false), so "nan" or "inf" is an Error status too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _sagemaker_strings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {
                k: (None if isinstance(v, str) and v.strip() in ("None", "none", "null", "") else v)
                for k, v in data.items()
            }
        return data


class RuleState(BaseModel):
    """Base of every rule's state. Keep it bounded: it is stored per (job, rule).

    NaN and ±Inf (a diverged loss) are stored as the strings "NaN"/"Infinity", which
    pydantic reads back as floats: JSON has no such numbers.
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


#: statistics a rule may ask the hook for: the fields of ``TensorStats``
STATISTICS: tuple[str, ...] = tuple(TensorStats.model_fields)
#: collections that hold scalars (losses, metrics), not tensors
SCALAR_COLLECTIONS: tuple[str, ...] = ("losses", "metrics", "scalars")
#: collections the PyTorch integration fills from module hooks: they need register_module(model)
MODULE_COLLECTIONS: tuple[str, ...] = (
    "weights",
    "biases",
    "gradients",
    "relu_output",
    "relu_input",
    "tanh_input",
    "sigmoid_input",
    "inputs",
    "outputs",
)


@dataclass(frozen=True)
class RuleInput:
    """One input a rule reads, declared so the hook saves exactly it and coverage can be checked.

    Selection: a tensor (``scalars=False``) or a scalar (``scalars=True``) is this input when it
    is in one of ``collections`` or its name matches one of ``regex`` (``re.match``), in one of
    ``modes`` (empty: any mode). An input with neither ``collections`` nor ``regex`` is "every
    tensor (or scalar) the hook saves": it asks the hook to turn nothing on, only to compute
    ``statistics`` for whatever it saves.

    For the hook: turn on ``collections``, save the tensors it can produce whose names match
    ``regex``, and compute ``statistics`` (fields of ``TensorStats``) for the selected tensors;
    any statistic not listed by some configured rule need not be computed.

    For coverage: a rule that never received a ``required`` input by the end of a job has not
    checked the job: it ends ``Error`` with ``what`` in the reason, never ``NoIssuesFound``.
    An input that is not required widens what the rule checks (its absence is named in the
    rule's NoIssuesFound details). A rule that checked nothing at all ends ``Error`` whatever
    its inputs' flags (``Coverage``).
    """

    #: what a user reads in a coverage message: "gradients", "TRAIN losses", "ReLU outputs"
    what: str
    collections: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    statistics: tuple[str, ...] = ()
    scalars: bool = False
    modes: tuple[Mode, ...] = ()
    required: bool = True

    def __post_init__(self) -> None:
        unknown = [s for s in self.statistics if s not in STATISTICS]
        if unknown:
            raise ValueError(f"unknown statistics {unknown}; known: {list(STATISTICS)}")
        if self.scalars and self.statistics:
            raise ValueError("a scalar input has a value, not statistics")

    def selects(self, name: str, collections: Sequence[str], mode: Mode, *, scalar: bool) -> bool:
        """Whether a saved tensor (or scalar) named ``name`` in ``collections`` is this input."""
        if scalar != self.scalars or (self.modes and mode not in self.modes):
            return False
        if not self.collections and not self.regex:
            return True
        if set(self.collections).intersection(collections):
            return True
        return any(compiled(r).match(name) for r in self.regex)

    def how_to_save(self) -> str:
        """What a user does so the hook saves this input (the end of a coverage message)."""
        hints: list[str] = []
        module = [c for c in self.collections if c in MODULE_COLLECTIONS]
        if module:
            hints.append("call hook.register_module(model)")
        if "losses" in self.collections:
            hints.append(
                "register the loss (hook.register_loss(loss_fn)) or save it with "
                "hook.save_scalar(name, value, collections=['losses'])"
            )
        wanted = [c for c in self.collections if c != "losses"]
        if wanted:
            quoted = ", ".join(repr(c) for c in wanted)
            plural = "s" if len(wanted) > 1 else ""
            hints.append(f"include the {quoted} collection{plural} (include_collections=[..., {quoted}])")
        if self.regex and not self.collections:
            hints.append(f"save tensors whose names match {', '.join(repr(r) for r in self.regex)}")
        text = " or ".join(hints) if hints else "save them with the hook"
        if self.modes and set(self.modes) != {"TRAIN", "EVAL", "GLOBAL"}:
            modes = "/".join(self.modes)
            text += f", in {modes} mode (hook.set_mode('{self.modes[0]}') around that loop)"
        return text


@dataclass(frozen=True)
class Coverage:
    """What a rule has checked so far; the evaluator turns it into the rule's final status.

    ``checked`` counts the rule's judgements (windows compared, tensors tested, evaluations
    compared), not the data that arrived: a rule that received losses but never had two far
    enough apart to compare checked nothing. At the end of a job the rule ends ``Error`` when
    it is not ``complete`` (nothing checked, or a required input never arrived), with
    ``starved()`` as the reason; otherwise ``NoIssuesFound`` with ``summary()``.
    """

    checked: int
    #: what one judgement is, plural: "windows of TRAIN loss", "gradient tensors"
    unit: str
    verb: str = "checked"
    #: required inputs (of ``reads()``) that never arrived
    missing: tuple[RuleInput, ...] = ()
    #: optional inputs that never arrived (named in the NoIssuesFound details)
    skipped: tuple[RuleInput, ...] = ()
    #: why nothing could be judged although inputs arrived ("" when nothing arrived)
    reason: str = ""

    @property
    def complete(self) -> bool:
        return self.checked > 0 and not self.missing

    def summary(self) -> str:
        """``compared 58 windows of TRAIN loss`` (and what was not checked, if anything)."""
        text = f"{self.verb} {self.checked:,} {self.unit}"
        if self.skipped:
            text += f" (not checked: {', '.join(i.what for i in self.skipped)}: none were saved)"
        return text

    def starved(self, rule: str, steps: int) -> str:
        """Why the rule cannot pass: what was missing and how to get it."""
        where = f"in {steps:,} step{'' if steps == 1 else 's'}"
        if self.missing:
            first = self.missing[0]
            names = ", ".join(i.what for i in self.missing)
            return f"{rule} saw no {names} {where}: the hook saved none; {first.how_to_save()}."
        reason = self.reason or "none of the inputs it reads arrived"
        return f"{rule} {self.verb} no {self.unit} {where}: {reason}."


def merge_coverage(items: Sequence[Coverage | None]) -> Coverage | None:
    """One coverage for a rule judged in parts (a profiler rule's per-worker states).

    Complete when any part is complete: a job's workers are judged together.
    """
    known = [c for c in items if c is not None]
    if not known:
        return None
    complete = [c for c in known if c.complete]
    first = complete[0] if complete else known[0]
    return Coverage(
        sum(c.checked for c in known),
        first.unit,
        first.verb,
        () if complete else first.missing,
        first.skipped,
        first.reason,
    )


@dataclass(frozen=True)
class Finding:
    """The rule's condition was met. Its text becomes the StatusDetails."""

    rule: str
    step: int
    message: str
    tensor: str | None = None
    value: float | None = None
    threshold: float | None = None
    #: the mode and its step of ``step``, when the rule fires after that step has passed (a
    #: window closed by a later step, or the job's end): alerts name both steps
    mode: Mode | None = None
    mode_step: int | None = None

    def details(self) -> str:
        """SageMaker's phrasing, then what exactly was measured (≤ 1024 chars)."""
        text = (
            f"RuleEvaluationConditionMet: Evaluation of the rule {self.rule} at step {self.step} "
            f"resulted in the condition being met. {self.message}"
        )
        return text[:1024]


@dataclass(frozen=True)
class TensorView:
    """One tensor of one worker at one step, as the rules see it."""

    name: str
    mode: Mode
    worker: int
    record: TensorRecord

    @property
    def stats(self) -> TensorStats | None:
        return self.record.stats

    @property
    def collections(self) -> list[str]:
        return self.record.collections


@dataclass(frozen=True)
class StepData:
    """Everything every worker saved at one (global) step, in the order workers are ranked."""

    step: int
    workers: tuple[StepHeader, ...]
    wall_time: float = field(default=0.0)
    #: the job's model structure from its manifest: parameter name -> kind (see
    #: ``trainguard.format.documents.ModelStructure`` and ``trainguard.rules._structure``)
    structure: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def from_headers(headers: Sequence[StepHeader], structure: Mapping[str, str] | None = None) -> StepData:
        ordered = tuple(sorted(headers, key=lambda h: h.worker))
        if not ordered:
            raise ValueError("a step needs at least one worker's header")
        steps = {h.step for h in ordered}
        if len(steps) != 1:
            raise ValueError(f"headers from different steps: {sorted(steps)}")
        return StepData(ordered[0].step, ordered, max(h.wall_time for h in ordered), structure or {})

    def modes(self) -> list[Mode]:
        present = {m for h in self.workers for m in h.modes}
        return [m for m in MODES if m in present]

    def tensors(
        self,
        mode: Mode | None = None,
        collections: Sequence[str] | None = None,
        regex: str | Sequence[str] | None = None,
    ) -> Iterator[TensorView]:
        """Tensors matching a mode, any of ``collections`` and any of ``regex`` (re.match).

        When both collections and regex are given, a tensor matching either is selected
        (SageMaker's ``collection_names`` + ``tensor_regex`` semantics).
        """
        patterns = _compile(regex)
        wanted = set(collections) if collections else None
        for header in self.workers:
            for m, record in header.modes.items():
                if mode is not None and m != mode:
                    continue
                for name, tensor in record.tensors.items():
                    if (wanted is None and patterns is None) or (
                        (wanted is not None and wanted.intersection(tensor.collections))
                        or (patterns is not None and any(p.match(name) for p in patterns))
                    ):
                        yield TensorView(name, m, header.worker, tensor)

    def select(self, item: RuleInput) -> Iterator[TensorView]:
        """The tensors a (tensor) ``RuleInput`` selects, in every worker and mode it names."""
        for view in self.tensors(None, item.collections or None, item.regex or None):
            if not item.modes or view.mode in item.modes:
                yield view

    def scalars(
        self, mode: Mode | None = None, collection: str | None = None
    ) -> Iterator[tuple[Mode, str, int, ScalarRecord]]:
        for header in self.workers:
            for m, record in header.modes.items():
                if mode is not None and m != mode:
                    continue
                for name, scalar in record.scalars.items():
                    if collection is None or collection in scalar.collections:
                        yield m, name, header.worker, scalar

    def scalar_mean(self, name: str, mode: Mode) -> float | None:
        """Mean of a scalar over the workers that saved it at this step (None if none did)."""
        values = [s.value for m, n, _, s in self.scalars(mode) if n == name]
        return sum(values) / len(values) if values else None

    def loss(self, mode: Mode, regex: str | None = None, use_losses_collection: bool = True) -> float | None:
        """The step's loss in ``mode``: the mean over workers (and over loss tensors when several).

        Losses are scalars in the ``losses`` collection, or scalars whose name matches ``regex``.
        """
        pattern = compiled(regex) if regex else None
        values = [
            s.value
            for _, name, _, s in self.scalars(mode)
            if (use_losses_collection and "losses" in s.collections)
            or (pattern is not None and pattern.match(name))
        ]
        return sum(values) / len(values) if values else None


def _compile(regex: str | Sequence[str] | None) -> list[Matcher] | None:
    if regex is None:
        return None
    items = [regex] if isinstance(regex, str) else list(regex)
    return [compiled(r) for r in items] if items else None


def compiled(regex: str) -> Matcher:
    """A job's pattern, compiled for bounded-time ``match`` (``trainguard.rules.regex``)."""
    return compile_bounded(regex)


C = TypeVar("C", bound=RuleConfig)
S = TypeVar("S", bound=RuleState)
#: what a rule is fed: ``StepData`` (model rules) or ``SystemBatch`` (system rules)
D = TypeVar("D")


class BaseRule(ABC, Generic[C, S, D]):
    """What every rule has, whatever it reads. Subclass ``Rule`` (model) or ``SystemRule``.

    The engine drives every rule through these methods, declared here with no-op defaults so
    it never probes for them: ``update`` per input, ``finish`` at the job's end, ``check`` on
    the clock (``uses_clock``), ``coverage`` for the final status, ``reads`` for the hook.
    """

    #: SageMaker's rule name (``rule_to_invoke``), PascalCase
    name: ClassVar[str]
    Config: ClassVar[type[RuleConfig]]
    State: ClassVar[type[RuleState]]
    #: one line for ``trainguard rules`` and the alert's "what to do"
    summary: ClassVar[str] = ""
    advice: ClassVar[str] = ""
    #: the rule's test in one line (what is compared with what, against which noise, over
    #: which horizon) and how often it may fire on a healthy job; "" where not stated
    method: ClassVar[str] = ""
    false_alarm_budget: ClassVar[str] = ""
    #: "model" rules read step objects, "profiler" rules system batches; "clock" (model rules
    #: also judged on a timer), "cross-job" (compared with another job), "report" (never fires)
    kind: ClassVar[str] = "model"
    #: the engine's timer calls ``check`` for this rule
    uses_clock: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a rule of kind "clock" (custom rules written before uses_clock) is on the timer
        if cls.__dict__.get("kind") == "clock" and "uses_clock" not in cls.__dict__:
            cls.uses_clock = True

    def __init__(self, config: C) -> None:
        self.config = config

    def initial_state(self) -> S:
        return self.State()  # type: ignore[return-value]

    def reads(self) -> tuple[RuleInput, ...]:
        """The inputs this configured rule reads (the hook saves them; coverage checks them)."""
        return ()

    def coverage(self, state: S) -> Coverage | None:
        """What the rule has checked so far (None: the rule does not say; see ``Coverage``)."""
        return None

    def covered(
        self,
        checked: int,
        unit: str,
        verb: str = "checked",
        *,
        received: Sequence[int] | None = None,
        reason: str = "",
    ) -> Coverage:
        """A ``Coverage`` from counters: ``received[i]`` counts arrivals of ``reads()[i]``.

        Without ``received``, nothing checked means every input is missing. When nothing was
        checked and no ``reason`` is given, every input that never arrived is named as missing.
        """
        inputs = self.reads()
        # without counters, whatever was checked stands for every input
        counts = [checked] * len(inputs) if received is None else list(received)
        if len(counts) != len(inputs):
            raise ValueError(f"{self.name}: {len(counts)} counters for {len(inputs)} inputs")
        absent = [i for i, n in zip(inputs, counts, strict=True) if n == 0]
        missing = tuple(i for i in absent if i.required)
        skipped = tuple(i for i in absent if not i.required)
        if checked == 0 and not missing and not reason:
            # nothing judged and no reason given: every input that never arrived is the cause
            missing, skipped = tuple(absent), ()
        return Coverage(checked, unit, verb, missing, skipped, reason)

    @abstractmethod
    def update(self, state: S, data: D) -> tuple[S, list[Finding]]:
        """Fold one input (a step of all workers, or a system batch) into the state; a finding
        means the rule fired."""

    def finish(self, state: S) -> list[Finding]:
        """Called once when the job has ended and every input was evaluated."""
        return []

    def check(self, state: S, now: float, *, started: float | None = None) -> tuple[S, list[Finding]]:
        """The timer's call (``uses_clock`` rules): judge at wall-clock ``now`` with no new data.

        ``started`` is the job's start (its manifest's time). The default does nothing.
        """
        return state, []

    # helpers ---------------------------------------------------------------------------
    def finding(
        self,
        step: int,
        message: str,
        *,
        tensor: str | None = None,
        value: float | None = None,
        threshold: float | None = None,
        mode: Mode | None = None,
        mode_step: int | None = None,
    ) -> Finding:
        return Finding(self.name, step, message, tensor, value, threshold, mode, mode_step)

    def load_state(self, raw: dict[str, Any] | None) -> S:
        return self.initial_state() if raw is None else self.State.model_validate(raw)  # type: ignore[return-value]

    @staticmethod
    def dump_state(state: RuleState) -> dict[str, Any]:
        return state.model_dump(mode="json")


class Rule(BaseRule[C, S, StepData]):
    """The model-rule base: ``update(state, step: StepData)``, per global step, in order.

    Custom rules subclass this. A cross-job rule (``kind = "cross-job"``) also names the job it
    compares with (``compares_with``) and implements ``compare``.
    """

    @abstractmethod
    def update(self, state: S, step: StepData) -> tuple[S, list[Finding]]:
        """Fold one step (all workers) into the state; a finding means the rule fired."""

    def compares_with(self) -> str | None:
        """The other job whose same step ``compare`` needs (None: not a cross-job rule)."""
        return None

    def compare(self, state: S, step: StepData, other: StepData | None) -> tuple[S, list[Finding]]:
        """Judge this job's step against the other job's same step (None: the other job holds
        no data at this step; count it, so coverage can say so). The default does nothing."""
        return state, []


#: the model-rule base by its descriptive name (``Rule`` is kept for custom rules)
ModelRule = Rule


class SystemRule(BaseRule[C, S, SystemBatch]):
    """The system-rule base (profiler rules): ``update(state, batch: SystemBatch)``, per worker.

    See ``trainguard.rules.profiler.base.ProfilerRule`` for the profiler rules' shared helpers.
    """

    kind: ClassVar[str] = "profiler"

    @abstractmethod
    def update(self, state: S, batch: SystemBatch) -> tuple[S, list[Finding]]:
        """Fold one system batch (one worker's samples and step timings) into the state."""


#: any rule, model or system
AnyRule = BaseRule[Any, Any, Any]


def fmt(value: float | None) -> str:
    """Numbers in StatusDetails: short, but never hiding NaN or Inf."""
    if value is None:
        return "n/a"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.6g}"

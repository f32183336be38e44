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
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from trainguard.format.documents import Mode, ScalarRecord, StepHeader, TensorRecord, TensorStats

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


@dataclass(frozen=True)
class RuleInput:
    """One input a rule reads, declared so the hook saves exactly it and coverage can be checked.

    The hook turns on ``collections`` (and saves tensors whose names match ``regex``) and
    computes ``statistics`` for them; scalar inputs (``scalars=True``) are scalar values in
    those collections (``("losses",)``: every loss). ``modes`` empty means any mode. A rule
    that never received a ``required`` input by the end of a job has not checked it: it ends
    ``Error`` with ``what`` in the reason, never ``NoIssuesFound``.
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


@dataclass(frozen=True)
class Finding:
    """The rule's condition was met. Its text becomes the StatusDetails."""

    rule: str
    step: int
    message: str
    tensor: str | None = None
    value: float | None = None
    threshold: float | None = None

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

    @staticmethod
    def from_headers(headers: Sequence[StepHeader]) -> StepData:
        ordered = tuple(sorted(headers, key=lambda h: h.worker))
        if not ordered:
            raise ValueError("a step needs at least one worker's header")
        steps = {h.step for h in ordered}
        if len(steps) != 1:
            raise ValueError(f"headers from different steps: {sorted(steps)}")
        return StepData(ordered[0].step, ordered, max(h.wall_time for h in ordered))

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
        pattern = re.compile(regex) if regex else None
        values = [
            s.value
            for _, name, _, s in self.scalars(mode)
            if (use_losses_collection and "losses" in s.collections)
            or (pattern is not None and pattern.match(name))
        ]
        return sum(values) / len(values) if values else None


def _compile(regex: str | Sequence[str] | None) -> list[re.Pattern[str]] | None:
    if regex is None:
        return None
    items = [regex] if isinstance(regex, str) else list(regex)
    return [_compiled(r) for r in items] if items else None


@lru_cache(maxsize=256)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


C = TypeVar("C", bound=RuleConfig)
S = TypeVar("S", bound=RuleState)


class Rule(ABC, Generic[C, S]):
    """Base class. Subclasses set ``name``, ``Config``, ``State`` and implement ``update``."""

    #: SageMaker's rule name (``rule_to_invoke``), PascalCase
    name: ClassVar[str]
    Config: ClassVar[type[RuleConfig]]
    State: ClassVar[type[RuleState]]
    #: one line for ``trainguard rules`` and the alert's "what to do"
    summary: ClassVar[str] = ""
    advice: ClassVar[str] = ""
    #: "model" rules read step objects; "profiler" rules read system samples; "clock" rules run on a schedule
    kind: ClassVar[str] = "model"

    def __init__(self, config: C) -> None:
        self.config = config

    def initial_state(self) -> S:
        return self.State()  # type: ignore[return-value]

    def reads(self) -> tuple[RuleInput, ...]:
        """The inputs this configured rule reads (the hook saves them; coverage checks them)."""
        return ()

    @abstractmethod
    def update(self, state: S, step: StepData) -> tuple[S, list[Finding]]:
        """Fold one step (all workers) into the state; a finding means the rule fired."""

    def finish(self, state: S) -> list[Finding]:
        """Called once when the job has ended and every step was evaluated."""
        return []

    # helpers ---------------------------------------------------------------------------
    def finding(
        self,
        step: int,
        message: str,
        *,
        tensor: str | None = None,
        value: float | None = None,
        threshold: float | None = None,
    ) -> Finding:
        return Finding(self.name, step, message, tensor, value, threshold)

    def load_state(self, raw: dict[str, Any] | None) -> S:
        return self.initial_state() if raw is None else self.State.model_validate(raw)  # type: ignore[return-value]

    @staticmethod
    def dump_state(state: RuleState) -> dict[str, Any]:
        return state.model_dump(mode="json")


def fmt(value: float | None) -> str:
    """Numbers in StatusDetails: short, but never hiding NaN or Inf."""
    if value is None:
        return "n/a"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.6g}"

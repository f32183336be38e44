"""ProfilerReport: runs every other profiler rule and collects what they found, for the report.

Parameters are the sub-rules' parameters prefixed with the rule name, as SageMaker's
ProfilerReport takes them (``CPUBottleneck_threshold="70"``, ``StepOutlier_n_outliers="5"``);
an unknown rule or parameter is a configuration error. Each sub-rule's state is kept inside
this rule's state; a sub-rule that fires is not updated again (like a standalone rule) and
its finding is recorded with the batch time. A sub-rule that raises is recorded as an error
and skipped; the others go on.

Choice: ProfilerReport itself fires only in ``finish()`` (the job ended), with one finding
that lists the sub-rules that found issues, so its status is ``IssuesFound`` exactly when the
report has issues to show, and it keeps evaluating every sub-rule until the end.
``check_clock`` forwards to MaxInitializationTime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainguard.format.system import SystemBatch
from trainguard.rules.base import Coverage, Finding, RuleConfig, merge_coverage
from trainguard.rules.profiler.base import ProfilerRule, ProfilerState
from trainguard.rules.profiler.batch_size import BatchSize
from trainguard.rules.profiler.cpu_bottleneck import CPUBottleneck
from trainguard.rules.profiler.dataloader import Dataloader
from trainguard.rules.profiler.gpu_memory_increase import GPUMemoryIncrease
from trainguard.rules.profiler.io_bottleneck import IOBottleneck
from trainguard.rules.profiler.load_balancing import LoadBalancing
from trainguard.rules.profiler.low_gpu_utilization import LowGPUUtilization
from trainguard.rules.profiler.max_initialization_time import MaxInitializationTime
from trainguard.rules.profiler.overall_system_usage import OverallSystemUsage
from trainguard.rules.profiler.step_outlier import StepOutlier

SUB_RULES: tuple[type[ProfilerRule[Any, Any]], ...] = (
    CPUBottleneck,
    IOBottleneck,
    LowGPUUtilization,
    GPUMemoryIncrease,
    BatchSize,
    LoadBalancing,
    MaxInitializationTime,
    StepOutlier,
    Dataloader,
    OverallSystemUsage,
)
_BY_NAME = {cls.name: cls for cls in SUB_RULES}


class ProfilerReportConfig(RuleConfig):
    """``<RuleName>_<parameter>`` entries; values are validated by the sub-rule's config."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _known(self) -> ProfilerReportConfig:
        for key in self.model_extra or {}:
            rule, _, param = key.partition("_")
            cls = _BY_NAME.get(rule)
            if cls is None:
                raise ValueError(
                    f"unknown ProfilerReport parameter {key!r}: expected <ProfilerRuleName>_<parameter>"
                )
            if param not in cls.Config.model_fields:
                raise ValueError(f"{rule} has no parameter {param!r} (from ProfilerReport parameter {key!r})")
        for name in _BY_NAME:
            self.sub_config(name)  # raises on a bad value
        return self

    def sub_config(self, rule: str) -> RuleConfig:
        prefix = f"{rule}_"
        params = {k[len(prefix) :]: v for k, v in (self.model_extra or {}).items() if k.startswith(prefix)}
        return _BY_NAME[rule].Config.model_validate(params)


class FindingRecord(BaseModel):
    step: int
    message: str
    time: float | None = None
    value: float | None = None
    threshold: float | None = None


class ProfilerReportState(ProfilerState):
    states: dict[str, dict[str, Any]] = Field(default_factory=dict, max_length=len(SUB_RULES))
    findings: dict[str, FindingRecord] = Field(default_factory=dict, max_length=len(SUB_RULES))
    errors: dict[str, str] = Field(default_factory=dict, max_length=len(SUB_RULES))


@dataclass
class RuleResult:
    """One sub-rule, as the report shows it."""

    name: str
    summary: str
    advice: str
    finding: FindingRecord | None
    error: str | None
    notes: dict[str, Any] = field(default_factory=dict)
    #: what the rule judged (its standalone verdict: a rule that judged nothing ends Error)
    coverage: Coverage | None = None

    @property
    def unjudged(self) -> str | None:
        """Why the rule could not judge the job (None when it did, or fired, or failed)."""
        if self.error or self.finding or self.coverage is None or self.coverage.complete:
            return None
        c = self.coverage
        return f"{self.name} {c.verb} no {c.unit}: {c.reason or 'none of what it reads arrived'}"

    @property
    def status(self) -> str:
        """What the rule would end with run on its own (the service's and replay's verdict)."""
        if self.error or self.unjudged:
            return "Error"
        return "IssuesFound" if self.finding else "NoIssuesFound"


class ProfilerReport(ProfilerRule[ProfilerReportConfig, ProfilerReportState]):
    """Runs every profiler rule; fires in ``finish`` when any of them found issues.

    Details and the choices made are in the module docstring.
    """

    name = "ProfilerReport"
    uses_clock = True
    Config = ProfilerReportConfig
    State = ProfilerReportState
    summary = "runs every profiler rule and writes the profiling report"
    advice = "Open report/profiler-report.html under the job folder for the details and suggestions."

    def __init__(self, config: ProfilerReportConfig) -> None:
        super().__init__(config)
        self.rules: dict[str, ProfilerRule[Any, Any]] = {
            name: cls(config.sub_config(name)) for name, cls in _BY_NAME.items()
        }

    def _update(
        self, state: ProfilerReportState, batch: SystemBatch
    ) -> tuple[ProfilerReportState, list[Finding]]:
        for name, rule in self.rules.items():
            if name in state.findings or name in state.errors:
                continue
            try:
                sub = rule.load_state(state.states.get(name))
                sub, found = rule.update(sub, batch)
                state.states[name] = rule.dump_state(sub)
            except Exception as exc:
                state.errors[name] = f"{type(exc).__name__}: {exc}"[:1024]
                continue
            if found:
                self._record(state, found[0], batch.end_time)
        return state, []

    def check_clock(
        self, state: ProfilerReportState, now: float, job_start: float | None = None
    ) -> tuple[ProfilerReportState, list[Finding]]:
        """Forward the scheduler's clock to MaxInitializationTime (pure)."""
        name = MaxInitializationTime.name
        state = state.model_copy(deep=True)
        if name in state.findings or name in state.errors:
            return state, []
        rule = self.rules[name]
        assert isinstance(rule, MaxInitializationTime)
        sub, found = rule.check_clock(rule.load_state(state.states.get(name)), now, job_start)
        state.states[name] = rule.dump_state(sub)
        if found:
            self._record(state, found[0], now)
        return state, []

    def finish(self, state: ProfilerReportState) -> list[Finding]:
        state = state.model_copy(deep=True)
        for name, rule in self.rules.items():
            if name in state.findings or name in state.errors:
                continue
            found = rule.finish(rule.load_state(state.states.get(name)))
            if found:
                self._record(state, found[0], None)
        if not state.findings:
            return []
        names = ", ".join(f"{n} (step {r.step})" for n, r in state.findings.items())
        return [
            self.finding(
                max(r.step for r in state.findings.values()),
                f"{len(state.findings)} profiler rule(s) found issues: {names}. See the profiler report.",
                value=float(len(state.findings)),
            )
        ]

    def results(self, state: ProfilerReportState) -> list[RuleResult]:
        out = []
        for name, rule in self.rules.items():
            notes: dict[str, Any] = {}
            coverage = None
            raw = state.states.get(name)
            if raw is not None or name not in state.errors:
                sub = rule.load_state(raw)
                notes, coverage = rule.notes(sub), rule.coverage(sub)
            out.append(
                RuleResult(
                    name,
                    rule.summary,
                    rule.advice,
                    state.findings.get(name),
                    state.errors.get(name),
                    notes,
                    coverage,
                )
            )
        return out

    @staticmethod
    def _record(state: ProfilerReportState, finding: Finding, when: float | None) -> None:
        state.findings[finding.rule] = FindingRecord(
            step=finding.step,
            message=finding.message,
            time=when,
            value=finding.value,
            threshold=finding.threshold,
        )


def evaluate_per_worker(
    batches: Sequence[SystemBatch], config: ProfilerReportConfig | None = None
) -> list[RuleResult]:
    """Run ProfilerReport the way the service does: one state per worker, its batches in seq order.

    Then merge: a rule found issues if it did for any worker (the earliest finding is shown,
    its message prefixed with the worker when there are several); otherwise a worker that
    could judge is preferred over one whose notes say it could not.
    """
    rule = ProfilerReport(config or ProfilerReportConfig())
    by_worker: dict[int, list[SystemBatch]] = {}
    for b in sorted(batches, key=lambda b: (b.worker, b.seq)):
        if not by_worker.get(b.worker) or by_worker[b.worker][-1].seq != b.seq:
            by_worker.setdefault(b.worker, []).append(b)
    per_worker: dict[int, list[RuleResult]] = {}
    for worker, items in sorted(by_worker.items()):
        state = rule.initial_state()
        for b in items:
            state, _ = rule.update(state, b)
        per_worker[worker] = rule.results(state)
    if not per_worker:
        return rule.results(rule.initial_state())
    merged: list[RuleResult] = []
    several = len(per_worker) > 1
    for index, first in enumerate(next(iter(per_worker.values()))):
        candidates = [(w, results[index]) for w, results in per_worker.items()]
        fired = [(w, r) for w, r in candidates if r.finding is not None]
        errors = [(w, r) for w, r in candidates if r.error]
        if fired:
            w, r = min(fired, key=lambda c: (c[1].finding.time or 0.0) if c[1].finding else 0.0)
            finding = r.finding
            if several and finding is not None and not finding.message.lower().startswith(f"worker {w} "):
                finding = finding.model_copy(update={"message": f"worker {w}: {finding.message}"})
            merged.append(RuleResult(r.name, r.summary, r.advice, finding, None, r.notes, r.coverage))
        elif errors:
            w, r = errors[0]
            merged.append(
                RuleResult(r.name, r.summary, r.advice, None, f"worker {w}: {r.error}", r.notes, r.coverage)
            )
        else:
            judged = [r for _, r in candidates if "note" not in r.notes]
            chosen = judged[0] if judged else first
            # a job's workers are judged together: judged on any worker is judged (the service's merge)
            coverage = merge_coverage([r.coverage for _, r in candidates])
            merged.append(
                RuleResult(chosen.name, chosen.summary, chosen.advice, None, None, chosen.notes, coverage)
            )
    return merged

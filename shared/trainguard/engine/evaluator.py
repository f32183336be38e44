"""Pure job evaluation: the same code behind the Lambda, ``trainguard replay`` and the tests.

Ordering. Each worker's step objects form a chain (``prev_step``). A worker's next object
is the one whose ``prev_step`` is the worker's frontier (the last step of it evaluated).
The next global step ``s`` can be evaluated only when every worker's next object is known
(or the worker has ended): then ``s`` is the smallest of those next steps, every worker
whose next object is at ``s`` contributes it, and the others provably wrote nothing at
``s``. So the steps evaluated, and what each holds, do not depend on arrival order,
duplication or concurrency: a live evaluation equals a sequential replay.

Every function here takes a state and returns a new one plus the transitions it made;
nothing touches AWS.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trainguard.engine.events import JobStatusDetail, RuleStatusDetail, RuleStatusEntry, Status
from trainguard.engine.model import JobInfo, JobState, RuleRecord, StepArrival, SystemArrival, Transition
from trainguard.format.documents import EndMarker, Manifest
from trainguard.rules.base import AnyRule, Coverage, Finding, Rule, StepData, SystemRule, merge_coverage
from trainguard.rules.config import ConfiguredRule, parse_rule_configurations
from trainguard.rules.profiler.base import ProfilerRule

#: at most this many steps per advance call, so one invocation's work stays bounded
MAX_STEPS_PER_ADVANCE = 5_000


@dataclass
class Outcome:
    state: JobState
    transitions: list[Transition] = field(default_factory=list)
    #: (step, worker) arrivals that were evaluated or are stale and can be deleted
    consumed: list[tuple[int, int]] = field(default_factory=list)
    #: (worker, seq) system batches likewise
    consumed_system: list[tuple[int, int]] = field(default_factory=list)
    changed: bool = False
    #: per evaluated step: (step, wall time, {"<MODE>.<scalar>": mean over workers}) for metrics
    scalars: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)


def apply_manifest(state: JobState, manifest: Manifest, now: float) -> Outcome:
    """The job declared itself: create its rules (InProgress, or Error for a bad entry)."""
    if state.info is not None:
        return Outcome(state)  # a duplicate delivery, or a rewritten manifest: the first one counts
    new = state.model_copy(deep=True)
    new.info = JobInfo.from_manifest(manifest)
    new.created = manifest.created
    out = Outcome(new, changed=True)
    for configured in _configured(new.info):
        record = RuleRecord(
            name=configured.configuration_name,
            rule=configured.rule_name,
            actions=list(configured.actions),
            status="InProgress",
            modified=now,
        )
        if configured.error is not None:
            _set_status(
                out, record, "Error", f"RuleConfigurationError: {configured.error}", now, previous=None
            )
        else:
            _set_status(out, record, "InProgress", "", now, previous=None)
        new.rules.append(record)
    return out


def apply_end(state: JobState, marker: EndMarker) -> Outcome:
    if marker.worker in state.ended:
        return Outcome(state)
    new = state.model_copy(deep=True)
    new.ended[marker.worker] = marker.last_step
    if marker.system_batches is not None:
        new.system_batches[marker.worker] = marker.system_batches
    new.stopped = new.stopped or marker.stopped
    return Outcome(new, changed=True)


def record_invalid(state: JobState, reason: str) -> Outcome:
    if reason in state.invalid_objects or len(state.invalid_objects) >= 20:
        return Outcome(state)
    new = state.model_copy(deep=True)
    new.invalid_objects.append(reason[:500])
    return Outcome(new, changed=True)


def request_stop(state: JobState, now: float) -> Outcome:
    """The stop action ran: rules still evaluating become Stopping."""
    if state.stop_requested or state.finished:
        return Outcome(state)
    new = state.model_copy(deep=True)
    new.stop_requested = True
    out = Outcome(new, changed=True)
    for record in new.rules:
        if record.status == "InProgress":
            _set_status(out, record, "Stopping", "The job is being stopped by a trainguard action.", now)
    return out


def apply_clock(state: JobState, now: float) -> Outcome:
    """A timer tick: rules that fire on the absence of data (``check(state, now)``) look now.

    Their verdict depends on the clock, so they are the one thing a replay of stored data
    cannot reproduce; every other rule's verdict is independent of when the tick runs.
    """
    if state.info is None or state.finished:
        return Outcome(state)
    new = state.model_copy(deep=True)
    out = Outcome(new)
    configured = {c.configuration_name: c for c in _configured(state.info)}
    for record in new.rules:
        rule = configured[record.name].rule if record.name in configured else None
        if record.status != "InProgress" or rule is None or not rule.uses_clock:
            continue
        try:
            if isinstance(rule, SystemRule):  # judged per worker: the timer looks at worker 0's state
                worker_state = rule.load_state(record.worker_states.get(0))
                worker_state, findings = rule.check(worker_state, now, started=new.created)
                record.worker_states[0] = rule.dump_state(worker_state)
            else:
                rule_state, findings = rule.check(rule.load_state(record.state), now, started=new.created)
                record.state = rule.dump_state(rule_state)
        except Exception as exc:
            _set_status(
                out, record, "Error", f"RuleEvaluationError on the timer: {type(exc).__name__}: {exc}", now
            )
            continue
        if findings:
            _fire(out, record, findings[0], now)
    return out


def advance(
    state: JobState,
    arrivals: Iterable[StepArrival],
    now: float,
    max_steps: int | None = MAX_STEPS_PER_ADVANCE,
    system: Iterable[SystemArrival] = (),
    other_steps: OtherSteps | None = None,
) -> Outcome:
    """Evaluate every step that is complete, in order; finish the job when all workers ended.

    At most ``max_steps`` steps are evaluated (None: no limit); the caller advances again.
    """
    out = Outcome(state.model_copy(deep=True))
    new = out.state
    pending: dict[int, dict[int, StepArrival]] = {}
    for arrival in arrivals:
        last = new.frontier.get(arrival.worker, -1)
        if arrival.step <= last:
            out.consumed.append((arrival.step, arrival.worker))  # stale duplicate
            continue
        pending.setdefault(arrival.worker, {})[arrival.step] = arrival
    if new.info is None or new.finished:
        return out
    rules = {c.configuration_name: c for c in _configured(new.info)}
    world = new.info.world_size
    budget = max_steps if max_steps is not None else 1 << 62
    while budget > 0:
        budget -= 1
        nexts: dict[int, StepArrival] = {}
        blocked = False
        for worker in range(world):
            frontier = new.frontier.get(worker)
            if worker in new.ended and new.ended[worker] == frontier:
                continue  # this worker has no more steps
            candidates = pending.get(worker, {})
            if not candidates:
                blocked = True
                break
            first = candidates[min(candidates)]
            if first.prev_step == frontier or first.bad is not None:
                nexts[worker] = first
            else:
                blocked = True  # the worker's next object has not arrived yet
                break
        if blocked or not nexts:
            break
        step = min(a.step for a in nexts.values())
        contributing = [a for a in nexts.values() if a.step == step]
        headers = [a.header for a in contributing if a.header is not None]
        for arrival in contributing:
            new.frontier[arrival.worker] = step
            del pending[arrival.worker][step]
            out.consumed.append((step, arrival.worker))
        new.watermark = step
        new.steps_evaluated += 1
        out.changed = True
        if headers:
            data = StepData.from_headers(headers)
            new.last_data_time = max(new.last_data_time or 0.0, data.wall_time)
            out.scalars.append((data.step, data.wall_time, scalar_means(data)))
            _evaluate_step(out, rules, data, now, other_steps)
    _advance_system(out, rules, system, now)
    if _all_ended(new):
        _finish(out, rules, now)
    return out


#: profiler rules keep a state per worker; workers past this many are stored for the
#: report but not judged live (a DynamoDB item holds every rule's state of the job)
MAX_PROFILED_WORKERS = 16


def _advance_system(
    out: Outcome, rules: dict[str, ConfiguredRule], system: Iterable[SystemArrival], now: float
) -> None:
    """Each worker's system batches, in seq order, through the profiler rules (per-worker state)."""
    state = out.state
    pending: dict[int, dict[int, SystemArrival]] = {}
    for arrival in system:
        if arrival.seq <= state.system_frontier.get(arrival.worker, -1):
            out.consumed_system.append((arrival.worker, arrival.seq))
        else:
            pending.setdefault(arrival.worker, {})[arrival.seq] = arrival
    for worker in sorted(pending):
        batches = pending[worker]
        while (seq := state.system_frontier.get(worker, -1) + 1) in batches:
            arrival = batches.pop(seq)
            state.system_frontier[worker] = seq
            out.consumed_system.append((worker, seq))
            out.changed = True
            if arrival.batch is None or worker >= MAX_PROFILED_WORKERS:
                continue
            for record in state.rules:
                configured = rules.get(record.name)
                rule = configured.rule if configured is not None else None
                if record.status not in ("InProgress", "Stopping") or not isinstance(rule, ProfilerRule):
                    continue
                try:
                    rule_state = rule.load_state(record.worker_states.get(worker))
                    rule_state, findings = rule.update(rule_state, arrival.batch)
                    record.worker_states[worker] = rule.dump_state(rule_state)
                except Exception as exc:
                    where = f"system batch {seq} of worker {worker}"
                    reason = f"RuleEvaluationError on {where}: {type(exc).__name__}: {exc}"
                    _set_status(out, record, "Error", reason, now)
                    continue
                if findings:
                    _fire(out, record, findings[0], now)


#: scalars published as metrics per step (CloudWatch bills per metric; losses come first)
MAX_METRIC_SCALARS = 20


def scalar_means(data: StepData) -> dict[str, float]:
    """Each scalar of the step, averaged over workers, as ``<MODE>.<name>`` (losses first)."""
    sums: dict[str, list[float]] = {}
    for mode, name, _, scalar in sorted(
        data.scalars(), key=lambda item: ("losses" not in item[3].collections, item[0], item[1])
    ):
        sums.setdefault(f"{mode}.{name}", []).append(scalar.value)
    return {key: sum(v) / len(v) for key, v in list(sums.items())[:MAX_METRIC_SCALARS]}


def _all_ended(state: JobState) -> bool:
    assert state.info is not None
    return all(
        w in state.ended
        and state.ended[w] == state.frontier.get(w)
        # a worker whose end marker counts its system batches is done once all were judged
        and (w not in state.system_batches or state.system_frontier.get(w, -1) >= state.system_batches[w] - 1)
        for w in range(state.info.world_size)
    )


#: the same step of another job (SimilarAcrossRuns): (job, step) -> its data, or None
OtherSteps = Callable[[str, int], "StepData | None"]


def _evaluate_step(
    out: Outcome,
    rules: dict[str, ConfiguredRule],
    data: StepData,
    now: float,
    other_steps: OtherSteps | None = None,
) -> None:
    for record in out.state.rules:
        if record.status not in ("InProgress", "Stopping"):
            continue
        configured = rules.get(record.name)
        rule = configured.rule if configured is not None else None
        if not isinstance(rule, Rule):
            continue  # a configuration error, or a system rule (judged on system batches)
        try:
            rule_state = rule.load_state(record.state)
            rule_state, findings = rule.update(rule_state, data)
            other_job = rule.compares_with()
            if other_job is not None and other_steps is not None and not findings:
                # a cross-job rule: the other job's data must be written already (a reference run)
                other = other_steps(other_job, data.step)
                if other is not None:
                    rule_state, findings = rule.compare(rule_state, data, other)
            record.state = rule.dump_state(rule_state)
        except Exception as exc:  # a rule bug or data it cannot handle: Error for this rule only
            _set_status(
                out,
                record,
                "Error",
                f"RuleEvaluationError at step {data.step}: {type(exc).__name__}: {exc}",
                now,
            )
            continue
        if findings:
            _fire(out, record, findings[0], now)


def _finish(out: Outcome, rules: dict[str, ConfiguredRule], now: float) -> None:
    state = out.state
    state.finished = True
    out.changed = True
    for record in state.rules:
        if record.status not in ("InProgress", "Stopping"):
            continue
        configured = rules.get(record.name)
        findings: list[Finding] = []
        coverage: Coverage | None = None
        if configured is not None and configured.rule is not None:
            rule = configured.rule
            try:
                if isinstance(rule, SystemRule):
                    covered: list[Coverage | None] = []
                    for worker in sorted(record.worker_states):
                        worker_state = rule.load_state(record.worker_states[worker])
                        findings += rule.finish(worker_state)
                        covered.append(rule.coverage(worker_state))
                    coverage = merge_coverage(covered) if covered else rule.coverage(rule.initial_state())
                else:
                    rule_state = rule.load_state(record.state)
                    findings = rule.finish(rule_state)
                    coverage = rule.coverage(rule_state)  # after finish: it may judge a last window
            except Exception as exc:
                _set_status(
                    out, record, "Error", f"RuleEvaluationError at job end: {type(exc).__name__}: {exc}", now
                )
                continue
        steps = state.steps_evaluated
        if findings:
            _fire(out, record, findings[0], now)
        elif state.stopped or state.stop_requested:
            _set_status(
                out, record, "Stopped", "The training job was stopped before the rule found issues.", now
            )
        elif coverage is not None and not coverage.complete:
            # a rule that never received what it reads has not checked the job: never a pass
            _set_status(
                out, record, "Error", f"RuleInputMissing: {coverage.starved(record.rule, steps)}", now
            )
        elif coverage is not None:
            _set_status(
                out,
                record,
                "NoIssuesFound",
                f"NoIssuesFound: the rule {record.rule} {coverage.summary()} in {steps:,} steps "
                f"(last step {state.watermark}) without finding issues.",
                now,
            )
        else:
            _set_status(
                out,
                record,
                "NoIssuesFound",
                f"NoIssuesFound: the rule {record.rule} evaluated {steps} steps "
                f"(last step {state.watermark}) without finding issues.",
                now,
            )


def _fire(out: Outcome, record: RuleRecord, finding: Finding, now: float) -> None:
    record.step = finding.step
    record.value = _finite_or_none(finding.value)
    record.threshold = _finite_or_none(finding.threshold)
    record.tensor = finding.tensor
    _set_status(out, record, "IssuesFound", finding.details(), now)


def _finite_or_none(value: float | None) -> float | None:
    # NaN/Inf are kept in the text of StatusDetails; numeric fields stay JSON-safe
    return value if value is not None and math.isfinite(value) else None


def _set_status(
    out: Outcome,
    record: RuleRecord,
    status: Status,
    details: str,
    now: float,
    previous: Status | str | None = "same",
) -> None:
    before: Status | None = record.status if previous == "same" else None
    record.status = status
    record.details = details[:1024]
    record.modified = now
    record.transitions += 1
    out.changed = True
    out.transitions.append(Transition(out.state.job, record.model_copy(deep=True), before))


def _status_entries(state: JobState) -> list[RuleStatusEntry]:
    """Every rule of the job, as SageMaker's DebugRuleEvaluationStatuses lists them."""
    return [
        RuleStatusEntry(
            RuleConfigurationName=r.name,
            RuleEvaluationStatus=r.status,
            StatusDetails=r.details,
            LastModifiedTime=r.modified,
        )
        for r in state.rules
    ]


def build_event(state: JobState, transition: Transition) -> RuleStatusDetail:
    record = transition.record
    info = state.info
    return RuleStatusDetail(
        EventId=f"{state.job}/{record.name}/{record.transitions}",
        TrainingJobName=state.job,
        RuleConfigurationName=record.name,
        RuleName=record.rule,
        RuleEvaluationStatus=record.status,
        PreviousStatus=transition.previous,
        StatusDetails=record.details,
        LastModifiedTime=record.modified,
        Step=record.step,
        Value=record.value,
        Threshold=record.threshold,
        Tensor=record.tensor,
        Actions=record.actions,
        SageMakerTrainingJobName=info.sagemaker_training_job_name if info else None,
        AllowSageMakerStop=info.allow_sagemaker_stop if info else False,
        TrainingJobStatus=state.training_status,  # type: ignore[arg-type]
        DebugRuleEvaluationStatuses=_status_entries(state),
    )


def build_job_event(state: JobState, now: float) -> JobStatusDetail:
    return JobStatusDetail(
        EventId=f"{state.job}/job/finished",
        TrainingJobName=state.job,
        TrainingJobStatus="Stopped" if state.training_status == "Stopped" else "Completed",
        LastStep=state.watermark,
        StepsEvaluated=state.steps_evaluated,
        LastModifiedTime=now,
        DebugRuleEvaluationStatuses=_status_entries(state),
    )


def _configured(info: JobInfo) -> list[ConfiguredRule]:
    key = json.dumps(info.rules, sort_keys=True) if info.rules is not None else "null"
    # the plugin modules in force are part of what a configuration means
    return _configured_cached(key, os.environ.get("TRAINGUARD_RULE_MODULES", ""))


@lru_cache(maxsize=512)
def _configured_cached(key: str, rule_modules: str) -> list[ConfiguredRule]:
    # Rules are stateless objects (their state lives in RuleRecord), so sharing is safe.
    entries: Any = json.loads(key)
    return parse_rule_configurations(entries)


def rule_objects(info: JobInfo) -> dict[str, AnyRule | None]:
    return {c.configuration_name: c.rule for c in _configured(info)}

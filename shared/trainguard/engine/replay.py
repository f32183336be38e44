"""Offline evaluation of a stored job: the reference the live pipeline must equal.

Both formats: step objects (format 1) are decoded as they are listed (their ``prev_step``
orders the chain); segments (format 2) are placed by their keys and their headers read when
the evaluation reaches them, so memory stays bounded by one segment per worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.evaluator import Outcome, advance, apply_end, apply_manifest, record_invalid
from trainguard.engine.model import JobState, SegmentArrival, StepArrival, SystemArrival, Transition
from trainguard.engine.sources import (
    JobSource,
    ObjectError,
    OtherJobs,
    SourceHeaders,
    pointer_of,
    read_end,
    read_manifest,
    sibling_opener,
    step_arrival,
    system_arrival,
)
from trainguard.format.documents import EndMarker, Manifest
from trainguard.format.layout import ObjectKind


@dataclass
class ReplayResult:
    state: JobState
    transitions: list[Transition] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """One entry per rule: the ``trainguard replay --json`` contract."""
        return [
            {
                "RuleConfigurationName": r.name,
                "RuleEvaluationStatus": r.status,
                "StatusDetails": r.details,
                "Step": r.step if r.status == "IssuesFound" else None,
            }
            for r in self.state.rules
        ]

    def alerts(self) -> list[tuple[str, str, str]]:
        """(rule, status, details) of every transition an alert would be sent for."""
        return [
            (t.record.name, t.record.status, t.record.details)
            for t in self.transitions
            if t.record.status in ("IssuesFound", "Error")
        ]


def replay(
    source: JobSource,
    rules: list[dict[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    now: float | None = None,
    open_job: Callable[[str], JobSource] | None = None,
) -> ReplayResult:
    """Evaluate every object of ``source`` in step order with the job's (or the given) rules.

    ``open_job`` opens the other jobs a cross-job rule compares with (default: as the
    source opens its siblings).
    """
    now = time.time() if now is None else now
    warnings: list[str] = []
    manifest: Manifest | None = None
    ends: list[EndMarker] = []
    arrivals: list[StepArrival | SegmentArrival] = []
    system: list[SystemArrival] = []
    refs = list(source.objects())
    for index, ref in enumerate(refs):
        if progress is not None:
            progress(index + 1, len(refs))
        try:
            if ref.kind is ObjectKind.MANIFEST:
                manifest = read_manifest(source.document(ref))
            elif ref.kind is ObjectKind.STEP:
                head, size = source.head(ref)
                arrivals.append(step_arrival(ref, head, size))
            elif ref.kind is ObjectKind.SEGMENT:
                arrivals.append(pointer_of(ref))
            elif ref.kind is ObjectKind.SYSTEM:
                system.append(system_arrival(ref, source.document(ref)))
            elif ref.kind is ObjectKind.END:
                ends.append(read_end(source.document(ref)))
        except ObjectError as exc:
            warnings.append(str(exc))
    if manifest is None:
        sizes = [a.header.world_size for a in arrivals if a.header is not None]
        sizes += [a.worker + 1 for a in arrivals]
        manifest = Manifest(
            job=source.job, created=now, hook_version="unknown", world_size=max(sizes, default=1)
        )
        said = (
            "manifest.json cannot be read"
            if any(r.kind is ObjectKind.MANIFEST for r in refs)
            else ("no manifest.json")
        )
        warnings.append(f"{said}: assuming the default rules and the world size the step objects name")
    if rules is not None:
        manifest = manifest.model_copy(update={"rules": rules})
    state = JobState(job=source.job)
    transitions: list[Transition] = []

    def take(outcome: Outcome) -> JobState:
        transitions.extend(outcome.transitions)
        return outcome.state

    state = take(apply_manifest(state, manifest, now))
    for end in ends:
        state = take(apply_end(state, end))
    for arrival in arrivals:
        if arrival.bad is not None:
            state = take(record_invalid(state, arrival.bad))
            warnings.append(arrival.bad)
    other_jobs = OtherJobs(open_job or sibling_opener(source))
    seen = set(state.invalid_objects)
    state = take(
        advance(
            state,
            arrivals,
            now,
            max_steps=None,
            system=system,
            other_steps=other_jobs.for_job(state.job),
            headers=SourceHeaders(source),
        )
    )
    warnings += [reason for reason in state.invalid_objects if reason not in seen]
    warnings += other_jobs.problems
    return ReplayResult(state, transitions, warnings)

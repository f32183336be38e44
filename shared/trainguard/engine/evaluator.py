"""Pure job evaluation: the same code behind the Lambda, ``trainguard replay`` and the tests.

Ordering. Each worker's data forms a chain. Format 1: one object per step, chained by
``prev_step``; a worker's next object is the one whose ``prev_step`` is the worker's
frontier (the last step of it evaluated). Format 2: one segment per flush window, chained by
``seq`` (0, 1, 2, ...); a worker's current segment is the one after the last it finished,
and its next step is the first one past the frontier. The next global step ``s`` can be
evaluated only when every worker's next step is known (or the worker has ended): then ``s``
is the smallest of those next steps, every worker whose next step is ``s`` contributes it,
and the others provably wrote nothing at ``s`` (smdebug's rule: a step is complete when
every worker wrote it, a later step is complete, or the job ended). So the steps
evaluated, and what each holds, do not depend on arrival order, duplication, concurrency,
or how a worker cut its steps into segments: a live evaluation equals a sequential replay.

What arrives is a pointer; its header is in memory or read again through a
:class:`~trainguard.engine.model.HeaderReader`, only when the evaluation reaches it. An
object that cannot be read is a bad arrival: it keeps its place in the chain (its key gives
the step range), contributes nothing, and its reason is recorded.

Every function here takes a state and returns a new one plus the transitions it made;
nothing touches AWS.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trainguard.engine.events import (
    FINAL_STATUSES,
    JobStatusDetail,
    RuleStatusDetail,
    RuleStatusEntry,
    Status,
)
from trainguard.engine.model import (
    HeaderReader,
    JobInfo,
    JobState,
    RuleRecord,
    SegmentArrival,
    StepArrival,
    SystemArrival,
    Transition,
    UnreadableObject,
)
from trainguard.format.documents import EndMarker, Manifest, Mode, SegmentHeader, StepHeader
from trainguard.rules.base import AnyRule, Coverage, Finding, Rule, StepData, SystemRule, fmt, merge_coverage
from trainguard.rules.config import MAX_RULES_PER_JOB, ConfiguredRule, parse_rule_configurations
from trainguard.rules.profiler.base import ProfilerRule

#: at most this many steps per advance call, so one invocation's work stays bounded
MAX_STEPS_PER_ADVANCE = 20_000
#: invalid-object reasons kept in the job state (the first ones; the count goes on)
MAX_INVALID_REASONS = 20
#: a job's rule configurations, as JSON: the state item (400 KB) holds them with every rule's
#: state, so a manifest whose rules are larger ends each rule Error when it arrives
MAX_RULE_CONFIG_BYTES = 64 * 1024
#: StatusDetails, as SageMaker bounds it
MAX_DETAILS_CHARS = 1024
#: at most one point per scalar per this many seconds of training time goes to the metrics
#: (a job saving its loss 100 times a second must not write 100 metric records a second)
METRIC_INTERVAL_S = 1.0


@dataclass
class Outcome:
    state: JobState
    transitions: list[Transition] = field(default_factory=list)
    #: (step, worker) arrivals that were evaluated or are stale and can be deleted
    consumed: list[tuple[int, int]] = field(default_factory=list)
    #: format-2 segments whose every step was evaluated, or stale duplicates: deletable
    consumed_segments: list[SegmentArrival] = field(default_factory=list)
    #: (worker, seq) system batches likewise
    consumed_system: list[tuple[int, int]] = field(default_factory=list)
    changed: bool = False
    #: evaluated steps, at most one per METRIC_INTERVAL_S of training time: (step, wall time,
    #: {"<MODE>.<scalar>": mean over workers}) for metrics
    scalars: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)
    #: rule states while steps are evaluated (loaded once, dumped once per advance)
    rule_states: RuleStates = field(default_factory=lambda: RuleStates(), repr=False)


class RuleStates:
    """Each rule's state, loaded once per :func:`advance` and dumped once at its end.

    A segment holds hundreds of steps; validating and dumping every rule's state at each of
    them would cost more than the rules themselves. The states round-trip through JSON
    between advances (that is what the state table stores), so a rule's verdicts do not
    depend on how steps were grouped.
    """

    def __init__(self) -> None:
        self._live: dict[str, tuple[Rule[Any, Any], Any]] = {}

    def load(self, record: RuleRecord, rule: Rule[Any, Any]) -> Any:
        live = self._live.get(record.name)
        if live is None:
            return rule.load_state(record.state)
        return live[1]

    def keep(self, record: RuleRecord, rule: Rule[Any, Any], state: Any) -> None:
        self._live[record.name] = (rule, state)

    def discard(self, record: RuleRecord) -> None:
        self._live.pop(record.name, None)

    def flush(self, records: Iterable[RuleRecord]) -> None:
        """Write every live state back into its record (as JSON, what the table stores)."""
        for record in records:
            live = self._live.pop(record.name, None)
            if live is not None:
                record.state = live[0].dump_state(live[1])


def apply_manifest(state: JobState, manifest: Manifest, now: float) -> Outcome:
    """The job declared itself: create its rules (InProgress, or Error for a bad entry)."""
    if state.info is not None:
        # a duplicate delivery, or a rewritten manifest: the first one counts, except for the
        # structure the hook learnt later (a model's unused parameters, after its first backward)
        info = state.info.with_structure(manifest)
        if info is None:
            return Outcome(state)
        grown = state.model_copy(deep=True)
        grown.info = info
        return Outcome(grown, changed=True)
    new = state.model_copy(deep=True)
    new.info = JobInfo.from_manifest(manifest)
    new.created = manifest.created
    new.last_activity = now
    out = Outcome(new, changed=True)
    size = rule_configuration_bytes(manifest.rules)
    if size > MAX_RULE_CONFIG_BYTES:
        _refuse_rule_configurations(out, manifest.rules or [], size, now)
        return out
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


def _refuse_rule_configurations(out: Outcome, entries: list[Any], size: int, now: float) -> None:
    """Rule configurations too large to keep: every rule ends Error, saying why (nothing is kept)."""
    state = out.state
    assert state.info is not None
    state.info = state.info.model_copy(update={"rules": []})  # [] (not None: the default rules)
    reason = (
        f"RuleConfigurationError: the job's rule configurations are {size:,} bytes of JSON; at most "
        f"{MAX_RULE_CONFIG_BYTES:,} fit the job's state (one DynamoDB item of 400 KB holds every "
        "rule's configuration and state). Shorten the parameters and start the job again."
    )
    seen: set[str] = set()
    for index, entry in enumerate(entries[: MAX_RULES_PER_JOB + 1]):
        name, rule = f"rule-{index}", "?"
        if isinstance(entry, dict):
            given = entry.get("RuleConfigurationName")
            params = entry.get("RuleParameters")
            if isinstance(given, str) and 1 <= len(given) <= 256:
                name = given
            invoked = params.get("rule_to_invoke") if isinstance(params, dict) else None
            if isinstance(invoked, str) and 1 <= len(invoked) <= 256:
                rule = invoked
        if name in seen:
            name = f"{name}#{index}"
        seen.add(name)
        record = RuleRecord(name=name, rule=rule, status="InProgress", modified=now)
        _set_status(out, record, "Error", reason, now, previous=None)
        state.rules.append(record)


def rule_configuration_bytes(rules: list[dict[str, Any]] | None) -> int:
    """Bytes of a job's rule configurations as the state stores them (JSON, UTF-8)."""
    if rules is None:
        return 0
    return len(json.dumps(rules, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def apply_end(state: JobState, marker: EndMarker, now: float | None = None) -> Outcome:
    if marker.worker in state.ended:
        return Outcome(state)
    new = state.model_copy(deep=True)
    new.ended[marker.worker] = marker.last_step
    if marker.system_batches is not None:
        new.system_batches[marker.worker] = marker.system_batches
    new.stopped = new.stopped or marker.stopped
    new.add_dropped(marker.dropped)
    new.dropped_objects += marker.dropped_objects
    if now is not None:
        new.last_activity = now
    return Outcome(new, changed=True)


def apply_stale(state: JobState, now: float, last_activity: float, idle_s: float) -> Outcome:
    """End a job that has sent nothing for ``idle_s`` seconds (it crashed without end markers).

    Every rule still evaluating ends ``Error`` (``Stopped`` if a stop was requested), and its
    details say exactly why: how long the job was silent, which workers never sent an end
    marker, and how far the rule got. A rule that already found issues keeps its verdict.
    """
    if state.finished or now - last_activity < idle_s:
        return Outcome(state)
    new = state.model_copy(deep=True)
    out = Outcome(new, changed=True)
    new.finished = True
    silent = _duration(now - last_activity)
    when = _utc(last_activity)
    if new.info is None:
        new.end_reason = f"no manifest.json and nothing new for {silent} (since {when})"
        return out
    missing = [w for w in range(new.info.world_size) if w not in new.ended]
    workers = _ranks(missing)
    new.end_reason = (
        f"the job sent nothing for {silent} (since {when}) and {workers} never sent an end marker"
    )
    for record in new.rules:
        if record.status == "Stopping":
            _set_status(
                out,
                record,
                "Stopped",
                f"JobStale: the job was being stopped and then sent nothing for {silent}; it is "
                f"treated as stopped after {new.steps_evaluated:,} steps (last step {new.watermark}).",
                now,
            )
        elif record.status == "InProgress":
            _set_status(
                out,
                record,
                "Error",
                f"JobStale: the job sent nothing for {silent} (since {when}) and {workers} never "
                f"sent an end marker (crashed or killed?), so {record.rule} could not finish: it "
                f"evaluated {new.steps_evaluated:,} steps (last step {new.watermark}) without finding "
                "issues, but a job that did not end has not passed.",
                now,
            )
    return out


def _duration(seconds: float) -> str:
    days = seconds / 86400
    if days >= 1:
        return f"{days:.1f} days"
    return f"{seconds / 3600:.1f} hours"


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _ranks(workers: list[int]) -> str:
    if not workers:
        return "no worker"
    shown = ", ".join(str(w) for w in workers[:8]) + (
        f" and {len(workers) - 8} more" if len(workers) > 8 else ""
    )
    return f"worker{'s' if len(workers) > 1 else ''} {shown}"


def shed_largest_rule_state(state: JobState, now: float, nbytes: int, limit: int) -> Outcome:
    """The job's state no longer fits one item: the rule with the largest state ends Error.

    A rule's state must stay bounded; one that grew past what the item holds cannot be
    stored, so it stops with the reason (the others go on). No rule left to shed: unchanged.
    """
    candidates = [r for r in state.rules if r.state is not None or r.worker_states]
    if not candidates:
        return Outcome(state)
    new = state.model_copy(deep=True)
    out = Outcome(new)
    sizes = {r.name: len(json.dumps([r.state, r.worker_states], default=str)) for r in new.rules}
    record = max(
        (r for r in new.rules if r.state is not None or r.worker_states), key=lambda r: sizes[r.name]
    )
    record.state, record.worker_states = None, {}
    if record.status in ("InProgress", "Stopping"):
        _set_status(
            out,
            record,
            "Error",
            f"RuleStateTooLarge: the job's state grew to {nbytes:,} bytes (at most {limit:,} fit one "
            f"DynamoDB item); {record.rule}'s state was the largest ({sizes[record.name]:,} bytes of "
            "JSON), so the rule stopped here.",
            now,
        )
    out.changed = True
    return out


def record_invalid(state: JobState, reason: str) -> Outcome:
    if reason[:500] in state.invalid_objects or len(state.invalid_objects) >= MAX_INVALID_REASONS:
        return Outcome(state)
    new = state.model_copy(deep=True)
    _note_invalid(new, reason)
    return Outcome(new, changed=True)


def _note_invalid(state: JobState, reason: str) -> bool:
    text = reason[:500]
    if text in state.invalid_objects or len(state.invalid_objects) >= MAX_INVALID_REASONS:
        return False
    state.invalid_objects.append(text)
    return True


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
    arrivals: Iterable[StepArrival | SegmentArrival],
    now: float,
    max_steps: int | None = MAX_STEPS_PER_ADVANCE,
    system: Iterable[SystemArrival] = (),
    other_steps: OtherSteps | None = None,
    headers: HeaderReader | None = None,
    out_of_time: Callable[[], bool] | None = None,
) -> Outcome:
    """Evaluate every step that is complete, in order; finish the job when all workers ended.

    ``arrivals``: what is buffered for the job, step objects (format 1) and segments
    (format 2), in any order, duplicates allowed. ``headers`` reads the header of an arrival
    that carries none (a pointer from the state table). At most ``max_steps`` steps are
    evaluated (None: no limit), and none after ``out_of_time()`` says the caller's time
    budget is spent; the caller advances again.
    """
    out = Outcome(state.model_copy(deep=True))
    new = out.state
    world = new.info.world_size if new.info is not None else None
    steps: dict[int, dict[int, StepArrival]] = {}
    segments: dict[int, dict[int, SegmentArrival]] = {}
    for arrival in arrivals:
        if world is not None and arrival.worker >= world:
            # a rank outside the job's world can never complete a step: say so, then drop it
            out.changed |= _note_invalid(
                new, f"{arrival.key}: worker {arrival.worker} is outside the job's world size {world}"
            )
            _consume(out, arrival)
        elif isinstance(arrival, SegmentArrival):
            if arrival.seq <= new.segment_frontier.get(arrival.worker, -1):
                out.consumed_segments.append(arrival)  # a stale duplicate
            else:
                segments.setdefault(arrival.worker, {})[arrival.seq] = arrival
        elif arrival.step <= new.frontier.get(arrival.worker, -1):
            out.consumed.append((arrival.step, arrival.worker))  # a stale duplicate
        else:
            steps.setdefault(arrival.worker, {})[arrival.step] = arrival
    if new.info is None or new.finished:
        return out
    assert world is not None
    chains: dict[int, _Chain] = {}
    for worker in set(steps) | set(segments):
        if worker in segments or worker in new.segment_frontier:
            for arrival in steps.get(worker, {}).values():
                # a worker writes one format; a step object beside its segments is not its chain
                out.changed |= _note_invalid(
                    new, f"{arrival.key}: worker {worker} writes format-2 segments; step object ignored"
                )
                _consume(out, arrival)
            chains[worker] = _SegmentChain(worker, segments.get(worker, {}), out, headers)
        else:
            chains[worker] = _StepChain(worker, steps[worker], out, headers)
    rules = {c.configuration_name: c for c in _configured(new.info)}
    budget = max_steps if max_steps is not None else 1 << 62
    last_metric: float | None = None
    while budget > 0:
        budget -= 1
        if out_of_time is not None and out_of_time():
            break  # what was evaluated so far is committed; the rest waits for the next call
        nexts: dict[int, int] = {}
        blocked = False
        for worker in range(world):
            if worker in new.ended and new.ended[worker] == new.frontier.get(worker):
                continue  # this worker has no more steps
            chain = chains.get(worker)
            upcoming = chain.peek() if chain is not None else None
            if upcoming is None:
                blocked = True  # the worker's next object has not arrived yet
                break
            nexts[worker] = upcoming
        if blocked or not nexts:
            break
        step = min(nexts.values())
        contributed: list[StepHeader] = []
        for worker, upcoming in nexts.items():
            if upcoming == step:
                header = chains[worker].take(step)
                if header is not None:
                    contributed.append(header)
        new.watermark = max(new.watermark, step)
        out.changed = True
        if contributed:
            new.last_activity = now
            new.steps_evaluated += 1
            data = StepData.from_headers(contributed, new.info.structure)
            new.last_data_time = max(new.last_data_time or 0.0, data.wall_time)
            if last_metric is None or not last_metric <= data.wall_time < last_metric + METRIC_INTERVAL_S:
                out.scalars.append((data.step, data.wall_time, scalar_means(data)))
                last_metric = data.wall_time
            _evaluate_step(out, rules, data, now, other_steps)
    out.rule_states.flush(new.rules)
    _advance_system(out, rules, system, now)
    if _all_ended(new):
        _finish(out, rules, now)
    return out


def _consume(out: Outcome, arrival: StepArrival | SegmentArrival) -> None:
    if isinstance(arrival, SegmentArrival):
        out.consumed_segments.append(arrival)
    else:
        out.consumed.append((arrival.step, arrival.worker))


class _Chain:
    """One worker's pending data: its next step (``peek``) and that step's header (``take``)."""

    def __init__(self, worker: int, out: Outcome, headers: HeaderReader | None) -> None:
        self.worker = worker
        self.out = out
        self.state = out.state
        self.headers = headers

    def peek(self) -> int | None:
        """The worker's next step, or None while the object holding it has not arrived."""
        raise NotImplementedError

    def take(self, step: int) -> StepHeader | None:
        """Move past ``step`` (the value ``peek`` gave); its header, None for a bad arrival."""
        raise NotImplementedError

    def _frontier(self) -> int:
        return self.state.frontier.get(self.worker, -1)

    def _unreadable(self, reason: str) -> None:
        self.out.changed |= _note_invalid(self.state, reason)


class _StepChain(_Chain):
    """Format 1: one object per step, each naming the worker's previous step (``prev_step``)."""

    def __init__(
        self, worker: int, pending: dict[int, StepArrival], out: Outcome, headers: HeaderReader | None
    ) -> None:
        super().__init__(worker, out, headers)
        self.pending = pending
        self.order = sorted(pending)
        self.position = 0

    def peek(self) -> int | None:
        if self.position >= len(self.order):
            return None
        arrival = self.pending[self.order[self.position]]
        frontier = self.state.frontier.get(self.worker)
        if arrival.prev_step == frontier or arrival.bad is not None:
            return arrival.step
        return None

    def take(self, step: int) -> StepHeader | None:
        arrival = self.pending[self.order[self.position]]
        self.position += 1
        self.state.frontier[self.worker] = step
        self.out.consumed.append((step, self.worker))
        if arrival.bad is not None:
            self._unreadable(arrival.bad)  # said once (the ingest may have said it already)
            return None
        if arrival.header is not None:
            return arrival.header
        if self.headers is None:
            raise RuntimeError(f"{arrival.key} is buffered without its header and no reader was given")
        try:
            return self.headers.step(arrival)
        except UnreadableObject as exc:
            self._unreadable(str(exc))
            return None


class _SegmentChain(_Chain):
    """Format 2: segments chained by ``seq``; the current one may be consumed step by step."""

    def __init__(
        self, worker: int, pending: dict[int, SegmentArrival], out: Outcome, headers: HeaderReader | None
    ) -> None:
        super().__init__(worker, out, headers)
        self.pending = pending
        self.opened: SegmentArrival | None = None
        self.header: SegmentHeader | None = None
        self.index = 0

    def _current(self) -> SegmentArrival | None:
        """The worker's current segment, opened, past every step already evaluated."""
        while True:
            seq = self.state.segment_frontier.get(self.worker, -1) + 1
            arrival = self.pending.get(seq)
            if arrival is None:
                return None
            if self.opened is not arrival:
                self._open(arrival)
            if self.header is None:  # bad: its steps are unknown, it moves the chain past them
                if arrival.last_step > self._frontier():
                    return arrival
            elif self.index < len(self.header.steps):
                return arrival
            self._finish(arrival)

    def _open(self, arrival: SegmentArrival) -> None:
        self.opened, self.header, self.index = arrival, None, 0
        if arrival.bad is not None:
            self._unreadable(arrival.bad)  # said once (the ingest may have said it already)
            return
        header = arrival.header
        if header is None:
            if self.headers is None:
                raise RuntimeError(f"{arrival.key} is buffered without its header and no reader was given")
            try:
                header = self.headers.segment(arrival)
            except UnreadableObject as exc:
                self._unreadable(str(exc))
                return
        frontier = self._frontier()
        if arrival.seq > 0 and frontier < header.first_step and header.prev_step != frontier:
            # the chain is still ordered by seq; a gap or overlap in steps is worth a reason
            self._unreadable(
                f"{arrival.key}: prev_step {header.prev_step}, but the worker's previous segment "
                f"ended at step {frontier}"
            )
        self.header = header
        self.index = bisect.bisect_right(header.steps, frontier, key=lambda entry: entry.step)

    def _finish(self, arrival: SegmentArrival) -> None:
        if self.header is not None:  # counted once: the chain passes each seq once
            self.state.add_dropped(self.header.dropped)
        self.state.segment_frontier[self.worker] = arrival.seq
        self.state.frontier[self.worker] = max(self._frontier(), arrival.last_step)
        self.out.consumed_segments.append(arrival)
        self.opened, self.header = None, None

    def peek(self) -> int | None:
        arrival = self._current()
        if arrival is None:
            return None
        if self.header is None:
            return max(arrival.first_step, self._frontier() + 1)
        return self.header.steps[self.index].step

    def take(self, step: int) -> StepHeader | None:
        arrival = self._current()
        assert arrival is not None
        if self.header is None:
            self._finish(arrival)
            return None
        view = self.header.step_header(self.index)
        self.index += 1
        self.state.frontier[self.worker] = view.step
        if self.index == len(self.header.steps):
            self._finish(arrival)
        return view


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
            if arrival.batch is not None:  # the monitor's own drops count like the hook's (once per seq)
                drops = {"system_samples": arrival.batch.dropped_samples}
                state.add_dropped({**drops, "system_events": arrival.batch.dropped_events})
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
            rule_state = out.rule_states.load(record, rule)
            rule_state, findings = rule.update(rule_state, data)
            other_job = rule.compares_with()
            if other_job is not None and other_steps is not None and not findings:
                # a cross-job rule: the other job's data must be written already (a reference run).
                # A step it lacks is None (the rule counts it); a job that did not allow the
                # comparison, or cannot be read, raises: this rule ends Error with the reason.
                other = other_steps(other_job, data.step)
                rule_state, findings = rule.compare(rule_state, data, other)
            out.rule_states.keep(record, rule, rule_state)
        except Exception as exc:  # a rule bug or data it cannot handle: Error for this rule only
            out.rule_states.discard(record)
            _set_status(
                out,
                record,
                "Error",
                f"RuleEvaluationError at step {data.step}: {type(exc).__name__}: {exc}",
                now,
            )
            continue
        if findings:
            _fire(out, record, findings[0], now, data)


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


def _fire(
    out: Outcome, record: RuleRecord, finding: Finding, now: float, data: StepData | None = None
) -> None:
    record.step = finding.step
    record.mode, record.mode_step = _mode_step(data, finding.step)
    if record.mode is None and finding.mode is not None:  # the step has passed: the rule knows
        record.mode, record.mode_step = finding.mode, finding.mode_step
    record.value = _finite_or_none(finding.value)
    record.value_text = None if finding.value is None or record.value is not None else fmt(finding.value)
    record.threshold = _finite_or_none(finding.threshold)
    record.tensor = finding.tensor
    _set_status(out, record, "IssuesFound", finding.details(), now)


def _mode_step(data: StepData | None, step: int) -> tuple[Mode | None, int | None]:
    """The mode of global step ``step`` and its mode step (TRAIN first when a step holds several)."""
    if data is None or data.step != step:
        return None, None
    for mode in data.modes():
        for header in data.workers:
            record = header.modes.get(mode)
            if record is not None:
                return mode, record.mode_step
    return None, None


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
    dropped = out.state.dropped_summary() if status in FINAL_STATUSES else ""
    if dropped:
        # a verdict on data the hook could not record completely says so
        note = f" The hook dropped {dropped}: this verdict does not cover them."
        details = details[: MAX_DETAILS_CHARS - len(note)] + note
    record.details = details[:MAX_DETAILS_CHARS]
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
        Mode=record.mode,
        ModeStep=record.mode_step,
        Value=record.value,
        ValueText=record.value_text,
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
        Dropped=dict(state.dropped),
        DroppedObjects=state.dropped_objects,
        EndReason=state.end_reason,
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

"""The job pipeline of the evaluate function: ingest → buffer → advance → commit → publish.

1. **ingest**: one S3 object of a job (a segment, a step object, a manifest, an end marker, a
   system batch) is read with bounded ranged GETs and checked against its key;
2. **buffer**: a segment or step object is buffered in the state table as a *pointer* (key,
   size, header length, chain links: ~100 bytes whatever the model size) and its decoded
   header kept in this process's cache;
3. **advance**: the job's state and everything buffered are read in one Query, and the pure
   evaluator (``trainguard.engine.evaluator.advance``) evaluates every complete step in order,
   re-reading a header only when the cache does not hold it;
4. **commit**: the new state is written if its version is still the one read, with the events
   of its status changes in the same transaction (the outbox);
5. **publish**: the events go to EventBridge, then the outbox entries and the consumed
   buffer items are deleted.

Correctness under at-least-once, unordered, concurrent delivery rests on three things:
every arrival is *put* before the job is read, so whoever reads last sees it; the state is
written only if its version is still the one read (a loser re-reads); events are written
to the outbox with the status change and published afterwards (an unpublished entry is
retried by the next invocation for that job). Event ids are deterministic, so consumers
drop the rare repeat.

Isolation: every entry point works on one job at a time under that job's time budget
(:mod:`trainguard.service.budget`); the clock's tick contains each job's failure, reports
it per job, and bounds its own work (at most ``MAX_JOBS_PER_TICK`` jobs, taken in a rotating
order, within the invocation's remaining time), so a slow or broken job never delays
another's evaluation or clock tick.

Limits checked here before anything is stored or sent: the state item (DynamoDB's 400 KB:
the largest rule state is shed with an Error status that says why), each event's size
(``fit_detail``), PutEvents requests (10 entries and 256 KB), buffered system batches.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from trainguard.engine.evaluator import (
    Outcome,
    advance,
    apply_clock,
    apply_end,
    apply_manifest,
    apply_stale,
    build_event,
    build_job_event,
    record_invalid,
    request_stop,
    shed_largest_rule_state,
)
from trainguard.engine.events import fit_detail
from trainguard.engine.model import JobState, SegmentArrival, StepArrival, Transition
from trainguard.engine.sources import (
    ComparisonRefused,
    ObjectError,
    OtherJobs,
    bad_segment,
    bad_step,
    header_probe_bytes,
    read_end,
    read_manifest,
    segment_arrival,
    step_arrival,
    system_arrival,
)
from trainguard.format.layout import (
    INGEST_PREFIX,
    LayoutError,
    ObjectKind,
    ObjectRef,
    job_prefix,
    parse_key,
    validate_job_name,
)
from trainguard.format.system import MAX_SYSTEM_BYTES
from trainguard.service.budget import Deadline, JobTimeBudgetExceeded, time_budget
from trainguard.service.publisher import Publisher, PublishError
from trainguard.service.s3_objects import (
    HeaderCache,
    ObjectMissing,
    S3Headers,
    S3Job,
    read_document,
    read_head,
)
from trainguard.service.state_store import MAX_ITEM_BYTES, ItemTooLarge, Loaded, StateStore, VersionConflict
from trainguard.text import printable

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
#: read-modify-write rounds per update (each commits progress); past it, SQS redelivers
MAX_ROUNDS = 64
#: an outbox entry older than this was left by an invocation that died before publishing;
#: younger ones are being published by the invocation that wrote them
OUTBOX_ORPHAN_AFTER_S = 30.0
#: one job's time per invocation (evaluate) or per tick (clock); the hard edge follows it
JOB_BUDGET_S = 20.0
#: jobs one tick looks at, at most; with more active jobs, consecutive ticks rotate through them
MAX_JOBS_PER_TICK = 200
#: active jobs a tick lists, at most (the sparse index holds keys only)
MAX_ACTIVE_JOBS_LISTED = 10_000
#: a job that has sent nothing for this long is ended by the clock (the default of the
#: TRAINGUARD_STALE_JOB_DAYS setting)
DEFAULT_STALE_AFTER_S = 7 * 24 * 3600.0
#: rule states shed at most per commit before the state is refused outright
MAX_SHEDS = 64

Mutation = Callable[[JobState, Loaded], Outcome]
T = TypeVar("T")


def _unchanged(state: JobState, loaded: Loaded) -> Outcome:
    return Outcome(state)


class PermanentError(Exception):
    """Retrying cannot help (bad key, bad object): the message goes to the DLQ with this reason."""


@dataclass
class Result:
    job: str
    kind: str
    transitions: int = 0
    steps_evaluated: int = 0
    #: why this job's work failed (the other jobs went on); None when it succeeded
    error: str | None = None
    #: the time budget ran out with work left (the next invocation or tick goes on)
    unfinished: bool = False


def _parsed(parse: Callable[[bytes], T], raw: bytes) -> T:
    """A document parsed, or a PermanentError with the parser's reason (never a retry)."""
    try:
        return parse(raw)
    except ObjectError as exc:
        raise PermanentError(str(exc)) from None


def last_activity(state: JobState, loaded: Loaded) -> float | None:
    """When data last arrived for the job: its state's record and the buffered items' times."""
    times = [a.at for a in loaded.arrivals] + [a.at for a in loaded.system]
    if state.last_activity is not None:
        times.append(state.last_activity)
    known = [t for t in times if t > 0]
    return max(known) if known else None


class JobPipeline:
    """ingest → buffer → advance → commit → publish, against one bucket and one state table.

    Parameters
    ----------
    store
        The state table adapter.
    s3
        A boto3 S3 client.
    publisher
        The EventBridge adapter.
    bucket
        The stack's data bucket: a record naming any other bucket is refused, never judged.
    ingest_prefix
        Where job folders live in the bucket (``jobs/``).
    clock
        Seconds since the epoch (tests pass a fake).
    on_commit
        Called after each committed evaluation (metrics); its failure never fails the evaluation.
    cache
        Decoded headers kept by this process (shared by every job it evaluates).
    stale_after_s
        A job that has sent nothing for this long is ended by the clock's tick (None: never).
    job_budget_s
        Each job's time per invocation (soft: between steps; hard: ``SIGALRM`` in the main thread).
    """

    def __init__(
        self,
        store: StateStore,
        s3: Any,
        publisher: Publisher,
        bucket: str,
        ingest_prefix: str = INGEST_PREFIX,
        clock: Callable[[], float] = time.time,
        on_commit: Callable[[str, Outcome, list[Transition]], None] | None = None,
        cache: HeaderCache | None = None,
        stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
        job_budget_s: float = JOB_BUDGET_S,
    ) -> None:
        self.store = store
        self.s3 = s3
        self.publisher = publisher
        self.bucket = bucket
        self.ingest_prefix = ingest_prefix
        self.clock = clock
        self.on_commit = on_commit
        self.cache = cache if cache is not None else HeaderCache()
        self.stale_after_s = stale_after_s
        self.job_budget_s = job_budget_s
        #: other jobs in the same bucket, for cross-job rules (SimilarAcrossRuns)
        self.other_jobs = OtherJobs(self._other_job)
        #: per thread (the local mode runs handlers in threads): the deadline of the job being
        #: worked on, the soft edge of its budget
        self._local = threading.local()

    # entry points -----------------------------------------------------------------------
    def handle_object(self, bucket: str, key: str) -> Result:
        """Ingest one object and evaluate its job (what one SQS record asks for)."""
        job = self.ingest(bucket, key)
        if job is None:
            return Result(parse_key(key, self.ingest_prefix).job, "ignored")
        return self.advance_job(job)

    def ingest(self, bucket: str, key: str) -> str | None:
        """Record one object; return the job to advance (None: nothing to evaluate).

        A batch ingests all its objects first and then advances each job once, so ten
        segments of one job cost one read-modify-write of its state, not ten.
        """
        if bucket != self.bucket:
            raise PermanentError(
                f"the record names bucket {printable(bucket[:80])!r}; "
                f"this stack evaluates only {self.bucket!r}"
            )
        try:
            ref = parse_key(key, self.ingest_prefix)
        except LayoutError as exc:
            raise PermanentError(str(exc)) from None
        now = self.clock()
        if ref.kind in (ObjectKind.SEGMENT, ObjectKind.STEP):
            self._buffer(key, ref, now)
            return ref.job
        if ref.kind is ObjectKind.SYSTEM:
            arrival = system_arrival(ref, self._document(key, MAX_SYSTEM_BYTES))
            arrival = self.store.put_system(ref.job, dataclasses.replace(arrival, at=now))
            if arrival.bad is not None:
                raise PermanentError(arrival.bad)
            return ref.job
        if ref.kind is ObjectKind.MANIFEST:
            manifest = _parsed(read_manifest, self._document(key))
            if manifest.job != ref.job:
                raise PermanentError(f"manifest names job {manifest.job!r} but lies under {ref.job!r}")
            self._update(ref.job, lambda s, _: apply_manifest(s, manifest, self.clock()))
            return None
        if ref.kind is ObjectKind.END:
            marker = _parsed(read_end, self._document(key))
            if (marker.job, marker.worker) != (ref.job, ref.worker):
                raise PermanentError(
                    f"end marker for {marker.job!r}/{marker.worker} lies under {ref.job!r}/{ref.worker}"
                )
            self._update(ref.job, lambda s, _: apply_end(s, marker, self.clock()))
            return None
        return None  # stop signals and reports are the service's own objects

    def advance_job(self, job: str) -> Result:
        return self._update(job, _unchanged)

    @contextmanager
    def budget(self, what: str, seconds: float | None = None) -> Iterator[Deadline]:
        """Work on one job (or one message) within a time budget (``job_budget_s`` by default).

        The evaluation stops between steps at the soft edge; the hard edge raises
        :class:`~trainguard.service.budget.JobTimeBudgetExceeded` (main thread only).
        """
        seconds = self.job_budget_s if seconds is None else seconds
        with time_budget(seconds, what) as deadline:
            self._local.deadline = deadline
            try:
                yield deadline
            finally:
                self._local.deadline = Deadline(None)

    def isolated(
        self, job: str, kind: str, work: Callable[[], Result], budget_s: float | None = None
    ) -> Result:
        """Run one job's ``work`` within its time budget; its failure is its own Result.

        PermanentError, transient errors and a spent budget alike become ``Result.error``
        (logged with the job's name); the caller goes on with the next job.
        """
        try:
            with self.budget(f"job {job}", budget_s):
                return work()
        except JobTimeBudgetExceeded as exc:
            logger.error("job %s: %s", printable(job), exc)
            return Result(job, kind, error=str(exc))
        except Exception as exc:
            logger.exception("job %s: %s failed; the other jobs go on", printable(job), kind)
            return Result(job, kind, error=f"{type(exc).__name__}: {exc}"[:1000])

    def tick(self, deadline: Deadline | None = None) -> list[Result]:
        """The schedule's tick: clock-driven rules of every active job look at the time.

        Each job is isolated (its failure or hang is its own Result); a job silent for
        ``stale_after_s`` is ended. At most ``MAX_JOBS_PER_TICK`` jobs per tick, in an order
        that rotates every minute, and none started after ``deadline``: the tick's work is
        bounded however many jobs are active.
        """
        deadline = deadline or Deadline(None)
        now = self.clock()
        jobs = sorted(self.store.active_jobs(limit=MAX_ACTIVE_JOBS_LISTED))
        if not jobs:
            return []
        offset = (int(now // 60) * MAX_JOBS_PER_TICK) % len(jobs)
        chosen = (jobs[offset:] + jobs[:offset])[:MAX_JOBS_PER_TICK]
        results: list[Result] = []
        for job in chosen:
            if deadline.passed():
                results.append(Result(job, "tick", unfinished=True))
                continue
            remaining = deadline.remaining()
            budget = self.job_budget_s if remaining is None else max(0.1, min(self.job_budget_s, remaining))
            work = functools.partial(self._update, job, self._clock_mutation(), "tick")
            results.append(self.isolated(job, "tick", work, budget))
        return results

    def request_stop(self, job: str) -> Result:
        return self._update(job, lambda s, _: request_stop(s, self.clock()), kind="stop")

    # internals --------------------------------------------------------------------------
    def _clock_mutation(self) -> Mutation:
        def mutate(state: JobState, loaded: Loaded) -> Outcome:
            now = self.clock()
            clock = apply_clock(state, now)
            if self.stale_after_s is None or clock.state.finished:
                return clock
            seen = last_activity(clock.state, loaded)
            if seen is None:
                # a state written before arrival times were kept: its silence counts from now
                fresh = clock.state.model_copy(deep=True)
                fresh.last_activity = now
                return Outcome(fresh, clock.transitions, changed=True)
            stale = apply_stale(clock.state, now, seen, self.stale_after_s)
            if not stale.changed:
                return clock
            return Outcome(stale.state, clock.transitions + stale.transitions, changed=True)

        return mutate

    def _other_job(self, name: str) -> S3Job:
        """Another job of this stack's bucket (never another bucket, never a path)."""
        try:
            validate_job_name(name)
        except LayoutError as exc:
            raise ComparisonRefused(
                f"other_trials {printable(name[:80])!r} is not a job of this stack: {exc}"
            ) from None
        return S3Job(self.bucket, job_prefix(name, self.ingest_prefix), self.s3, job=name)

    def _document(self, key: str, limit: int | None = None) -> bytes:
        try:
            if limit is None:
                return read_document(self.s3, self.bucket, key)
            return read_document(self.s3, self.bucket, key, limit)
        except ObjectError as exc:
            raise PermanentError(str(exc)) from None
        except ObjectMissing:
            raise PermanentError(f"{key} no longer exists (NoSuchKey)") from None

    def _buffer(self, key: str, ref: ObjectRef, now: float) -> None:
        """Read a segment's or step object's header, cache it, buffer its pointer.

        A missing (NoSuchKey) or unreadable object is buffered as a bad arrival: its key gives
        its place in the worker's chain, so the job moves on without it; the reason is
        recorded in the job's state and the message goes to the DLQ with it.
        """
        arrival: StepArrival | SegmentArrival
        try:
            head, size = read_head(self.s3, self.bucket, key, header_probe_bytes(ref))
        except ObjectMissing:
            reason = "no longer exists (NoSuchKey) when it was read"
            arrival = bad_segment(ref, reason) if ref.kind is ObjectKind.SEGMENT else bad_step(ref, reason)
        else:
            arrival = (
                segment_arrival(ref, head, size)
                if ref.kind is ObjectKind.SEGMENT
                else step_arrival(ref, head, size)
            )
        arrival = dataclasses.replace(arrival, at=now)
        if arrival.header is not None:
            self.cache.put(self.bucket, key, arrival.size, arrival.header, arrival.header_end)
        self.store.put_arrival(ref.job, arrival)
        if arrival.bad is not None:
            reason = arrival.bad
            self._update(ref.job, lambda s, _: record_invalid(s, reason))
            raise PermanentError(reason)

    def _headers(self, job: str) -> S3Headers:
        return S3Headers(self.s3, self.bucket, job_prefix(job, self.ingest_prefix), job, self.cache)

    def _update(self, job: str, mutate: Mutation, kind: str = "job") -> Result:
        """Read-modify-write of the job until nothing is left to do; then clean up and publish.

        After a commit the job is read once more: an arrival put while we evaluated may have
        been read by its own invocation *before* our commit (so it saw, say, no manifest yet
        and did nothing). Its put happened before our commit, so our next read sees it —
        no wake-up is lost, whatever the interleaving. The job's time budget ends the rounds
        early (progress is committed; the next invocation or tick goes on).
        """
        result = Result(job, kind)
        conflicts = 0
        headers = self._headers(job)
        deadline: Deadline = getattr(self._local, "deadline", Deadline(None))
        for _ in range(MAX_ROUNDS):
            loaded = self.store.load(job)
            now = self.clock()
            first = mutate(loaded.state, loaded)
            second = advance(
                first.state,
                loaded.arrivals,
                now,
                system=loaded.system,
                other_steps=self.other_jobs.for_job(job),
                headers=headers,
                out_of_time=deadline.passed,
            )
            transitions = first.transitions + second.transitions
            if not (first.changed or second.changed):
                self._after(loaded, second, {})
                return result
            try:
                second, transitions, events = self._commit(loaded, second, transitions, now)
            except VersionConflict:
                conflicts += 1
                if conflicts >= MAX_ATTEMPTS:
                    break
                time.sleep(random.uniform(0, 0.02 * conflicts))
                continue
            if self.on_commit is not None:
                try:
                    self.on_commit(job, second, transitions)
                except Exception:  # metrics are best effort: the verdicts are already committed
                    logger.exception("on_commit hook failed for job %s", printable(job))
            result.transitions += len(transitions)
            result.steps_evaluated += second.state.steps_evaluated - loaded.state.steps_evaluated
            self._after(loaded, second, events)
            mutate = _unchanged  # the change is applied; now only look for more work
            if deadline.passed():
                result.unfinished = True
                return result
        raise VersionConflict(f"job {job}: conflicting writers or too much work; SQS will redeliver")

    def _commit(
        self, loaded: Loaded, outcome: Outcome, transitions: list[Transition], now: float
    ) -> tuple[Outcome, list[Transition], dict[str, str]]:
        """Write the outcome's state and its events; a state too large for its item sheds the
        largest rule state (that rule ends Error, saying why) until it fits."""
        for _ in range(MAX_SHEDS):
            state = outcome.state
            events = {
                f"{t.record.name}/{t.record.transitions}": fit_detail(build_event(state, t))
                for t in transitions
            }
            if state.finished and not loaded.state.finished:
                events["job/finished"] = fit_detail(build_job_event(state, now))
            try:
                self.store.commit(state, loaded.version, events, now)
            except ItemTooLarge as exc:
                shed = shed_largest_rule_state(state, now, exc.nbytes, MAX_ITEM_BYTES)
                if not shed.changed:
                    raise PermanentError(str(exc)) from None
                logger.warning("%s; shedding the largest rule state", exc)
                outcome = dataclasses.replace(outcome, state=shed.state)
                transitions = transitions + shed.transitions
                continue
            return outcome, transitions, events
        raise PermanentError(
            f"job {loaded.state.job}: the state does not fit one item after {MAX_SHEDS} sheds"
        )

    def _after(self, loaded: Loaded, outcome: Outcome, new_events: dict[str, str]) -> None:
        job = loaded.state.job
        if outcome.consumed:
            self.store.delete_steps(job, outcome.consumed)
        if outcome.consumed_segments:
            self.store.delete_segments(job, outcome.consumed_segments)
        if outcome.consumed_system:
            self.store.delete_system(job, outcome.consumed_system)
        cutoff = self.clock() - OUTBOX_ORPHAN_AFTER_S
        orphans = {k: detail for k, (detail, created) in loaded.outbox.items() if created < cutoff}
        pending = {**orphans, **new_events}
        if pending:
            try:
                published = self.publisher.publish(pending)
            except PublishError as exc:
                # what was accepted leaves the outbox; the rest is published by a later invocation
                self.store.delete_outbox(job, exc.published)
                raise
            self.store.delete_outbox(job, published)

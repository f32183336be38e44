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
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.engine.evaluator import (
    Outcome,
    advance,
    apply_clock,
    apply_end,
    apply_manifest,
    build_event,
    build_job_event,
    record_invalid,
    request_stop,
)
from trainguard.engine.model import JobState, SegmentArrival, StepArrival, Transition
from trainguard.engine.sources import (
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
from trainguard.format.layout import INGEST_PREFIX, LayoutError, ObjectKind, ObjectRef, job_prefix, parse_key
from trainguard.service.publisher import Publisher
from trainguard.service.s3_objects import (
    HeaderCache,
    ObjectMissing,
    S3Headers,
    S3Job,
    read_document,
    read_head,
)
from trainguard.service.state_store import Loaded, StateStore, VersionConflict

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
#: read-modify-write rounds per update (each commits progress); past it, SQS redelivers
MAX_ROUNDS = 64
#: an outbox entry older than this was left by an invocation that died before publishing;
#: younger ones are being published by the invocation that wrote them
OUTBOX_ORPHAN_AFTER_S = 30.0


def _unchanged(state: JobState) -> Outcome:
    return Outcome(state)


class PermanentError(Exception):
    """Retrying cannot help (bad key, bad object): the message goes to the DLQ with this reason."""


@dataclass
class Result:
    job: str
    kind: str
    transitions: int = 0
    steps_evaluated: int = 0


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
    ) -> None:
        self.store = store
        self.s3 = s3
        self.publisher = publisher
        self.bucket = bucket
        self.ingest_prefix = ingest_prefix
        self.clock = clock
        self.on_commit = on_commit
        self.cache = cache if cache is not None else HeaderCache()
        #: other jobs in the same bucket, for cross-job rules (SimilarAcrossRuns)
        self.other_steps = OtherJobs(lambda job: S3Job(bucket, f"{ingest_prefix}{job}", s3, job=job))

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
                f"the record names bucket {bucket[:80]!r}; this stack evaluates only {self.bucket!r}"
            )
        try:
            ref = parse_key(key, self.ingest_prefix)
        except LayoutError as exc:
            raise PermanentError(str(exc)) from None
        if ref.kind in (ObjectKind.SEGMENT, ObjectKind.STEP):
            self._buffer(key, ref)
            return ref.job
        if ref.kind is ObjectKind.SYSTEM:
            arrival = system_arrival(ref, self._document(key))
            self.store.put_system(ref.job, arrival)
            if arrival.bad is not None:
                raise PermanentError(arrival.bad)
            return ref.job
        if ref.kind is ObjectKind.MANIFEST:
            manifest = read_manifest(self._document(key))
            if manifest.job != ref.job:
                raise PermanentError(f"manifest names job {manifest.job!r} but lies under {ref.job!r}")
            self._update(ref.job, lambda s: apply_manifest(s, manifest, self.clock()))
            return None
        if ref.kind is ObjectKind.END:
            marker = read_end(self._document(key))
            if (marker.job, marker.worker) != (ref.job, ref.worker):
                raise PermanentError(
                    f"end marker for {marker.job!r}/{marker.worker} lies under {ref.job!r}/{ref.worker}"
                )
            self._update(ref.job, lambda s: apply_end(s, marker))
            return None
        return None  # stop signals and reports are the service's own objects

    def advance_job(self, job: str) -> Result:
        return self._update(job, _unchanged)

    def tick(self) -> list[Result]:
        """The schedule's tick: clock-driven rules of every active job look at the time."""
        return [self._update(job, lambda s: apply_clock(s, self.clock())) for job in self.store.active_jobs()]

    def request_stop(self, job: str) -> Result:
        return self._update(job, lambda s: request_stop(s, self.clock()), kind="stop")

    # internals --------------------------------------------------------------------------
    def _document(self, key: str) -> bytes:
        try:
            return read_document(self.s3, self.bucket, key)
        except ObjectError as exc:
            raise PermanentError(str(exc)) from None
        except ObjectMissing:
            raise PermanentError(f"{key} no longer exists (NoSuchKey)") from None

    def _buffer(self, key: str, ref: ObjectRef) -> None:
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
        if arrival.header is not None:
            self.cache.put(self.bucket, key, arrival.size, arrival.header, arrival.header_end)
        self.store.put_arrival(ref.job, arrival)
        if arrival.bad is not None:
            reason = arrival.bad
            self._update(ref.job, lambda s: record_invalid(s, reason))
            raise PermanentError(reason)

    def _headers(self, job: str) -> S3Headers:
        return S3Headers(self.s3, self.bucket, job_prefix(job, self.ingest_prefix), job, self.cache)

    def _update(self, job: str, mutate: Callable[[JobState], Outcome], kind: str = "job") -> Result:
        """Read-modify-write of the job until nothing is left to do; then clean up and publish.

        After a commit the job is read once more: an arrival put while we evaluated may have
        been read by its own invocation *before* our commit (so it saw, say, no manifest yet
        and did nothing). Its put happened before our commit, so our next read sees it —
        no wake-up is lost, whatever the interleaving.
        """
        result = Result(job, kind)
        conflicts = 0
        headers = self._headers(job)
        for _ in range(MAX_ROUNDS):
            loaded = self.store.load(job)
            now = self.clock()
            first = mutate(loaded.state)
            second = advance(
                first.state,
                loaded.arrivals,
                now,
                system=loaded.system,
                other_steps=self.other_steps,
                headers=headers,
            )
            transitions = first.transitions + second.transitions
            if not (first.changed or second.changed):
                self._after(loaded, second, {})
                return result
            events = {
                f"{t.record.name}/{t.record.transitions}": build_event(second.state, t).model_dump_json()
                for t in transitions
            }
            if second.state.finished and not loaded.state.finished:
                events["job/finished"] = build_job_event(second.state, now).model_dump_json()
            try:
                self.store.commit(second.state, loaded.version, events, now)
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
                    logger.exception("on_commit hook failed for job %s", job)
            result.transitions += len(transitions)
            result.steps_evaluated += second.state.steps_evaluated - loaded.state.steps_evaluated
            self._after(loaded, second, events)
            mutate = _unchanged  # the change is applied; now only look for more work
        raise VersionConflict(f"job {job}: conflicting writers or too much work; SQS will redeliver")

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
            self.publisher.publish(list(pending.values()))
            self.store.delete_outbox(job, pending.keys())

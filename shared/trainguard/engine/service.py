"""The evaluate pipeline for one S3 object: read → buffer → advance → commit → publish.

Correctness under at-least-once, unordered, concurrent delivery rests on three things:
1. every step arrival is *put* before the job is read, so whoever reads last sees it;
2. the job state is written only if its version is still the one read (a loser re-reads);
3. events are written to an outbox in the same transaction as the status change, and
   published (then deleted) afterwards; an unpublished outbox entry is retried by the next
   invocation for that job. Event ids are deterministic, so consumers drop the rare repeat.
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
from trainguard.engine.model import JobState, StepArrival, Transition
from trainguard.engine.sources import (
    ObjectError,
    OtherJobs,
    S3Job,
    read_document,
    read_end,
    read_head,
    read_manifest,
    step_arrival,
    system_arrival,
)
from trainguard.engine.store import HeaderTooLarge, Loaded, StateStore, VersionConflict
from trainguard.format.layout import INGEST_PREFIX, LayoutError, ObjectKind, ObjectRef, parse_key

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


class Publisher:
    """EventBridge adapter: PutEvents in chunks of 10, failing loudly on any failed entry."""

    def __init__(self, client: Any, bus_name: str) -> None:
        self.client = client
        self.bus_name = bus_name
        self.requests = 0

    def publish(self, details: list[str]) -> None:
        from trainguard.engine.events import EVENT_SOURCE, detail_type

        for start in range(0, len(details), 10):
            entries = [
                {
                    "Source": EVENT_SOURCE,
                    "DetailType": detail_type(d),
                    "Detail": d,
                    "EventBusName": self.bus_name,
                }
                for d in details[start : start + 10]
            ]
            self.requests += 1
            resp = self.client.put_events(Entries=entries)
            if resp.get("FailedEntryCount", 0):
                codes = {e.get("ErrorCode") for e in resp.get("Entries", []) if e.get("ErrorCode")}
                raise RuntimeError(
                    f"PutEvents failed for {resp['FailedEntryCount']} entries: {sorted(codes)}"
                )


@dataclass
class Result:
    job: str
    kind: str
    transitions: int = 0
    steps_evaluated: int = 0


class EvaluateService:
    def __init__(
        self,
        store: StateStore,
        s3: Any,
        publisher: Publisher,
        ingest_prefix: str = INGEST_PREFIX,
        clock: Callable[[], float] = time.time,
        on_commit: Callable[[str, Outcome, list[Transition]], None] | None = None,
        bucket: str | None = None,
    ) -> None:
        self.store = store
        self.s3 = s3
        self.publisher = publisher
        self.ingest_prefix = ingest_prefix
        self.clock = clock
        #: called after each committed evaluation (metrics); never fails the evaluation
        self.on_commit = on_commit
        #: other jobs in the same bucket, for cross-job rules (SimilarAcrossRuns)
        self.other_steps = (
            OtherJobs(lambda job: S3Job(bucket, f"{ingest_prefix}{job}", s3, job=job)) if bucket else None
        )
        self.s3_requests = 0

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
        step objects of one job cost one read-modify-write of its state, not ten.
        """
        try:
            ref = parse_key(key, self.ingest_prefix)
        except LayoutError as exc:
            raise PermanentError(str(exc)) from None
        if ref.kind is ObjectKind.STEP:
            self._on_step(bucket, key, ref)
            return ref.job
        if ref.kind is ObjectKind.SYSTEM:
            arrival = system_arrival(ref, self._document(bucket, key))
            self.store.put_system(ref.job, arrival)
            if arrival.bad is not None:
                raise PermanentError(arrival.bad)
            return ref.job
        if ref.kind is ObjectKind.MANIFEST:
            manifest = read_manifest(self._document(bucket, key))
            if manifest.job != ref.job:
                raise PermanentError(f"manifest names job {manifest.job!r} but lies under {ref.job!r}")
            self._update(ref, lambda s: apply_manifest(s, manifest, self.clock()))
            return None
        if ref.kind is ObjectKind.END:
            marker = read_end(self._document(bucket, key))
            if (marker.job, marker.worker) != (ref.job, ref.worker):
                raise PermanentError(
                    f"end marker for {marker.job!r}/{marker.worker} lies under {ref.job!r}/{ref.worker}"
                )
            self._update(ref, lambda s: apply_end(s, marker))
            return None
        return None  # stop signals and reports are the service's own objects

    def advance_job(self, job: str) -> Result:
        return self._update(ObjectRef(job, ObjectKind.STEP), lambda s: Outcome(s))

    def tick(self) -> list[Result]:
        """The schedule's tick: clock-driven rules of every active job look at the time."""
        return [
            self._update(ObjectRef(job, ObjectKind.STEP), lambda s: apply_clock(s, self.clock()))
            for job in self.store.active_jobs()
        ]

    def request_stop(self, job: str) -> Result:
        ref = ObjectRef(job, ObjectKind.STOP)
        return self._update(ref, lambda s: request_stop(s, self.clock()))

    # internals --------------------------------------------------------------------------
    def _document(self, bucket: str, key: str) -> bytes:
        self.s3_requests += 1
        try:
            return read_document(self.s3, bucket, key)
        except ObjectError as exc:
            raise PermanentError(str(exc)) from None
        except self.s3.exceptions.NoSuchKey:
            raise PermanentError(f"{key} no longer exists") from None

    def _on_step(self, bucket: str, key: str, ref: ObjectRef) -> None:
        self.s3_requests += 1
        try:
            head, size = read_head(self.s3, bucket, key)
        except self.s3.exceptions.NoSuchKey:
            raise PermanentError(f"{key} no longer exists") from None
        arrival = step_arrival(ref, head, size)
        try:
            self.store.put_arrival(ref.job, arrival)
        except HeaderTooLarge as exc:
            # keep the worker's chain moving; the reason is recorded and dead-lettered
            assert ref.step is not None and ref.worker is not None
            arrival = StepArrival(ref.step, ref.worker, None, None, bad=str(exc))
            self.store.put_arrival(ref.job, arrival)
        if arrival.bad is not None:
            reason = arrival.bad
            self._update(ref, lambda s: record_invalid(s, reason))
            raise PermanentError(reason)

    def _update(self, ref: ObjectRef, mutate: Callable[[JobState], Outcome]) -> Result:
        """Read-modify-write of the job until nothing is left to do; then clean up and publish.

        After a commit the job is read once more: an arrival put while we evaluated may have
        been read by its own invocation *before* our commit (so it saw, say, no manifest yet
        and did nothing). Its put happened before our commit, so our next read sees it —
        no wake-up is lost, whatever the interleaving.
        """
        result = Result(ref.job, ref.kind.value)
        conflicts = 0
        for _ in range(MAX_ROUNDS):
            loaded = self.store.load(ref.job)
            now = self.clock()
            first = mutate(loaded.state)
            second = advance(
                first.state, loaded.arrivals, now, system=loaded.system, other_steps=self.other_steps
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
                    self.on_commit(ref.job, second, transitions)
                except Exception:  # metrics are best effort: the verdicts are already committed
                    logger.exception("on_commit hook failed for job %s", ref.job)
            result.transitions += len(transitions)
            result.steps_evaluated += second.state.steps_evaluated - loaded.state.steps_evaluated
            self._after(loaded, second, events)
            mutate = _unchanged  # the change is applied; now only look for more work
        raise VersionConflict(f"job {ref.job}: conflicting writers or too much work; SQS will redeliver")

    def _after(self, loaded: Loaded, outcome: Outcome, new_events: dict[str, str]) -> None:
        job = loaded.state.job
        if outcome.consumed:
            self.store.delete_steps(job, outcome.consumed)
        if outcome.consumed_system:
            self.store.delete_system(job, outcome.consumed_system)
        cutoff = self.clock() - OUTBOX_ORPHAN_AFTER_S
        orphans = {k: detail for k, (detail, created) in loaded.outbox.items() if created < cutoff}
        pending = {**orphans, **new_events}
        if pending:
            self.publisher.publish(list(pending.values()))
            self.store.delete_outbox(job, pending.keys())

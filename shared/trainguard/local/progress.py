"""The live view of a local run: what each job wrote and what was evaluated, as it happens.

One :class:`Progress` watches a :class:`~trainguard.local.runtime.LocalCloud` through its
``on_invoke``/``on_event`` callbacks and a background thread, and prints:

- the job's own output, each line prefixed with the time and the job's label;
- a status line per running job: the last step each worker wrote and the last one evaluated,
  the rules' statuses (counts, with the rules that found issues and where) and the alerts
  sent. On a terminal it is one line redrawn in place under the job's output; otherwise a
  plain line every ``plain_every_s`` seconds when something changed, so a log stays short;
- lines for what matters when it happens: a rule that found issues or failed, each alert's
  email and SMS text, a stop request, the report written, an error of the local runtime;
- while a job has printed nothing and written nothing yet, how long it has been starting
  and why (``starting_hint``: e.g. the process is importing PyTorch), instead of silence.

``verbose=True`` adds a line per function invocation (what the previous view printed).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import unquote_plus

from trainguard.format import layout
from trainguard.text import printable

#: how often the thread looks at the alerts topic and the runtime's errors, and redraws
TICK_S = 0.2
#: how often the state table is read for the steps evaluated and the rule statuses
STATE_POLL_S = 1.0
SHOWN_WORKERS = 4
LOUD_STATUSES = ("IssuesFound", "Error")


@dataclass
class JobView:
    """What the view knows about one job."""

    job: str
    label: str
    started: float
    starting_hint: str = ""
    output_lines: int = 0
    objects: int = 0
    outside_layout: int = 0
    #: worker -> last step it wrote (from the objects delivered to the evaluate function)
    written: dict[int, int] = field(default_factory=dict)
    #: worker -> last step of it that was evaluated (from the job's state)
    evaluated: dict[int, int] = field(default_factory=dict)
    system_batches: int = 0
    statuses: dict[str, str] = field(default_factory=dict)
    fired_at: dict[str, int | None] = field(default_factory=dict)
    alerts: int = 0
    training_status: str = "InProgress"
    finished: bool = False
    process_ended: bool = False

    @property
    def active(self) -> bool:
        return not (self.finished and self.process_ended)


class Progress:
    """Prints a local run as it happens (see the module docstring)."""

    def __init__(
        self,
        cloud: Any,
        load_state: Callable[[str], Any] | None = None,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        verbose: bool = False,
        quiet: bool = False,
        plain_every_s: float = 10.0,
    ) -> None:
        self.cloud = cloud
        self.load_state = load_state
        self.stream = stream or sys.stdout
        self.tty = (self.stream.isatty() if tty is None else tty) and not quiet
        self.verbose = verbose
        self.quiet = quiet
        self.plain_every_s = plain_every_s
        self.t0 = time.monotonic()
        self.jobs: dict[str, JobView] = {}
        #: (job, notification) of every alert SNS published, in order
        self.alerts: list[tuple[str, dict[str, Any]]] = []
        self._message_jobs: dict[str, str] = {}
        self._sent_seen = 0
        self._errors_seen = 0
        self._lock = threading.RLock()
        self._status_shown = ""
        self._last_plain = time.monotonic()
        self._plain_shown = ""
        self._last_poll = 0.0
        self._stop = threading.Event()
        cloud.on_invoke.append(self._invoked)
        if hasattr(cloud, "on_begin"):
            cloud.on_begin.append(self._beginning)
        cloud.on_event.append(self._event)
        self._thread = threading.Thread(target=self._run, daemon=True, name="tg-progress")
        self._thread.start()

    # ------------------------------------------------------------------ output
    def _elapsed(self) -> str:
        return f"[{time.monotonic() - self.t0:7.2f}s]"

    def say(self, text: str, always: bool = False) -> None:
        """Print a line (above the status line on a terminal); ``always`` prints it even when quiet."""
        if self.quiet and not always:
            return
        with self._lock:
            self._clear_status()
            lines = text.splitlines() or [""]
            self.stream.write(f"{self._elapsed()} {lines[0]}\n" + "".join(f"{line}\n" for line in lines[1:]))
            self.stream.flush()
            self._draw_status()

    def job_started(self, job: str, label: str, starting_hint: str = "") -> None:
        """A job's process is about to start; ``starting_hint`` says what its first seconds are."""
        with self._lock:
            view = self._view(job)
            view.label, view.starting_hint, view.started = label, starting_hint, time.monotonic()
            view.process_ended = False

    def job_output(self, job: str, line: str) -> None:
        """One line the job printed."""
        with self._lock:
            view = self._view(job)
            view.output_lines += 1
            self.say(f"{view.label} │ {line.rstrip()}", always=True)

    def job_ended(self, job: str) -> None:
        with self._lock:
            self._view(job).process_ended = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            self._clear_status()

    def _view(self, job: str) -> JobView:
        view = self.jobs.get(job)
        if view is None:
            view = self.jobs[job] = JobView(job, job, time.monotonic())
        return view

    # ------------------------------------------------------------------ the status line
    def status_text(self, view: JobView) -> str:
        """One line about a job: written and evaluated per worker, rule statuses, alerts."""
        seconds = time.monotonic() - view.started
        head = f"▶ {view.job} {seconds:5.1f} s"
        if not view.objects and not view.output_lines:
            hint = f" ({view.starting_hint})" if view.starting_hint else ""
            return f"{head} │ starting: no output and no object from the job yet{hint}"
        parts = [head, "written " + _per_worker(view.written), "evaluated " + _per_worker(view.evaluated)]
        if view.system_batches:
            parts.append(f"{view.system_batches} system batches")
        if view.statuses:
            parts.append("rules " + _rule_summary(view))
        if view.alerts:
            parts.append(f"{view.alerts} alert{'s' if view.alerts != 1 else ''} sent")
        if view.outside_layout:
            parts.append(f"{view.outside_layout} objects outside the layout")
        if view.finished:
            parts.append(f"evaluation finished ({view.training_status})")
        return " │ ".join(parts)

    def _status_lines(self) -> list[str]:
        # rule names come from the job's configuration: escape bytes are shown, not obeyed
        return [printable(self.status_text(v)) for v in self.jobs.values() if v.active]

    def _clear_status(self) -> None:
        if self.tty and self._status_shown:
            self.stream.write("\r\x1b[2K")
            self._status_shown = ""

    def _draw_status(self) -> None:
        if not self.tty:
            return
        lines = self._status_lines()
        if not lines:
            return
        width = max(20, shutil.get_terminal_size((120, 24)).columns - 1)
        text = "  ".join(lines)
        text = text if len(text) <= width else text[: width - 1] + "…"
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._status_shown = text

    def _plain_tick(self) -> None:
        """Without a terminal: the status as a plain line now and then, when it changed."""
        now = time.monotonic()
        if self.tty or self.quiet or now - self._last_plain < self.plain_every_s:
            return
        self._last_plain = now
        lines = self._status_lines()
        # the seconds change every time: compare without them
        key = "\n".join(_without_seconds(line) for line in lines)
        starting = any(not v.objects and not v.output_lines for v in self.jobs.values() if v.active)
        if lines and (key != self._plain_shown or starting):
            self._plain_shown = key
            for line in lines:
                self.say(line)

    # ------------------------------------------------------------------ what the cloud does
    def _beginning(self, fid: str, event: dict[str, Any]) -> None:
        """Said before the function acts: the job may print that it was asked to stop at once."""
        detail = event.get("detail") if isinstance(event, dict) else None
        if fid != "stop_job" or not isinstance(detail, dict):
            return
        if detail.get("RuleEvaluationStatus") == "IssuesFound" and "StopTraining" in detail.get(
            "Actions", []
        ):
            job, rule = detail.get("TrainingJobName"), detail.get("RuleConfigurationName")
            self.say(f"■ stop_job: {rule} found issues in {job} and asks it to stop", always=True)

    def _invoked(self, fid: str, event: dict[str, Any], result: Any, seconds: float) -> None:
        with self._lock:
            if fid == "evaluate":
                self._delivered(event)
            elif fid == "notify" and isinstance(result, dict) and result.get("message_id"):
                job = event.get("detail", {}).get("TrainingJobName")
                if isinstance(job, str):
                    self._message_jobs[str(result["message_id"])] = job
            elif fid == "stop_job" and isinstance(result, dict) and result.get("stopped"):
                actions = ", ".join(str(a) for a in result.get("actions", []))
                self.say(f"■ stop_job: stop signal for {result.get('job')}: {actions}", always=True)
            elif fid == "report" and isinstance(result, dict) and result.get("report"):
                self.say(f"▤ report: wrote {result['report']}")
            elif fid.startswith("custom:"):
                self.say(f"λ {fid[len('custom:') :]}: {json.dumps(result, default=str)[:300]}", always=True)
            if self.verbose:
                self.say(f"λ {fid}: {json.dumps(result, default=str)[:160]} ({seconds * 1000:.0f} ms)")

    def _delivered(self, event: dict[str, Any]) -> None:
        for record in event.get("Records", []):
            try:
                body = json.loads(record["body"])
            except (KeyError, TypeError, ValueError):
                continue  # not an S3 notification: the evaluate function dead-letters it, with the reason
            for s3 in body.get("Records", []) if isinstance(body, dict) else []:
                try:
                    key = unquote_plus(s3["s3"]["object"]["key"])
                except (KeyError, TypeError):
                    continue
                self._object(key)

    def _object(self, key: str) -> None:
        job, _, _ = key[len(layout.INGEST_PREFIX) :].partition("/")
        try:
            ref = layout.parse_key(key)
        except layout.LayoutError:
            if job and key.startswith(layout.INGEST_PREFIX):
                self._view(job).outside_layout += 1
            return
        view = self._view(ref.job)
        view.objects += 1
        if ref.kind in (layout.ObjectKind.STEP, layout.ObjectKind.SEGMENT) and ref.worker is not None:
            last = ref.last_step if ref.last_step is not None else ref.step
            if last is not None:
                view.written[ref.worker] = max(view.written.get(ref.worker, -1), last)
        elif ref.kind is layout.ObjectKind.SYSTEM:
            view.system_batches += 1

    def _event(self, event: dict[str, Any]) -> None:
        detail = event.get("detail", {})
        job = detail.get("TrainingJobName")
        if not isinstance(job, str):
            return
        with self._lock:
            view = self._view(job)
            if "RuleName" not in detail:  # the job-level event: every step evaluated, the job ended
                view.finished = True
                view.training_status = str(detail.get("TrainingJobStatus", ""))
                self.say(
                    f"● {job}: evaluation finished ({view.training_status}, "
                    f"{detail.get('StepsEvaluated')} steps)",
                    always=True,
                )
                return
            rule, status = str(detail.get("RuleConfigurationName")), str(detail.get("RuleEvaluationStatus"))
            view.statuses[rule] = status
            if status == "IssuesFound":
                view.fired_at[rule] = detail.get("Step")
            if status in LOUD_STATUSES or self.verbose:
                at = f" at step {detail['Step']}" if detail.get("Step") is not None else ""
                self.say(
                    printable(f"● {job} / {rule}: {detail.get('PreviousStatus') or '—'} → {status}{at}"),
                    always=status in LOUD_STATUSES,
                )

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except Exception as exc:  # the view must never end the run; say what broke, once
                self.say(f"⚠ progress view: {type(exc).__name__}: {exc} (the run goes on)", always=True)
                self._stop.wait(STATE_POLL_S)

    def _tick(self) -> None:
        self._watch_alerts()
        self._watch_errors()
        now = time.monotonic()
        if self.load_state is not None and now - self._last_poll >= STATE_POLL_S:
            self._last_poll = now
            for view in [v for v in list(self.jobs.values()) if v.active]:
                self._poll_state(view)
        with self._lock:
            self._draw_status()
        self._plain_tick()

    def _poll_state(self, view: JobView) -> None:
        assert self.load_state is not None
        state = self.load_state(view.job)
        if state is None:
            return
        with self._lock:
            view.evaluated = dict(state.frontier)
            for record in state.rules:
                view.statuses[record.name] = record.status
                if record.status == "IssuesFound":
                    view.fired_at[record.name] = record.step
            view.training_status = state.training_status
            view.finished = view.finished or state.finished

    def _watch_alerts(self) -> None:
        try:
            sent = self.cloud.sent_notifications()
        except Exception:  # the cloud is starting or shutting down: look again next tick
            return
        for note in sent[self._sent_seen :]:
            self._sent_seen += 1
            with self._lock:
                job = self._message_jobs.get(str(note.get("message_id")), _job_of(note))
                self.alerts.append((job, note))
                self._view(job).alerts += 1
            lines = [
                f"✉ SNS → email {'(delivered)' if 'Email' in note['channels'] else '(filtered out)'}: "
                f"{note['subject']}"
            ]
            lines += ["    │ " + line for line in (note["email"] or "").splitlines()]
            lines.append(
                f"✆ SNS → SMS {'(delivered)' if 'SMS' in note['channels'] else '(filtered out)'}: "
                f"{note['sms']}"
            )
            self.say("\n".join(lines), always=True)

    def _watch_errors(self) -> None:
        errors = list(self.cloud.errors)
        for error in errors[self._errors_seen :]:
            self.say(f"⚠ local runtime: {error}", always=True)
        self._errors_seen = len(errors)


def _per_worker(steps: dict[int, int]) -> str:
    if not steps:
        return "—"
    shown = " ".join(f"w{w}:{s}" for w, s in sorted(steps.items())[:SHOWN_WORKERS])
    more = len(steps) - SHOWN_WORKERS
    return shown + (f" (+{more} workers)" if more > 0 else "")


def _rule_summary(view: JobView) -> str:
    counts: dict[str, int] = {}
    for status in view.statuses.values():
        counts[status] = counts.get(status, 0) + 1
    parts = []
    for status, count in sorted(counts.items(), key=lambda kv: (kv[0] not in LOUD_STATUSES, kv[0])):
        text = f"{count} {status}"
        if status in LOUD_STATUSES:
            names = [
                name + (f"@{view.fired_at[name]}" if view.fired_at.get(name) is not None else "")
                for name, s in view.statuses.items()
                if s == status
            ]
            text += f" ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
        parts.append(text)
    return ", ".join(parts)


def _without_seconds(line: str) -> str:
    head, sep, rest = line.partition(" s │ ")
    return head.rsplit(" ", 1)[0] + sep + rest if sep else line


def _job_of(note: dict[str, Any]) -> str:
    """The job an alert is about, from its email text (when notify's answer was not seen)."""
    for line in (note.get("email") or "").splitlines():
        if line.startswith("Training job:"):
            return line.split(":", 1)[1].strip()
    return "?"

"""What a local run leaves behind, and how ``trainguard status/replay/report`` find it.

The local cloud lives in memory (a moto server in the ``trainguard local`` or
``trainguard demo`` process). Before it goes, every job it saw is kept on disk::

    runs/
      <job>/                    the job folder, the same layout as s3://<bucket>/jobs/<job>/
                                (manifest.json, steps/ or segments/, system/, end/, control/,
                                report/profiler-report.html): trainguard replay/report read it
      _trainguard/
        session.json            the last local run: while it runs, its endpoint, state table
                                and process id (``trainguard status`` reads the live table);
                                after, when it finished and which jobs it kept
        <job>.status.json       the job's final statuses (the shape ``status --json`` prints),
                                every event its rules sent, and the alerts' email and SMS texts

Job names start with a letter or digit, so ``_trainguard`` can never be a job folder. A job
folder is replaced only when it came from an earlier local run (its status file exists);
anything else already there is left alone and the job is kept under another name.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.cli_errors import CommandError
from trainguard.format import layout

RESULTS = "_trainguard"
SESSION = "session.json"
FORMAT = "trainguard.local-results/1"
DEFAULT_RUNS = Path("runs")
#: a status or session file larger than this is not ours (they are a few hundred KB at most)
MAX_RESULT_BYTES = 16 * 1024 * 1024
#: keep at most this many events and alerts per job in its status file
MAX_EVENTS = 2000


def results_dir(runs: Path) -> Path:
    return runs / RESULTS


def status_path(runs: Path, job: str) -> Path:
    return results_dir(runs) / f"{layout.validate_job_name(job)}.status.json"


# --------------------------------------------------------------------------- the JSON shape
def rule_entries(state: Any) -> list[dict[str, Any]]:
    """A job's rules as ``DebugRuleEvaluationStatuses`` entries (SageMaker's names, plus Step)."""
    return [
        {
            "RuleConfigurationName": r.name,
            "RuleEvaluationStatus": r.status,
            "StatusDetails": r.details,
            "Step": r.step if r.status == "IssuesFound" else None,
            "LastModifiedTime": r.modified,
        }
        for r in state.rules
    ]


def job_entry(state: Any) -> dict[str, Any]:
    """One job as ``trainguard status --json`` prints it (from a table or from saved results)."""
    return {
        "TrainingJobName": state.job,
        "TrainingJobStatus": state.training_status,
        "LastStep": state.watermark,
        "StepsEvaluated": state.steps_evaluated,
        "DebugRuleEvaluationStatuses": rule_entries(state),
        # what the hook could not record (by reason), and why trainguard ended a job that did not
        # end by itself (it went silent)
        "Dropped": dict(state.dropped),
        "DroppedObjects": state.dropped_objects,
        "EndReason": state.end_reason,
    }


# --------------------------------------------------------------------------- the session file
@dataclass
class Session:
    """The last local run of a ``runs/`` folder."""

    runs: Path
    command: str
    pid: int
    started: float
    endpoint: str | None = None
    table: str | None = None
    bucket: str | None = None
    #: while it runs: the local cloud's own (moto) key pair, so ``trainguard status`` passes
    #: its enforced IAM; dropped from the file when the run ends
    access_key: tuple[str, str] | None = None
    finished: float | None = None
    jobs: list[str] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        """Still running: not finished, and its process exists."""
        return self.finished is None and _pid_alive(self.pid)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "command": self.command,
            "pid": self.pid,
            "started": self.started,
            "finished": self.finished,
            "endpoint": self.endpoint if self.finished is None else None,
            "access_key": list(self.access_key) if self.access_key and self.finished is None else None,
            "table": self.table,
            "bucket": self.bucket,
            "jobs": self.jobs,
            "dead_letters": self.dead_letters[:100],
            "errors": self.errors[:100],
        }

    def save(self) -> None:
        _write_json(results_dir(self.runs) / SESSION, self.to_json())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    except OSError:
        return False
    return True


def _key_pair(value: Any) -> tuple[str, str] | None:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return None


def read_session(runs: Path) -> Session | None:
    """The session file of ``runs``, or None when there is none. A damaged one is an error."""
    path = results_dir(runs) / SESSION
    if not path.is_file():
        return None
    doc = _read_json(path)
    try:
        return Session(
            runs=runs,
            command=str(doc["command"]),
            pid=int(doc["pid"]),
            started=float(doc["started"]),
            endpoint=doc.get("endpoint"),
            access_key=_key_pair(doc.get("access_key")),
            table=doc.get("table"),
            bucket=doc.get("bucket"),
            finished=None if doc.get("finished") is None else float(doc["finished"]),
            jobs=[str(j) for j in doc.get("jobs", [])],
            dead_letters=[str(d) for d in doc.get("dead_letters", [])],
            errors=[str(e) for e in doc.get("errors", [])],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"{path}: not a trainguard session file ({exc}); delete it") from None


# --------------------------------------------------------------------------- saved results
def saved_jobs(runs: Path) -> list[dict[str, Any]]:
    """Every job kept under ``runs`` (its status file), by name."""
    folder = results_dir(runs)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.status.json")):
        doc = _read_json(path)
        if doc.get("format") != FORMAT or "TrainingJobName" not in doc:
            raise CommandError(f"{path}: not a trainguard status file; delete it")
        out.append(doc)
    return out


def local_job_folder(runs: Path, job: str) -> Path | None:
    """``runs/<job>`` when it was kept by a local run."""
    try:
        kept = status_path(runs, job).is_file()
    except layout.LayoutError:
        return None
    folder = runs / job
    return folder if kept and folder.is_dir() else None


def last_jobs(runs: Path) -> list[Path]:
    """Job folders the last local run kept, in the order it ran them."""
    session = read_session(runs)
    if session is None:
        return []
    folders = [local_job_folder(runs, job) for job in session.jobs]
    return [f for f in folders if f is not None]


def _read_json(path: Path) -> dict[str, Any]:
    if path.stat().st_size > MAX_RESULT_BYTES:
        raise CommandError(f"{path}: larger than {MAX_RESULT_BYTES} bytes, not a trainguard results file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: not valid JSON ({exc}); delete it") from None
    if not isinstance(doc, dict):
        raise CommandError(f"{path}: not a trainguard results file; delete it")
    return doc


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a file


# --------------------------------------------------------------------------- keeping a run
@dataclass
class KeptJob:
    """One job written to disk by :func:`keep_jobs`."""

    job: str
    folder: Path
    status_file: Path
    objects: int
    report: Path | None
    state: Any
    skipped: list[str] = field(default_factory=list)


def check_runs_folder(runs: Path, job: str | None) -> None:
    """Refuse to start when ``runs/<job>`` holds something that no local run wrote."""
    if job is None:
        return
    try:
        layout.validate_job_name(job)
    except layout.LayoutError as exc:
        raise CommandError(f"{exc} (--job)") from None
    folder = runs / job
    if folder.exists() and local_job_folder(runs, job) is None:
        raise CommandError(
            f"{folder} exists and was not written by a local run: "
            "pass --job OTHER_NAME or --runs OTHER_FOLDER"
        )


def keep_jobs(
    s3: Any,
    bucket: str,
    runs: Path,
    load_state: Any,
    events: Iterable[dict[str, Any]] = (),
    alerts: Iterable[tuple[str, dict[str, Any]]] = (),
    ingest_prefix: str = layout.INGEST_PREFIX,
) -> list[KeptJob]:
    """Copy every job folder of ``bucket`` to ``runs/<job>/`` and write its status file.

    ``load_state(job)`` returns the job's state from the state table (None if it has none);
    ``events`` are the bus events seen; ``alerts`` are ``(job, notification)`` pairs.
    """
    by_job: dict[str, list[tuple[str, str]]] = {}
    skipped: dict[str, list[str]] = {}
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=ingest_prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            job, sep, relative = key[len(ingest_prefix) :].partition("/")
            try:
                layout.validate_job_name(job)
            except layout.LayoutError:
                skipped.setdefault("", []).append(f"{key}: not under a job folder")
                continue
            if not sep or not _safe_relative(relative):
                skipped.setdefault(job, []).append(f"{key}: not a safe path inside the job folder")
                continue
            by_job.setdefault(job, []).append((key, relative))
    events_by_job: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        name = event.get("detail", {}).get("TrainingJobName")
        if isinstance(name, str):
            events_by_job.setdefault(name, []).append(event.get("detail", {}))
    alerts_by_job: dict[str, list[dict[str, Any]]] = {}
    for name, note in alerts:
        alerts_by_job.setdefault(name, []).append(note)
    kept = []
    for job in sorted(set(by_job) | set(events_by_job)):
        kept.append(
            _keep_one(
                s3,
                bucket,
                runs,
                job,
                by_job.get(job, []),
                load_state(job),
                events_by_job.get(job, []),
                alerts_by_job.get(job, []),
                skipped.get(job, []),
            )
        )
    return kept


def _safe_relative(relative: str) -> bool:
    parts = relative.split("/")
    return (
        bool(relative)
        and len(relative) <= 1024
        and "\\" not in relative
        and "\x00" not in relative
        and all(p not in ("", ".", "..") for p in parts)
    )


def _keep_one(
    s3: Any,
    bucket: str,
    runs: Path,
    job: str,
    objects: list[tuple[str, str]],
    state: Any,
    events: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    skipped: list[str],
) -> KeptJob:
    runs.mkdir(parents=True, exist_ok=True)
    target = runs / job
    if target.exists() and local_job_folder(runs, job) is None:
        # not ours (and --job checked before the run): keep both, say where this one went
        target = runs / f"{job}.local-{time.strftime('%Y%m%d-%H%M%S')}"
    staging = results_dir(runs) / f".{job}.{os.getpid()}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for key, relative in objects:
        path = staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        with path.open("wb") as fh:
            shutil.copyfileobj(body, fh, 1024 * 1024)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    report = target / layout.REPORT
    status_file = (
        status_path(runs, job) if target.name == job else results_dir(runs) / f"{target.name}.status.json"
    )
    doc: dict[str, Any] = {"format": FORMAT}
    if state is not None:
        doc.update(job_entry(state))
        doc["Finished"] = state.finished
        doc["InvalidObjects"] = list(state.invalid_objects)
    else:
        doc.update(
            {
                "TrainingJobName": job,
                "TrainingJobStatus": "Unknown",
                "LastStep": -1,
                "StepsEvaluated": 0,
                "DebugRuleEvaluationStatuses": [],
                "Finished": False,
                "InvalidObjects": [],
            }
        )
    doc.update(
        {
            "Folder": str(target),
            "Objects": len(objects),
            "Report": str(report) if report.is_file() else None,
            "SkippedObjects": skipped[:100],
            "Events": events[-MAX_EVENTS:],
            "Alerts": alerts[-MAX_EVENTS:],
            "Kept": time.time(),
        }
    )
    _write_json(status_file, doc)
    return KeptJob(
        job, target, status_file, len(objects), report if report.is_file() else None, state, skipped
    )


# --------------------------------------------------------------------------- reading a live run
def live_state_store(session: Session) -> Any:
    """A StateStore on a running local cloud's table (moto's fixed test credentials)."""
    import boto3
    from botocore.config import Config

    from trainguard.service.state_store import StateStore

    if not session.endpoint or not session.table:
        raise CommandError(f"{results_dir(session.runs) / SESSION}: the running session names no endpoint")
    key_id, secret = session.access_key or ("testing", "testing")  # moto's fixed test keys
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=session.endpoint,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2}),
    )
    return StateStore(session.table, ddb)

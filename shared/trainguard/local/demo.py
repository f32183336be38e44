"""``trainguard demo`` and ``trainguard local``: the local mode a new user starts with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from trainguard.local.runtime import DEMO_EMAIL, DEMO_PHONE, CustomAction, LocalCloud


class Timeline:
    """Prints what happens, as it happens: objects evaluated, status changes, alerts sent."""

    def __init__(self, cloud: LocalCloud, quiet: bool = False) -> None:
        self.cloud = cloud
        self.quiet = quiet
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._sent_seen = 0
        self._stop = threading.Event()
        cloud.on_invoke.append(self._invoked)
        cloud.on_event.append(self._event)
        self._thread = threading.Thread(target=self._watch_sns, daemon=True)
        self._thread.start()

    def say(self, text: str, always: bool = False) -> None:
        if self.quiet and not always:
            return
        with self._lock:
            print(f"[{time.monotonic() - self.t0:7.2f}s] {text}", flush=True)

    def _invoked(self, fid: str, event: dict[str, Any], result: Any, seconds: float) -> None:
        if fid != "evaluate":
            self.say(f"λ {fid}: {json.dumps(result)[:160]} ({seconds * 1000:.0f} ms)")
            return
        keys = []
        for record in event.get("Records", []):
            try:
                for s3 in json.loads(record["body"]).get("Records", []):
                    keys.append(unquote_plus(s3["s3"]["object"]["key"]))
            except (ValueError, KeyError, TypeError):
                continue
        steps = [k.split("/steps/")[1][:12].lstrip("0") or "0" for k in keys if "/steps/" in k]
        other = [k.split("/", 2)[-1] for k in keys if "/steps/" not in k]
        parts = []
        if steps:
            parts.append(
                f"step{'s' if len(steps) > 1 else ''} {', '.join(steps[:6])}{' …' if len(steps) > 6 else ''}"
            )
        parts += other
        self.say(f"λ evaluate: {'; '.join(parts)} ({seconds * 1000:.0f} ms)")

    def _event(self, event: dict[str, Any]) -> None:
        d = event["detail"]
        if "RuleName" not in d:  # the job-level event: every step evaluated, the job ended
            self.say(
                f"● {d['TrainingJobName']}: evaluation finished ({d['TrainingJobStatus']}, "
                f"{d['StepsEvaluated']} steps)",
                always=True,
            )
            return
        at = f" at step {d['Step']}" if d.get("Step") is not None else ""
        self.say(
            f"● {d['TrainingJobName']} / {d['RuleConfigurationName']}: "
            f"{d.get('PreviousStatus') or '—'} → {d['RuleEvaluationStatus']}{at}",
            always=d["RuleEvaluationStatus"] in ("IssuesFound", "Error"),
        )

    def _watch_sns(self) -> None:
        while not self._stop.wait(0.1):
            try:
                sent = self.cloud.sent_notifications()
            except Exception:  # noqa: S112 - the cloud is shutting down; try again next tick
                continue
            for note in sent[self._sent_seen :]:
                self._sent_seen += 1
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

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _run_training(cmd: list[str], env: dict[str, str], timeline: Timeline, label: str) -> int:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        timeline.say(f"{label} │ {line.rstrip()}", always=True)
    return proc.wait()


def _job_env(cloud: LocalCloud, job: str) -> dict[str, str]:
    assert cloud.resources is not None
    env = dict(os.environ)
    env.update(cloud.training_env(job))  # the training-job policy, tagged with this job
    env["TRAINGUARD_OUT_DIR"] = f"s3://{cloud.resources.bucket}/jobs/{job}"
    env["TRAINGUARD_JOB_NAME"] = job
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _state(cloud: LocalCloud, job: str) -> Any:
    from trainguard.engine.store import StateStore
    from trainguard.service.clients import client

    assert cloud.resources is not None
    loaded = StateStore(cloud.resources.table, client("dynamodb")).load_state(job)
    return loaded[0] if loaded else None


def run_demo(fault: str = "exploding", steps: int = 120, quiet: bool = False) -> int:
    from trainguard.cli import print_status
    from trainguard.engine.store import StateStore
    from trainguard.service.clients import client

    print("trainguard demo: the deployed topology on a local moto server, the real hook and handlers\n")
    with LocalCloud(name="trainguard-demo") as cloud:
        assert cloud.resources is not None
        res = cloud.resources
        print(f"moto server      {res.endpoint}")
        print(
            f"bucket           s3://{res.bucket}/jobs/  → SQS {res.queues['ingest'].rsplit('/', 1)[-1]} (DLQ)"
        )
        print(f"state table      {res.table}")
        print(f"event bus        {res.bus}: rules {', '.join(res.targets)}")
        print(f"alerts topic     {res.topic_arn.rsplit(':', 1)[-1]}: email {DEMO_EMAIL}, SMS {DEMO_PHONE}\n")
        timeline = Timeline(cloud, quiet=quiet)
        outcome: dict[str, Any] = {}
        try:
            jobs = [(f"demo-{fault}", fault, steps), ("demo-slow-loader", "slow-loader", 200)]
            jobs.append(("demo-clean-twin", "none", steps))
            for job, job_fault, job_steps in jobs:
                timeline.say(
                    f"━━ job {job}: "
                    + (f"fault {job_fault}" if job_fault != "none" else "no fault (the clean twin)"),
                    always=True,
                )
                cmd = [
                    sys.executable,
                    "-m",
                    "trainguard.local.demo_job",
                    "--fault",
                    job_fault,
                    "--steps",
                    str(job_steps),
                ]
                code = _run_training(cmd, _job_env(cloud, job), timeline, "train")
                if not cloud.wait_idle(60):
                    timeline.say("warning: queues did not drain within 60 s", always=True)
                outcome[job] = (code, _state(cloud, job))
        finally:
            timeline.close()
        print()
        print_status(StateStore(res.table, client("dynamodb")), None)
        report = _download_report(res.bucket, "demo-slow-loader")
        if report:
            print(f"\nprofiler report of demo-slow-loader (written by the report function): {report}")
        if cloud.errors:
            print("\nerrors seen by the local runtime:", *cloud.errors[:10], sep="\n  ")
    return _verdict(outcome, f"demo-{fault}")


def _download_report(bucket: str, job: str) -> str | None:
    from trainguard.service.clients import client

    try:
        body = (
            client("s3")
            .get_object(Bucket=bucket, Key=f"jobs/{job}/report/profiler-report.html")["Body"]
            .read()
        )
    except Exception:
        return None
    path = Path("runs") / f"{job}-profiler-report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return str(path.resolve())


def _verdict(outcome: dict[str, Any], faulty: str) -> int:
    ok = True
    code, state = outcome.get(faulty, (1, None))
    if state is None or not any(r.status == "IssuesFound" for r in state.rules):
        print(f"\n✗ {faulty}: no rule found the injected fault")
        ok = False
    else:
        fired = next(r for r in state.rules if r.status == "IssuesFound")
        stopped = state.stopped or state.stop_requested
        print(
            f"\n✓ {faulty}: {fired.name} found issues at step {fired.step}; "
            f"{'the job was stopped' if stopped else 'the job was not stopped'}"
        )
        ok = ok and stopped and code == 0
    code, state = outcome.get("demo-slow-loader", (1, None))
    outlier = state.rule("StepOutlier") if state is not None else None
    if outlier is None or outlier.status != "IssuesFound":
        print("✗ demo-slow-loader: StepOutlier did not catch the stalled data loader")
        ok = False
    else:
        print(f"✓ demo-slow-loader: StepOutlier caught the stalled data loader at step {outlier.step}")
    code, state = outcome.get("demo-clean-twin", (1, None))
    if state is None or not state.finished or any(r.status != "NoIssuesFound" for r in state.rules):
        print("✗ demo-clean-twin: expected every rule NoIssuesFound")
        ok = False
    else:
        print("✓ demo-clean-twin: every rule NoIssuesFound")
    return 0 if ok else 1


def run_local(cmd: list[str], job: str | None = None, actions: list[dict[str, Any]] | None = None) -> int:
    """Run the user's script against a local trainguard; print the timeline and final statuses."""
    from trainguard.cli import print_status
    from trainguard.engine.store import StateStore
    from trainguard.service.clients import client

    job = job or Path(cmd[-1]).stem.replace("_", "-") if cmd else "local-job"
    custom = [CustomAction(a["name"], a["pattern"], a["handler"]) for a in actions or []]
    with LocalCloud(name="trainguard-local", custom_actions=custom) as cloud:
        assert cloud.resources is not None
        print(
            f"local trainguard on {cloud.resources.endpoint}; the job writes to "
            f"s3://{cloud.resources.bucket}/jobs/{job} (TRAINGUARD_OUT_DIR)"
        )
        timeline = Timeline(cloud)
        try:
            code = _run_training(cmd, _job_env(cloud, job), timeline, "job")
            cloud.wait_idle(60)
        finally:
            timeline.close()
        print()
        print_status(StateStore(cloud.resources.table, client("dynamodb")), job)
        if cloud.errors:
            print("\nerrors seen by the local runtime:", *cloud.errors[:10], sep="\n  ")
    return code

"""The live view of a local run, fed what a LocalCloud reports (its callbacks and topic)."""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trainguard.engine.model import JobState, RuleRecord
from trainguard.local.progress import Progress


@dataclass
class Cloud:
    """The part of LocalCloud the view reads: its callbacks, its topic, its errors."""

    on_invoke: list[Any] = field(default_factory=list)
    on_event: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent_notifications(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.notes)

    def invoke(self, fid: str, event: dict[str, Any], result: Any) -> None:
        for callback in self.on_invoke:
            callback(fid, event, result, 0.01)

    def event(self, detail: dict[str, Any]) -> None:
        for callback in self.on_event:
            callback({"detail": detail})


def s3_batch(*keys: str) -> dict[str, Any]:
    body = {"Records": [{"s3": {"object": {"key": k}}} for k in keys]}
    return {"Records": [{"body": json.dumps(body)}]}


def wait_for(stream: io.StringIO, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in stream.getvalue():
            return stream.getvalue()
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never printed; got:\n{stream.getvalue()}")


def state(job: str) -> JobState:
    return JobState(
        job=job,
        frontier={0: 5, 1: 4},
        rules=[
            RuleRecord(name="ExplodingTensor", rule="ExplodingTensor", status="IssuesFound", step=5),
            RuleRecord(name="LossNotDecreasing", rule="LossNotDecreasing"),
        ],
    )


def test_plain_output_has_the_jobs_lines_alerts_and_a_periodic_status():
    cloud, out = Cloud(), io.StringIO()
    view = Progress(cloud, state, stream=out, tty=False, plain_every_s=0.0)
    try:
        view.job_started("job-a", "train", "the process imports PyTorch first")
        wait_for(
            out, "starting: no output and no object from the job yet (the process imports PyTorch first)"
        )
        view.job_output("job-a", "step 0 loss 0.7\n")
        cloud.invoke(
            "evaluate",
            s3_batch(
                "jobs/job-a/manifest.json",
                "jobs/job-a/steps/000000000005/worker-00000.safetensors",
                "jobs/job-a/segments/worker-00001/000000000000-000000000000-000000000007.safetensors",
                "jobs/job-a/system/worker-00000/000000000000.json",
                "jobs/job-a/not/in/the/layout",
            ),
            {"batchItemFailures": []},
        )
        cloud.event(
            {
                "TrainingJobName": "job-a",
                "RuleName": "ExplodingTensor",
                "RuleConfigurationName": "ExplodingTensor",
                "RuleEvaluationStatus": "IssuesFound",
                "PreviousStatus": "InProgress",
                "Step": 5,
            }
        )
        cloud.invoke("notify", {"detail": {"TrainingJobName": "job-a"}}, {"message_id": "m-1"})
        with cloud.lock:
            cloud.notes.append(
                {
                    "message_id": "m-1",
                    "subject": "trainguard: ExplodingTensor IssuesFound in job-a",
                    "email": "Training job:  job-a\nStep:          5 (global step; TRAIN step 4)",
                    "sms": "trainguard job-a: ExplodingTensor IssuesFound step 5 (TRAIN 4)",
                    "channels": ["Email", "SMS"],
                }
            )
        cloud.errors.append("evaluate: RuntimeError: boom")
        text = wait_for(out, "1 alert sent")
        wait_for(out, "⚠ local runtime: evaluate: RuntimeError: boom")
    finally:
        view.close()
    text = out.getvalue()
    assert "train │ step 0 loss 0.7" in text
    assert "● job-a / ExplodingTensor: InProgress → IssuesFound at step 5" in text
    assert "✉ SNS → email (delivered): trainguard: ExplodingTensor IssuesFound in job-a" in text
    assert "    │ Step:          5 (global step; TRAIN step 4)" in text
    status = next(line for line in text.splitlines() if "1 alert sent" in line)
    assert "written w0:5 w1:7" in status and "evaluated w0:5 w1:4" in status
    assert "1 IssuesFound (ExplodingTensor@5)" in status and "1 InProgress" in status
    assert "1 objects outside the layout" in status and "1 system batches" in status
    assert "\x1b[" not in text  # no terminal control codes in a log
    assert view.alerts[0][0] == "job-a"


def test_on_a_terminal_the_status_line_is_redrawn_in_place():
    cloud, out = Cloud(), io.StringIO()
    view = Progress(cloud, state, stream=out, tty=True)
    try:
        view.job_started("job-b", "job")
        cloud.invoke("evaluate", s3_batch("jobs/job-b/steps/000000000003/worker-00000.safetensors"), {})
        wait_for(out, "evaluated w0:5")
        view.job_output("job-b", "hello")
    finally:
        view.close()
    text = out.getvalue()
    assert "\r\x1b[2K▶ job-b" in text  # redrawn, not appended
    assert "\r\x1b[2K[" in text and "job │ hello\n" in text  # a job line clears the status line first
    assert text.endswith("\r\x1b[2K")  # closing leaves a clean line


def test_quiet_prints_only_what_matters():
    cloud, out = Cloud(), io.StringIO()
    view = Progress(cloud, None, stream=out, tty=True, quiet=True)
    try:
        view.job_started("job-c", "train")
        cloud.event(
            {
                "TrainingJobName": "job-c",
                "RuleName": "Overfit",
                "RuleConfigurationName": "Overfit",
                "RuleEvaluationStatus": "InProgress",
            }
        )
        cloud.event({"TrainingJobName": "job-c", "TrainingJobStatus": "Completed", "StepsEvaluated": 9})
        view.job_output("job-c", "a line of the job")
        time.sleep(0.5)
    finally:
        view.close()
    text = out.getvalue()
    assert "InProgress" not in text and "▶" not in text
    assert "● job-c: evaluation finished (Completed, 9 steps)" in text and "train │ a line of the job" in text


def test_the_stop_is_said_before_the_job_can_print_that_it_was_asked():
    """stop_job's line comes before its effects: the job's own "asked to stop" line follows it."""
    cloud, out = Cloud(), io.StringIO()
    cloud.on_begin = []  # type: ignore[attr-defined]
    view = Progress(cloud, state, stream=out, tty=False, plain_every_s=3600.0)
    try:
        view.job_started("job-a", "train")
        event = {
            "detail": {
                "TrainingJobName": "job-a",
                "RuleConfigurationName": "ExplodingTensor",
                "RuleEvaluationStatus": "IssuesFound",
                "Actions": ["StopTraining"],
            }
        }
        for begin in cloud.on_begin:  # type: ignore[attr-defined]
            begin("stop_job", event)
        # what the handler does: the signal is written, the job sees it and says so at once
        view.job_output("job-a", "trainguard: the service asked job job-a to stop\n")
        cloud.invoke("stop_job", event, {"stopped": True, "job": "job-a", "actions": ["s3://b/k"]})
        text = wait_for(out, "stop signal for job-a")
    finally:
        view.close()
    first = text.index("■ stop_job: ExplodingTensor found issues in job-a and asks it to stop")
    assert first < text.index("the service asked job job-a to stop") < text.index("stop signal for job-a")

"""``trainguard demo`` and ``trainguard local``: the local mode a new user starts with.

Both start a :class:`~trainguard.local.runtime.LocalCloud`, run training processes against it
with a :class:`~trainguard.local.progress.Progress` view, and before the cloud goes keep
every job under ``runs/`` (:mod:`trainguard.local.results`): its objects, final statuses,
events and alerts, so ``trainguard status``, ``replay`` and ``report`` work afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.cli_errors import CommandError
from trainguard.local import results
from trainguard.local.progress import Progress
from trainguard.local.runtime import DEMO_EMAIL, DEMO_PHONE, CustomAction, LocalCloud

#: a safety net only: the pipeline normally drains within seconds of the job's last write
SETTLE_TIMEOUT_S = 300.0
#: the demo's slow-loader job: 100 TRAIN steps of warm-up for StepOutlier, then its stalls
SLOW_LOADER_STEPS = 280
TORCH_HINT = "the process imports PyTorch first: seconds, more on a busy machine"


def _job_env(cloud: LocalCloud, job: str) -> dict[str, str]:
    assert cloud.resources is not None
    env = dict(os.environ)
    env.update(cloud.training_env(job))  # the training-job policy, tagged with this job
    env["TRAINGUARD_OUT_DIR"] = f"s3://{cloud.resources.bucket}/jobs/{job}"
    env["TRAINGUARD_JOB_NAME"] = job
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _state_loader(cloud: LocalCloud) -> Callable[[str], Any]:
    from trainguard.service.clients import client
    from trainguard.service.state_store import StateStore

    assert cloud.resources is not None
    store = StateStore(cloud.resources.table, client("dynamodb"))

    def load(job: str) -> Any:
        loaded = store.load_state(job)
        return loaded[0] if loaded else None

    return load


class LocalRun:
    """One ``trainguard local``/``demo`` session: the cloud, the live view, what is kept."""

    def __init__(
        self,
        cloud: LocalCloud,
        runs: Path,
        command: str,
        *,
        quiet: bool = False,
        verbose: bool = False,
    ) -> None:
        assert cloud.resources is not None
        self.cloud = cloud
        self.runs = runs
        self.load_state = _state_loader(cloud)
        res = cloud.resources
        self.session = results.Session(
            runs=runs,
            command=command,
            pid=os.getpid(),
            started=time.time(),
            endpoint=res.endpoint,
            access_key=res.access_key,
            table=res.table,
            bucket=res.bucket,
        )
        self.session.save()  # `trainguard status` finds the live table through it
        self.progress = Progress(cloud, self.load_state, quiet=quiet, verbose=verbose)
        self.kept: list[results.KeptJob] = []

    def run_job(self, cmd: list[str], job: str, label: str, starting_hint: str = "") -> int:
        """Run one training process to its end, then wait until its objects are evaluated."""
        if job not in self.session.jobs:
            self.session.jobs.append(job)
            self.session.save()
        self.progress.job_started(job, label, starting_hint)
        try:
            proc = subprocess.Popen(
                cmd,
                env=_job_env(self.cloud, job),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except OSError as exc:
            raise CommandError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                self.progress.job_output(job, line)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            self.progress.job_ended(job)
        if code != 0:
            self.progress.say(f"{label} │ (the process exited with code {code})", always=True)
        if not self.cloud.wait_idle(SETTLE_TIMEOUT_S, settle=1.0):
            self.progress.say(
                f"warning: the local queues did not drain within {SETTLE_TIMEOUT_S:.0f} s; "
                "the statuses below may not be final",
                always=True,
            )
        return code

    def close(self) -> None:
        """Stop the view and keep every job on disk (also after Ctrl-C or a failure)."""
        self.progress.close()
        assert self.cloud.resources is not None
        from trainguard.service.clients import client

        try:
            self.kept = results.keep_jobs(
                client("s3"),
                self.cloud.resources.bucket,
                self.runs,
                self.load_state,
                events=list(self.cloud.events),
                alerts=list(self.progress.alerts),
            )
        finally:
            self.session.finished = time.time()
            for job in (k.job for k in self.kept):
                if job not in self.session.jobs:
                    self.session.jobs.append(job)
            self.session.dead_letters = _dead_letters(self.cloud)
            self.session.errors = list(self.cloud.errors)
            self.session.save()

    def print_kept(self) -> None:
        """Where everything is."""
        from trainguard.cli import print_jobs

        # the jobs in the order they ran (the bucket lists them by name)
        order = {job: i for i, job in enumerate(self.session.jobs)}
        kept = sorted(self.kept, key=lambda k: order.get(k.job, len(order)))
        print()
        print_jobs([results.job_entry(k.state) for k in kept if k.state is not None])
        if not kept:
            print(f"\nnothing was written to s3://{self.session.bucket}/jobs/, so nothing was kept")
            return
        print(f"\nkept in {self.runs}/ (the local cloud is gone; these stay):")
        for k in kept:
            state = k.state
            events = sum(1 for e in self.cloud.events if e.get("detail", {}).get("TrainingJobName") == k.job)
            alerts = sum(1 for job, _ in self.progress.alerts if job == k.job)
            print(f"  {k.folder}/  {k.objects} objects: the job folder, as in S3")
            if k.report is not None:
                print(f"  {k.report}  the profiler report")
            print(
                f"  {k.status_file}  final statuses, {events} event{'s' * (events != 1)}, "
                f"{alerts} alert{'s' * (alerts != 1)}"
            )
            if k.skipped:
                print(f"    {len(k.skipped)} objects not kept: {k.skipped[0]}")
            if state is not None and not state.finished:
                print(f"    {k.job}: its evaluation had not finished (no end marker from every worker)")
        example = max(self.kept, key=lambda k: order.get(k.job, -1)).folder
        print(
            f"\nnext: trainguard status · trainguard replay {example} · trainguard report {example}"
            f"\n      (the session: {results.results_dir(self.runs) / results.SESSION})"
        )
        if self.session.dead_letters:
            print(f"\n{len(self.session.dead_letters)} objects went to the dead-letter queue:")
            for reason in self.session.dead_letters[:10]:
                print(f"  {reason}")
        if self.cloud.errors:
            print("\nerrors seen by the local runtime:", *self.cloud.errors[:10], sep="\n  ")


def _dead_letters(cloud: LocalCloud) -> list[str]:
    reasons = []
    for message in cloud.dlq_messages("ingest"):
        attribute = message.get("MessageAttributes", {}).get("reason", {})
        reasons.append(str(attribute.get("StringValue", "no reason given")))
    return reasons


def _print_resources(cloud: LocalCloud, runs: Path) -> None:
    res = cloud.resources
    assert res is not None
    print(f"moto server      {res.endpoint}")
    print(f"bucket           s3://{res.bucket}/jobs/  → SQS {res.queues['ingest'].rsplit('/', 1)[-1]} (DLQ)")
    print(f"state table      {res.table}  (`trainguard status` reads it while this runs)")
    print(f"event bus        {res.bus}: rules {', '.join(res.targets)}")
    print(f"alerts topic     {res.topic_arn.rsplit(':', 1)[-1]}: email {DEMO_EMAIL}, SMS {DEMO_PHONE}")
    print(f"kept afterwards  {runs}/<job>/ and {results.results_dir(runs)}/\n")


def run_demo(
    fault: str = "exploding",
    steps: int = 120,
    quiet: bool = False,
    verbose: bool = False,
    runs: Path = results.DEFAULT_RUNS,
) -> int:
    from trainguard.local.demo_job import FAULTS, clean_twin_steps

    if fault not in FAULTS or fault in ("none", "slow-loader"):
        choices = ", ".join(f for f in FAULTS if f not in ("none", "slow-loader"))
        raise CommandError(f"unknown fault {fault!r}: choose one of {choices}")
    jobs = [
        (f"demo-{fault}", fault, steps, "fault " + fault),
        ("demo-slow-loader", "slow-loader", SLOW_LOADER_STEPS, "fault slow-loader (profiling on)"),
        ("demo-clean-twin", "none", clean_twin_steps(steps), "no fault (the clean twin)"),
    ]
    for job, *_ in jobs:
        results.check_runs_folder(runs, job)
    print("trainguard demo: the deployed topology on a local moto server, the real hook and handlers\n")
    outcome: dict[str, Any] = {}
    with LocalCloud(name="trainguard-demo") as cloud:
        _print_resources(cloud, runs)
        run = LocalRun(cloud, runs, "demo", quiet=quiet, verbose=verbose)
        try:
            for job, job_fault, job_steps, what in jobs:
                run.progress.say(f"━━ job {job}: {what}", always=True)
                cmd = [
                    sys.executable,
                    "-m",
                    "trainguard.local.demo_job",
                    "--fault",
                    job_fault,
                    "--steps",
                    str(job_steps),
                ]
                code = run.run_job(cmd, job, "train", TORCH_HINT)
                outcome[job] = (code, run.load_state(job))
        finally:
            run.close()
            run.print_kept()
    return _verdict(outcome, fault)


def _verdict(outcome: dict[str, Any], fault: str) -> int:
    """Outcomes only (statuses, the stop, the exit code), never timings: what load cannot change."""
    from trainguard.local.demo_job import FAULT_RULES, stops

    ok = True
    faulty = f"demo-{fault}"
    code, state = outcome.get(faulty, (1, None))
    expected = FAULT_RULES[fault]
    record = next((r for r in state.rules if r.name == expected), None) if state is not None else None
    if record is None or record.status != "IssuesFound":
        print(f"\n✗ {faulty}: {expected} did not find the injected fault ({_seen(record)})")
        ok = False
    else:
        stopped = state.stopped or state.stop_requested
        print(
            f"\n✓ {faulty}: {expected} found issues at step {record.step}; "
            f"{'the job was stopped' if stopped else 'the job was not stopped (its rule only alerts)'}"
        )
        if code != 0 or (stops(fault) and not stopped):
            print(f"✗ {faulty}: expected the job to be stopped and to exit cleanly (exit code {code})")
            ok = False
    code, state = outcome.get("demo-slow-loader", (1, None))
    outlier = next((r for r in state.rules if r.name == "StepOutlier"), None) if state is not None else None
    if outlier is None or outlier.status != "IssuesFound":
        print(f"✗ demo-slow-loader: StepOutlier did not catch the stalled data loader ({_seen(outlier)})")
        ok = False
    else:
        print(f"✓ demo-slow-loader: StepOutlier caught the stalled data loader at step {outlier.step}")
    code, state = outcome.get("demo-clean-twin", (1, None))
    if state is None or not state.finished or any(r.status != "NoIssuesFound" for r in state.rules):
        others = "" if state is None else ", ".join(f"{r.name} {r.status}" for r in state.rules)
        print(f"✗ demo-clean-twin: expected every rule NoIssuesFound ({others or 'no state'})")
        ok = False
    else:
        print("✓ demo-clean-twin: every rule NoIssuesFound")
    return 0 if ok else 1


def _seen(record: Any) -> str:
    if record is None:
        return "the rule has no status"
    return f"{record.status}: {record.details[:200]}" if record.details else record.status


def default_job_name(cmd: list[str]) -> str:
    """The job's name from the command: the script's name (``train.py`` → ``train``)."""
    from trainguard.format.layout import LayoutError, validate_job_name

    script = next((a for a in cmd[1:] if a.endswith(".py")), None)
    if script is None and len(cmd) > 2 and cmd[1] == "-m":
        script = cmd[2].rsplit(".", 1)[-1]
    name = Path(script).stem.replace("_", "-") if script else "local-job"
    try:
        return validate_job_name(name)
    except LayoutError:
        return "local-job"


def run_local(
    cmd: list[str],
    job: str | None = None,
    actions: list[dict[str, Any]] | None = None,
    runs: Path = results.DEFAULT_RUNS,
    verbose: bool = False,
) -> int:
    """Run the user's script against a local trainguard; keep its results under ``runs/``."""
    job = job or default_job_name(cmd)
    results.check_runs_folder(runs, job)
    custom = [CustomAction(a["name"], a["pattern"], a["handler"]) for a in actions or []]
    with LocalCloud(name="trainguard-local", custom_actions=custom) as cloud:
        assert cloud.resources is not None
        print(
            f"local trainguard on {cloud.resources.endpoint}; the job writes to "
            f"s3://{cloud.resources.bucket}/jobs/{job} (TRAINGUARD_OUT_DIR); "
            f"kept afterwards under {runs}/"
        )
        run = LocalRun(cloud, runs, "local", verbose=verbose)
        try:
            code = run.run_job(cmd, job, "job")
        finally:
            run.close()
            run.print_kept()
    return code

"""What a local run leaves behind, and ``trainguard status/replay/report`` reading it with no flags.

A LocalCloud (moto server on 127.0.0.1, the real handlers) evaluates a job; while it runs,
``trainguard status`` reads its live table through the session file; after, the job folder
and its statuses are on disk and every command works without AWS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainguard.cli import main
from trainguard.local import results
from trainguard.local.demo import LocalRun
from trainguard.local.runtime import LocalCloud
from trainguard.local.synthetic import SyntheticJob
from trainguard.service import clients

JOB = "kept-job"


def put(cloud: LocalCloud, job: str, objects: dict[str, bytes]) -> None:
    s3 = clients.client("s3")
    for rel, body in objects.items():
        s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/{job}/{rel}", Body=body)


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> dict:
    """One local session: a faulty job evaluated, `status` asked while it runs, then kept."""
    runs = tmp_path_factory.mktemp("session") / "runs"
    live: dict = {}
    with LocalCloud(name="tg-kept") as cloud:
        run = LocalRun(cloud, runs, "local", quiet=True)
        run.session.jobs.append(JOB)
        job = SyntheticJob(JOB, steps=list(range(0, 30, 2)), nan_steps=frozenset({14}))
        put(cloud, JOB, job.objects())
        # a key no job folder may hold: kept out, and said
        clients.client("s3").put_object(Bucket=cloud.resources.bucket, Key=f"jobs/{JOB}/a//b", Body=b"x")
        assert cloud.wait_idle(60)
        live["session"] = results.read_session(runs)
        live["status"] = _run(["status", "--runs", str(runs), "--json"])
        live["status_text"] = _run(["status", "--runs", str(runs)])
        run.close()
    return {"runs": runs, "run": run, "live": live}


def _run(argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_during_the_run_status_reads_the_live_table_without_flags(kept):
    session = kept["live"]["session"]
    assert session is not None and session.live and session.endpoint.startswith("http://127.0.0.1:")
    code, out = kept["live"]["status"]
    assert code == 0
    jobs = {j["TrainingJobName"]: j for j in json.loads(out)}
    statuses = {r["RuleConfigurationName"]: r for r in jobs[JOB]["DebugRuleEvaluationStatuses"]}
    assert statuses["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound"
    assert statuses["ExplodingTensor"]["Step"] == 14
    code, text = kept["live"]["status_text"]
    assert code == 0 and "(the running trainguard local, pid" in text and "IssuesFound" in text


def test_the_job_folder_and_its_statuses_are_kept(kept):
    runs: Path = kept["runs"]
    folder = runs / JOB
    assert (folder / "manifest.json").is_file() and (folder / "end" / "worker-00000.json").is_file()
    assert len(list((folder / "steps").iterdir())) == 15
    doc = json.loads((runs / "_trainguard" / f"{JOB}.status.json").read_text())
    assert doc["format"] == results.FORMAT and doc["TrainingJobStatus"] == "Completed"
    rules = {
        r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in doc["DebugRuleEvaluationStatuses"]
    }
    assert rules["ExplodingTensor"] == "IssuesFound"
    assert any(e.get("RuleEvaluationStatus") == "IssuesFound" for e in doc["Events"])
    # the 30-step synthetic job has no EVAL losses and is shorter than LossNotDecreasing's window:
    # those rules say so (Error), they do not pass it
    assert sorted(a["subject"] for a in doc["Alerts"]) == [
        "trainguard: ExplodingTensor IssuesFound in kept-job",
        "trainguard: LossNotDecreasing Error in kept-job",
        "trainguard: Overfit Error in kept-job",
    ]
    assert doc["SkippedObjects"] == [f"jobs/{JOB}/a//b: not a safe path inside the job folder"]
    session = results.read_session(runs)
    assert session is not None and not session.live and session.endpoint is None and session.jobs == [JOB]


def test_after_the_run_every_command_works_with_no_flags_and_no_aws(kept, monkeypatch, capsys):
    runs = kept["runs"]
    monkeypatch.chdir(runs.parent)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "(the last local run, finished " in out and f"{JOB} (Completed" in out and "IssuesFound" in out
    assert "earlier local runs" not in out  # only one run kept anything
    assert main(["status", JOB, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["TrainingJobName"] == JOB
    assert main(["replay", "--json", "--no-progress"]) == 0  # the only job of the last run
    replayed = {r["RuleConfigurationName"]: r for r in json.loads(capsys.readouterr().out)}
    assert replayed["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound"
    assert replayed["ExplodingTensor"]["Step"] == 14
    assert main(["replay", JOB, "--json", "--no-progress"]) == 0  # a kept job by name
    capsys.readouterr()
    assert main(["report"]) == 0
    where = Path(capsys.readouterr().out.strip())
    assert where == Path("runs") / JOB / "report" / "profiler-report.html" and where.is_file()
    assert "ExplodingTensor" in where.read_text()
    assert main(["status", "nope"]) == 2
    assert "no job 'nope' kept under runs/" in capsys.readouterr().err


def test_a_folder_no_local_run_wrote_is_never_replaced(tmp_path):
    from trainguard.cli_errors import CommandError

    runs = tmp_path / "runs"
    (runs / "mine").mkdir(parents=True)
    (runs / "mine" / "notes.txt").write_text("my own files")
    with pytest.raises(CommandError, match="was not written by a local run"):
        results.check_runs_folder(runs, "mine")
    results.check_runs_folder(runs, "other")  # a new name is fine
    with pytest.raises(CommandError, match="invalid job name"):
        results.check_runs_folder(runs, "../up")


def test_damaged_result_files_are_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "_trainguard").mkdir(parents=True)
    (tmp_path / "runs" / "_trainguard" / "x.status.json").write_text("{broken")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainguard status: runs/_trainguard/x.status.json: not valid JSON")


def test_the_default_job_name_is_the_scripts():
    from trainguard.local.demo import default_job_name

    assert default_job_name(["python", "examples/torch_loop.py", "--epochs", "3"]) == "torch-loop"
    assert default_job_name(["python", "-m", "my_pkg.train_net"]) == "train-net"
    assert default_job_name(["./run.sh"]) == "local-job"

"""The CLI's error contract: one line ``trainguard <command>: <what is wrong and what to do>``,
exit code 2, a traceback only with ``--debug``, nothing created by a failed command."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from trainguard import cli
from trainguard.cli import main
from trainguard.cli_errors import EXIT_BUG, EXIT_USAGE


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Each test in an empty folder: no runs/ from an earlier demo is seen."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_aws(tmp_path, monkeypatch):
    """No credentials and no region anywhere, and no instance-metadata service to fall back on."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_PROFILE",
        "TRAINGUARD_TABLE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from trainguard.service import clients

    clients.reset()
    yield
    clients.reset()


def one_error_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"trainguard {command}: "), lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def test_replay_of_a_missing_folder(capsys):
    assert main(["replay", "/missing"]) == EXIT_USAGE
    line = one_error_line(capsys, "replay")
    assert "/missing: no such job folder" in line and "s3://bucket/prefix/<job>" in line


def test_report_of_an_unsupported_url(capsys):
    assert main(["report", "ftp://x/y"]) == EXIT_USAGE
    assert "unsupported URL scheme 'ftp'" in one_error_line(capsys, "report")


def test_report_of_a_missing_folder_creates_nothing(tmp_path, capsys):
    target = tmp_path / "nonexistent"
    assert main(["report", str(target)]) == EXIT_USAGE
    assert "no such job folder" in one_error_line(capsys, "report")
    assert not target.exists()


def test_report_of_a_file_is_not_a_job_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["report", "notes.txt"]) == EXIT_USAGE
    assert "is a file, not a job folder" in one_error_line(capsys, "report")


def test_status_with_a_table_and_no_region(no_aws, capsys):
    assert main(["status", "--table", "t"]) == EXIT_USAGE
    assert "no AWS region configured: pass --region" in one_error_line(capsys, "status")


def test_replay_from_s3_without_credentials(no_aws, monkeypatch, capsys):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert main(["replay", "s3://bucket/jobs/some-job", "--no-progress"]) == EXIT_USAGE
    line = one_error_line(capsys, "replay")
    assert "no usable AWS credentials" in line and "aws configure" in line


def test_status_without_results_or_credentials_never_probes_the_metadata_service(no_aws, monkeypatch, capsys):
    from botocore import utils

    def probe(*args, **kwargs):  # pragma: no cover - the assertion is that this never runs
        raise AssertionError("trainguard status reached for the instance-metadata service")

    monkeypatch.setattr(utils.InstanceMetadataFetcher, "retrieve_iam_role_credentials", probe)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    assert main(["status"]) == EXIT_USAGE
    line = one_error_line(capsys, "status")
    assert "no local results under runs/" in line and "trainguard local" in line


def test_replay_with_no_job_and_no_local_run(capsys):
    assert main(["replay"]) == EXIT_USAGE
    assert "no job given and no local run kept under runs/" in one_error_line(capsys, "replay")


def test_local_without_a_command(capsys):
    assert main(["local", "--"]) == EXIT_USAGE
    assert "no command to run" in one_error_line(capsys, "local")


def test_local_with_a_bad_actions_file(tmp_path, capsys):
    (tmp_path / "actions.json").write_text('[{"name": "x"}]')
    assert main(["local", "--actions", "actions.json", "--", "true"]) == EXIT_USAGE
    assert "entry 0 needs name, pattern and handler" in one_error_line(capsys, "local")
    (tmp_path / "actions.json").write_text("{not json")
    assert main(["local", "--actions", "actions.json", "--", "true"]) == EXIT_USAGE
    assert "not valid JSON" in one_error_line(capsys, "local")


def test_an_unknown_rule_module(monkeypatch, capsys):
    from trainguard.rules.plugins import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "")  # restored afterwards: the command adds its module to it
    assert main(["rules", "--rule-module", "no_such_module_anywhere"]) == EXIT_USAGE
    assert "no_such_module_anywhere" in one_error_line(capsys, "rules")


def test_debug_adds_the_traceback(capsys):
    assert main(["replay", "/missing", "--debug"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "CommandError" in err
    assert err.strip().splitlines()[-1].startswith("trainguard replay: /missing: no such job folder")
    assert main(["--debug", "replay", "/missing"]) == EXIT_USAGE
    assert "Traceback" in capsys.readouterr().err


def test_an_unexpected_error_is_one_line_with_exit_1(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_rules", broken)
    assert main(["rules"]) == EXIT_BUG
    line = one_error_line(capsys, "rules")
    assert "unexpected error: RuntimeError: a bug" in line and "--debug" in line


def test_python_dash_m_is_the_same_command(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    shared = Path(cli.__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(shared)
    done = subprocess.run(
        [sys.executable, "-m", "trainguard", "report", "ftp://x/y"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip() == (
        "trainguard report: ftp://x/y: unsupported URL scheme 'ftp'; "
        "give a local job folder or s3://bucket/prefix/<job>"
    )
    helped = subprocess.run(
        [sys.executable, "-m", "trainguard", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert helped.returncode == 0 and "usage: trainguard" in helped.stdout


def test_s3_jobs_that_are_not_there(capsys):
    import boto3
    from moto import mock_aws
    from trainguard.service import clients

    with mock_aws():
        clients.reset()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="tg-empty")
        assert main(["report", "s3://tg-empty/jobs/nothing-here"]) == EXIT_USAGE
        assert "s3://tg-empty/jobs/nothing-here: no objects there" in one_error_line(capsys, "report")
        assert main(["replay", "s3://tg-missing/jobs/x", "--no-progress"]) == EXIT_USAGE
        assert "the bucket tg-missing does not exist" in one_error_line(capsys, "replay")
        assert main(["replay", "s3://tg-empty", "--no-progress"]) == EXIT_USAGE
        assert "name the job folder" in one_error_line(capsys, "replay")
    clients.reset()


@pytest.mark.parametrize("command", ["replay", "report"])
@pytest.mark.parametrize("contents", ["empty", "foreign", "report only", "bad name"])
def test_a_folder_that_is_not_a_job_is_one_line_and_nothing_is_written(tmp_path, capsys, command, contents):
    folder = tmp_path / ("my files" if contents == "bad name" else "notajob")
    folder.mkdir()
    if contents in ("foreign", "bad name"):
        (folder / "notes.txt").write_text("hello")
        (folder / "data.json").write_text('{"x": 1}')
        (folder / "steps").mkdir()
        (folder / "steps" / "readme.md").write_text("not a step object")
    if contents == "report only":
        (folder / "report").mkdir()
        (folder / "report" / "profiler-report.html").write_text("<html></html>")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    assert main([command, str(folder)]) == EXIT_USAGE
    line = one_error_line(capsys, command)
    assert "not a trainguard job folder" in line and "pydantic" not in line and "http" not in line
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


def test_a_job_without_manifest_in_a_folder_not_named_like_a_job(tmp_path, capsys):
    folder = tmp_path / "my files"
    (folder / "end").mkdir(parents=True)
    (folder / "end" / "worker-00000.json").write_text("{}")
    assert main(["replay", str(folder)]) == EXIT_USAGE
    line = one_error_line(capsys, "replay")
    assert "no manifest.json to name the job" in line and "'my files' is not a job name" in line


def test_an_unreadable_manifest_is_named_without_pydantic_noise(tmp_path, capsys):
    folder = tmp_path / "halfjob"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"a": 1}')
    assert main(["replay", str(folder), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "manifest.json: job: Field required; created: Field required" in err
    assert "errors.pydantic.dev" not in err and "no manifest.json" not in err
    assert "manifest.json cannot be read: assuming the default rules" in err


@pytest.fixture
def job(tmp_path):
    from trainguard.format.documents import Manifest, dump_document

    folder = tmp_path / "jobs" / "a-job"
    folder.mkdir(parents=True)
    manifest = Manifest(job="a-job", created=1.7e9, hook_version="test", world_size=1)
    (folder / "manifest.json").write_bytes(dump_document(manifest))
    return folder


@pytest.mark.parametrize(
    ("out", "reason"),
    [
        ("/etc/passwd/x.html", "/etc/passwd is not a folder"),
        ("/etc/passwd/sub/x.html", "/etc/passwd is not a folder"),
        ("/proc/x.html", "/proc does not allow creating files"),
        (".", "is a folder; name the file"),
    ],
)
def test_an_output_that_cannot_be_written_names_the_real_cause(job, capsys, out, reason):
    assert main(["report", str(job), "--out", out]) == EXIT_USAGE
    line = one_error_line(capsys, "report")
    assert line == f"trainguard report: --out {out}: {reason}" or line.startswith(
        f"trainguard report: --out {out}: {reason}"
    )
    assert "no such file" not in line and "unexpected error" not in line


def test_an_output_folder_without_write_permission(job, tmp_path, capsys):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        assert main(["report", str(job), "--out", str(locked / "r.html")]) == EXIT_USAGE
        assert f"{locked}: permission denied" in one_error_line(capsys, "report")
    finally:
        locked.chmod(0o700)


def test_local_checks_its_rules_file_before_the_run(tmp_path, monkeypatch, capsys):
    from trainguard.local import demo

    def never(*args, **kwargs):  # pragma: no cover - the assertion is that no run starts
        raise AssertionError("the run started")

    monkeypatch.setattr(demo, "run_local", never)
    (tmp_path / "unknown.json").write_text(
        '[{"RuleConfigurationName": "Mine", "RuleParameters": {"rule_to_invoke": "NoSuchRule"}}]'
    )
    assert main(["local", "--rules", "unknown.json", "--", "true"]) == EXIT_USAGE
    line = one_error_line(capsys, "local")
    assert "--rules unknown.json: Mine: unknown rule 'NoSuchRule'" in line
    (tmp_path / "bad.json").write_text(
        '[{"RuleConfigurationName": "L", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing",'
        ' "num_steps": "many"}}]'
    )
    assert main(["local", "--rules", "bad.json", "--", "true"]) == EXIT_USAGE
    assert "L: bad parameter for LossNotDecreasing: num_steps" in one_error_line(capsys, "local")
    assert main(["local", "--rules", "missing.json", "--", "true"]) == EXIT_USAGE
    assert one_error_line(capsys, "local") == (
        "trainguard local: --rules missing.json: No such file or directory"
    )


def test_every_option_has_help_text():
    for action in _all_actions(cli._parser()):
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, f"{action.option_strings} has no help text"


def _all_actions(parser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)


def test_an_s3_folder_of_other_objects_is_not_a_job(capsys):
    import boto3
    from moto import mock_aws
    from trainguard.service import clients

    with mock_aws():
        clients.reset()
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="tg-other")
        s3.put_object(Bucket="tg-other", Key="jobs/photos/cat.jpg", Body=b"x")
        s3.put_object(Bucket="tg-other", Key="jobs/photos/report/profiler-report.html", Body=b"x")
        for command in ("replay", "report"):
            assert main(
                [command, "s3://tg-other/jobs/photos", "--no-progress"][: 3 if command == "replay" else 2]
            ) == (EXIT_USAGE)
            assert "s3://tg-other/jobs/photos: not a trainguard job folder" in one_error_line(capsys, command)
    clients.reset()

"""The command line as a user runs it."""

from __future__ import annotations

import json

from trainguard.cli import main
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules.config import DEFAULT_RULES


def write(tmp_path, job: SyntheticJob):
    folder = tmp_path / job.job
    for rel, body in job.objects().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    return folder


def test_replay_json_has_one_object_per_rule_with_the_first_issue_step(tmp_path, capsys):
    # long enough for LossNotDecreasing's 50-step blocks, with validation losses for Overfit
    folder = write(
        tmp_path,
        SyntheticJob(
            "cli-1",
            steps=list(range(0, 120, 2)),
            nan_steps=frozenset({14}),
            eval_loss=lambda s, w: 1.02 / (1 + s) if s % 10 == 0 else None,
        ),
    )
    assert main(["replay", str(folder), "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [set(o) for o in out] == [
        {"RuleConfigurationName", "RuleEvaluationStatus", "StatusDetails", "Step"}
    ] * len(DEFAULT_RULES)
    by_name = {o["RuleConfigurationName"]: o for o in out}
    assert by_name["ExplodingTensor"]["RuleEvaluationStatus"] == "IssuesFound"
    assert by_name["ExplodingTensor"]["Step"] == 14
    assert by_name["LossNotDecreasing"] == {
        "RuleConfigurationName": "LossNotDecreasing",
        "RuleEvaluationStatus": "NoIssuesFound",
        "StatusDetails": by_name["LossNotDecreasing"]["StatusDetails"],
        "Step": None,
    }


def test_replay_with_a_rules_file_in_sagemaker_format(tmp_path, capsys):
    folder = write(
        tmp_path,
        SyntheticJob(
            "cli-2",
            steps=[0, 4, 8, 12, 16],
            loss=lambda s, w: {0: 0.30, 4: 0.33, 8: 0.31, 12: 0.30, 16: 0.28}[s],
        ),
    )
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "DebugRuleConfigurations": [
                    {
                        "RuleConfigurationName": "LossNotDecreasing",
                        "RuleParameters": {
                            "rule_to_invoke": "LossNotDecreasing",
                            "num_steps": "10",
                            "diff_percent": "0",
                        },
                    },
                    {"RuleConfigurationName": "Nope", "RuleParameters": {"rule_to_invoke": "NotARule"}},
                ]
            }
        )
    )
    assert main(["replay", str(folder), "--rules", str(rules), "--json", "--no-progress"]) == 0
    out = {o["RuleConfigurationName"]: o for o in json.loads(capsys.readouterr().out)}
    assert (
        out["LossNotDecreasing"]["RuleEvaluationStatus"] == "IssuesFound"
        and out["LossNotDecreasing"]["Step"] == 12
    )
    assert (
        out["Nope"]["RuleEvaluationStatus"] == "Error"
        and "unknown rule 'NotARule'" in out["Nope"]["StatusDetails"]
    )


def test_rules_lists_every_rule_with_defaults(capsys):
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    for name in (
        "LossNotDecreasing",
        "VanishingGradient",
        "ExplodingTensor",
        "DeadRelu",
        "Overfit",
        "LossDivergence",
        "CPUBottleneck",
    ):
        assert name in out
    # trainguard's default, SageMaker's beside it, and why they differ
    assert "num_steps='None'  [SageMaker: 10]" in out and "why: None = 50 training steps" in out


def test_status_reads_the_state_table(aws, capsys):
    job = SyntheticJob("cli-status", steps=[0, 1, 2], nan_steps=frozenset({1}))
    service = aws.service()
    for key in aws.put_job("cli-status", job.objects()):
        service.handle_object(aws.bucket, key)
    assert main(["status", "--table", aws.table, "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert jobs[0]["TrainingJobName"] == "cli-status" and jobs[0]["TrainingJobStatus"] == "Completed"
    assert {
        r["RuleConfigurationName"]: r["RuleEvaluationStatus"] for r in jobs[0]["DebugRuleEvaluationStatuses"]
    }["ExplodingTensor"] == "IssuesFound"
    assert main(["status", "cli-status", "--table", aws.table]) == 0
    assert "IssuesFound" in capsys.readouterr().out
    assert main(["status", "nope", "--table", aws.table]) == 2
    assert capsys.readouterr().err.startswith("trainguard status: no job 'nope' in the state table")


def test_status_lines_are_shortened_at_a_word_with_an_ellipsis(capsys):
    from trainguard.cli import _print_rules

    details = "LossNotDecreasing: mean EVAL loss over training steps 39-79 is 1.4015, " + "word " * 40
    _print_rules("job", [("LossNotDecreasing", "IssuesFound", details)])
    line = capsys.readouterr().out.splitlines()[1]
    shown = line.split("IssuesFound", 1)[1].strip()
    assert shown.endswith("…") and len(shown) <= 160
    assert details.startswith(shown[:-1]) and details[len(shown) - 1] == " "


def test_status_says_which_jobs_the_last_run_kept_and_which_earlier_runs_did(tmp_path, monkeypatch, capsys):
    import json as jsonlib

    from trainguard.local import results

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    folder = results.results_dir(runs)
    folder.mkdir(parents=True)
    for name in ("old-job", "zeta-job", "alpha-job"):
        doc = {
            "format": results.FORMAT,
            "TrainingJobName": name,
            "TrainingJobStatus": "Completed",
            "LastStep": 9,
            "DebugRuleEvaluationStatuses": [],
        }
        (folder / f"{name}.status.json").write_text(jsonlib.dumps(doc))
    session = results.Session(runs=runs, command="demo", pid=1, started=1.0, finished=2.0)
    session.jobs = ["zeta-job", "alpha-job"]  # the order the run ran them
    session.save()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("(the last local run, finished ") and "2 jobs" in lines[0]
    titles = [line for line in lines if line.endswith("last step 9)")]
    assert [t.split()[0] for t in titles] == ["zeta-job", "alpha-job", "old-job"]
    assert "(kept by earlier local runs under runs/: 1 job)" in out
    assert "kept by the last local run" not in out

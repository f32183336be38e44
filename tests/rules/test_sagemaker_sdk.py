"""Everything the real SageMaker SDK sends for debugger and profiler rules is accepted unchanged.

The fixtures are ``CreateTrainingJob`` requests captured from ``estimator.fit`` of
``sagemaker`` 2.x with ``smdebug-rulesconfig`` (tests/fixtures/sagemaker_sdk/generate.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainguard.cli import main
from trainguard.engine import evaluator
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules.config import DEFAULT_RULES, DEFAULT_RULES_ENV, parse_rule_configurations
from trainguard.rules.profiler import PROFILER_RULES
from trainguard.rules.profiler.profiler_report import ProfilerReportConfig
from trainguard.rules.sagemaker import RulesFormatError, load_rules_file, loads_rules, normalize_rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sagemaker_sdk"
REQUESTS = sorted(p.name for p in FIXTURES.glob("*.json"))
SDK_DEBUG_RULES = {
    "VanishingGradient", "SimilarAcrossRuns", "WeightUpdateRatio", "AllZero", "ExplodingTensor",
    "UnchangedTensor", "LossNotDecreasing", "CheckInputImages", "DeadRelu", "Confusion", "TreeDepth",
    "ClassImbalance", "Overfit", "TensorVariance", "Overtraining", "PoorWeightInitialization",
    "SaturatedActivation", "NLPSequenceRatio", "StalledTrainingRule", "FeatureImportanceOverweight",
    "CreateXgboostReport",
}  # fmt: skip


def request(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_the_fixtures_cover_every_rule_the_sdk_has():
    seen = {
        e["RuleParameters"]["rule_to_invoke"]
        for name in REQUESTS
        for e in normalize_rules(request(name)).entries()
    }
    assert seen == SDK_DEBUG_RULES | set(PROFILER_RULES)
    assert request("debug_rules_actions.json")["_generated_by"]["sagemaker"].startswith("2.")


@pytest.mark.parametrize("name", REQUESTS)
def test_every_rule_of_every_sdk_request_is_accepted(name):
    rules = normalize_rules(request(name))
    configured = parse_rule_configurations(rules.entries())
    assert [c.configuration_name for c in configured] == [e["RuleConfigurationName"] for e in rules.entries()]
    errors = {c.configuration_name: c.error for c in configured if c.error}
    if name == "debug_rules_21.json":  # SageMaker takes 20: the 21st is named, and says why
        assert errors == {
            "CreateXgboostReport": "more than 20 debugger rules in one job (SageMaker's limit); "
            "this one is not evaluated"
        }
    else:
        assert errors == {}
        assert all(c.rule is not None for c in configured)


def test_sdk_action_lists_become_the_rules_actions():
    configured = parse_rule_configurations(normalize_rules(request("debug_rules_actions.json")).entries())
    assert {c.actions for c in configured} == {("StopTraining", "Email", "SMS")}
    notes = " ".join(configured[0].notes)
    assert "email: endpoint not used" in notes and "stoptraining: training_job_prefix not used" in notes
    mixed = {c.configuration_name: c for c in parse_rule_configurations(
        normalize_rules(request("mixed_with_actions.json")).entries()
    )}  # fmt: skip
    assert mixed["ExplodingWeights"].actions == ("StopTraining",)
    assert mixed["ExplodingWeights"].rule.config.only_nan is True
    assert mixed["ProfilerReport"].actions == ("Email", "SMS")  # no action_json: the defaults


def test_similar_across_runs_reads_the_sdks_other_trial_paths_as_jobs():
    [rule] = [
        c
        for c in parse_rule_configurations(normalize_rules(request("debug_rules_defaults.json")).entries())
        if c.rule_name == "SimilarAcrossRuns"
    ]
    assert rule.rule.config.other_trials == ("baseline-job", "baseline2-job")
    assert "other_trial_0 's3://example-bucket/output/baseline-job/debug-output'" in " ".join(rule.notes)


@pytest.mark.parametrize(
    ("paths", "jobs"),
    [
        ({"other_trial_0": "s3://b/jobs/run-7/"}, ("run-7",)),
        ({"other_trial_1": "s3://b/x/second/debug-output", "other_trial_0": "first"}, ("first", "second")),
        ({"other_trials": "plain-job"}, ("plain-job",)),
    ],
)
def test_other_trials_in_every_spelling(paths, jobs):
    [c] = parse_rule_configurations(
        [{"RuleConfigurationName": "S", "RuleParameters": {"rule_to_invoke": "SimilarAcrossRuns", **paths}}]
    )
    assert c.error is None and c.rule.config.other_trials == jobs


def test_other_trials_both_spellings_or_no_job_is_an_error():
    rule = {"rule_to_invoke": "SimilarAcrossRuns"}
    both, nojob = parse_rule_configurations(
        [
            {
                "RuleConfigurationName": "A",
                "RuleParameters": {**rule, "other_trials": "a", "other_trial_0": "b"},
            },
            {"RuleConfigurationName": "B", "RuleParameters": {**rule, "other_trial_0": "s3://b/"}},
        ]
    )
    assert "not both" in both.error
    assert "names no trainguard job" in nojob.error


def test_profiler_scan_interval_is_accepted_and_noted_and_report_parameters_are_honoured():
    configured = {
        c.configuration_name: c
        for c in parse_rule_configurations(normalize_rules(request("profiler_report_params.json")).entries())
    }
    report = configured["ProfilerReport"].rule.config
    assert isinstance(report, ProfilerReportConfig)
    assert report.sub_config("CPUBottleneck").threshold == 70
    assert report.sub_config("StepOutlier").n_outliers == 5
    cpu = configured["CPUBottleneck"]
    assert cpu.rule.config.threshold == 60
    assert any("scan_interval_us accepted, not used" in n for n in cpu.notes)
    [prefixed] = parse_rule_configurations(
        [
            {
                "RuleConfigurationName": "ProfilerReport",
                "RuleParameters": {"rule_to_invoke": "ProfilerReport", "CPUBottleneck_scan_interval_us": "1"},
            }
        ]
    )
    assert prefixed.error is None and "CPUBottleneck_scan_interval_us" in prefixed.notes[0]


def test_escaped_and_plain_action_json_and_bad_ones():
    def actions(action_json: str):
        params = {"rule_to_invoke": "LossNotDecreasing", "action_json": action_json}
        [c] = parse_rule_configurations([{"RuleConfigurationName": "L", "RuleParameters": params}])
        return c.actions if c.error is None else c.error

    assert actions('[{"name": "sms", "endpoint": "+1555"}]') == ("SMS",)
    assert actions('{\\"name\\": \\"stoptraining\\"}') == ("StopTraining",)  # a single Action
    assert "not JSON" in actions("[{name: email}]")
    assert "unknown action 'page'" in actions('[{"name": "page"}]')


def test_one_file_with_both_keys_keeps_both_lists_and_the_hook_config():
    rules = normalize_rules(request("mixed_with_actions.json"))
    assert [e["RuleConfigurationName"] for e in rules.debug_rules] == [
        "LossNotDecreasing",
        "VanishingGradient",
        "ExplodingWeights",
    ]
    assert [e["RuleConfigurationName"] for e in rules.profiler_rules] == [
        "ProfilerReport",
        "LowGPUUtilization",
    ]
    assert rules.debug_hook_config["HookParameters"] == {"save_interval": "10"}
    only_profiler = normalize_rules(
        {"ProfilerRuleConfigurations": request("profiler_rules.json")["ProfilerRuleConfigurations"]}
    )
    assert len(only_profiler.profiler_rules) == 11 and only_profiler.debug_rules == []
    # a plain list is split by kind; the tuple unpacks
    debug, profiler, hook = normalize_rules(rules.entries())
    assert (len(debug), len(profiler), hook) == (3, 2, None)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("nope", "expected a list"),
        ({"TrainingJobName": "x"}, "no DebugRuleConfigurations"),
        ({"RuleConfigurationName": "x", "RuleParameters": {}}, "this is one rule entry"),
        ({"DebugRuleConfigurations": {"a": 1}}, "must be a list"),
        ({"DebugHookConfig": []}, "must be an object"),
        ([{"RuleConfigurationName": f"r{i}", "RuleParameters": {}} for i in range(51)], "at most"),
    ],
)
def test_shapes_that_are_not_rules_documents_are_clear_errors(doc, message):
    with pytest.raises(RulesFormatError, match=message):
        normalize_rules(doc)


def test_rules_files_are_bounded_and_named_in_errors(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b" " * (2 * 1024 * 1024) + b"]")
    with pytest.raises(RulesFormatError, match=r"big\.json: larger than"):
        load_rules_file(big)
    with pytest.raises(RulesFormatError, match=r"missing\.json"):
        load_rules_file(tmp_path / "missing.json")
    with pytest.raises(RulesFormatError, match="not JSON"):
        loads_rules("[" * 100_000, "deep")


def write_job(tmp_path, job: SyntheticJob) -> Path:
    folder = tmp_path / job.job
    for rel, body in job.objects().items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    return folder


def test_replay_takes_a_whole_create_training_job_request(tmp_path, capsys):
    folder = write_job(
        tmp_path, SyntheticJob("sdk-replay", steps=list(range(0, 40, 2)), nan_steps=frozenset({14}))
    )
    assert (
        main(
            [
                "replay",
                str(folder),
                "--rules",
                str(FIXTURES / "mixed_with_actions.json"),
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    out = {o["RuleConfigurationName"]: o for o in json.loads(capsys.readouterr().out)}
    assert set(out) == {
        "LossNotDecreasing",
        "VanishingGradient",
        "ExplodingWeights",
        "ProfilerReport",
        "LowGPUUtilization",
    }
    assert all(
        o["RuleEvaluationStatus"] != "Error" or "unknown" not in o["StatusDetails"] for o in out.values()
    )


def test_replay_rejects_a_file_that_is_not_rules(tmp_path, capsys):
    folder = write_job(tmp_path, SyntheticJob("sdk-bad", steps=[0, 1]))
    bad = tmp_path / "bad.json"
    bad.write_text('{"TrainingJobName": "x"}')
    assert main(["replay", str(folder), "--rules", str(bad), "--no-progress"]) == 2
    assert "no DebugRuleConfigurations" in capsys.readouterr().err


def test_the_stacks_default_rules_are_the_rules_of_a_job_that_declares_none(monkeypatch):
    entries = normalize_rules(request("mixed_with_actions.json")).entries()
    monkeypatch.setenv(DEFAULT_RULES_ENV, json.dumps(entries))
    evaluator._configured_cached.cache_clear()
    assert [c.configuration_name for c in parse_rule_configurations(None)] == [
        e["RuleConfigurationName"] for e in entries
    ]
    monkeypatch.setenv(DEFAULT_RULES_ENV, "{not json")
    [bad] = parse_rule_configurations(None)
    assert bad.error and DEFAULT_RULES_ENV in bad.error
    monkeypatch.delenv(DEFAULT_RULES_ENV)
    assert len(parse_rule_configurations(None)) == len(DEFAULT_RULES)


@pytest.mark.parametrize(
    "name", ["mixed_with_actions.json", "debug_rules_actions.json", "profiler_rules.json"]
)
def test_the_hook_carries_the_sdks_rules_to_the_service_unchanged(tmp_path, name):
    import trainguard
    from trainguard.trial import create_trial

    entries = normalize_rules(request(name)).entries()
    hook = trainguard.Hook(tmp_path / "hook-sdk", rules=entries)
    hook.save_scalar("loss", 1.0)
    hook.close()
    stored = create_trial(tmp_path / "hook-sdk").manifest.rules
    assert stored == entries  # the manifest holds the SDK's entries as they are
    assert all(c.error is None for c in parse_rule_configurations(stored))


def test_the_hook_takes_a_whole_create_training_job_request(tmp_path):
    import trainguard
    from trainguard.trial import create_trial

    doc = request("mixed_with_actions.json")  # as estimator.fit sends it: both lists and the hook config
    with trainguard.Hook(tmp_path / "whole-request", rules=doc) as hook:
        hook.save_scalar("loss", 1.0)
    assert create_trial(tmp_path / "whole-request").manifest.rules == normalize_rules(doc).entries()
    with pytest.raises(RulesFormatError, match="expected a list of rule configurations or an object"):
        trainguard.Hook(tmp_path / "not-rules", rules="LossNotDecreasing")  # type: ignore[arg-type]

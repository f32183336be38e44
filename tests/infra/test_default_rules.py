"""The stack's ``defaultRules``: any SageMaker rules document, validated at synth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainguard.rules.config import parse_rule_configurations

from infra.config import MAX_DEFAULT_RULES_BYTES, ConfigError, StackConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sagemaker_sdk"


def load(tmp_path: Path, value) -> StackConfig:
    return StackConfig.load({"defaultRules": value}.get, tmp_path, environ={})


def test_a_create_training_job_request_file_becomes_compact_defaults(tmp_path):
    (tmp_path / "rules.json").write_text((FIXTURES / "mixed_with_actions.json").read_text())
    config = load(tmp_path, "rules.json")
    entries = json.loads(config.default_rules)
    assert [e["RuleConfigurationName"] for e in entries] == [
        "LossNotDecreasing", "VanishingGradient", "ExplodingWeights", "ProfilerReport", "LowGPUUtilization",
    ]  # fmt: skip
    assert not any("RuleEvaluatorImage" in e for e in entries)  # the container's, not needed
    assert all(c.error is None for c in parse_rule_configurations(entries))


def test_inline_json_and_unset(tmp_path):
    inline = '[{"RuleConfigurationName": "L", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}}]'
    assert json.loads(load(tmp_path, inline).default_rules)[0]["RuleConfigurationName"] == "L"
    assert load(tmp_path, None).default_rules is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('[{"RuleConfigurationName": "X", "RuleParameters": {"rule_to_invoke": "Nope"}}]', "X: unknown rule"),
        ("missing.json", "missing.json"),
        ('{"TrainingJobName": "x"}', "no DebugRuleConfigurations"),
        ("[]", "no rule configurations"),
    ],
)
def test_bad_defaults_fail_synth(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, value)


def test_defaults_must_fit_lambdas_environment(tmp_path):
    many = [
        {
            "RuleConfigurationName": f"Loss{i}-" + "x" * 150,
            "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"},
        }
        for i in range(20)
    ]
    with pytest.raises(ConfigError, match=f"room for {MAX_DEFAULT_RULES_BYTES}"):
        load(tmp_path, json.dumps(many))

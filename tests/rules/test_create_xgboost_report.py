"""CreateXgboostReport: accepted in SageMaker configs, never fires, ends NoIssuesFound."""

from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.local.synthetic import SyntheticJob
from trainguard.rules.config import parse_rule_configurations

CONFIG = [
    {"RuleConfigurationName": "xgb-report", "RuleParameters": {"rule_to_invoke": "CreateXgboostReport"}}
]


def test_sagemaker_config_is_accepted():
    (configured,) = parse_rule_configurations(CONFIG)
    assert configured.error is None and configured.rule is not None


def test_never_fires_and_ends_without_issues(tmp_path):
    job = SyntheticJob("xgb", steps=list(range(5)), rules=CONFIG, nan_steps=frozenset({2}))
    for rel, body in job.objects().items():
        (tmp_path / "xgb" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "xgb" / rel).write_bytes(body)
    (record,) = replay(LocalJob.open(tmp_path / "xgb")).state.rules
    assert record.status == "NoIssuesFound"


def test_unknown_parameters_are_an_error():
    (configured,) = parse_rule_configurations(
        [
            {
                "RuleConfigurationName": "x",
                "RuleParameters": {"rule_to_invoke": "CreateXgboostReport", "foo": "1"},
            }
        ]
    )
    assert configured.error is not None and "foo" in configured.error

"""CreateXgboostReport: accepted in SageMaker configs, never fires; ends NoIssuesFound when the
job saved XGBoost data to report, Error when it saved none (a report of nothing is no report)."""

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


def test_a_job_without_xgboost_data_is_not_reported_as_fine(tmp_path):
    job = SyntheticJob("xgb", steps=list(range(5)), rules=CONFIG, nan_steps=frozenset({2}))
    for rel, body in job.objects().items():
        (tmp_path / "xgb" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "xgb" / rel).write_bytes(body)
    (record,) = replay(LocalJob.open(tmp_path / "xgb")).state.rules
    assert record.status == "Error" and "saw no XGBoost metrics" in record.details


def test_never_fires_and_ends_without_issues_on_xgboost_data():
    from rulejobs import make, run, scalar, step_data

    rule = make("CreateXgboostReport")
    steps = [step_data(s, train=None) for s in range(5)]
    for sd in steps:
        sd.workers[0].modes["TRAIN"].scalars["validation-logloss"] = scalar(0.5, ["metrics"])
    out = run(rule, steps)
    coverage = rule.coverage(out.state)
    assert out.fired_at is None and coverage is not None and coverage.complete and coverage.checked == 5


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

"""Custom rules (issue 4 item 4): the LossSpike example, plugin loading, replay and local mode.

The example lives in examples/custom_rule/my_rules; these tests import it the way a user's
deployment does (its folder on sys.path, its module named in TRAINGUARD_RULE_MODULES).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import trainguard
from trainguard import cli
from trainguard.engine.replay import replay
from trainguard.engine.sources import LocalJob
from trainguard.format.documents import ModeRecord, ScalarRecord, StepHeader
from trainguard.rules import plugins
from trainguard.rules.base import StepData
from trainguard.rules.catalog import describe_rules
from trainguard.rules.config import parse_rule_configurations
from trainguard.rules.plugins import ENV_VAR, PluginError, load_plugins, rule_class

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_rule"


@pytest.fixture(autouse=True)
def _clean_plugins(monkeypatch: pytest.MonkeyPatch):
    """Each test starts without custom rules and leaves none behind (env, sys.path, cache)."""
    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    plugins.reset()
    yield
    plugins.reset()


def train_step(step: int, loss: float) -> StepData:
    """A step as the hook writes it for ``save_scalar("loss", loss, collections=["losses"])``."""
    header = StepHeader(
        job="unit",
        step=step,
        worker=0,
        world_size=1,
        wall_time=float(step),
        modes={
            "TRAIN": ModeRecord(
                mode_step=step, scalars={"loss": ScalarRecord(value=loss, collections=["losses"])}
            )
        },
    )
    return StepData.from_headers([header])


def spike_config(name: str, **params: str) -> list[dict[str, object]]:
    return [{"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": "LossSpike", **params}}]


def fires_at(rule, losses: list[float]) -> int | None:
    state = rule.initial_state()
    for step, loss in enumerate(losses):
        # stored between invocations as JSON, like the evaluator does
        state = rule.load_state(json.loads(json.dumps(rule.dump_state(state))))
        state, findings = rule.update(state, train_step(step, loss))
        if findings:
            return findings[0].step
    return None


# ----------------------------------------------------------------------------- the example rule


def test_loss_spike_fires_on_a_jump_over_the_running_median() -> None:
    from my_rules import LossSpike

    rule = LossSpike(LossSpike.Config.model_validate({"factor": "3", "window": "10"}))  # SageMaker strings
    smooth = [1.0 - 0.01 * i for i in range(30)]
    assert fires_at(rule, smooth) is None
    spiked = [*smooth[:20], 2.5, *smooth[21:25], 4.0, *smooth[26:]]  # 2.5 < 3 x 0.85; 4.0 > 3 x median
    assert fires_at(rule, spiked) == 25
    primed = rule.initial_state().model_copy(update={"recent": [1.0] * 5})
    [finding] = rule.update(primed, train_step(7, 9.0))[1]
    assert finding.value == pytest.approx(9.0) and finding.threshold == 3.0
    assert "LossSpike" in finding.details() and "at step 7" in finding.details()


def test_loss_spike_waits_for_min_steps_ignores_nan_and_keeps_its_state_bounded() -> None:
    from my_rules import LossSpike

    rule = LossSpike(LossSpike.Config(window=8, min_steps=5))
    assert fires_at(rule, [1.0, 1.0, 1.0, 1.0, 50.0]) is None  # only 4 steps of history
    assert fires_at(rule, [1.0] * 5 + [math.nan, math.inf, 1.1]) is None
    state = rule.initial_state()
    for step in range(10_000):
        state, _ = rule.update(state, train_step(step, 1.0))
    assert len(state.recent) == 8
    assert len(json.dumps(rule.dump_state(state))) < 200
    with pytest.raises(ValueError):
        LossSpike.Config.model_validate({"factor": "0.5"})


# ----------------------------------------------------------------------------- loading


def write_module(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return f"{folder}:{name}"


FAKE_RULE = """
    from trainguard.rules.base import Rule, RuleConfig, RuleState

    class Fake(Rule[RuleConfig, RuleState]):
        name = {name!r}
        Config = RuleConfig
        State = RuleState

        def update(self, state, step):
            return state, []

    RULES = [Fake]
"""


def test_plugin_rules_join_the_registry_and_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rule_class("LossSpike") is None
    monkeypatch.setenv(ENV_VAR, "my_rules")
    from my_rules import LossSpike

    loaded = load_plugins()
    assert loaded.errors == {}
    assert loaded.custom == {"LossSpike": LossSpike} and loaded.origins == {"LossSpike": "my_rules"}
    assert rule_class("LossSpike") is LossSpike
    assert rule_class("LossNotDecreasing") is loaded.rules["LossNotDecreasing"]
    rows = {row["name"]: row for row in describe_rules()}
    assert rows["LossSpike"]["source"] == "my_rules"
    assert rows["LossSpike"]["parameters"] == {
        "factor": "3.0",
        "window": "20",
        "min_steps": "5",
        "tensor_regex": "None",
    }
    assert rows["LossNotDecreasing"]["source"] == "trainguard"
    [configured] = parse_rule_configurations(spike_config("spike-parse", factor="4"))
    assert configured.error is None and configured.rule is not None and configured.rule.config.factor == 4.0


@pytest.mark.parametrize(
    ("module", "body", "expected"),
    [
        ("tg_plugin_missing", None, "import failed: ModuleNotFoundError"),
        ("tg_plugin_syntax", "def broken(:\n", "import failed: SyntaxError"),
        ("tg_plugin_raises", "raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("tg_plugin_no_list", "X = 1\n", "no RULES = [YourRule, ...]"),
        ("tg_plugin_not_rule", "class NotARule:\n    pass\nRULES = [NotARule]\n", "is not a subclass of"),
        ("tg_plugin_clash", FAKE_RULE.format(name="LossNotDecreasing"), "clashes with a built-in rule"),
        ("tg_plugin_clash_profiler", FAKE_RULE.format(name="LowGPUUtilization"), "built-in profiler rule"),
        ("tg_plugin_bad_name", FAKE_RULE.format(name="loss_spike"), "must be a PascalCase string"),
        ("tg_plugin_dup", FAKE_RULE.format(name="LossSpike"), "already provided by module 'my_rules'"),
    ],
)
def test_a_bad_rule_module_is_a_clear_error_naming_it(
    tmp_path: Path, module: str, body: str | None, expected: str
) -> None:
    spec = write_module(tmp_path, module, body) if body is not None else module
    loaded = load_plugins(["my_rules", spec])
    assert set(loaded.errors) == {module}
    assert expected in loaded.errors[module]
    assert "LossSpike" in loaded.custom  # the good module still loads
    with pytest.raises(PluginError) as err:
        load_plugins(["my_rules", spec], strict=True)
    assert f"rule module '{module}'" in str(err.value) and expected in str(err.value)


def test_a_failed_module_makes_its_rules_errors_and_leaves_built_ins_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "tg_plugin_gone")
    configured = parse_rule_configurations(
        [
            *spike_config("spike-gone"),
            {"RuleConfigurationName": "lnd", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}},
        ]
    )
    spike, lnd = configured
    assert spike.rule is None and spike.error is not None
    assert "unknown rule 'LossSpike'" in spike.error
    assert "tg_plugin_gone: import failed: ModuleNotFoundError" in spike.error
    assert lnd.error is None and lnd.rule is not None
    monkeypatch.setenv(ENV_VAR, "not a module name")
    [bad] = parse_rule_configurations(spike_config("spike-bad-env"))
    assert bad.error is not None and ENV_VAR in bad.error


# ----------------------------------------------------------------------------- replay, through the real hook


def hook_job(folder: Path, spike_at: int, rules: list[dict[str, object]]) -> Path:
    with trainguard.Hook(folder, rules=rules, stop_check_interval_s=0) as hook:
        for step in range(40):
            loss = 8.0 if step == spike_at else 2.0 * math.exp(-step / 30) + 0.1
            hook.save_scalar("loss", loss, step=step, collections=["losses"])
    return folder


def test_replay_with_rule_module_finds_the_spike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = hook_job(tmp_path / "spiky-job", 27, spike_config("spike-replay", factor="3"))
    # without the module: an Error status that says how to provide it. (Other rules JSON: the
    # evaluator caches parsed configurations by their JSON for the life of the process.)
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps(spike_config("spike-no-module")))
    assert cli.main(["replay", str(job), "--json", "--no-progress", "--rules", str(rules_file)]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["RuleEvaluationStatus"] == "Error" and ENV_VAR in row["StatusDetails"]
    # DIR:module, as in the README (cwd need not be on sys.path)
    flag = ["--rule-module", f"{EXAMPLE}:my_rules"]
    assert cli.main(["replay", str(job), "--json", "--no-progress", *flag]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["RuleEvaluationStatus"] == "IssuesFound" and row["Step"] == 27
    assert "LossSpike: TRAIN loss 8 > factor=3" in row["StatusDetails"]
    # the library call agrees, and a clean job ends NoIssuesFound
    result = replay(LocalJob.open(str(job)))
    assert result.summary()[0]["Step"] == 27
    clean = hook_job(tmp_path / "clean-job", -1, spike_config("spike-replay"))
    assert replay(LocalJob.open(str(clean))).summary()[0]["RuleEvaluationStatus"] == "NoIssuesFound"


def test_cli_lists_custom_rules_and_rejects_a_broken_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "--rule-module", "my_rules"]) == 0
    out = capsys.readouterr().out
    assert "LossSpike" in out and "(custom: my_rules)" in out and "LossNotDecreasing" in out
    assert cli.main(["rules", "--rule-module", "tg_plugin_absent"]) == 2
    assert "rule module 'tg_plugin_absent': import failed" in capsys.readouterr().err


# ----------------------------------------------------------------------------- local mode on moto


@pytest.mark.slow
def test_local_pipeline_alerts_on_the_custom_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.local.runtime import LocalCloud
    from trainguard.local.synthetic import SyntheticJob
    from trainguard.service import clients

    # as on Lambda: the module is importable (the layer is /opt/python) and named in the env
    monkeypatch.setenv(ENV_VAR, "my_rules")
    rules = [{**spike_config("spike")[0], "Actions": ["Email"]}]
    job = SyntheticJob(
        "custom-spike-1",
        steps=list(range(0, 60, 2)),
        rules=rules,
        loss=lambda step, worker: 6.0 if step == 30 else 1.0 - 0.005 * step,
    )
    with LocalCloud(name="tg-custom-rules") as cloud:
        s3 = clients.client("s3")
        for rel, body in job.objects().items():
            s3.put_object(Bucket=cloud.resources.bucket, Key=f"jobs/{job.job}/{rel}", Body=body)
        assert cloud.wait_idle(30)
        fired = [
            e["detail"]
            for e in cloud.events
            if e["detail"].get("TrainingJobName") == job.job
            and e["detail"].get("RuleEvaluationStatus") == "IssuesFound"
        ]
        assert [(d["RuleConfigurationName"], d["RuleName"], d["Step"]) for d in fired] == [
            ("spike", "LossSpike", 30)
        ]
        [sent] = [n for n in cloud.sent_notifications() if job.job in n["subject"]]
        assert sent["channels"] == ["Email"]
        assert "gradient clipping" in sent["email"]  # LossSpike.advice: notify loaded the module too
        assert not cloud.errors

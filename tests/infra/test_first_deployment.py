"""What a first deployment hits (issue 9, item 8): the CDK entry point, subscribers, two stacks in
one account and region, and cdk-nag suppressions that each match a real finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App  # noqa: E402
from aws_cdk.assertions import Annotations, Match, Template  # noqa: E402

from infra import nag  # noqa: E402
from infra.app import build_app, cdk_json_context  # noqa: E402
from infra.config import ConfigError, StackConfig  # noqa: E402
from infra.stack import TrainguardStack  # noqa: E402


@pytest.fixture(scope="module")
def layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layer")
    (root / "python" / "trainguard").mkdir(parents=True)
    (root / "python" / "trainguard" / "__init__.py").write_text("")
    return root


# ----------------------------------------------------------------------------- cdk.json


def test_cdk_json_runs_a_launcher_not_one_venv_path() -> None:
    app = json.loads((REPO / "cdk.json").read_text())["app"]
    assert ".venv/bin/python" not in app
    assert app == "sh infra/cdk-app.sh"


def fake_python(tmp_path: Path, name: str, importable: bool) -> Path:
    path = tmp_path / name
    log = tmp_path / f"{name}.log"
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit {0 if importable else 1}; fi\necho "$@" > "{log}"\n'
    )
    path.chmod(0o755)
    return path


def test_the_launcher_uses_the_first_python_that_has_the_cdk(tmp_path: Path) -> None:
    without = fake_python(tmp_path, "bare", importable=False)
    with_cdk = fake_python(tmp_path, "python3", importable=True)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "TRAINGUARD_PYTHON": str(without), "HOME": str(tmp_path)}
    # the repo's own .venv would win over PATH: run a copy of the launcher in a repo without one
    repo = tmp_path / "repo"
    (repo / "infra").mkdir(parents=True)
    (repo / "infra" / "cdk-app.sh").write_text((REPO / "infra" / "cdk-app.sh").read_text())
    proc = subprocess.run(["sh", str(repo / "infra" / "cdk-app.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "python3.log").read_text().strip() == "infra/app.py"
    assert with_cdk.exists() and not (tmp_path / "bare.log").exists()


def test_the_launcher_says_what_to_do_without_a_usable_python(tmp_path: Path) -> None:
    fake_python(tmp_path, "python3", importable=False)
    repo = tmp_path / "repo"
    (repo / "infra").mkdir(parents=True)
    (repo / "infra" / "cdk-app.sh").write_text((REPO / "infra" / "cdk-app.sh").read_text())
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["sh", str(repo / "infra" / "cdk-app.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "make setup" in proc.stderr and "TRAINGUARD_PYTHON" in proc.stderr


# ----------------------------------------------------------------------------- subscribers


def warnings_of(stack: TrainguardStack) -> list[str]:
    found = Annotations.from_stack(stack).find_warning("*", Match.any_value())
    return [str(w.entry.data) for w in found]


def test_synth_warns_when_alerts_and_alarms_have_no_subscriber(layer_dir: Path, tmp_path: Path) -> None:
    _app, stack = build_app(
        {"layerAsset": str(layer_dir)}, outdir=str(tmp_path / "a"), nag=False, config_dir=tmp_path
    )
    text = "\n".join(warnings_of(stack))
    assert "No alertEmails or alertPhones" in text and "No opsEmails" in text
    _app, stack = build_app(
        {"layerAsset": str(layer_dir), "alertPhones": "+15555550100", "opsEmails": "ops@example.com"},
        outdir=str(tmp_path / "b"),
        nag=False,
        config_dir=tmp_path,
    )
    assert warnings_of(stack) == []


# ----------------------------------------------------------------------------- two stacks


def physical_names(template: dict[str, Any]) -> set[str]:
    keys = ("Name", "AlarmName", "DashboardName", "TopicName", "QueueName", "TableName", "BucketName")
    names = set()
    for res in template["Resources"].values():
        for key in keys:
            value = res.get("Properties", {}).get(key)
            if isinstance(value, str):
                names.add(f"{res['Type']}:{value}")
    names |= {f"Export:{o['Export']['Name']}" for o in template.get("Outputs", {}).values() if "Export" in o}
    return names


def test_two_stacks_in_one_account_and_region_share_no_physical_name(layer_dir: Path, tmp_path: Path) -> None:
    app = App(context=cdk_json_context(), outdir=str(tmp_path / "out"))
    config = StackConfig(layer_dir=layer_dir, alert_emails=("a@example.com",))
    first = TrainguardStack(app, "TrainguardTeamA", config=config)
    second = TrainguardStack(app, "TrainguardTeamB", config=config)
    a = physical_names(Template.from_stack(first).to_json())
    b = physical_names(Template.from_stack(second).to_json())
    assert "AWS::Events::EventBus:TrainguardTeamA" in a and "AWS::Events::EventBus:TrainguardTeamB" in b
    assert not a & b, a & b


def test_bus_name_is_validated_when_given() -> None:
    assert StackConfig.load({"busName": "ml-bus"}.get, Path("/nonexistent"), environ={}).bus_name == "ml-bus"
    assert StackConfig.load({}.get, Path("/nonexistent"), environ={}).bus_name is None
    for bad in ("default", "a b", "x" * 300):
        with pytest.raises(ConfigError):
            StackConfig.load({"busName": bad}.get, Path("/nonexistent"), environ={})


def test_sagemaker_stop_config_is_a_strict_boolean() -> None:
    load = StackConfig.load
    assert load({"sagemakerStop": "true"}.get, Path("/x"), environ={}).sagemaker_stop is True
    assert load({"sagemakerStop": True}.get, Path("/x"), environ={}).sagemaker_stop is True
    assert load({}.get, Path("/x"), environ={}).sagemaker_stop is False
    with pytest.raises(ConfigError):
        load({"sagemakerStop": "maybe"}.get, Path("/x"), environ={})


# ----------------------------------------------------------------------------- cdk-nag


def test_every_cdk_nag_suppression_matches_a_real_finding_and_says_why(
    layer_dir: Path, tmp_path: Path
) -> None:
    """No stale suppression: each acknowledgment silences a finding cdk-nag actually reports."""
    nag.ACKNOWLEDGED.clear()
    app, stack = build_app(
        {"layerAsset": str(layer_dir), "alertEmails": "a@example.com", "sagemakerStop": "true"},
        outdir=str(tmp_path / "out"),
        nag=True,
        config_dir=tmp_path,
    )
    app.synth()
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    (plugin,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []
    suppressed = [
        (v["acknowledgedId"], c["constructPath"])
        for v in plugin.get("suppressedViolations", [])
        for c in v["violatingConstructs"]
    ]
    ours = [
        (path, rule, reason) for path, rule, reason in nag.ACKNOWLEDGED if path.startswith(stack.stack_name)
    ]
    assert ours
    stale = [
        (path, rule)
        for path, rule, _ in ours
        if not any(
            rid == rule and (cpath == path or cpath.startswith(path + "/")) for rid, cpath in suppressed
        )
    ]
    assert not stale, stale
    for _path, rule, reason in ours:
        assert len(reason) > 60 and reason.rstrip().endswith((".", ")")), (rule, reason)

"""The metrics a function publishes, in the environment the template gives it, are the ones its
alarms and dashboard query (issue 9: with POWERTOOLS_SERVICE_NAME set, Powertools added a
``service`` dimension to every metric and no rule alarm could ever fire).

Everything is read from the synthesized template: each function's environment variables, each
alarm's namespace and dimensions, the Error alarm's Metrics Insights query, the dashboard's
SEARCH expressions.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from template_policies import logical_id
from trainguard.engine.model import RuleRecord, Transition
from trainguard.wiring import WIRING

PUBLISHERS = [f.id for f in WIRING.functions if f.id in ("evaluate", "clock", "stop_job")]


def flatten(node: Any) -> str:
    """A template value as text (Fn::Join parts concatenated, tokens as <ref>)."""
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "".join(flatten(n) for n in node)
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(flatten(p) for p in parts)
    return "<ref>"


def queried(template: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    """(namespace, metric, dimension names) of every alarm and dashboard widget on our metrics."""
    out: set[tuple[str, str, tuple[str, ...]]] = set()
    for res in template["Resources"].values():
        p = res.get("Properties", {})
        if res["Type"] == "AWS::CloudWatch::Alarm":
            if "Namespace" in p and not p["Namespace"].startswith("AWS/"):
                dims = tuple(sorted(d["Name"] for d in p.get("Dimensions", [])))
                out.add((p["Namespace"], p["MetricName"], dims))
            for m in p.get("Metrics", []):
                query = m.get("Expression", "")
                hit = re.search(r'SELECT SUM\("(\w+)"\) FROM SCHEMA\("([^"]+)",\s*([^)]*)\)', query)
                if hit:
                    dims = tuple(sorted(d.strip() for d in hit.group(3).split(",")))
                    out.add((hit.group(2), hit.group(1), dims))
        if res["Type"] == "AWS::CloudWatch::Dashboard":
            body = flatten(p["DashboardBody"]).replace('\\"', '"')
            for schema, metric in re.findall(r"SEARCH\('\{([^}]+)\} MetricName=\"([^\"]+)\"", body):
                namespace, *dims = [s.strip() for s in schema.split(",")]
                out.add((namespace, metric, tuple(sorted(dims))))
    return out


def function_environment(template: dict[str, Any], stack: Any, fid: str) -> dict[str, str]:
    variables = template["Resources"][logical_id(stack, stack.functions[fid])]["Properties"]["Environment"]
    return {
        k: v if isinstance(v, str) else f"resolved-{k.lower()}" for k, v in variables["Variables"].items()
    }


def published(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str]
) -> list:
    from trainguard.service import metrics

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    capsys.readouterr()
    transitions = [
        Transition(
            job="job-1",
            record=RuleRecord(name="grads", rule=rule, status=status, step=3),
            previous="InProgress",
        )
        for rule in ("VanishingGradient", "StepOutlier")
        for status in ("IssuesFound", "Error")
    ]
    metrics.publish("job-1", [(3, 1_800_000_000.0, {"TRAIN.loss": 0.5, "EVAL.loss": 0.7})], transitions)
    out = []
    for line in capsys.readouterr().out.splitlines():
        if '"_aws"' in line:
            blob = json.loads(line)
            for directive in blob["_aws"]["CloudWatchMetrics"]:
                for dims in directive["Dimensions"]:
                    for metric in directive["Metrics"]:
                        out.append((directive["Namespace"], metric["Name"], tuple(sorted(dims))))
    return out


@pytest.mark.parametrize("fid", PUBLISHERS)
def test_every_queried_metric_is_published_with_exactly_its_dimensions(
    synthesized, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fid: str
) -> None:
    stack, template = synthesized
    env = function_environment(template, stack, fid)
    assert env["POWERTOOLS_SERVICE_NAME"]  # the variable that used to add a "service" dimension
    emitted = set(published(monkeypatch, capsys, env))
    wanted = queried(template)
    # the rule alarms, the Error alarm's query, the dashboard's searches
    assert {("trainguard", "IssuesFound", ("RuleName",)), ("trainguard", "Error", ("RuleName",))} <= wanted
    assert ("trainguard", "TRAIN.loss", ("TrainingJobName",)) in wanted
    missing = wanted - emitted
    assert not missing, f"{fid}: alarms/dashboard query metrics it never publishes: {sorted(missing)}"
    # and nothing published under a dimension set nobody queries, except the per-job copies
    stray = {
        e
        for e in emitted
        if e[2] not in {w[2] for w in wanted} | {("RuleConfigurationName", "TrainingJobName")}
    }
    assert not stray, stray


def test_the_per_rule_alarm_dimension_is_the_rule_name(synthesized) -> None:
    _stack, template = synthesized
    rule_alarms = [q for q in queried(template) if q[1] == "IssuesFound"]
    assert rule_alarms and all(dims == ("RuleName",) for _, _, dims in rule_alarms)

"""Per-job rule configuration: SageMaker's ``DebugRuleConfigurations``, unchanged, plus actions.

Accepted entry (SageMaker's shape; ``Actions`` is trainguard's optional addition)::

    {"RuleConfigurationName": "LossNotDecreasing",
     "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "10"},
     "Actions": ["Email", "SMS", "StopTraining"]}

SageMaker's own action list (``RuleParameters["action_json"]``, as smdebug-rulesconfig's
``ActionList`` writes it) is read too, so existing configs keep their stop/alert choices.
A bad entry never rejects the others: it becomes a ``ConfiguredRule`` whose ``error`` says
what is wrong, and the job shows that rule as ``Error``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trainguard.rules.base import AnyRule, RuleConfig
from trainguard.rules.plugins import load_plugins, rule_class

MAX_RULES_PER_JOB = 20  # SageMaker's limit
MAX_PARAMETERS = 100
ACTIONS = ("Email", "SMS", "StopTraining")
#: Applied when a job declares no rules: the checks nearly every job wants, at defaults.
DEFAULT_RULES = ("LossNotDecreasing", "VanishingGradient", "ExplodingTensor", "DeadRelu", "Overfit")
DEFAULT_ACTIONS = ("Email", "SMS")


@dataclass
class ConfiguredRule:
    """One entry of a job's rule configuration, parsed (or the reason it could not be)."""

    configuration_name: str
    rule_name: str
    parameters: dict[str, str] = field(default_factory=dict)
    actions: tuple[str, ...] = DEFAULT_ACTIONS
    rule: AnyRule | None = None
    error: str | None = None


def default_rule_configurations() -> list[dict[str, Any]]:
    return [
        {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}} for name in DEFAULT_RULES
    ]


def parse_rule_configurations(entries: list[dict[str, Any]] | None) -> list[ConfiguredRule]:
    """Parse a job's ``DebugRuleConfigurations`` (None: the default rule set)."""
    raw = default_rule_configurations() if entries is None else entries
    out: list[ConfiguredRule] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        if index >= MAX_RULES_PER_JOB:
            out.append(
                ConfiguredRule(f"rule-{index}", "?", error=f"more than {MAX_RULES_PER_JOB} rules in one job")
            )
            break
        item = parse_one(entry, index)
        if item.configuration_name in seen:
            item.error = item.error or f"duplicate RuleConfigurationName {item.configuration_name!r}"
            item.configuration_name = f"{item.configuration_name}#{index}"
            item.rule = None
        seen.add(item.configuration_name)
        out.append(item)
    return out


def parse_one(entry: Any, index: int = 0) -> ConfiguredRule:
    if not isinstance(entry, dict):
        return ConfiguredRule(f"rule-{index}", "?", error="a rule configuration must be a JSON object")
    name = entry.get("RuleConfigurationName")
    params = entry.get("RuleParameters")
    if not isinstance(name, str) or not 1 <= len(name) <= 256:
        name = f"rule-{index}"
        return ConfiguredRule(name, "?", error="RuleConfigurationName must be a string of 1-256 characters")
    if not isinstance(params, dict):
        return ConfiguredRule(name, "?", error="RuleParameters must be an object of string values")
    if len(params) > MAX_PARAMETERS:
        return ConfiguredRule(name, "?", error=f"more than {MAX_PARAMETERS} RuleParameters")
    params = {str(k): ("" if v is None else str(v)) for k, v in params.items()}
    rule_name = params.pop("rule_to_invoke", None)
    # SageMaker-only parameters we accept and ignore (they configure its container)
    action_json = params.pop("action_json", None)
    if not rule_name:
        return ConfiguredRule(name, "?", params, error="RuleParameters.rule_to_invoke is missing")
    try:
        actions = _parse_actions(entry.get("Actions"), action_json)
    except ValueError as exc:
        return ConfiguredRule(name, rule_name, params, error=str(exc))
    extra = set(entry) - {
        "RuleConfigurationName",
        "RuleParameters",
        "Actions",
        "RuleEvaluatorImage",
        "InstanceType",
        "VolumeSizeInGB",
        "LocalPath",
        "S3OutputPath",
    }
    if extra:
        return ConfiguredRule(name, rule_name, params, actions, error=f"unknown keys {sorted(extra)}")
    cls = rule_class(rule_name)  # a built-in, else a custom rule (trainguard.rules.plugins)
    if cls is None:
        return ConfiguredRule(
            name, rule_name, params, actions, error=load_plugins().unknown_rule_message(rule_name)
        )
    try:
        config: RuleConfig = cls.Config.model_validate(params)
        rule = cls(config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'parameters'}: {e['msg']}" for e in exc.errors()[:5]
        )
        return ConfiguredRule(
            name, rule_name, params, actions, error=f"bad parameter for {rule_name}: {problems}"
        )
    except ValueError as exc:
        return ConfiguredRule(name, rule_name, params, actions, error=f"bad parameter for {rule_name}: {exc}")
    except Exception as exc:  # a custom rule's own code: an Error for this rule, not the job
        return ConfiguredRule(
            name,
            rule_name,
            params,
            actions,
            error=f"{rule_name} failed to start: {type(exc).__name__}: {exc}",
        )
    return ConfiguredRule(name, rule_name, params, actions, rule=rule)


def _parse_actions(actions: Any, action_json: str | None) -> tuple[str, ...]:
    found: list[str] = []
    if actions is not None:
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ValueError(f"Actions must be a list drawn from {list(ACTIONS)}")
        found.extend(actions)
    if action_json:
        try:
            doc = json.loads(action_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"action_json is not JSON: {exc}") from None
        items = doc if isinstance(doc, list) else [doc]
        for item in items:
            key = item.get("name") if isinstance(item, dict) else item
            mapping = {"stoptraining": "StopTraining", "email": "Email", "sms": "SMS"}
            if isinstance(key, str) and key.lower() in mapping:
                found.append(mapping[key.lower()])
    unknown = [a for a in found if a not in ACTIONS]
    if unknown:
        raise ValueError(f"unknown actions {unknown}; allowed: {list(ACTIONS)}")
    if actions is None and not action_json:
        return DEFAULT_ACTIONS
    return tuple(dict.fromkeys(found))

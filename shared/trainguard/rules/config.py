"""Per-job rule configuration: SageMaker's ``DebugRuleConfigurations``, unchanged, plus actions.

Accepted entry (SageMaker's shape; ``Actions`` is trainguard's optional addition)::

    {"RuleConfigurationName": "LossNotDecreasing",
     "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": "10"},
     "Actions": ["Email", "SMS", "StopTraining"]}

Everything the SageMaker SDK writes into an entry is accepted as it writes it:

* ``action_json`` (smdebug-rulesconfig's ``ActionList``, JSON escaped inside the string):
  its StopTraining, Email and SMS become the rule's actions. The SDK's addresses, phone
  numbers and ``training_job_prefix`` are not used: alerts go to the stack's subscribers
  and a stop goes to this job only (a job's own config must never choose recipients or
  name another job to stop).
* ``other_trial_0``, ``other_trial_1``... (``other_trials_s3_input_paths``): SimilarAcrossRuns's
  ``other_trials``, each S3 path read as the trainguard job it names.
* ``scan_interval_us`` (profiler rules, and ``<Rule>_scan_interval_us`` for ProfilerReport):
  how often SageMaker's rule container rescans S3. trainguard judges each system batch
  when it arrives, so there is nothing to rescan: accepted and noted, not used.
* ``RuleEvaluatorImage``, ``InstanceType``, ``VolumeSizeInGB``, ``LocalPath``,
  ``S3OutputPath``: the rule container's settings, accepted and not used.

What was accepted but not used is listed in ``ConfiguredRule.notes``. A bad entry never
rejects the others: it becomes a ``ConfiguredRule`` whose ``error`` says what is wrong,
under its own ``RuleConfigurationName``, and the job shows that rule as ``Error``.
Containers (a list, ``DebugRuleConfigurations``/``ProfilerRuleConfigurations``, a whole
CreateTrainingJob request) are unpacked by :func:`trainguard.rules.sagemaker.normalize_rules`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trainguard.format.layout import INGEST_PREFIX, LayoutError, validate_job_name
from trainguard.rules.base import AnyRule, RuleConfig
from trainguard.rules.plugins import load_plugins, rule_class
from trainguard.rules.sagemaker import (
    MAX_DEBUG_RULES,
    MAX_PROFILER_RULES,
    RulesFormatError,
    is_profiler_entry,
    loads_rules,
)

MAX_RULES_PER_JOB = MAX_DEBUG_RULES  # SageMaker's limit, for each of debugger and profiler rules
MAX_PARAMETERS = 100
#: the stack's ``defaultRules`` (JSON, any shape ``normalize_rules`` takes): the rules of a
#: job that declares none; unset, the built-in ``DEFAULT_RULES``
DEFAULT_RULES_ENV = "TRAINGUARD_DEFAULT_RULES"
#: RuleParameters that configure SageMaker's rule container, not the rule: accepted, not used
CONTAINER_PARAMETERS = {
    "scan_interval_us": (
        "scan_interval_us accepted, not used: trainguard judges each system batch when it "
        "arrives instead of rescanning S3 on an interval"
    ),
}
_OTHER_TRIAL = re.compile(r"other_trial_([0-9]{1,3})\Z")
ACTIONS = ("Email", "SMS", "StopTraining")
#: Applied when a job declares no rules: the checks nearly every job wants, at defaults.
DEFAULT_RULES = (
    "LossNotDecreasing",
    "VanishingGradient",
    "ExplodingTensor",
    "DeadRelu",
    "Overfit",
    # a loss that grows by orders of magnitude while finite: ExplodingTensor waits for NaN (issue 22)
    "LossDivergence",
)
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
    #: what the entry carried that was accepted but is not used here, and why
    notes: tuple[str, ...] = ()


def default_rule_configurations() -> list[dict[str, Any]]:
    """The rules of a job that declares none: the stack's ``defaultRules``, else ``DEFAULT_RULES``.

    Raises ``RulesFormatError`` when ``TRAINGUARD_DEFAULT_RULES`` is set but unusable (the
    stack validates it at synth, so this means a hand-edited environment).
    """
    configured = os.environ.get(DEFAULT_RULES_ENV, "").strip()
    if configured:
        return loads_rules(configured, DEFAULT_RULES_ENV).entries()
    return [
        {"RuleConfigurationName": name, "RuleParameters": {"rule_to_invoke": name}} for name in DEFAULT_RULES
    ]


def parse_rule_configurations(entries: list[dict[str, Any]] | None) -> list[ConfiguredRule]:
    """Parse a job's rule entries, debugger and profiler mixed (None: the default rule set).

    At most ``MAX_DEBUG_RULES`` debugger and ``MAX_PROFILER_RULES`` profiler rules are
    evaluated (SageMaker's limits); each entry past a limit is an ``Error`` under its own name.
    """
    try:
        raw: list[Any] = default_rule_configurations() if entries is None else list(entries)
    except RulesFormatError as exc:
        return [ConfiguredRule("defaultRules", "?", error=str(exc)[:900])]
    out: list[ConfiguredRule] = []
    seen: set[str] = set()
    counts = {"debugger": 0, "profiler": 0}
    for index, entry in enumerate(raw):
        kind = "profiler" if is_profiler_entry(entry) else "debugger"
        counts[kind] += 1
        limit = MAX_PROFILER_RULES if kind == "profiler" else MAX_DEBUG_RULES
        if counts[kind] > limit:
            name = _entry_name(entry, index)
            item = ConfiguredRule(
                name,
                _entry_rule(entry),
                error=(
                    f"more than {limit} {kind} rules in one job (SageMaker's limit); "
                    "this one is not evaluated"
                ),
            )
        else:
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
    action_json = params.pop("action_json", None)
    if not rule_name:
        return ConfiguredRule(name, "?", params, error="RuleParameters.rule_to_invoke is missing")
    notes: list[str] = []
    try:
        actions = _parse_actions(entry.get("Actions"), action_json, notes)
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
        values = _sagemaker_parameters(cls, params, notes)
    except ValueError as exc:
        return ConfiguredRule(name, rule_name, params, actions, error=f"bad parameter for {rule_name}: {exc}")
    try:
        config: RuleConfig = cls.Config.model_validate(values)
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
    if rule_name == "TensorVariance" and not {"max_threshold", "min_threshold"} & {
        k for k, v in params.items() if v.strip() not in ("", "None", "none", "null")
    }:
        notes.append(
            "TensorVariance has neither max_threshold nor min_threshold (SageMaker's defaults, which "
            "could never fire): trainguard's defaults apply (min 1e-5, max 10 on weights)"
        )
    return ConfiguredRule(name, rule_name, params, actions, rule=rule, notes=tuple(notes))


def _entry_name(entry: Any, index: int) -> str:
    name = entry.get("RuleConfigurationName") if isinstance(entry, dict) else None
    return name if isinstance(name, str) and 1 <= len(name) <= 256 else f"rule-{index}"


def _entry_rule(entry: Any) -> str:
    params = entry.get("RuleParameters") if isinstance(entry, dict) else None
    rule = params.get("rule_to_invoke") if isinstance(params, dict) else None
    return rule if isinstance(rule, str) and rule else "?"


def _sagemaker_parameters(cls: Any, params: dict[str, str], notes: list[str]) -> dict[str, Any]:
    """The entry's parameters as the rule's Config takes them: SageMaker's spellings mapped."""
    fields = set(getattr(cls.Config, "model_fields", {}))
    values: dict[str, Any] = {}
    trials: dict[int, str] = {}
    for key, value in params.items():
        trial = _OTHER_TRIAL.match(key)
        if trial and "other_trials" in fields:
            trials[int(trial.group(1))] = value
            continue
        base = key.partition("_")[2] if cls.name == "ProfilerReport" else key
        reason = CONTAINER_PARAMETERS.get(key) or CONTAINER_PARAMETERS.get(base)
        if reason is not None and key not in fields:
            notes.append(reason if base == key else f"{key}: {reason}")
            continue
        values[key] = value
    if trials:
        jobs = [_trial_job(trials[i]) for i in sorted(trials)]
        given = values.get("other_trials")
        if given:
            raise ValueError("give other_trials or other_trial_0, other_trial_1..., not both")
        values["other_trials"] = tuple(dict.fromkeys(jobs))
        notes.extend(
            f"other_trial_{i} {trials[i]!r} read as trainguard job {job!r}"
            for i, job in zip(sorted(trials), jobs, strict=True)
            if job != trials[i]
        )
    return values


def _trial_job(path: str) -> str:
    """The trainguard job an ``other_trials_s3_input_paths`` entry names.

    ``s3://bucket/jobs/<job>/...`` (trainguard's layout) gives ``<job>``; SageMaker's
    ``s3://bucket/<prefix>/<training-job>/debug-output`` gives ``<training-job>``; any
    other URI or path its last component; a bare name is the job itself.
    """
    text = path.strip()
    if text.startswith("s3://"):
        parts = [p for p in text[len("s3://") :].split("/")[1:] if p]
    else:
        parts = [p for p in text.split("/") if p]
    marker = INGEST_PREFIX.strip("/")
    if marker in parts and parts.index(marker) + 1 < len(parts):
        job = parts[parts.index(marker) + 1]
    elif len(parts) >= 2 and parts[-1] == "debug-output":
        job = parts[-2]
    else:
        job = parts[-1] if parts else ""
    try:
        return validate_job_name(job)
    except LayoutError as exc:
        raise ValueError(f"other trial {path[:200]!r} names no trainguard job: {exc}") from None


#: smdebug-rulesconfig's action names (``Action.__class__.__name__.lower()``)
_ACTION_NAMES = {"stoptraining": "StopTraining", "email": "Email", "sms": "SMS"}


def _load_action_json(text: str) -> Any:
    """Parse ``action_json`` as JSON, or as the SDK writes it: JSON escaped inside the string.

    smdebug-rulesconfig serialises ``[{\\"name\\": \\"email\\", ...}]`` (backslash-quote),
    which is the body of a JSON string: decoding it as one gives the JSON itself.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        if '\\"' not in text:
            raise ValueError(f"action_json is not JSON: {first}") from None
        try:
            return json.loads(json.loads(f'"{text}"'))
        except json.JSONDecodeError as exc:
            raise ValueError(f"action_json is not JSON, escaped or not: {exc}") from None


def _parse_actions(actions: Any, action_json: str | None, notes: list[str] | None = None) -> tuple[str, ...]:
    found: list[str] = []
    if actions is not None:
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ValueError(f"Actions must be a list drawn from {list(ACTIONS)}")
        found.extend(actions)
    if action_json:
        if len(action_json) > 16_384:
            raise ValueError("action_json is longer than 16384 characters")
        doc = _load_action_json(action_json)
        items = doc if isinstance(doc, list) else [doc]
        for item in items:
            key = item.get("name") if isinstance(item, dict) else item
            if not isinstance(key, str) or key.lower() not in _ACTION_NAMES:
                raise ValueError(
                    f"action_json: unknown action {str(key)[:60]!r}; SageMaker's are stoptraining, email, sms"
                )
            found.append(_ACTION_NAMES[key.lower()])
            extra = sorted(k for k in item if k != "name") if isinstance(item, dict) else []
            if extra and notes is not None:
                notes.append(
                    f"action_json {key.lower()}: {', '.join(extra)} not used (alerts go to the stack's "
                    "subscribers; a stop goes to this job only)"
                )
    unknown = [a for a in found if a not in ACTIONS]
    if unknown:
        raise ValueError(f"unknown actions {unknown}; allowed: {list(ACTIONS)}")
    if actions is None and not action_json:
        return DEFAULT_ACTIONS
    return tuple(dict.fromkeys(found))

"""Deploy-time settings of the trainguard stack, read once and validated at synth.

Sources, later ones winning: defaults < ``trainguard.config.json`` at the repo root (optional)
< CDK context (``cdk.json`` or ``-c key=value``) < environment for the test switch
``TRAINGUARD_LAYER_DIR``. A bad value fails ``cdk synth``, not the first alert.

Keys (context names; the config file uses the same)::

    alertEmails       comma-separated or a JSON list: rule alerts by email (filter actions=Email)
    alertPhones       E.164 numbers: rule alerts by SMS (filter actions=SMS)
    opsEmails         CloudWatch alarm notifications (default: alertEmails)
    ruleAlarmEmails   rule-outcome alarms (IssuesFound per built-in rule, Error): the
                      rule-alarm topic, unfiltered (default: none; subscribe by hand)
    architecture      x86_64 (default) or arm64; the layer is built for the same
    layerAsset        a prebuilt layer folder (holding python/): skips the pip build (tests)
    logLevel          LOG_LEVEL of the functions (default INFO)
    logRetentionDays  function log retention (default 30)
    dataRetentionDays job objects under the ingest prefix expire after this (default 90; 0: never)
    busName           the custom EventBridge bus (default "trainguard")
    ruleModules       custom rules: DIR:module[,DIR:module...] (DIR relative to the repo root);
                      each DIR becomes part of a second layer on the rule-evaluating functions
                      and each module (with RULES = [...]) is imported and validated at synth
    defaultRules      the rules of a job that declares none: a JSON file (relative to the repo
                      root) or inline JSON, in any shape the SageMaker SDK writes (a list,
                      DebugRuleConfigurations/ProfilerRuleConfigurations, a CreateTrainingJob
                      request); validated at synth (default: trainguard's built-in defaults)
    nag               "false" skips the cdk-nag AwsSolutions checks in infra/app.py
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "trainguard.config.json"

_EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")
_PHONE = re.compile(r"^\+[1-9][0-9]{6,14}$")  # E.164, as SNS wants it
_BUS = re.compile(r"^[A-Za-z0-9._-]{1,256}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ARCHITECTURES = ("x86_64", "arm64")
#: Lambda's environment holds 4 KB in all; the default rules may take this much of it
MAX_DEFAULT_RULES_BYTES = 3072
#: rule-container settings the SDK writes into each entry; not needed in the environment
_CONTAINER_KEYS = ("RuleEvaluatorImage", "InstanceType", "VolumeSizeInGB", "LocalPath", "S3OutputPath")
#: values CloudWatch Logs accepts (a subset: the common ones)
RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 180, 365)


class ConfigError(ValueError):
    """A deploy setting that would make a broken stack."""


def _as_list(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        if value.strip().startswith("["):
            value = json.loads(value)
        else:
            return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value if str(v).strip())
    raise ConfigError(f"expected a comma-separated string or a list, got {value!r}")


def _default_rules(value: Any, repo: Path) -> str | None:
    """``defaultRules`` as the compact JSON the rule-evaluating functions read, validated."""
    if value is None or value == "":
        return None
    from trainguard.rules.config import parse_rule_configurations
    from trainguard.rules.sagemaker import RulesFormatError, load_rules_file, loads_rules, normalize_rules

    try:
        if isinstance(value, (list, dict)):
            rules = normalize_rules(value)
        elif isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            rules = loads_rules(value, "defaultRules")
        else:
            rules = load_rules_file(repo / str(value))
    except RulesFormatError as exc:
        raise ConfigError(f"defaultRules: {exc}") from None
    entries = [
        {k: v for k, v in e.items() if k not in _CONTAINER_KEYS} if isinstance(e, dict) else e
        for e in rules.entries()
    ]
    if not entries:
        raise ConfigError("defaultRules: no rule configurations (leave it unset for the built-in defaults)")
    bad = [f"{c.configuration_name}: {c.error}" for c in parse_rule_configurations(entries) if c.error]
    if bad:
        raise ConfigError("defaultRules: " + "; ".join(bad)[:2000])
    text = json.dumps(entries, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_DEFAULT_RULES_BYTES:
        raise ConfigError(
            f"defaultRules: {len(text.encode())} bytes of JSON; Lambda's environment leaves room for "
            f"{MAX_DEFAULT_RULES_BYTES} (fewer rules or parameters, or give jobs their rules in the hook)"
        )
    return text


def _as_int(key: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from None


@dataclass(frozen=True)
class RuleModuleSource:
    """One ``ruleModules`` entry: a folder shipped in the custom-rules layer, a module in it."""

    folder: Path
    module: str

    @staticmethod
    def parse(entry: str, base: Path) -> RuleModuleSource:
        folder, sep, module = entry.strip().rpartition(":")
        if not sep or not folder.strip() or not _MODULE.match(module.strip()):
            raise ConfigError(
                f"ruleModules entry {entry!r}: expected DIR:module, like examples/custom_rule:my_rules"
            )
        path = Path(folder.strip()).expanduser()
        return RuleModuleSource((base / path).resolve(), module.strip())

    def __str__(self) -> str:
        return f"{self.folder}:{self.module}"


@dataclass(frozen=True)
class StackConfig:
    alert_emails: tuple[str, ...] = ()
    alert_phones: tuple[str, ...] = ()
    ops_emails: tuple[str, ...] = ()
    rule_alarm_emails: tuple[str, ...] = ()
    architecture: str = "x86_64"
    layer_dir: Path | None = None
    log_level: str = "INFO"
    log_retention_days: int = 30
    data_retention_days: int = 90
    bus_name: str = "trainguard"
    rule_modules: tuple[RuleModuleSource, ...] = ()
    #: ``defaultRules`` as validated, compact JSON (None: the built-in defaults)
    default_rules: str | None = None

    def __post_init__(self) -> None:
        for email in (*self.alert_emails, *self.ops_emails, *self.rule_alarm_emails):
            if not _EMAIL.match(email):
                raise ConfigError(f"not an email address: {email!r}")
        for phone in self.alert_phones:
            if not _PHONE.match(phone):
                raise ConfigError(f"not an E.164 phone number (like +15555550100): {phone!r}")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"logLevel must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if self.log_retention_days not in RETENTION_DAYS:
            raise ConfigError(
                f"logRetentionDays must be one of {RETENTION_DAYS}, got {self.log_retention_days}"
            )
        if self.data_retention_days < 0:
            raise ConfigError("dataRetentionDays must be >= 0 (0 keeps job objects forever)")
        if not _BUS.match(self.bus_name) or self.bus_name == "default":
            raise ConfigError(f"invalid busName {self.bus_name!r}")
        if self.layer_dir is not None and not (self.layer_dir / "python").is_dir():
            raise ConfigError(f"layerAsset {self.layer_dir} has no python/ folder")
        for source in self.rule_modules:
            top = source.module.split(".", 1)[0]
            if not source.folder.is_dir():
                raise ConfigError(f"ruleModules: no folder {source.folder}")
            if not ((source.folder / top).is_dir() or (source.folder / f"{top}.py").is_file()):
                raise ConfigError(
                    f"ruleModules: {source.folder} has no {top}/ package or {top}.py module "
                    f"(needed to import {source.module})"
                )

    @classmethod
    def load(
        cls,
        get_context: Callable[[str], Any],
        repo: Path,
        environ: Mapping[str, str] = os.environ,
    ) -> StackConfig:
        """Merge the config file, CDK context (``node.try_get_context``) and the environment."""
        file_values: dict[str, Any] = {}
        path = repo / CONFIG_FILE
        if path.exists():
            try:
                file_values = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: {exc}") from None
            if not isinstance(file_values, dict):
                raise ConfigError(f"{path}: expected a JSON object")

        def get(key: str) -> Any:
            value = get_context(key)
            return file_values.get(key) if value is None else value

        alert_emails = _as_list(get("alertEmails"))
        layer = environ.get("TRAINGUARD_LAYER_DIR") or get("layerAsset")
        return cls(
            alert_emails=alert_emails,
            alert_phones=_as_list(get("alertPhones")),
            ops_emails=_as_list(get("opsEmails")) or alert_emails,
            rule_alarm_emails=_as_list(get("ruleAlarmEmails")),
            architecture=str(get("architecture") or "x86_64"),
            layer_dir=Path(layer).resolve() if layer else None,
            log_level=str(get("logLevel") or "INFO").upper(),
            log_retention_days=_as_int("logRetentionDays", get("logRetentionDays") or 30),
            data_retention_days=_as_int(
                "dataRetentionDays", 90 if get("dataRetentionDays") is None else get("dataRetentionDays")
            ),
            bus_name=str(get("busName") or "trainguard"),
            rule_modules=tuple(
                dict.fromkeys(RuleModuleSource.parse(e, repo) for e in _as_list(get("ruleModules")))
            ),
            default_rules=_default_rules(get("defaultRules"), repo),
        )

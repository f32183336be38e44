"""What ``trainguard rules`` prints: every registered rule, its kind, summary and parameters.

Custom rules (``trainguard.rules.plugins``, from ``TRAINGUARD_RULE_MODULES``) are listed
after the built-in model rules, with the module they come from.
"""

from __future__ import annotations

from typing import Any, TypedDict

from trainguard.rules.base import Rule
from trainguard.rules.plugins import load_plugins
from trainguard.rules.registry import RULES


class RuleRow(TypedDict):
    name: str
    #: "model", "clock", "cross-job" (see ``registry``) or "profiler"
    kind: str
    summary: str
    advice: str
    #: parameter -> default as SageMaker would pass it ("None", "10", "True", "a,b");
    #: None for a required parameter
    parameters: dict[str, str | None]
    required: list[str]
    #: "trainguard" for a built-in rule, else the custom rule's module
    source: str


def sagemaker_string(value: Any) -> str:
    """A default value written the way it appears in ``RuleParameters``."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def describe_rules(*, profiler: bool = True) -> list[RuleRow]:
    """One row per registered rule: the model rules in registry order, the custom rules of
    ``TRAINGUARD_RULE_MODULES``, then (``profiler``) the profiler rules of
    ``trainguard.rules.profiler.PROFILER_RULES``."""
    from trainguard.rules.profiler import PROFILER_RULES

    plugins = load_plugins()
    registries: list[dict[str, type[Rule[Any, Any]]]] = [RULES, plugins.custom]
    if profiler:
        registries.append(dict(PROFILER_RULES))
    rows: list[RuleRow] = []
    for name, cls in ((n, c) for registry in registries for n, c in registry.items()):
        params: dict[str, str | None] = {}
        required: list[str] = []
        for field_name, info in cls.Config.model_fields.items():
            if info.is_required():
                params[field_name] = None
                required.append(field_name)
            else:
                params[field_name] = sagemaker_string(info.default)
        rows.append(
            RuleRow(
                name=name,
                kind=cls.kind,
                summary=cls.summary,
                advice=cls.advice,
                parameters=params,
                required=required,
                source=plugins.origins.get(name, "trainguard"),
            )
        )
    return rows

"""trainguard's rules: the contract (``base``), the built-in rules and one public registry.

::

    from trainguard.rules import RULES, builtin_rules, rule_class, Rule, SystemRule

``RULES`` holds the model rules by SageMaker name, ``builtin_rules()`` adds the system
(profiler) rules, and ``rule_class(name)`` resolves any rule a job may name: a built-in, else a
custom rule of ``TRAINGUARD_RULE_MODULES`` (``trainguard.rules.plugins``).
"""

from __future__ import annotations

from trainguard.rules.base import (
    AnyRule,
    BaseRule,
    Coverage,
    Finding,
    ModelRule,
    Rule,
    RuleConfig,
    RuleInput,
    RuleState,
    StepData,
    SystemRule,
)
from trainguard.rules.plugins import rule_class
from trainguard.rules.registry import CHECKING_RULES, RULES, builtin_rules

__all__ = [
    "CHECKING_RULES",
    "RULES",
    "AnyRule",
    "BaseRule",
    "Coverage",
    "Finding",
    "ModelRule",
    "Rule",
    "RuleConfig",
    "RuleInput",
    "RuleState",
    "StepData",
    "SystemRule",
    "builtin_rules",
    "rule_class",
]

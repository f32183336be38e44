"""Narrow cdk-nag (v3) acknowledgments: one finding on one construct, each with its reason.

cdk-nag 3 reads CDK's native ``Validations.of(construct).acknowledge(...)``. A finding's id
is ``AwsSolutions::AwsSolutions-<rule>`` or, for rules with several findings per resource
(IAM4/IAM5), ``...-<rule>[<finding>]`` — e.g. ``IAM5[Resource::<DataBucket1234.Arn>/jobs/*]``.
:func:`nag_text` renders a CDK value the way cdk-nag prints it, so wildcard resources are
acknowledged one by one, exactly, and a new wildcard is a new, failing finding.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

_POLICY_VARIABLE = re.compile(r"\$\{([^}]+)\}")


#: every acknowledgment made in this process: (construct path, rule id, reason); a test checks
#: that each one matches a finding cdk-nag really reports (no stale suppression)
ACKNOWLEDGED: list[tuple[str, str, str]] = []


def acknowledge(construct: IConstruct, rule: str, reason: str, finding: str | None = None) -> None:
    rule_id = f"AwsSolutions::AwsSolutions-{rule}" + (f"[{finding}]" if finding else "")
    Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=reason))
    ACKNOWLEDGED.append((construct.node.path, rule_id, reason))


def nag_text(stack: Stack, value: Any) -> str:
    """A (tokenized) string as cdk-nag renders it: ``<Logical.Attr>``, ``<Logical>``, ``<AWS::Region>``."""
    return _render(stack.resolve(value))


def _render(node: Any) -> str:
    if isinstance(node, str):
        return _POLICY_VARIABLE.sub(r"<\1>", node)  # cdk-nag prints ${aws:X} as <aws:X>
    if isinstance(node, dict) and len(node) == 1:
        ((fn, arg),) = node.items()
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(_render(p) for p in parts)
        if fn == "Fn::GetAtt":
            return f"<{arg[0]}.{arg[1]}>"
        if fn == "Ref":
            return f"<{arg}>"
    raise ValueError(f"cannot render {node!r} for a cdk-nag finding id")


def acknowledge_wildcard_resources(
    construct: IConstruct, stack: Stack, resources: list[str], reason: str
) -> None:
    """Acknowledge IAM5 for exactly these resource strings (only those containing ``*``)."""
    for resource in resources:
        text = nag_text(stack, resource)
        if "*" in text:
            acknowledge(construct, "IAM5", reason, f"Resource::{text}")

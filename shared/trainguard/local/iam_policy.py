"""A small evaluator of IAM identity policies: would AWS allow this request?

moto authorizes actions and (for S3 and SQS) resources, but ignores conditions and policy
variables and sees DynamoDB, EventBridge and SNS resources as ``*``. The end-to-end tests
record every AWS call and check it here against the synthesized template's policies, so a
call AWS would deny fails a test even where moto let it through.

What it implements (AWS's policy evaluation logic, identity-based policies of one account):

- an explicit ``Deny`` wins; otherwise an ``Allow`` allows; otherwise the request is denied;
- ``Action``/``NotAction`` (case-insensitive, ``*`` and ``?``), ``Resource``/``NotResource``
  (ARNs matched segment by segment, case-sensitive, ``*`` and ``?``);
- policy variables ``${key}`` in resources and condition values, from the request context
  (an unresolvable variable makes the resource match nothing), and ``${*}``, ``${?}``, ``${$}``;
- condition operators String*, Arn*, Numeric*, Bool, Null, with ``IfExists``, and the
  ``ForAllValues:``/``ForAnyValue:`` set qualifiers; several values of one key are OR-ed,
  keys and operators AND-ed; negated operators are true for a missing key.

Not modelled: resource-based policies, permission boundaries, SCPs, sessions policies, date
and IP operators (a policy using one raises, rather than being misjudged).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ContextValue = str | tuple[str, ...]


class UnsupportedPolicy(ValueError):
    """The policy uses something this evaluator does not model."""


@dataclass(frozen=True)
class Request:
    """One authorization question: ``action`` on ``resource`` with condition keys ``context``."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    #: why the request is made (shown in a denial), e.g. "GetObject jobs/a/manifest.json"
    note: str = ""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    #: "explicit deny by <sid>", "allowed by <sid>", or "no statement allows it"
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


_LITERALS = {"*": "\x00star", "?": "\x00q", "$": "\x00dollar"}
_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def _substitute(text: str, context: Mapping[str, ContextValue]) -> str | None:
    """Policy variables replaced from ``context``; None when one cannot be resolved."""
    lowered = {k.lower(): v for k, v in context.items()}
    missing = False

    def repl(match: re.Match[str]) -> str:
        nonlocal missing
        name = match.group(1)
        if name in _LITERALS:
            return _LITERALS[name]
        value = lowered.get(name.lower())
        if value is None or isinstance(value, tuple):
            missing = True
            return ""
        # a substituted value is literal text, never a wildcard
        return value.replace("*", _LITERALS["*"]).replace("?", _LITERALS["?"]).replace("$", _LITERALS["$"])

    out = _VARIABLE.sub(repl, text)
    return None if missing else out


def substitute(text: str, context: Mapping[str, ContextValue]) -> str | None:
    """``text`` with its policy variables resolved (``${*}`` etc. back to the literal)."""
    out = _substitute(text, context)
    if out is None:
        return None
    for literal, marker in _LITERALS.items():
        out = out.replace(marker, literal)
    return out


def _glob(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    parts: list[str] = []
    for ch in pattern:
        if ch == "*":
            parts.append(".*")
        elif ch == "?":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    regex = "".join(parts)
    for literal, marker in _LITERALS.items():
        regex = regex.replace(re.escape(marker), re.escape(literal))
    return re.compile(rf"\A{regex}\Z", re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _like(pattern: str, value: str, ignore_case: bool = False) -> bool:
    return _glob(pattern, ignore_case).match(value) is not None


def _equals(expected: str, value: str) -> bool:
    for literal, marker in _LITERALS.items():
        expected = expected.replace(marker, literal)
    return expected == value


def arn_like(pattern: str, arn: str) -> bool:
    """ARN matching: each of the six colon-separated parts on its own (``*`` alone: any)."""
    if pattern == "*":
        return True
    p_parts = pattern.split(":", 5)
    a_parts = arn.split(":", 5)
    if len(p_parts) != 6 or len(a_parts) != 6:
        return False  # not an ARN (pattern): matches nothing rather than everything
    return all(_like(p, a) for p, a in zip(p_parts, a_parts, strict=True))


def action_matches(pattern: str, action: str) -> bool:
    return _like(pattern, action, ignore_case=True)


_NUMERIC = {
    "NumericEquals": lambda a, b: a == b,
    "NumericNotEquals": lambda a, b: a != b,
    "NumericLessThan": lambda a, b: a < b,
    "NumericLessThanEquals": lambda a, b: a <= b,
    "NumericGreaterThan": lambda a, b: a > b,
    "NumericGreaterThanEquals": lambda a, b: a >= b,
}


def _match_one(operator: str, expected: str, value: str) -> bool:
    """One (condition value, context value) pair under a non-negated base operator."""
    if operator == "StringEquals":
        return _equals(expected, value)
    if operator == "StringEqualsIgnoreCase":
        return _equals(expected.lower(), value.lower())
    if operator == "StringLike":
        return _like(expected, value)
    if operator in ("ArnEquals", "ArnLike"):
        return arn_like(expected, value)
    if operator == "Bool":
        return expected.lower() == value.lower()
    if operator in _NUMERIC:
        try:
            return bool(_NUMERIC[operator](float(value), float(expected)))
        except ValueError:
            return False
    raise UnsupportedPolicy(f"condition operator {operator!r} is not modelled")


_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


def condition_holds(
    operator: str, key: str, values: Iterable[Any], context: Mapping[str, ContextValue]
) -> bool:
    """Whether one ``{operator: {key: values}}`` entry holds for ``context``."""
    qualifier = ""
    if ":" in operator:
        qualifier, operator = operator.split(":", 1)
    if_exists = operator.endswith("IfExists")
    if if_exists:
        operator = operator[: -len("IfExists")]
    lowered = {k.lower(): v for k, v in context.items()}
    present = key.lower() in lowered
    raw = lowered.get(key.lower())
    actual = list(raw) if isinstance(raw, tuple) else ([] if raw is None else [raw])
    expected: list[str] = []
    for v in values:
        text = str(v).lower() if isinstance(v, bool) else str(v)
        substituted = _substitute(text, context)
        if substituted is not None:
            expected.append(substituted)
    if operator == "Null":
        want_absent = [e.lower() == "true" for e in expected]
        return any(w == (not present) for w in want_absent)
    negated = operator in _NEGATED
    base = _NEGATED.get(operator, operator)

    def matches(value: str) -> bool:
        hit = any(_match_one(base, e, value) for e in expected)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(matches(v) for v in actual)  # vacuously true for a missing key
    if qualifier == "ForAnyValue":
        return any(matches(v) for v in actual)
    if qualifier:
        raise UnsupportedPolicy(f"condition qualifier {qualifier!r} is not modelled")
    if not present:
        return if_exists or negated
    return all(matches(v) for v in actual)


def _statement_applies(statement: Mapping[str, Any], request: Request) -> bool:
    if "Action" in statement:
        if not any(action_matches(p, request.action) for p in _as_list(statement["Action"])):
            return False
    elif "NotAction" in statement:
        if any(action_matches(p, request.action) for p in _as_list(statement["NotAction"])):
            return False
    else:
        raise UnsupportedPolicy("a statement without Action or NotAction")

    def resource_hit(patterns: Any) -> bool:
        for pattern in _as_list(patterns):
            resolved = _substitute(str(pattern), request.context)
            if resolved is not None and arn_like(resolved, request.resource):
                return True
        return False

    if "Resource" in statement:
        if not resource_hit(statement["Resource"]):
            return False
    elif "NotResource" in statement:
        if resource_hit(statement["NotResource"]):
            return False
    else:
        raise UnsupportedPolicy("an identity statement without Resource or NotResource")
    for operator, entries in (statement.get("Condition") or {}).items():
        for key, values in entries.items():
            if not condition_holds(operator, key, _as_list(values), request.context):
                return False
    return True


def evaluate(policies: Sequence[Mapping[str, Any]], request: Request) -> Decision:
    """AWS's decision for ``request`` under these identity policies (documents)."""
    allowed_by: str | None = None
    for policy in policies:
        for statement in _as_list(policy.get("Statement", [])):
            if not _statement_applies(statement, request):
                continue
            sid = statement.get("Sid", "(no Sid)")
            if statement.get("Effect") == "Deny":
                return Decision(False, f"explicit deny by {sid}")
            if statement.get("Effect") == "Allow" and allowed_by is None:
                allowed_by = sid
    if allowed_by is not None:
        return Decision(True, f"allowed by {allowed_by}")
    return Decision(False, "no statement allows it")

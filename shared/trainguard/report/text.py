"""Words for the report: rule descriptions with their parameter values, ordinals."""

from __future__ import annotations

import re

from trainguard.rules.base import RuleConfig, fmt

_PLACEHOLDER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`|\b([A-Za-z_][A-Za-z0-9_]*)\b")


def fill(text: str, config: RuleConfig | None) -> str:
    """A rule's description with its parameters' values: "`threshold` minutes" -> "20 minutes".

    A name in backticks is always a parameter: it becomes its value (a name the config does not
    have keeps its name, without the backticks). A bare word that names a numeric parameter
    ("over num_steps steps") becomes its value too; other words are left alone.
    """

    def value(match: re.Match[str]) -> str:
        quoted, bare = match.group(1), match.group(2)
        name = quoted or bare
        known = config is not None and name in type(config).model_fields
        v = getattr(config, name) if known else None
        if known and isinstance(v, int | float) and not isinstance(v, bool):
            return fmt(float(v))
        if quoted is None:
            return bare
        return name if not known else ("any" if v is None else str(v))

    return _PLACEHOLDER.sub(value, text)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 101st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

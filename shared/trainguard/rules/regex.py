"""Regular expressions from job configurations, run in bounded time.

``tensor_regex``, ``labels_regex``, ``regex``... come from whoever writes a job's rule
configuration, and every rule of every job is evaluated by the same Lambda: a pattern that
backtracks exponentially (``(a+)+$`` against a 61-character name never returns under Python's
``re``) would hang the batch, its redeliveries, replay and the clock tick of every job after it.
So patterns run on RE2 (``google-re2``), whose matching is linear in the name's length and
whose memory is bounded (``max_mem``), with Python ``re``'s call semantics: ``match`` anchors
at the start of the name, as SageMaker's rules and ``re.match`` do.

What RE2 cannot run (backreferences ``\\1``, lookarounds ``(?=...)``/``(?<!...)``, possessive
or atomic groups) is rejected with a configuration error naming the construct, so the rule ends
``Error`` for that job alone. Patterns are at most ``MAX_PATTERN_CHARS`` long.

Without ``google-re2`` installed (a training environment that lacks the wheel), only patterns
that cannot backtrack badly are accepted: no quantifier applied to a group that itself contains
a quantifier or an alternation, no backreference. Anything else is a configuration error that
says to install ``google-re2``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Protocol

MAX_PATTERN_CHARS = 1024
#: RE2's memory budget for one compiled pattern (its default is 8 MiB)
RE2_MAX_MEM = 8 << 20

try:  # pragma: no branch - which one depends on the environment
    import re2 as _re2

    _OPTIONS: Any = _re2.Options()
    _OPTIONS.log_errors = False  # errors are raised and reported, not logged by the C++ library
    _OPTIONS.max_mem = RE2_MAX_MEM
    HAVE_RE2 = True
except ImportError:  # pragma: no cover - the service and the dev environment have it
    _re2 = None
    HAVE_RE2 = False


class Matcher(Protocol):
    """What the rules use of a compiled pattern (``re.Pattern`` and RE2's both have it)."""

    @property
    def pattern(self) -> str: ...

    def match(self, string: str) -> Any: ...


class RegexError(ValueError):
    """A pattern that is invalid, too long, or not runnable in bounded time."""


#: constructs RE2 does not support, with what to say about them
_UNSUPPORTED = (
    (re.compile(r"\\[1-9]|\(\?P=\w+\)"), "a backreference"),
    (re.compile(r"\(\?<?[=!]"), "a lookahead or lookbehind"),
    (re.compile(r"\(\?>|[*+?}]\+"), "an atomic group or possessive quantifier"),
)


@lru_cache(maxsize=512)
def compile_bounded(pattern: str) -> Matcher:
    """Compile a job's pattern for bounded-time matching; ``RegexError`` says why it cannot be."""
    if not isinstance(pattern, str):
        raise RegexError(f"a regular expression must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexError(f"regular expression is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}")
    try:
        re.compile(pattern)  # Python's verdict on the syntax users write (and its messages)
    except re.error as exc:
        raise RegexError(f"invalid regular expression {pattern!r}: {exc}") from None
    if _re2 is not None:
        try:
            compiled: Matcher = _re2.compile(pattern, _OPTIONS)
        except _re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            raise RegexError(_unsupported(pattern, f"RE2: {reason}")) from None
        return compiled
    if any(construct.search(pattern) for construct, _ in _UNSUPPORTED) or _may_backtrack(pattern):
        raise RegexError(
            _unsupported(pattern, "it can take exponential time without RE2")
            + "; install google-re2 (pip install google-re2) or simplify the pattern"
        )
    return re.compile(pattern)


def _unsupported(pattern: str, reason: str) -> str:
    what = next((w for construct, w in _UNSUPPORTED if construct.search(pattern)), None)
    uses = f" uses {what}, which" if what else ""
    return (
        f"{pattern!r}{uses} cannot run in trainguard's bounded-time regex engine ({reason}); rewrite it "
        "without backreferences, lookarounds or atomic groups (names are matched with re.match)"
    )


def _may_backtrack(pattern: str) -> bool:
    """A quantified group holding a quantifier or an alternation: ``(a+)+``, ``(a|aa)*``."""
    depth, stack = 0, [False]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            close = pattern.find("]", i + 2)
            i = close + 1 if close != -1 else len(pattern)
            continue
        if char == "(":
            depth += 1
            stack.append(False)
        elif char == ")" and depth:
            depth -= 1
            inner = stack.pop()
            following = pattern[i + 1 : i + 2]
            if inner and following in ("*", "+", "?", "{"):
                return True
            stack[-1] = stack[-1] or inner
        elif char in "*+?{|" and depth:
            stack[-1] = True
        i += 1
    return False

"""Text from jobs made safe to show: the one helper every output boundary calls.

Job, rule and tensor names and status details come from documents a job wrote; they may
hold terminal escape sequences (``\\x1b[2J`` clears a screen, OSC 8 forges a link), other
control characters, or bidirectional overrides that make a name read differently from
what it is. Stored names are never changed; what a person reads (CLI output, alert
emails and SMS, SQS message attributes) goes through :func:`printable` on the way out.
"""

from __future__ import annotations

import unicodedata

#: characters that reorder or hide text (Unicode bidi controls, zero-width marks, BOM)
_INVISIBLE = frozenset(
    "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff"
)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _unsafe(char: str, keep_newlines: bool) -> bool:
    if char == "\\":
        return False
    if keep_newlines and char in "\n\t":
        return False
    if char in _INVISIBLE:
        return True
    # Cc: C0/C1 controls and DEL; Cs: lone surrogates (not encodable); Zl/Zp: line breaks;
    # noncharacters such as U+FFFE, which SQS refuses
    category = unicodedata.category(char)
    if category in ("Cc", "Cs", "Zl", "Zp"):
        return True
    return category == "Cn" and (ord(char) & 0xFFFE) == 0xFFFE


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control or invisible character written as a visible escape.

    ``"run\\x1b[31m"`` becomes ``"run\\\\x1b[31m"`` (the four characters ``\\x1b``), a
    right-to-left override becomes ``\\u202e``. Letters of every script pass unchanged;
    backslashes are left as they are (the result is for reading, not for parsing back).
    ``keep_newlines`` keeps line feeds and tabs (multi-line text such as an email body).
    """
    if text.isprintable() and not any(c in _INVISIBLE for c in text):
        return text
    return "".join(_escape(c) if _unsafe(c, keep_newlines) else c for c in text)


def ascii_text(text: str) -> str:
    """:func:`printable`, and every non-ASCII character escaped too (SNS subjects are ASCII)."""
    return printable(text).encode("ascii", "backslashreplace").decode("ascii")


def clip_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding is at most ``max_bytes`` bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text
    return raw[:max_bytes].decode("utf-8", "ignore")


def shorten(text: str, limit: int, ellipsis: str = "…") -> str:
    """``text``, or as much of it as fits in ``limit`` characters, cut at a word and ending "…".

    A cut mid-word ("num_steps=50 traini") reads as a typo; a word longer than half the
    limit is cut inside (a path, a tensor name), still with the ellipsis.
    """
    if len(text) <= limit:
        return text
    cut = text[: max(1, limit - len(ellipsis))]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + ellipsis


def validation_text(exc: BaseException, most: int = 4) -> str:
    """A pydantic ``ValidationError`` as one line a person reads: ``job: Field required; ...``.

    pydantic's own text spreads over lines and ends each error with a documentation URL.
    Another exception: its text.
    """
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    try:
        items = errors(include_url=False)
    except TypeError:  # not pydantic's errors()
        return str(exc)
    parts = []
    for item in items[:most]:
        where = ".".join(str(part) for part in item.get("loc", ()))
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    if len(items) > most:
        parts.append(f"and {len(items) - most} more")
    return "; ".join(parts) or str(exc)

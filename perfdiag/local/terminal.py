"""Text from the input (trace names, file names, error messages) made safe to print.

A trace can name a function `\x1b]0;pwned\x07` or `\x1b[2J`: printed raw, it sets the window
title, clears the screen or fakes coloured text. Every control character (C0 and C1, DEL, and
the Unicode bidirectional overrides) but newline and tab is shown as its escape (`\x1b`), so an
escape sequence arrives as plain text.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NOT_ESCAPED_BY_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """`text` with its control characters but newline and tab written as escapes."""
    return _UNSAFE.sub(_escape, text)


def safe_json(text: str) -> str:
    """JSON text with DEL, C1 and bidirectional controls written as JSON escapes (JSON
    escapes only C0): the same document, safe to print."""
    return _NOT_ESCAPED_BY_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)

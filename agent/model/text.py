"""Text other people chose, made safe to show: every view, log and doctor line passes it through here.

Job, pod, process and GPU names come from job scripts, process environments, workload reports,
traces and remote agents. Shown as they are, an escape sequence in a job name clears the
operator's terminal, retitles it or writes their clipboard (OSC 52); a bidi override makes
``job\u202egnp.exe`` read as ``jobexe.png``; an undecodable byte (a lone surrogate) stops a page
from being encoded at all. Control characters are replaced by U+FFFD rather than dropped, so the
reader sees that something stood there; logs write them as backslash escapes instead
(:func:`escaped`), so the exact value survives. Markup (rich's ``[bold]``, HTML) is not this module's
business: the terminal views draw names as plain :class:`rich.text.Text` and the pages escape them.

It sits in the model, below every reader (context, backends, views, diagnostics, the logs), and imports nothing.
"""

from __future__ import annotations

import unicodedata

REPLACEMENT = "\ufffd"

_KEPT_FORMAT = {"\u200c", "\u200d"}
"""Zero-width (non-)joiners: format characters that scripts and emoji sequences need."""

_REPLACED_CATEGORIES = {"Cc", "Cs", "Zl", "Zp", "Cf"}
"""C0/C1 controls (ESC, CSI, BEL, NUL, DEL), lone surrogates, line and paragraph separators, and
format characters (bidi overrides and isolates, invisible tags)."""


def _unsafe(char: str) -> bool:
    """Whether ``char`` is one that :func:`printable` replaces."""
    if char.isprintable() or char == " " or char in _KEPT_FORMAT:
        return False
    return unicodedata.category(char) in _REPLACED_CATEGORIES


def _shown(char: str) -> str:
    return REPLACEMENT if _unsafe(char) else char


def printable(text: object, limit: int | None = None) -> str:
    """``text`` as a string safe to put on a terminal or a page: controls replaced, cut to ``limit``
    characters (an ellipsis marks the cut)."""
    value = str(text)
    if limit is not None and len(value) > limit:
        value = value[: limit - 1] + "…"
    if value.isprintable():  # the common case: nothing to look at character by character
        return value
    return "".join(_shown(c) for c in value)


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(char: str) -> str:
    if not _unsafe(char):
        return char
    code = ord(char)
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escaped(text: object) -> str:
    """``text`` with every character :func:`printable` would replace written as a backslash escape
    instead (``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\n``): for logs, where the exact value matters
    more than its look. Backslashes themselves are left alone; a format that quotes escapes them first."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(_escape(c) for c in value)


def one_line(text: object, limit: int = 160) -> str:
    """``text`` (an exception, a server's reason phrase, a body's first bad line) as one short printable
    line, white space folded: for a log field, a status header or an error on stderr."""
    return printable(" ".join(str(text).split()), limit)

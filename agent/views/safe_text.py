"""Names other people choose, made safe to show: every view passes free text through :func:`printable`.

Job, pod, process and GPU names come from job scripts, process environments, workload reports,
traces and remote agents. Shown as they are, an escape sequence in a job name clears the
operator's terminal, retitles it or writes their clipboard (OSC 52); a bidi override makes
``job\u202egnp.exe`` read as ``jobexe.png``; an undecodable byte (a lone surrogate) stops a page
from being encoded at all. Control characters are replaced by U+FFFD rather than dropped, so the
reader sees that something stood there. Markup (rich's ``[bold]``, HTML) is not this module's
business: the terminal views draw names as plain :class:`rich.text.Text` and the pages escape them.
"""

from __future__ import annotations

import unicodedata

REPLACEMENT = "\ufffd"

_KEPT_FORMAT = {"\u200c", "\u200d"}
"""Zero-width (non-)joiners: format characters that scripts and emoji sequences need."""

_REPLACED_CATEGORIES = {"Cc", "Cs", "Zl", "Zp", "Cf"}
"""C0/C1 controls (ESC, CSI, BEL, NUL, DEL), lone surrogates, line and paragraph separators, and
format characters (bidi overrides and isolates, invisible tags)."""


def _shown(char: str) -> str:
    if char.isprintable() or char == " ":
        return char
    if char in _KEPT_FORMAT or unicodedata.category(char) not in _REPLACED_CATEGORIES:
        return char
    return REPLACEMENT


def printable(text: object, limit: int | None = None) -> str:
    """``text`` as a string safe to put on a terminal or a page: controls replaced, cut to ``limit``
    characters (an ellipsis marks the cut)."""
    value = str(text)
    if limit is not None and len(value) > limit:
        value = value[: limit - 1] + "…"
    if value.isprintable():  # the common case: nothing to look at character by character
        return value
    return "".join(_shown(c) for c in value)

"""Label values written into PromQL: the one place a value becomes a quoted string or a regex.

Every value that enters a report query comes from outside: ``--cluster`` on the command line, and,
worse, label values the store answered (job ids for the worst jobs, dcgm-exporter UUIDs, AMD DME
``hostname`` and ``gpu_id``), which an exporter's author chose. Written in unescaped, a ``"`` breaks
the query (that host's GPUs drop out of the report) and ``0",hostname!="`` turns into a matcher the
label's author picked, reading other hosts' series. So every source's queries (queries.py, dcgm.py,
amd.py) build their matchers with :func:`equals` and :func:`any_of` and nothing else.

PromQL string literals follow Go's escapes (Prometheus' lexer, VictoriaMetrics' MetricsQL): a raw
newline ends the query with "unterminated quoted string", so backslash, double quote and newline are
always escaped, and every other control character too (``\\uXXXX``, which both accept), so what is
sent is one printable line. Regex alternatives escape each value with :func:`re.escape`: it escapes
only ASCII punctuation and whitespace, and Go's RE2 syntax reads any escaped ASCII non-alphanumeric
as itself, so the escaped value matches exactly that value.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable

_SHORT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPED = ("Cc", "Cs")
"""Control characters, and lone surrogates (no UTF-8 form: sent as ``\\udXXX``, which the server refuses
as a parse error, one problem on the page, rather than a value that cannot be encoded at all)."""


def string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal that reads back as exactly ``value``."""
    return '"' + "".join(_SHORT.get(c) or (f"\\u{ord(c):04x}" if unicodedata.category(c) in _ESCAPED else c)
                         for c in value) + '"'


def equals(name: str, value: str) -> str:
    """``name="value"``: the series whose label ``name`` is exactly ``value``."""
    return f"{name}={string(value)}"


def any_of(name: str, values: Iterable[str]) -> str:
    """``name=~"a|b"``: the series whose label ``name`` is exactly one of ``values`` (each taken
    literally, whatever regex syntax it holds)."""
    return f"{name}=~{string(regex_of(values))}"


def regex_of(values: Iterable[str]) -> str:
    """The regex (before string quoting) matching exactly the ``values``: for :func:`any_of`, and for
    callers that add a regex of their own (``Queries.sel``'s ``~`` values)."""
    return "|".join(re.escape(v) for v in values)

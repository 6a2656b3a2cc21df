"""Structured, quiet-by-default logging on stderr (logfmt or JSON lines).

Each line is one event with key=value context (``gpu=3 error="lost: ..."``) so log pipelines
can filter on fields. Per-cycle chatter lives at debug; info carries only start, stop and
state changes (a GPU going down or coming back), so a healthy node logs almost nothing.

Values carry names other people choose (jobs, pods, inference servers' models), so no line holds
a control or format character: logfmt writes them as escapes (``\\x1b``, ``\\u202e``,
agent.model.text.escaped), JSON as ``\\u001b`` (``json.dumps`` keeps to ASCII).

No line holds a credential either: every message, field and traceback passes
:func:`agent.model.redact.hide`, which hides the secrets the settings hold (remembered as they load,
agent/app/secrets.py), URL userinfo and query values, and bearer tokens, whichever module logged them.
The handler sits on the root logger too (at warning), so the libraries' own warnings are written in the
same format and hidden alike, not as raw lines on stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from agent.model.redact import hide
from agent.model.text import escaped

HANDLER_NAME = "roofwatch"
"""The name of the agent's own stderr handler: a second configuration replaces it, leaves others be."""
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    """The record's own fields, every text among them with its secrets hidden."""
    return {k: v if isinstance(v, (int, float, bool, type(None))) else hide(v) for k, v in vars(record).items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _logfmt_value(value: object) -> str:
    """A logfmt value: bare when it can be, else quoted with ``\\`` and ``"`` escaped and every
    control or format character written as an escape (``\\n``, ``\\x1b``, ``\\u202e``): values come
    from job, pod and model names, and a raw ESC would drive the terminal that tails the log."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return '"' + escaped(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        fields = {"ts": ts, "level": record.levelname.lower(), "logger": record.name, "msg": hide(record.getMessage())}
        fields.update(_extras(record))
        if record.exc_info:
            fields["exc"] = hide(self.formatException(record.exc_info))
        return " ".join(f"{escaped(k)}={_logfmt_value(v)}" for k, v in fields.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": hide(record.getMessage()),
        }
        fields.update(_extras(record))
        if record.exc_info:
            fields["exc"] = hide(self.formatException(record.exc_info))
        # ASCII only: with ensure_ascii=False json leaves DEL, C1 controls (\x9b, a CSI) and bidi overrides raw
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=True)


def configure_logging(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    ours = logging.getLogger("roofwatch")
    ours.handlers[:] = [handler]
    ours.setLevel(level.upper())
    ours.propagate = False
    libraries = logging.getLogger()  # grpc, urllib3, the OpenTelemetry SDK: their warnings in our format, hidden
    libraries.handlers[:] = [h for h in libraries.handlers if h.get_name() != HANDLER_NAME] + [handler]
    libraries.setLevel(max(logging.WARNING, ours.level))

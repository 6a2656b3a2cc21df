"""Structured logs: one event per line, context as fields, safe quoting."""

from __future__ import annotations

import json
import logging

from agent.app.logs import JsonFormatter, LogfmtFormatter


def record(msg: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("roofwatch.collector", logging.WARNING, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_logfmt_quotes_values_with_spaces_quotes_and_newlines():
    line = LogfmtFormatter().format(record("device down", gpu="3", error='lost: "gone"\nreset'))
    assert "\n" not in line
    assert 'level=warning logger=roofwatch.collector msg="device down" gpu=3' in line
    assert 'error="lost: \\"gone\\"\\nreset"' in line


def test_json_lines_carry_extras():
    data = json.loads(JsonFormatter().format(record("device down", gpu="3", failures=2)))
    assert data["msg"] == "device down" and data["gpu"] == "3" and data["failures"] == 2
    assert data["level"] == "warning" and isinstance(data["ts"], float)

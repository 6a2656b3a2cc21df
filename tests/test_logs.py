"""Structured logs: one event per line, context as fields, safe quoting."""

from __future__ import annotations

import json
import logging
import unicodedata

from agent.app.logs import JsonFormatter, LogfmtFormatter


def record(msg: str, *args, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("roofwatch.collector", logging.WARNING, __file__, 1, msg, args, None)
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


HOSTILE = "Qwen-通义-Modèle\x1b]0;owned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\x7f\x00\u202egnp\udcff"
"""A model or pod name as its owner chose it: OSC 0, CSI 2J, OSC 52, a C1 CSI, DEL, NUL, a bidi
override and a lone surrogate (an undecodable byte), between letters that must stay readable."""


def _controls(line: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in line
            if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or unicodedata.category(c) in ("Cf", "Cs", "Zl", "Zp")]


def test_logfmt_escapes_control_and_format_characters_in_the_message_and_every_extra():
    rec = record("scraped model %s", HOSTILE, model=HOSTILE, **{"pod": "pod\x1b[2J", "count": 3})
    line = LogfmtFormatter().format(rec)
    assert _controls(line) == [], line
    assert "owned" in line and "Qwen-通义-Modèle" in line, "the value stays readable"
    assert '\\x1b]0;owned\\x07\\x1b[2J\\x1b]52;c;' in line and "\\x9b31m\\x7f\\x00\\u202egnp\\udcff" in line, line
    assert 'pod="pod\\x1b[2J"' in line and "count=3" in line
    line.encode("utf-8")  # a lone surrogate would have made the line unwritable to stderr


def test_logfmt_keeps_plain_values_bare_and_letters_unescaped():
    line = LogfmtFormatter().format(record("up", gpu="0/7", model="通义千问-Modèle"))
    assert line.endswith("msg=up gpu=0/7 model=通义千问-Modèle"), line


def test_json_lines_escape_control_and_format_characters_and_round_trip():
    line = JsonFormatter().format(record("scraped model %s", HOSTILE, model=HOSTILE, pod="pod\x1b[2J"))
    assert _controls(line) == [], line
    data = json.loads(line)
    assert data["msg"] == "scraped model " + HOSTILE and data["model"] == HOSTILE and data["pod"] == "pod\x1b[2J"


def test_credentials_are_hidden_in_every_line_and_words_about_them_are_not():
    """Every log line passes agent.model.redact.hide: tokens go, "basic auth" stays (a reload's warning said
    "basic <hidden>" once, which no operator can read)."""
    from agent.model.redact import hide, remember

    remember(["planted-SECRET-1"])
    kept = ["basic auth is on", "bearer token missing", "Basic Authentication required", "turning basic auth off"]
    for text in kept:
        assert hide(text) == text
    hidden = {"Bearer sk-live-SECRET": "Bearer <hidden>", "Basic dXNlcjpwYXNz": "Basic <hidden>",
              "auth=Bearer abcdefghijklmnopqrstuvwxyz": "auth=Bearer <hidden>",
              "GET http://u:pw@h:1/m?token=x": "GET http://<hidden>@h:1/m?token=<hidden>",
              "it said planted-SECRET-1 back": "it said <hidden> back", "password: hunter2": "password: <hidden>"}
    for text, shown in hidden.items():
        assert hide(text) == shown, text

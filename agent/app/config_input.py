"""Reading what a person wrote into settings: the YAML file and the environment's JSON values.

Whatever goes wrong here must end as one line that names the setting (or the file and line), never
a traceback: a file in Latin-1, a 10 MB file, ``[[[[...`` fifty thousand deep, a list setting given
as a bare word in the environment, or a number of 4301 digits (past Python's integer-parsing limit,
which raised a ValueError from inside the YAML and JSON parsers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

MAX_CONFIG_BYTES = 2**20
"""A settings file is a few kilobytes; anything past a MiB is not one (and is not read whole)."""

SHOWN_CHARS = 60
"""Longest a value is echoed in an error: enough to recognise it, never a 4301-digit number."""


class ConfigInputError(ValueError):
    """A file or variable that cannot be read as settings; the message is one line."""


def shown(value: object) -> str:
    """``repr(value)`` cut to ``SHOWN_CHARS`` (an ellipsis marks the cut)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + "...'"


def printable_name(part: object) -> str:
    """A key of a settings path as an error may show it: a name from a file can hold anything."""
    text = str(part)
    text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
    return text if text.isprintable() else repr(text)[1:-1]


def read_config_file(path: Path) -> Any:
    """The parsed YAML of ``path``; :class:`ConfigInputError` naming the file (and line, or setting)."""
    where = f"config file {path}"
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigInputError(f"{where}: not found") from None
    except OSError as exc:
        raise ConfigInputError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigInputError(f"{where}: larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a settings file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigInputError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                               "save it as UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigInputError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigInputError(f"{where}: nested too deeply to be settings") from None
    except ValueError as exc:  # raised while constructing a value: a number past the digit limit
        setting = _setting_with_long_number(text)
        raise ConfigInputError(f"{where}: {setting or 'a value'}: {_number_problem(exc)}") from None


def _number_problem(exc: BaseException) -> str:
    if "digits" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return " ".join(str(exc).split())[:120]


def _setting_with_long_number(text: str) -> str | None:
    """The dotted path of the first integer too long to parse, found without constructing values."""
    try:
        root = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None
    limit = sys.get_int_max_str_digits()
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, yaml.MappingNode):
            stack.extend((value, f"{where}.{key.value}" if where else str(key.value)) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.ScalarNode) and node.tag.endswith(":int") and sum(c.isdigit() for c in node.value) > limit:
            return where or None
    return None


def describe_environment_error(exc: Exception, env_prefix: str) -> str:
    """One line for pydantic-settings' failure to parse an environment value as JSON (list, mapping or
    nested setting): the setting, the variable, what is wrong and what a good value looks like."""
    message = str(exc)
    field = message.split('"')[1] if message.count('"') >= 2 else "(settings)"
    variable = env_prefix + field.upper()
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, json.JSONDecodeError):
        problem = f"{cause.msg} at column {cause.colno}"
    elif cause is not None:
        problem = _number_problem(cause)
    else:
        problem = "cannot be parsed"
    return (f"{field}: {variable} is not valid JSON ({problem}); a list or mapping setting takes JSON, "
            f"for example {env_prefix}GPU_LABELS='[\"job_id\"]' or {env_prefix}CLASSIFIER='{{\"window_s\": 30}}'")

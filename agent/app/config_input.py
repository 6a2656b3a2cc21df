"""Reading what a person wrote into settings: the YAML file and the environment's JSON values.

Whatever goes wrong here must end as one line that names the setting (or the file and line), never
a traceback: a file in Latin-1, a 10 MB file, ``/dev/zero`` or a FIFO, ``[[[[...`` fifty thousand
deep, an alias bomb, a list setting given as a bare word in the environment, or a number of 4301
digits (past Python's integer-parsing limit, which raised a ValueError from inside the YAML and JSON
parsers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.context.file_input import FileInputError, read_text_file
from agent.context.yaml_input import SHOWN_CHARS, YamlInputError, load_yaml, value_problem


class ConfigInputError(ValueError):
    """A file or variable that cannot be read as settings; the message is one line."""


def shown(value: object) -> str:
    """``repr(value)`` cut to ``SHOWN_CHARS`` (an ellipsis marks the cut)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + "...'"


def read_config_file(path: Path) -> Any:
    """The parsed YAML of ``path``; :class:`ConfigInputError` naming the file (and line, or setting).

    Read once, here: the settings are built from this result, so the file cannot change between a
    check and a second read, and no other YAML parser sees it (agent.context.file_input for what the
    path may be, agent.context.yaml_input for the alias and size budget)."""
    where = f"config file {path}"
    try:
        return load_yaml(read_text_file(path, where, "settings file"), where)
    except (FileInputError, YamlInputError) as exc:
        raise ConfigInputError(str(exc)) from None


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
        problem = value_problem(cause)
    else:
        problem = "cannot be parsed"
    return (f"{field}: {variable} is not valid JSON ({problem}); a list or mapping setting takes JSON, "
            f"for example {env_prefix}GPU_LABELS='[\"job_id\"]' or {env_prefix}CLASSIFIER='{{\"window_s\": 30}}'")

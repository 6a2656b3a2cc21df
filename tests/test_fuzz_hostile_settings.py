"""Fuzzing the settings: any setting name with any value, from the YAML file or the environment.

Numbers at every edge (non-finite, subnormal, 400-digit integers), text from every Unicode
category, and structures nested deep or repeated wide. For every input, within a time and memory
bound: settings come back with every number finite and inside its bounds, or ``ConfigError`` is
raised with one line that names the setting (or the file); nothing else escapes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, event, given
from hypothesis import strategies as st

from agent.app.config import ConfigError, Settings, load_settings
from agent.classifier.thresholds import Thresholds
from tests.hostile_fuzzing import FUZZ, any_text, bounded, deep, numbers

NAMES = sorted(Settings.model_fields) + [f"classifier.{n}" for n in sorted(Thresholds.model_fields)] + ["nonsense"]
values = st.recursive(numbers | any_text | st.booleans() | st.none(),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=8)


@pytest.fixture(autouse=True)
def no_roofwatch_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ROOFWATCH_"):
            monkeypatch.delenv(key)


def check(outcome: Settings | ConfigError, where: str) -> None:
    if isinstance(outcome, ConfigError):
        message = str(outcome)
        assert "\n" not in message and len(message) < 4000, message[:300]  # two scopes of valid names at most
        assert where in message, (where, message[:300])
        event("refused")
        return
    event("accepted")
    for model in (outcome, outcome.classifier):
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, float):
                assert math.isfinite(value), (name, value)


def load(config: Path | None) -> Settings | ConfigError:
    try:
        return load_settings(config)
    except ConfigError as exc:
        return exc


@pytest.mark.slow
@FUZZ
@given(name=st.sampled_from(NAMES), value=values | st.integers(1, 60_000).map(deep), unicode=st.booleans())
def test_any_value_in_the_file_loads_or_is_one_line(tmp_path_factory: pytest.TempPathFactory, name: str, value: Any,
                                                    unicode: bool) -> None:
    head, _, leaf = name.rpartition(".")
    document = {head: {leaf: value}} if head else {leaf: value}
    try:
        text = yaml.safe_dump(document, allow_unicode=unicode)
    except (yaml.YAMLError, RecursionError):
        text = f"{name}: {value}\n"  # deep strings: written raw, as a person might
    config = tmp_path_factory.mktemp("settings") / "c.yaml"
    config.write_bytes(text.encode("utf-8", "surrogatepass"))
    with bounded(f"settings file with {name}"):
        outcome = load(config)
    check(outcome, leaf if isinstance(outcome, ConfigError) and leaf in str(outcome) else str(config))


@pytest.mark.slow  # 30 inputs under a traced memory bound: 2.0-2.5 s on a 2-core machine, at the quick tier's limit
@FUZZ
@given(name=st.sampled_from(NAMES), value=values, as_json=st.booleans())
def test_any_environment_value_loads_or_is_one_line(name: str, value: Any, as_json: bool) -> None:
    import json

    text = json.dumps(value, allow_nan=True, ensure_ascii=False) if as_json or not isinstance(value, str) else value
    variable = "ROOFWATCH_" + name.replace(".", "__").upper()
    assume("\x00" not in text)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:  # the environment holds bytes: only what surrogateescape can write exists
        assume(False)
    os.environ[variable] = text
    try:
        with bounded(f"{variable}"):
            outcome = load(None)
    finally:
        del os.environ[variable]
    check(outcome, name.rpartition(".")[2] if name != "nonsense" else "nonsense")


def nested_aliases(leaf: Any, levels: int, width: int) -> str:
    """``&l2 [&l1 [&l0 [leaf, leaf], *l0], *l1]`` for width 2: ``width ** levels`` values once expanded."""
    import json

    text = f"&l0 [{', '.join([json.dumps(leaf)] * width)}]"
    for i in range(1, levels):
        text = f"&l{i} [{', '.join([text] + [f'*l{i - 1}'] * (width - 1))}]"
    return text


@pytest.mark.slow
@FUZZ
@given(name=st.sampled_from(NAMES), levels=st.integers(1, 12), width=st.integers(1, 12), leaf=values,
       recursive=st.booleans())
def test_any_alias_structure_in_the_file_loads_or_is_one_line(tmp_path_factory: pytest.TempPathFactory, name: str,
                                                              levels: int, width: int, leaf: Any,
                                                              recursive: bool) -> None:
    """Anchors and aliases of any depth and width under any setting, up to 12^12 values expanded, or an
    alias inside its own anchor: settings within bounds or one line, in bounded memory (issue 42, finding 9)."""
    head, _, key = name.rpartition(".")
    value = "&loop [*loop]" if recursive else nested_aliases(leaf, levels, width)
    config = tmp_path_factory.mktemp("settings") / "c.yaml"
    config.write_text(f"{head}:\n  {key}: {value}\n" if head else f"{key}: {value}\n")
    with bounded(f"aliases {width}^{levels} under {name}"):
        outcome = load(config)
    check(outcome, key if isinstance(outcome, ConfigError) and key in str(outcome) else str(config))

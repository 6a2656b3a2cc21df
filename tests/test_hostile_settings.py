"""Settings that are wrong in ways a person would not guess: a step of a microsecond, a file in
Latin-1, a list given as a bare word in the environment, a 4301-digit number.

Each must end as one line that names the setting, with exit status 2, before anything starts.
``classifier.evaluate_every_s: 1e-6`` used to be accepted and hung the agent (the demo's head start
replays minutes on that grid); the others printed tracebacks of up to 53 lines.
"""

from __future__ import annotations

import os
import subprocess
import typing

import annotated_types
import pytest
from pydantic import BaseModel

from agent.app.config import ConfigError, Settings, load_settings
from tests.agent_process import clean_env, roofwatch_cmd

BIG = "1" * 4301


@pytest.fixture(autouse=True)
def no_roofwatch_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ROOFWATCH_"):
            monkeypatch.delenv(key)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=60,
                          env=clean_env(**(env or {})))


def one_line_naming(result: subprocess.CompletedProcess[str], setting: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert setting in lines[0] and len(lines[0]) < 400, lines[0]
    return lines[0]


# -- bounds ---------------------------------------------------------------------------------------


def _numeric_fields(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, object]]:
    for name, info in model.model_fields.items():
        kinds = [a for a in typing.get_args(info.annotation) or (info.annotation,) if a is not type(None)]
        if any(k in (int, float) for k in kinds) and bool not in kinds:
            yield prefix + name, info
        for kind in kinds:
            inner = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _numeric_fields(inner, f"{prefix}{name}.")


def test_every_numeric_setting_has_a_lower_and_an_upper_bound():
    unbounded = []
    for name, info in _numeric_fields(Settings):
        kinds = {type(m) for m in info.metadata}
        if not kinds & {annotated_types.Ge, annotated_types.Gt} or not kinds & {annotated_types.Le, annotated_types.Lt}:
            unbounded.append(name)
    assert unbounded == []
    assert {"classifier.evaluate_every_s", "inference_endpoints.flops_per_token", "report_ttl_s"} <= {
        n for n, _ in _numeric_fields(Settings)}, "the walk reaches nested settings"


@pytest.mark.slow
def test_a_microsecond_evaluation_step_is_refused_naming_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("classifier:\n  evaluate_every_s: 1.0e-6\n")
    with pytest.raises(ConfigError, match=r"classifier\.evaluate_every_s: Input should be greater than or equal to 0\.5"):
        load_settings(config)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"ts": {1_800_000_000 + i}, "gpu": "0", "gr_active": 0.9}}\n' for i in range(600)))
    line = one_line_naming(run("classify", "--config", str(config), str(trace)), "classifier.evaluate_every_s")
    assert "0.5" in line  # refused at load, before any replay (run's 60 s timeout guards a hang)


@pytest.mark.parametrize("setting, value", [
    ("classifier.idle_held_bytes", "1.0e30"), ("classifier.dataloader_cores", ".inf"), ("classifier.step_cv", "1.0e300"),
    ("classifier.net_congestion_per_s", ".inf"), ("stale_after_s", "1.0e300"), ("classifier.window_s", "1.0e-9"),
])
def test_extreme_values_of_formerly_open_settings_are_refused(tmp_path, setting, value):
    config = tmp_path / "c.yaml"
    head, _, leaf = setting.rpartition(".")
    config.write_text(f"{head}:\n  {leaf}: {value}\n" if head else f"{leaf}: {value}\n")
    with pytest.raises(ConfigError, match=rf"{setting.replace('.', '[.]')}: "):
        load_settings(config)


# -- files, environment variables and numbers that cannot be read ---------------------------------


@pytest.mark.slow
def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("node_name: café\n".encode("latin-1"))
    line = one_line_naming(run("snapshot", "--backend", "virtual", "--config", str(config)), str(config))
    assert "not UTF-8" in line and "line 1" in line


@pytest.mark.slow
def test_a_config_file_that_is_too_large_is_one_line(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("# padding\n" * 200_000)
    line = one_line_naming(run("snapshot", "--backend", "virtual", "--config", str(config)), str(config))
    assert "larger than 1 MiB" in line


@pytest.mark.slow
@pytest.mark.parametrize("variable, value, setting", [
    ("ROOFWATCH_GPU_LABELS", "job_id", "gpu_labels"),
    ("ROOFWATCH_INFERENCE_ENDPOINTS", "[", "inference_endpoints"),
    ("ROOFWATCH_CLASSIFIER", "window_s=20", "classifier"),
    ("ROOFWATCH_GPU_LABELS", f"[{BIG}]", "gpu_labels"),
    ("ROOFWATCH_CLASSIFIER", f'{{"window_s": {BIG}}}', "classifier"),
])
def test_a_list_or_mapping_setting_from_the_environment_that_is_not_json_is_one_line(variable, value, setting):
    line = one_line_naming(run("snapshot", "--backend", "virtual", env={variable: value}), setting)
    assert variable in line and "JSON" in line
    assert BIG not in line


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "env", "nested-env"])
def test_a_4301_digit_integer_is_one_line_naming_the_setting(tmp_path, where):
    config = tmp_path / "c.yaml"
    if where == "file":
        config.write_text(f"interval_s: 1\nexpected_gpus: {BIG}\n")
        result = run("snapshot", "--backend", "virtual", "--config", str(config))
    elif where == "env":
        result = run("snapshot", "--backend", "virtual", env={"ROOFWATCH_EXPECTED_GPUS": BIG})
    else:
        result = run("snapshot", "--backend", "virtual", env={"ROOFWATCH_CLASSIFIER__WINDOW_S": BIG})
    line = one_line_naming(result, "window_s" if where == "nested-env" else "expected_gpus")
    assert BIG[:100] not in line, "the value is shortened, not echoed whole"


@pytest.mark.slow
def test_deeply_nested_yaml_is_one_line(tmp_path):
    config = tmp_path / "deep.yaml"
    config.write_text("gpu_labels: " + "[" * 50_000 + "]" * 50_000 + "\n")
    line = one_line_naming(run("snapshot", "--backend", "virtual", "--config", str(config)), str(config))
    assert "nested too deeply" in line


def test_the_echoed_value_of_a_bad_setting_is_short(monkeypatch):
    monkeypatch.setenv("ROOFWATCH_NODE_NAME", "")
    monkeypatch.setenv("ROOFWATCH_INTERVAL_S", "x" * 10_000)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "interval_s:" in str(info.value) and len(str(info.value)) < 400 and "ROOFWATCH_INTERVAL_S" in str(info.value)


@pytest.mark.parametrize(("setting", "value"), [
    ("listen", "[" * 3000 + "x"), ("listen", "h" * 5000), ("listen", ":" + "9" * 5000), ("listen", "a b:80"),
    ("listen", ":²"), ("dcgm_exporter_url", "[" * 3000), ("dcgm_exporter_url", "ftp://" + "x" * 5000),
    ("inference_endpoints", '[{"url": "ftp://' + "x" * 2000 + '"}]'),
])
def test_a_bad_address_is_named_in_a_short_line(monkeypatch, setting, value):
    """Validators that quote the value clip it, so a kilobytes-long value is still one short line (a
    3,800-character one went past the 4,000-character bound of one line, found by the settings fuzz
    test for listen and then for dcgm_exporter_url); a Unicode digit as the port is refused as a port."""
    monkeypatch.setenv(f"ROOFWATCH_{setting.upper()}", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert setting in message and "\n" not in message and len(message) < 400, message[:300]

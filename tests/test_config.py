"""Settings precedence and errors: flags > ROOFWATCH_* env > YAML file > defaults; bad values exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.app.config import ConfigError, load_settings, parse_listen


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ROOFWATCH_"):
            monkeypatch.delenv(key)


def test_defaults():
    s = load_settings()
    assert s.backend == "auto" and s.interval_s == 1.0 and s.listen_address == ("", 9477)
    assert s.effective_stale_after_s == 10.0


def test_precedence_file_env_flag(tmp_path, monkeypatch):
    cfg = tmp_path / "roofwatch.yaml"
    cfg.write_text("interval_s: 2\nnode_name: from-file\nlog_level: debug\n")
    s = load_settings(cfg)
    assert (s.interval_s, s.node_name, s.log_level) == (2.0, "from-file", "debug")
    monkeypatch.setenv("ROOFWATCH_INTERVAL_S", "3")
    monkeypatch.setenv("ROOFWATCH_NODE_NAME", "from-env")
    s = load_settings(cfg)
    assert (s.interval_s, s.node_name, s.log_level) == (3.0, "from-env", "debug")
    s = load_settings(cfg, interval_s=4.0, node_name=None)
    assert (s.interval_s, s.node_name) == (4.0, "from-env")  # a flag not given (None) does not override


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"interval_s": -1}, "interval_s", "greater than or equal to 0.05"),
        ({"backend": "cuda"}, "backend", "'auto', 'nvml', 'amd', 'virtual', 'nvml-virtual', 'amd-virtual', "
                                          "'dcgm-exporter' or 'amd-exporter'"),
        ({"dcgm_exporter_url": "localhost:9400"}, "dcgm_exporter_url", "not an http:// or https:// URL"),
        ({"amd_exporter_url": "localhost:5000"}, "amd_exporter_url", "not an http:// or https:// URL"),
        ({"amd_exporter_profiler_window_us": 0}, "amd_exporter_profiler_window_us", "greater than or equal to 1"),
        ({"dcgm_exporter_stale_s": 0.5}, "dcgm_exporter_stale_s", "greater than or equal to 1"),
        ({"listen": "nonsense"}, "listen", "HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, "listen", "0 to 65535"),
        ({"dtype": "int4"}, "dtype", "'fp8'"),
    ],
)
def test_bad_values_name_field_and_allowed(overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        load_settings(**overrides)
    assert f"{field}:" in str(err.value) and allowed in str(err.value)


def test_unknown_key_in_file_is_named(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("intervl_s: 3\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert "intervl_s: unknown setting" in str(err.value) and "interval_s" in str(err.value)


@pytest.mark.parametrize(("text", "message"), [("a: [1, 2\n", "invalid YAML"), ("- 1\n- 2\n", "must be a mapping")])
def test_unreadable_file(tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(cfg)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_settings("/nonexistent/roofwatch.yaml")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(":9477", ("", 9477)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9000", ("::1", 9000)), ("node-1.lan:1", ("node-1.lan", 1))],
)
def test_parse_listen(value, expected):
    assert parse_listen(value) == expected


def _roofwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFWATCH_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "agent.app.cli", *args], capture_output=True, text=True, timeout=60, env=full_env
    )


@pytest.mark.slow
def test_cli_bad_flag_value_exits_2_naming_field():
    result = _roofwatch("demo", "--interval", "-1", "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert "interval_s" in result.stderr and "0.05" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_bad_env_value_exits_2_naming_field():
    result = _roofwatch("run", env={"ROOFWATCH_BACKEND": "cuda"})
    assert result.returncode == 2
    assert "backend" in result.stderr and "from ROOFWATCH_BACKEND" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_bad_config_file_exits_2_naming_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("history_len: 3\n")
    result = _roofwatch("demo", "--config", str(cfg))
    assert result.returncode == 2
    assert "history_len" in result.stderr and str(cfg) in result.stderr


def test_attribution_and_report_settings_are_checked_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"gpu_labels\.0: .*'job_id', 'namespace', 'pod' or 'container'"):
        load_settings(gpu_labels=["hostname"])
    with pytest.raises(ConfigError, match=r"inference_endpoints\.0\.bogus: unknown setting \(valid settings: .*params"):
        load_settings(inference_endpoints=[{"url": "http://127.0.0.1:8000", "bogus": 1}])
    with pytest.raises(ConfigError, match=r"report_token and report_token_file are exclusive"):
        load_settings(report_token="x" * 16, report_token_file=str(tmp_path / "t"))
    with pytest.raises(ConfigError, match=r"report_token: String should have at least 8 characters"):
        load_settings(report_token="short")
    settings = load_settings(report_token_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"report_token_file: .*missing: not found"):
        settings.read_report_token()
    (tmp_path / "token").write_text("  s3cret-token\n")
    assert load_settings(report_token_file=str(tmp_path / "token")).read_report_token() == "s3cret-token"


@pytest.mark.slow
def test_cli_unreadable_report_token_file_exits_2_naming_it(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agent.app.cli", "run", "--backend", "nvml"],
                            env={**os.environ, "ROOFWATCH_REPORT_TOKEN_FILE": str(tmp_path / "nope")},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "report_token_file" in result.stderr and "nope" in result.stderr

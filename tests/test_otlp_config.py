"""OTLP configuration, names and doctor: settings over ``OTEL_EXPORTER_OTLP_*``, the semantic-conventions
names pinned to the release read, the ``roofwatch.*`` rule, and doctor's check of the endpoint."""

from __future__ import annotations

import os

import pytest

from agent.app.config import ConfigError, load_settings
from agent.diagnostics.otlp import otlp_findings
from exporters.otlp import CATALOGUE
from exporters.otlp import names as n
from exporters.otlp.convert import point_attributes
from exporters.otlp.endpoint import OtlpConfigError, resolve
from tests.otlp_receiver import GrpcReceiver, HttpReceiver


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("OTEL_", "ROOFWATCH_"))]:
        monkeypatch.delenv(key)


# -- settings ----------------------------------------------------------------------------------------


def test_off_unless_configured():
    assert resolve(load_settings(), {}) is None
    assert resolve(load_settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) is None
    assert resolve(load_settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                     "OTEL_METRICS_EXPORTER": "prometheus"}) is None
    config = resolve(load_settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert config.endpoint == "http://c:4318/v1/metrics" and config.protocol == "http/protobuf"
    assert config.source == "OTEL_EXPORTER_OTLP_ENDPOINT"


def test_settings_win_over_the_standard_variables():
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
               "OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=2", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}
    config = resolve(load_settings(), environ)
    assert (config.protocol, config.endpoint, config.timeout_s) == ("grpc", "http://env:4318", 2.5)  # spec: milliseconds
    assert config.headers == {"a": "1", "b": "2"}
    settings = load_settings(otlp_endpoint="https://mine:4318/otlp", otlp_protocol="http/protobuf",
                             otlp_headers={"B": "secret-b"}, otlp_timeout_s=4)
    config = resolve(settings, environ)
    assert (config.protocol, config.endpoint, config.timeout_s) == ("http/protobuf", "https://mine:4318/otlp/v1/metrics", 4.0)
    assert config.headers == {"a": "1", "b": "secret-b"} and config.source == "otlp_endpoint"
    assert "secret" not in config.describe() and "headers: a, b" in config.describe()  # header values are credentials


def test_signal_specific_variables_win_over_the_general_ones():
    config = resolve(load_settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4318",
                                       "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics:9999/custom",
                                       "OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "3000"})
    assert config.endpoint == "http://metrics:9999/custom" and config.timeout_s == 3.0


@pytest.mark.parametrize(("environ", "named"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
])
def test_an_unusable_variable_is_named(environ, named):
    with pytest.raises(OtlpConfigError, match=named):
        resolve(load_settings(), environ)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"otlp_endpoint": "collector:4318"}, "otlp_endpoint"),
    ({"otlp_protocol": "http/json"}, "otlp_protocol"),
    ({"otlp_interval_s": 0.1}, "otlp_interval_s"),
    ({"otlp_timeout_s": 0}, "otlp_timeout_s"),
    ({"otlp_headers": "novalue"}, "otlp_headers"),
    ({"otlp_headers": {"bad name": "x"}}, "otlp_headers"),
    ({"otlp_headers": {"x": "a\r\nInjected: 1"}}, "otlp_headers"),
    ({"otlp_queue_size": 0}, "otlp_queue_size"),
])
def test_a_bad_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_settings(**overrides)


def test_headers_accept_the_variable_form_in_yaml(tmp_path):
    path = tmp_path / "roofwatch.yaml"
    path.write_text("otlp_endpoint: http://c:4318\notlp_headers: x-scope-orgid=t1, api-key=k\n")
    assert load_settings(path).otlp_headers == {"x-scope-orgid": "t1", "api-key": "k"}


def test_the_flag_reaches_the_settings_on_run_and_demo():
    from agent.app.cli import build_parser
    from agent.app.cli_base import settings_from

    for command in ("run", "demo"):
        args = build_parser().parse_args([command, "--otlp-endpoint", "http://c:4318"])
        assert settings_from(args).otlp_endpoint == "http://c:4318"


def test_a_bad_variable_stops_the_agent_with_a_usage_error(monkeypatch):
    from agent.app.assemble import open_otlp
    from agent.app.cli_base import EXIT_USAGE, CliError

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(CliError) as failure:
        open_otlp(load_settings(), lambda: None)
    assert failure.value.code == EXIT_USAGE and "OTEL_EXPORTER_OTLP_PROTOCOL" in str(failure.value)


# -- names -------------------------------------------------------------------------------------------


def test_semantic_convention_names_are_pinned():
    assert n.SEMCONV_RELEASE == "1.44.0"
    mapped = {prom: sc.name for prom, sc in n.SEMCONV.items()}
    assert mapped == {
        "roofwatch_gpu_engine_active_ratio": "hw.gpu.utilization",
        "roofwatch_gpu_memory_used_bytes": "hw.gpu.memory.usage",
        "roofwatch_gpu_memory_total_bytes": "hw.gpu.memory.limit",
        "roofwatch_gpu_pcie_bytes_total": "hw.gpu.io",
        "roofwatch_gpu_power_watts": "hw.power",
        "roofwatch_gpu_energy_joules_total": "hw.energy",
        "roofwatch_gpu_ecc_errors_total": "hw.errors",
    }
    assert n.MEMORY_UTILIZATION.name == "hw.gpu.memory.utilization"
    for prom in (*n.SEMCONV, *n.MEMORY_UTILIZATION_FROM):
        assert prom in CATALOGUE, f"{prom} was renamed: its semantic-conventions entry no longer matches a family"


def test_the_rule_for_everything_else():
    assert n.roofwatch_name("roofwatch_gpu_mfu_ratio", "gauge", "1") == "roofwatch.gpu.mfu"
    assert n.roofwatch_name("roofwatch_gpu_power_limit_watts", "gauge", "W") == "roofwatch.gpu.power_limit"
    assert n.roofwatch_name("roofwatch_collector_cycles_total", "counter", "{cycle}") == "roofwatch.collector.cycles"
    assert n.roofwatch_name("roofwatch_nic_bytes_total", "counter", "By") == "roofwatch.nic.io"
    assert n.roofwatch_name("roofwatch_gpu_link_bytes_total", "counter", "By") == "roofwatch.gpu.link_io"
    assert n.roofwatch_name("roofwatch_gpu_up", "gauge", "1") == "roofwatch.gpu.up"
    assert n.roofwatch_name("roofwatch_gpu_info", "info", "1") == "roofwatch.gpu.info"
    assert n.ucum("gpus") == "{gpu}" and n.ucum("batches") == "{batch}" and n.ucum("processes") == "{process}"


def test_every_family_has_its_own_otlp_name():
    names = {}
    for prom, defn in CATALOGUE.items():
        name, unit = n.otlp_name(prom, defn.kind, defn.unit)
        assert name.startswith(("hw.", "roofwatch.")) and name == name.lower(), name
        assert name not in names, f"{prom} and {names.get(name)} both become {name}"
        names[name] = prom
        assert unit and " " not in unit, (prom, unit)


def test_labels_become_attributes():
    labels = {"node": "n1", "gpu": "0/1", "uuid": "MIG-abc", "namespace": "ml", "pod": "train-0", "container": "",
              "pid": "4242", "process": "python", "dtype": "bf16"}
    attributes = point_attributes(labels, None, {"MIG-abc": {"hw.vendor": "nvidia", "hw.model": "H100"}})
    assert attributes == {"hw.type": "gpu", "hw.id": "MIG-abc", "hw.name": "gpu0/1", "hw.vendor": "nvidia",
                          "hw.model": "H100", "k8s.namespace.name": "ml", "k8s.pod.name": "train-0",
                          "k8s.node.name": "n1", "process.pid": 4242, "process.executable.name": "python",
                          "roofwatch.dtype": "bf16"}


# -- doctor ------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts a receiver (a server on loopback)
@pytest.mark.parametrize("receiver_class", [HttpReceiver, GrpcReceiver])
def test_doctor_checks_the_endpoint(receiver_class):
    receiver = receiver_class()
    try:
        protocol = "grpc" if receiver_class is GrpcReceiver else "http/protobuf"
        settings = load_settings(otlp_endpoint=receiver.base_url, otlp_protocol=protocol, otlp_timeout_s=1)
        (finding,) = otlp_findings(settings, {})
        assert finding.status == "ok" and receiver.base_url in finding.detail
        receiver.mode = "error"
        (finding,) = otlp_findings(settings, {})
        assert finding.status == "warn" and "dropped" in finding.impact
    finally:
        receiver.close()


def test_doctor_is_silent_when_the_push_is_off_and_names_a_bad_variable():
    assert otlp_findings(load_settings(), {}) == []
    (finding,) = otlp_findings(load_settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                                 "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert finding.status == "fail" and "OTEL_EXPORTER_OTLP_PROTOCOL" in finding.detail

"""What the lower layers get from the program instead of importing it (issue 43, the layer order).

The backends, the selftest, the simulated recording, ``top`` and the HTTP server used to import
``agent/app`` (the settings, the default port) or a view (the status page). Each now receives its
part from above: :class:`~agent.backends.options.BackendOptions`, plain values, the port from the
model, the ``/`` page registered by the app. These tests hold that what is handed down is what the
settings say, and that nothing is lost on the way; tests/test_architecture.py holds that no import
climbs.
"""

from __future__ import annotations

import dataclasses
import http.client
from pathlib import Path

import pytest

from agent.app.config import Settings, load_settings
from agent.model import CollectorHealth, NodeSnapshot
from agent.trace import TraceReader
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import resolve_scenario
from exporters.http import AgentHTTPServer
from tests.agent_process import serving


def test_every_backend_option_is_a_setting_of_that_name() -> None:
    from agent.backends.options import BackendOptions

    names = [f.name for f in dataclasses.fields(BackendOptions) if f.name != "explicit"]
    assert "scenario" in names and "dcgm_bindings_path" in names
    assert sorted(set(names) - set(Settings.model_fields)) == []


def test_the_options_carry_the_settings_values_and_which_the_user_set(tmp_path: Path) -> None:
    from agent.backends.options import BackendOptions

    config = tmp_path / "roofwatch.yaml"
    config.write_text('specs:\n  "NVIDIA Mystery X9": {bf16_tflops: 400, mem_bandwidth_tbs: 2}\n'
                      "dcgm_bindings_path: [/opt/dcgm]\n", encoding="utf-8")
    settings = load_settings(config, backend="nvml-virtual", node_name="gpu-node-7", interval_s=2.0)
    options = BackendOptions.of(settings)
    for field in dataclasses.fields(BackendOptions):
        if field.name not in ("explicit", "inference_endpoints", "dcgm_bindings_path"):
            assert getattr(options, field.name) == getattr(settings, field.name), field.name
    assert options.dcgm_bindings_path == ("/opt/dcgm",) and options.inference_endpoints == ()
    assert options.specs["NVIDIA Mystery X9"]["bf16_tflops"] == 400
    # what the user set, flag or file; a default that follows the node (kubelet socket, scenario) is not among them
    assert {"backend", "node_name", "interval_s", "dcgm_bindings_path", "specs"} <= options.explicit
    assert not {"kubelet_socket", "scenario", "amd_exporter_url"} & options.explicit
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.node_name = "elsewhere"  # type: ignore[misc]


def test_a_replaced_option_counts_as_set_as_the_settings_copy_did() -> None:
    from agent.backends.options import BackendOptions

    settings = Settings(backend="amd-virtual")
    copied = settings.model_copy(update={"scenario": "mi300x"})
    replaced = BackendOptions.of(settings).replace(scenario="mi300x")
    assert replaced.scenario == copied.scenario == "mi300x"
    assert ("scenario" in replaced.explicit) == ("scenario" in copied.model_fields_set) is True
    assert BackendOptions.of(settings).scenario == settings.scenario  # the original is untouched


def test_the_virtual_backend_opens_from_the_options_the_app_builds() -> None:
    from agent.backends.options import BackendOptions
    from agent.backends.registry import open_backend

    settings = Settings(backend="virtual", scenario="demo", virtual_node=None, interval_s=2.0)
    backend = open_backend(BackendOptions.of(settings))
    try:
        assert backend.name == "virtual" and backend.interval_s == 2.0
        assert backend.node == resolve_scenario("demo").nodes[0].name
        assert len(backend.discover()) == len(VirtualEngine(resolve_scenario("demo")).devices(backend.node))
    finally:
        backend.close()


def test_record_simulate_writes_the_scenario_from_plain_values(tmp_path: Path) -> None:
    from agent.virtual.recording import record_simulation

    engine = VirtualEngine(resolve_scenario("demo"))
    node = engine.nodes[0]
    out = tmp_path / "sim.jsonl.gz"
    count = record_simulation("demo", out, node=node, interval_s=1.0, duration_s=3.0)
    with TraceReader(out) as reader:
        samples = list(reader)
        header = reader.header or {}
    assert count == len(samples) == 3 * len(engine.devices(node))
    assert {s.node for s in samples} == {node} and header.get("node") == node
    assert "simulated scenario demo" in header.get("note", "")
    assert all(s.label is not None for s in samples)  # the simulation knows the truth: a labelled trace


def test_the_selftest_on_a_real_gpu_is_handed_the_settings_it_opens_with() -> None:
    from agent.diagnostics.selftest.selftest import Options, SelftestError, run_selftest

    with pytest.raises(SelftestError, match="settings"):
        run_selftest(Options(backend="nvml"))


def test_top_and_the_settings_share_one_default_port() -> None:
    from agent.model.terms import DEFAULT_PORT
    from agent.views.top_source import metrics_url

    assert Settings.model_fields["listen"].default == f":{DEFAULT_PORT}"
    assert metrics_url(None) == f"http://127.0.0.1:{DEFAULT_PORT}/metrics"


def _snapshot() -> NodeSnapshot:
    import time

    return NodeSnapshot(ts=time.time(), node="n1", devices=(), expected_devices=0,
                        health=CollectorHealth(backend="test", last_cycle_ts=time.time()))


def _get(server: AgentHTTPServer, path: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def test_the_http_server_serves_the_page_the_app_registers_and_none_it_was_not_given() -> None:
    snapshot = _snapshot()
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=1e9)) as bare:
        status, _, body = _get(bare, "/")
        assert status == 404 and b"/metrics" in body and b"/healthz" in body
        assert _get(bare, "/metrics")[0] == 200 and _get(bare, "/api/v1/snapshot")[0] == 200
    from agent.app.assemble import status_page

    page = status_page()
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=1e9, page=page)) as agent:
        status, headers, body = _get(agent, "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert headers["content-security-policy"] == page.content_security_policy
        assert "script-src" in page.content_security_policy  # the page's script, allowed by its hash
        assert f'data-refresh="{page.default_refresh_s:g}"'.encode() in body and b"n1" in body
        status, _, body = _get(agent, "/?refresh=30")
        assert status == 200 and b'data-refresh="30"' in body
        assert _get(agent, "/?refresh=-1")[0] == 400

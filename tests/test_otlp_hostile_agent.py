"""Hostile collectors against the real agent process and the real ``roofwatch doctor``.

Before: a collector answering each push with ``200`` and a 1.5 GiB body took the agent from 60 to 1,832 MiB
RSS in 5 s (the unit allows 256 MiB); ``doctor`` said "ok" to a collector redirecting every push; grpcio
wrote raw lines of its own to stderr on every failed TLS handshake, beside the agent's logfmt. Now the agent
stays under its limit and keeps answering ``/metrics`` while every push is counted; doctor says where the
push is redirected and how to fix it; the agent's own log says a failure once and grpcio says nothing.
"""

from __future__ import annotations

import json
import re
import subprocess

import psutil
import pytest

from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd
from tests.hostile_collectors import FailingTlsListener, HostileCollector
from tests.otlp_receiver import HttpReceiver
from tests.test_otlp_agent import otlp_counter
from tests.test_tls_auth import pki  # noqa: F401 - the fixture: a CA and a server certificate it signed

pytestmark = pytest.mark.slow

MEMORY_MAX = 256 * 1024 * 1024
"""The systemd unit's and the chart's memory limit."""
SECRET = "sk-live-SECRET-e19b"
GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d|ssl_transport_security|absl::InitializeLog", re.M)
"""A line of grpcio's C core (absl's format: ``I1206 10:45:34.354150 7807 file.cc:2563] ...``)."""


def otlp_env(**extra: str) -> dict[str, str]:
    """The test's environment without OTEL_* and GRPC_* variables, a push every second, and ``extra``."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("OTEL_", "GRPC_"))}
    return {**env, "ROOFWATCH_OTLP_INTERVAL_S": "1", **extra}


def test_an_agent_pushing_to_a_collector_answering_1_5_gib_stays_under_its_memory_limit():
    with HostileCollector("huge") as collector:
        agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--otlp-endpoint", collector.base_url,
                             env=otlp_env(ROOFWATCH_OTLP_TIMEOUT_S="2"))
        process, peak = psutil.Process(agent.proc.pid), [0]
        try:
            def pushed_three_times() -> bool:
                peak[0] = max(peak[0], process.memory_info().rss)
                assert peak[0] < MEMORY_MAX, f"RSS {peak[0] / 2**20:.0f} MiB"
                text = agent.metrics()  # answered while the pushes happen
                assert "roofwatch_gpu_up{" in text
                return otlp_counter(text, "exports", outcome="success") >= 3

            poll(pushed_three_times, 60, interval=0.1, what="three pushes counted")
            assert len(collector.requests) >= 3
            exit_code, _, err = agent.stop()
            assert exit_code == 0, err[-2000:]
            assert err.count("answer was longer than 16 KiB") == 1, "said once, not once per push"
        finally:
            agent.kill()
    print(f"peak RSS {peak[0] / 2**20:.0f} MiB")


def test_doctor_says_where_the_push_is_redirected_and_how_to_fix_it():
    target = HttpReceiver()
    location = f"https://user:{SECRET}@127.0.0.1:{target.port}/v1/metrics"
    with HostileCollector("redirect", status=308, location=location) as collector:
        env = otlp_env(ROOFWATCH_OTLP_ENDPOINT=collector.base_url,
                       OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{SECRET}")
        text = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual"), capture_output=True, text=True,
                              timeout=60, env=env)
        as_json = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--json"), capture_output=True,
                                 text=True, timeout=60, env=env)
        assert collector.wait_for(2, timeout=1), "doctor tried the collector"
    target.close()
    assert target.attempts == 0, "the redirect was not followed"
    shown = f"redirected to https://<hidden>@127.0.0.1:{target.port}/v1/metrics"
    assert shown in text.stdout and "set otlp_endpoint to the collector's own URL" in text.stdout, text.stdout
    (finding,) = [f for f in json.loads(as_json.stdout)["findings"] if f["check"] == "otlp"]
    assert finding["status"] == "warn" and shown in finding["detail"] and "otlp_endpoint" in finding["fix"]
    for output in (text.stdout, text.stderr, as_json.stdout, as_json.stderr):
        assert SECRET not in output and "accepted an empty export" not in output


@pytest.mark.parametrize("verbosity", [None, "INFO"])
def test_a_grpc_collector_failing_the_tls_handshake_is_one_log_line_not_grpcio_stderr(pki, verbosity):  # noqa: F811
    """grpcio's C core reads GRPC_VERBOSITY when it loads: the agent sets NONE unless the operator chose a
    level, which it keeps (with INFO the core's handshake line shows: the control that the test can see it)."""
    listener = FailingTlsListener(str(pki / "server.crt"), str(pki / "server.key"))
    env = otlp_env(ROOFWATCH_OTLP_PROTOCOL="grpc", ROOFWATCH_OTLP_TIMEOUT_S="1",
                   **({"GRPC_VERBOSITY": verbosity} if verbosity else {}))
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--otlp-endpoint", listener.base_url, env=env)
    try:
        agent.wait_healthy()
        poll(lambda: otlp_counter(agent.metrics(), "dropped_batches", reason="export_failed") >= 3
             and listener.handshakes >= 3, 60, what="three failed pushes, each a failed handshake")
        exit_code, _, err = agent.stop()
    finally:
        agent.kill()
        listener.close()
    assert exit_code == 0
    if verbosity is None:
        assert not GRPC_CORE_LINE.search(err), err[-3000:]
        assert all(line.startswith("ts=") for line in err.splitlines()), err[-3000:]  # only the agent's logfmt
        assert err.count("OTLP push failed") == 1, err[-3000:]
    else:
        assert GRPC_CORE_LINE.search(err), "the operator's GRPC_VERBOSITY was overridden"

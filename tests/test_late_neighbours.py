"""Neighbours that start late or go away (issue 46 item 3), against real agent processes.

In a DaemonSet the agent, dcgm-exporter (or AMD's Device Metrics Exporter) and the inference servers start in
no fixed order, and DCGM takes tens of seconds to come up. Before, ``roofwatch run --backend dcgm-exporter``
(and ``amd-exporter``) exited at start while its exporter did not answer yet ("connection refused"): a crash
loop under Kubernetes or systemd. Now the agent serves at once and says what it waits for (``/healthz`` 200,
``/readyz`` 503, ``roofwatch_source_up`` 0), reads the source within two of its read intervals of its first
answer, marks it down (unknown, never 0) when it goes, and reads it again within two intervals of its return.

"When the source arrived" is when the stand-in exporter first answered (``FakeExporter.answered_at``); "when
the agent had its readings" is the timestamp of the first sample carrying them in the agent's own trace
(``--record``), so the test's polling pace does not enter the figure. Before, a GPU of an exporter that had
been down for a while came back only after the collector's grown back-off (1 s doubling to 60 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.virtual.devices import device_uuid
from tests import amd_exporter_fixtures as fx
from tests.agent_process import poll
from tests.dcgm_exporter_server import FakeExporter, fixture, replace_uuids
from tests.neighbour_agent import Agent, free_port
from tests.test_amd_exporter_join import joined_body

pytestmark = pytest.mark.slow

READ_S = 2.0
"""The exporters' and the inference endpoint's read interval here: the readings must follow within two."""
CAPTURES = Path(__file__).parent / "fixtures" / "captures"


def source_up(metrics: str) -> dict[str, float]:
    return {line.split('source="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines() if line.startswith("roofwatch_source_up{")}


def waits_for_its_source(agent: Agent, what: str) -> None:
    """Served at once, alive, not ready, naming the exporter and why; the source down, no GPU series at all."""
    health = poll(lambda: (h := agent.get("healthz"))[0] == 200 and "connection refused" in h[1] and h, 30,
                  what="/healthz naming the exporter it waits for")
    assert health[1].startswith(f"waiting for {what}: connection refused"), health
    ready = agent.get("readyz")
    assert ready[0] == 503 and ready[1].startswith(f"not ready: waiting for {what}: connection refused"), ready
    metrics = agent.get("metrics")[1]
    assert 0.0 in source_up(metrics).values()
    assert "roofwatch_gpu_power_watts{" not in metrics and "roofwatch_gpu_up{" not in metrics


EXPORTERS = {
    "dcgm-exporter": (fixture("a100-8x-pods.exporter-4.9.prom"), "ROOFWATCH_DCGM_EXPORTER_INTERVAL_S", 8),
    "amd-exporter": (fx.FILES["mi300x-spx-profiler.prom"](), "ROOFWATCH_AMD_EXPORTER_INTERVAL_S", 8),
}


@pytest.mark.parametrize("backend", EXPORTERS)
def test_an_agent_started_before_its_exporter_serves_waits_and_reads_it_when_it_comes_and_returns(backend, tmp_path):
    body, interval_variable, gpus = EXPORTERS[backend]
    exporter_port = free_port()
    url = f"http://127.0.0.1:{exporter_port}/metrics"
    agent = Agent(tmp_path, "run", "--backend", backend, f"--{backend}-url", url, **{interval_variable: str(READ_S)})
    exporter = None
    try:
        waits_for_its_source(agent, f"{backend} at {url}")
        exporter = FakeExporter(body, port=exporter_port)
        ready = poll(lambda: (r := agent.get("readyz"))[0] == 200 and r, 30, what="/readyz once the exporter answers")
        assert ready[1] == f"ready: {gpus}/{gpus} GPUs up", ready
        arrived = exporter.answered_at
        assert arrived is not None
        assert source_up(agent.get("metrics")[1]) == {backend: 1.0}

        exporter.stop()  # the exporter restarts: its GPUs are down, their values unknown, never 0
        # One exposition says both: the source down and no GPU value (the reader may fail between a cycle's
        # device reads and its source state, so the first snapshot after the failure can say only the latter).
        poll(lambda: (m := agent.get("metrics")[1]) and source_up(m) == {backend: 0.0}
             and "roofwatch_gpu_power_watts{" not in m, 30, what="the source down and its GPUs without values")
        down = agent.get("readyz")
        assert down[0] == 503 and down[1].startswith(f"not ready: waiting for {backend}: down (connection refused"), down
        assert agent.get("healthz")[0] == 200, "alive: a probe must not restart it"
        # Down long enough for a doubling back-off to have grown past 8 s (0.5 + 1 + 2 + 4 + 8 s).
        poll(lambda: all(d["consecutive_failures"] >= 6 for d in agent.samples().values()), 60,
             what="six failed reads of every GPU")
        exporter.start()
        poll(lambda: agent.get("readyz")[0] == 200 and "roofwatch_gpu_power_watts{" in agent.get("metrics")[1], 30,
             what="the GPUs back after the exporter returned")
        returned = exporter.answered_at
        assert returned is not None
    finally:
        if exporter is not None:
            exporter.stop()
        log = agent.finish()
    assert f"waiting for {backend} at {url}" in log, log[-3000:]
    has_power = lambda s: s.get("power_w") is not None  # noqa: E731
    for when, label in ((arrived, "its first answer"), (returned, "its return")):
        first = agent.first_sample_after(when, has_power)
        assert len(first) == gpus, (label, first)
        assert max(first.values()) <= 2 * READ_S, f"readings {max(first.values()):.1f} s after {label}"


@pytest.fixture
def a100_pair(tmp_path: Path) -> Path:
    """Two A100s for the fake NVML: pre-Hopper, so NVML alone reads no SM or tensor activity."""
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump({"name": "a100-late", "seed": 5, "nodes": [{
        "name": "dgx-a100-017", "model": "a100-sxm-80gb", "gpus": 2, "workloads": [
            {"job": "serve", "gpus": [0, 1], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        ]}]}))
    return path


def test_the_exporter_joined_to_nvml_is_read_when_it_comes_and_returns(a100_pair, tmp_path):
    """NVML over the fake driver, joined to a dcgm-exporter that starts after the agent and restarts under it: the
    GPUs are read throughout, the joined counters come within two read intervals of the exporter, and are
    unknown (never 0) while it is gone; ``/readyz`` stays 200 and names it meanwhile."""
    uuids = {str(i): device_uuid(5, "dgx-a100-017", i, "nvidia") for i in range(2)}
    exporter_port = free_port()
    agent = Agent(tmp_path, "demo", "--backend", "nvml-virtual", "--scenario", str(a100_pair),
                  "--dcgm-exporter-url", f"http://127.0.0.1:{exporter_port}/metrics",
                  ROOFWATCH_DCGM_EXPORTER_INTERVAL_S=str(READ_S))
    exporter = None
    joined = lambda s: s.get("sm_active") is not None  # noqa: E731
    try:
        ready = poll(lambda: (r := agent.get("readyz"))[0] == 200 and "connection refused" in r[1] and r, 30,
                     what="/readyz naming the exporter it waits for")
        assert ready[1].startswith("ready: 2/2 GPUs up; waiting for dcgm-exporter: down (connection refused"), ready
        assert all(d["sample"]["sm_active"] is None for d in agent.samples().values()), "unknown, not 0"
        exporter = FakeExporter(replace_uuids(fixture("a100-8x-pods.prom"), uuids), port=exporter_port)
        poll(lambda: agent.get("readyz")[1] == "ready: 2/2 GPUs up"
             and agent.samples()["0"]["sample"]["sm_active"] == 0.913, 30, what="joined")
        arrived = exporter.answered_at
        exporter.stop()
        gone = poll(lambda: (r := agent.get("readyz"))[1].startswith("ready: 2/2 GPUs up; waiting for dcgm-exporter: "
                                                                   "down") and r, 30, what="the exporter gone")
        assert gone[0] == 200, "the GPUs' own readings are good: ready, naming what it waits for"
        poll(lambda: all(d["sample"]["sm_active"] is None for d in agent.samples().values()), 30,
             what="the joined counters unknown")
        exporter.start()
        poll(lambda: agent.get("readyz")[1] == "ready: 2/2 GPUs up", 30, what="the exporter back")
        returned = exporter.answered_at
    finally:
        if exporter is not None:
            exporter.stop()
        agent.finish()
    for when, label in ((arrived, "first answer"), (returned, "return")):
        first = agent.first_sample_after(when, joined)
        assert sorted(first) == ["0", "1"] and max(first.values()) <= 2 * READ_S, (label, first)


def test_a_late_inference_endpoint_is_scraped_when_it_comes_and_returns(tmp_path):
    """The sidecar beside its dcgm-exporter, with an inference server on GPU 2 that starts after the agent and
    restarts under it: its serving figures come within two scrape intervals of its first answer and of its
    return (a rate needs two scrapes: the second follows a second after the first, not a whole interval), and
    are absent, never 0, while it is gone."""
    vllm_port = free_port()
    vllm_url = f"http://127.0.0.1:{vllm_port}/metrics"
    config = tmp_path / "roofwatch.yaml"
    config.write_text(yaml.safe_dump({"inference_endpoints": [{"url": vllm_url, "gpus": ["2"], "model_bytes": 1e9}]}))
    vllm_body = (CAPTURES / "vllm" / "kops-qwen05b-v1-idle.txt").read_text()
    serving = lambda s: s["gpu"] == "2" and (s.get("workload") or {}).get("serving") is not None  # noqa: E731
    vllm = None
    with FakeExporter(fixture("a100-8x-pods.prom")) as exporter:
        agent = Agent(tmp_path, "run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url, "--config",
                      str(config), ROOFWATCH_INFERENCE_INTERVAL_S=str(READ_S))
        try:
            ready = poll(lambda: (r := agent.get("readyz"))[0] == 200 and "connection refused" in r[1] and r, 30,
                         what="/readyz naming the endpoint it waits for")
            assert ready[1].startswith(f"ready: 8/8 GPUs up; waiting for inference {vllm_url}: down (connection "
                                       "refused"), ready
            vllm = FakeExporter(vllm_body, port=vllm_port)
            poll(lambda: "roofwatch_serving_info{" in agent.get("metrics")[1], 30, what="the serving figures")
            assert agent.get("readyz")[1] == "ready: 8/8 GPUs up"
            arrived = vllm.answered_at
            vllm.stop()
            poll(lambda: "roofwatch_serving_info{" not in agent.get("metrics")[1]
                 and "inference" in agent.get("readyz")[1], 30, what="the figures gone with the server")
            vllm.start()
            poll(lambda: "roofwatch_serving_info{" in agent.get("metrics")[1], 30, what="the figures back")
            returned = vllm.answered_at
        finally:
            if vllm is not None:
                vllm.stop()
            agent.finish()
    for when, label in ((arrived, "first answer"), (returned, "return")):
        first = agent.first_sample_after(when, serving)
        assert list(first) == ["2"] and first["2"] <= 2 * READ_S, (label, first)


def test_amd_smi_joined_to_a_late_device_metrics_exporter_gets_its_counters_when_it_comes(tmp_path):
    exporter_port = free_port()
    agent = Agent(tmp_path, "demo", "--backend", "amd-virtual",
                  ROOFWATCH_AMD_EXPORTER_URL=f"http://127.0.0.1:{exporter_port}/metrics",
                  ROOFWATCH_AMD_EXPORTER_INTERVAL_S=str(READ_S))
    exporter = None
    try:
        ready = poll(lambda: (r := agent.get("readyz"))[0] == 200 and "amd-exporter: down" in r[1] and r, 30,
                     what="/readyz naming the exporter it waits for")
        assert ready[1].startswith("ready: 8/8 GPUs up; waiting for amd-exporter: down (connection refused"), ready
        exporter = FakeExporter(joined_body(), port=exporter_port)
        poll(lambda: all(agent.samples()[str(g)]["sample"]["tensor_active"] is not None for g in range(7)), 30,
             what="GPUs 0-6 joined")
        arrived = exporter.answered_at
    finally:
        if exporter is not None:
            exporter.stop()
        agent.finish()
    first = agent.first_sample_after(arrived, lambda s: s.get("tensor_active") is not None)
    assert sorted(first) == [str(i) for i in range(7)], first  # GPU 7's serial matches nothing, as in the fixture
    assert max(first.values()) <= 2 * READ_S, first

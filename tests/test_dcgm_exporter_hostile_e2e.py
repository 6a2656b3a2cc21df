"""A hostile dcgm-exporter against the real agent process: a body listing 10,000 GPUs, and labels
thousands of characters long. ``roofwatch run`` and ``demo`` as child processes reading the stand-in
exporter over HTTP (tests/dcgm_exporter_server.py), watched from outside with psutil, as the systemd
unit's limits would see them (256 MiB, 256 tasks)."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import AgentProcess, clean_env, http_get, poll, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter, fixture, lengthen_labels, many_gpus
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

MAX_THREADS = 64
"""The unit allows 256 tasks; the agent runs ~30 threads (16 sampling workers, the listener's 5, the
collector, the exporter reader). 10,000 GPUs used to start 10,008."""
MAX_RSS = 192 * 1024 * 1024
"""The unit allows 256 MiB; 10,000 GPUs used to pass 551 MiB and grow."""


class Watch:
    """The agent's threads and RSS, checked at every poll: a breach fails at once, not at a timeout."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.threads = self.rss = 0

    def __call__(self) -> None:
        threads, rss = self.process.num_threads(), self.process.memory_info().rss
        self.threads, self.rss = max(self.threads, threads), max(self.rss, rss)
        assert threads < MAX_THREADS, f"{threads} threads"
        assert rss < MAX_RSS, f"RSS {rss / 2**20:.0f} MiB"


def test_an_exporter_listing_10000_gpus_costs_bounded_threads_memory_and_log_lines(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = tmp_path / "agent.log"
    with FakeExporter(many_gpus(10_000)) as exporter, log_path.open("w") as log:
        proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                                              "--listen", f"127.0.0.1:{port}", "--interval", "0.5"),
                                stdout=subprocess.DEVNULL, stderr=log, text=True,
                                env=clean_env(ROOFWATCH_DCGM_EXPORTER_INTERVAL_S="2"))
        try:
            watch = Watch(proc.pid)

            def healthy() -> bool:
                watch()
                assert proc.poll() is None, "the agent exited"
                return http_get(url + "healthz")[0] == 200

            poll(healthy, 120, interval=0.2, what="/healthz 200")

            def all_up() -> dict | None:
                watch()
                status, body = http_get(url + "api/v1/snapshot")
                data = json.loads(body) if status == 200 else {}
                up = [d["info"]["gpu"] for d in data.get("devices", ()) if d["up"]]
                return data if len(up) == 128 else None

            data = poll(all_up, 60, interval=0.2, what="the first 128 GPUs up")
            assert [d["info"]["gpu"] for d in data["devices"]] == [str(i) for i in range(128)]
            reads = exporter.requests
            poll(lambda: healthy() and exporter.requests >= reads + 3, 60, interval=0.2,
                 what="three more reads of the 11 MiB body")
            assert http_get(url + "healthz")[0] == 200
            status, body = http_get(url + "metrics")
            assert status == 200 and body.count(b"roofwatch_gpu_up{") == 128
            watch()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    lines = log_path.read_text().splitlines()
    refused = [line for line in lines if "max_devices" in line]
    assert len(refused) == 1, lines[:20]
    assert "lists 10000 GPUs and MIG instances, more than max_devices (128)" in refused[0]
    assert "refusing 9872 (128, 129, 130, 131 and 9868 more)" in refused[0] and len(refused[0]) < 800
    assert len(lines) < 20, lines[:20]
    print("\n".join(lines))
    print(f"peak: {watch.threads} threads, RSS {watch.rss / 2**20:.0f} MiB, {len(lines)} log lines")


def test_labels_thousands_of_characters_long_are_clipped_in_the_agents_exposition():
    body = lengthen_labels(fixture("a100-8x-pods.prom"), 2200, ("Hostname", "UUID", "modelName", "pci_bus_id"))
    with FakeExporter(body) as exporter:
        agent = AgentProcess("demo", "--backend", "dcgm-exporter", "--dcgm-exporter-url", exporter.url,
                             "--listen", "127.0.0.1:0", "--interval", "0.2",
                             env=clean_env(ROOFWATCH_DCGM_EXPORTER_INTERVAL_S="0.2"))
        try:
            agent.wait_healthy(60)
            text = poll(lambda: (t := agent.metrics()) and "roofwatch_gpu_power_watts{" in t and t, 30,
                        what="GPU readings in /metrics")
            status, raw = agent.get("api/v1/snapshot")
        finally:
            agent.kill()
    labels = [(s.name, k, v) for family in text_string_to_metric_families(text) for s in family.samples
              for k, v in s.labels.items()]
    too_long = sorted({(name, k) for name, k, v in labels if len(v) > 128})
    assert too_long == [], too_long[:10]
    nodes = {v for name, k, v in labels if k == "node"}
    assert nodes == {("dgx-a100-017~" * 200)[:128]}, "the exporter's Hostname, clipped"
    assert len({v for name, k, v in labels if k == "uuid"}) == 8, "clipped UUIDs still tell the GPUs apart"
    data = json.loads(raw)
    assert status == 200 and data["node"] == next(iter(nodes))
    assert all(len(d["info"]["uuid"]) == 128 and len(d["info"]["model"]) == 128 for d in data["devices"])

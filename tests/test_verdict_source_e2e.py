"""The source a verdict rests on, through real agent processes (issue 43, item 7).

A ``roofwatch demo`` over the fake NVML of an A100 node, joined by UUID to a stand-in dcgm-exporter serving a
fixture in the real exporter's format: the GPUs the exporter lists get their profiling counters from it and
their verdicts say so on ``/api/v1/snapshot``, ``/metrics`` and ``/``; the GPU whose UUID the exporter does not
list is judged from NVML's own power and memory busy time, and says that. And the default demo (H100s, GPM)
names GPM on its page and in doctor, never the list of every source.
"""

from __future__ import annotations

import json
import re
import subprocess
from html import unescape
from pathlib import Path

import pytest
import yaml

from agent.virtual.devices import device_uuid
from tests.agent_process import AgentProcess, clean_env, http_get, poll, roofwatch_cmd, running_demo
from tests.dcgm_exporter_server import FakeExporter, fixture, replace_uuids
from tests.top_exposition import series

pytestmark = pytest.mark.slow

FAST = {  # read the exporter often and classify over short windows (tests/test_dcgm_exporter_e2e.py)
    "ROOFWATCH_DCGM_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_CLASSIFIER__WINDOW_S": "2",
    "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4", "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5",
}
GENERIC = "GPM, DCGM, AMD's profiler"


def _get(url: str) -> str:
    status, body = http_get(url)
    assert status == 200, url
    return body.decode()


def _rests_on(page: str) -> dict[str, str]:
    """GPU -> the status page card's "verdict rests on" words."""
    return {gpu: unescape(text) for gpu, text in re.findall(
        r'<div class="card" data-gpu="([^"]+)".*?<li class="basis muted"[^>]*>verdict rests on: (.*?)</li>', page, re.S)}


@pytest.fixture
def a100_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump({"name": "a100-join", "seed": 5, "nodes": [{
        "name": "dgx-a100-017", "model": "a100-sxm-80gb", "gpus": 8, "workloads": [
            {"job": "train", "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
             "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]}]}]}))
    return path


def test_gpus_joined_to_dcgm_exporter_say_so_and_the_one_left_out_says_nvml(a100_scenario: Path) -> None:
    uuids = {str(i): device_uuid(5, "dgx-a100-017", i, "nvidia") for i in range(8)}
    body = replace_uuids(fixture("a100-8x-pods.prom"), {k: v for k, v in uuids.items() if k != "7"})
    with FakeExporter(body) as exporter:
        agent = AgentProcess("demo", "--backend", "nvml-virtual", "--scenario", str(a100_scenario),
                             "--dcgm-exporter-url", exporter.url, "--listen", "127.0.0.1:0", "--interval", "0.2",
                             env=clean_env(**FAST))
        try:
            agent.wait_healthy()

            def settled() -> dict | None:
                verdicts = {v["gpu"]: v for v in json.loads(_get(agent.url + "api/v1/snapshot"))["verdicts"]}
                done = verdicts.get("0", {}).get("basis") == "counters" and "7" in verdicts
                return verdicts if done else None

            verdicts = poll(settled, 30, what="GPU 0's verdict on the exporter's counters")
            metrics, page = _get(agent.url + "metrics"), _get(agent.url + "?refresh=0")
        finally:
            agent.kill()
    labels = {lab["gpu"]: lab for lab, _ in series(metrics, "roofwatch_gpu_workload_reason_info")}
    said = _rests_on(page)
    assert (verdicts["0"]["basis_source"], labels["0"]["basis_source"]) == ("dcgm-exporter", "dcgm-exporter")
    assert "compute-pipe and DRAM bandwidth counters from dcgm-exporter" in said["0"], said["0"]
    assert verdicts["7"]["basis"] == "power_and_mem_busy", "the exporter does not list GPU 7's UUID: NVML alone"
    assert (verdicts["7"]["basis_source"], labels["7"]["basis_source"]) == ("nvml", "nvml")
    assert "from NVML" in said["7"] and "dcgm-exporter" not in said["7"], said["7"]
    assert GENERIC not in page


def test_the_demo_page_and_doctor_name_gpm() -> None:
    with running_demo() as agent:
        page = poll(lambda: (p := _get(agent.url + "?refresh=0")) and 'class="basis muted"' in p and p, 30,
                    what="cards with a basis")
    said = _rests_on(page)
    counters = {gpu: words for gpu, words in said.items() if words.startswith("compute-pipe")}
    assert counters and all(words == "compute-pipe and DRAM bandwidth counters from GPM" for words in counters.values())
    assert GENERIC not in page
    doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "virtual", "--json"), capture_output=True, text=True,
                            env=clean_env(), timeout=60)
    lines = [f["detail"] for f in json.loads(doctor.stdout)["findings"] if f["check"] == "verdict basis"]
    assert any("counters from GPM (basis counters)" in line for line in lines), lines
    assert not any(GENERIC in line for line in lines)

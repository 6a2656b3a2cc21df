"""``roofwatch run --backend amd-exporter`` as a real process against AMD Device Metrics Exporter
expositions served over HTTP (tests/fixtures/amd-exporter, assembled in DME's format: see its README).

With the profiler's series an MI300X gets a counter roofline: the GEMM GPUs (MFMA busy, 16-bit ops over
the window near 60 % of the BF16 peak) are compute_bound and the decoding ones (HBM bytes over the
window near the bandwidth) memory_bound, on ``counters``, with a counter MFU within 5 points of the
fixture's ops / window / peak. Without them the same node reads as amdsmi reads it (activity, UMC
activity, power), no counter MFU. In CPX no partition shows partition 0's power or activity.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import amd_exporter_fixtures as fx
from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

FAST = {"ROOFWATCH_AMD_EXPORTER_INTERVAL_S": "0.2", "ROOFWATCH_CLASSIFIER__WINDOW_S": "2",
        "ROOFWATCH_CLASSIFIER__LONG_WINDOW_S": "4", "ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S": "0.5"}


def run_agent(body: str, until, what: str, count: int):
    """Serve ``body``, run the agent on it, and return (verdicts by GPU, /metrics text) once ``until`` holds."""
    with FakeExporter(body) as exporter:
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        agent = subprocess.Popen(roofwatch_cmd("run", "--backend", "amd-exporter", "--amd-exporter-url", exporter.url,
                                               "--listen", f"127.0.0.1:{port}", "--interval", "0.2"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**FAST))
        try:
            poll(lambda: http_get(url + "healthz")[0] == 200, 30, what="/healthz")

            def verdicts():
                return {v["gpu"]: v for v in json.loads(http_get(url + "api/v1/snapshot")[1])["verdicts"]}

            found = poll(lambda: (v := verdicts()) and len(v) == count and until(v) and v, 40, what=what)
            metrics = http_get(url + "metrics")[1].decode()
        finally:
            agent.terminate()
            agent.communicate(timeout=15)
    return found, metrics


def series(text: str, name: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


def test_gemm_gpus_are_compute_bound_and_decoding_ones_memory_bound_on_counters():
    expected = {str(gpu): "compute_bound" if work is fx.GEMM else "memory_bound" for gpu, work in enumerate(fx.WORKLOADS)}
    # Waits for the settled state (a first window may still hold a partial read), then checks its figures.
    verdicts, metrics = run_agent(fx.FILES["mi300x-spx-profiler.prom"](),
                                  lambda v: {g: x["class"] for g, x in v.items()} == expected and all(
                                      x["basis"] == "counters" and x["mfu_counters"] is not None for x in v.values()),
                                  "GEMM GPUs compute_bound and decoding ones memory_bound, on counters", 8)
    for gpu, work in enumerate(fx.WORKLOADS):
        v = verdicts[str(gpu)]
        assert v["class"] == ("compute_bound" if work is fx.GEMM else "memory_bound"), v
        assert v["basis"] == "counters", v
        assert v["mfu_counters"] == pytest.approx(fx.expected_mfu(work), abs=0.05), v
    power = series(metrics, "roofwatch_gpu_power_watts")
    assert power["0"] == 721.0 and power["4"] == 515.0


def test_without_profiler_series_the_counterless_verdicts_say_why():
    """As amdsmi reads an MI300X: power against TDP and UMC activity, no counter MFU, and the reason says so."""
    expected = {str(gpu): ("compute_bound", "power_proxy") if work is fx.GEMM else ("memory_bound", "at_roof")
                for gpu, work in enumerate(fx.WORKLOADS)}
    verdicts, _ = run_agent(fx.FILES["mi300x-spx-no-profiler.prom"](),
                            lambda v: {g: (x["class"], x["detail"]) for g, x in v.items()} == expected,
                            "the counter-less verdict for each of the 8 MI300X", 8)
    for gpu, work in enumerate(fx.WORKLOADS):
        v = verdicts[str(gpu)]
        assert v["basis"] == "power_and_dram" and v["mfu_counters"] is None, v
        assert v["reasons"][0].startswith("no tensor or FP-pipe counter on this GPU"), v
        assert (v["class"], v["detail"]) == (("compute_bound", "power_proxy") if work is fx.GEMM
                                             else ("memory_bound", "at_roof")), v


def test_cpx_partitions_do_not_show_partition_0s_power_or_activity():
    verdicts, metrics = run_agent(fx.FILES["mi300x-cpx-profiler.prom"](),
                                  lambda v: all(x["detail"] != "warming_up" for x in v.values())
                                  and (v["0/1"]["class"], v["0/5"]["class"]) == ("compute_bound", "idle"),
                                  "a verdict per partition, partition 1 computing and 5 idle", 16)
    assert all(v["basis"] == "counters" for v in verdicts.values()), verdicts
    assert verdicts["0/1"]["class"] == "compute_bound" and verdicts["0/5"]["class"] == "idle"
    power = series(metrics, "roofwatch_gpu_power_watts")
    assert power == {"0/0": 688.0, "1/0": 688.0}, power
    busy = series(metrics, "roofwatch_gpu_engine_active_ratio")
    assert len(busy) == 16, busy
    for key, value in busy.items():
        g, p = map(int, key.split("/"))
        assert value == pytest.approx(fx.CPX_BUSY[g][p] / 100), key

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


def labels_of(text: str, name: str) -> dict[str, dict[str, str]]:
    return {s.labels["gpu"]: s.labels for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


def expect_classes(workloads: list, gemm: tuple, keys: list[str]) -> dict[str, str]:
    return {key: "compute_bound" if work is gemm else "memory_bound" for key, work in zip(keys, workloads)}


def test_mi250x_gcds_are_separate_gpus_each_held_to_half_the_packages_peaks():
    """Each GCD is its own gpu_id and its own GPU, with the catalogue's per-GCD MI250X peaks (383/2 TFLOP/s BF16,
    3.2/2 TB/s), and its power from MI2xx's series (no gpu_package_power on MI2xx)."""
    keys = [str(g) for g in range(8)]
    expected = expect_classes(fx.MI250X_WORKLOADS, fx.MI250X_GEMM, keys)
    verdicts, metrics = run_agent(fx.FILES["mi250x-profiler.prom"](),
                                  lambda v: {g: x["class"] for g, x in v.items()} == expected and all(
                                      x["basis"] == "counters" and x["mfu_counters"] is not None for x in v.values()),
                                  "the 8 MI250X GCDs judged on counters", 8)
    for key, work in zip(keys, fx.MI250X_WORKLOADS):
        assert verdicts[key]["mfu_counters"] == pytest.approx(fx.expected_mfu(work, fx.MI250X_PEAK_BF16), abs=0.05)
    info = labels_of(metrics, "roofwatch_gpu_info")
    assert {i["spec"] for i in info.values()} == {"mi250x"} and {i["model"] for i in info.values()} == {
        "AMD Instinct MI250X"}
    assert len({i["uuid"] for i in info.values()}) == 8, "the two GCDs of a package share a serial, not an id"
    peaks = series(metrics, "roofwatch_gpu_peak_flops")
    assert set(peaks) == set(keys) and all(v == pytest.approx(fx.MI250X_PEAK_BF16) for v in peaks.values()), peaks
    bandwidth = series(metrics, "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second")
    assert all(v == pytest.approx(fx.MI250X_BANDWIDTH) for v in bandwidth.values()), bandwidth
    assert series(metrics, "roofwatch_gpu_power_watts")["0"] == fx.MI250X_GEMM[7]


def test_mi355x_spx_gemm_compute_bound_and_decode_memory_bound_against_its_own_peaks():
    keys = [str(g) for g in range(8)]
    expected = expect_classes(fx.MI355X_WORKLOADS, fx.MI355X_GEMM, keys)
    verdicts, metrics = run_agent(fx.FILES["mi355x-spx-profiler.prom"](),
                                  lambda v: {g: x["class"] for g, x in v.items()} == expected and all(
                                      x["basis"] == "counters" and x["mfu_counters"] is not None for x in v.values()),
                                  "the 8 MI355X judged on counters", 8)
    for key, work in zip(keys, fx.MI355X_WORKLOADS):
        assert verdicts[key]["mfu_counters"] == pytest.approx(fx.expected_mfu(work, fx.MI355X_PEAK_BF16), abs=0.05)
    assert {i["spec"] for i in labels_of(metrics, "roofwatch_gpu_info").values()} == {"mi355x"}
    bandwidth = series(metrics, "roofwatch_gpu_peak_memory_bandwidth_bytes_per_second")
    assert all(v == pytest.approx(fx.MI355X_BANDWIDTH) for v in bandwidth.values()), bandwidth


def test_mi355x_dpx_partitions_are_held_to_half_and_only_partition_0_shows_power():
    keys = [f"{g}/{p}" for g in range(8) for p in range(2)]
    expected = {key: "compute_bound" if key.endswith("/0") else "memory_bound" for key in keys}
    verdicts, metrics = run_agent(fx.FILES["mi355x-dpx-profiler.prom"](),
                                  lambda v: {g: x["class"] for g, x in v.items()} == expected and all(
                                      x["basis"] == "counters" for x in v.values()),
                                  "16 MI355X DPX partitions judged on counters", 16)
    assert verdicts["3/0"]["mfu_counters"] == pytest.approx(fx.expected_mfu(fx.MI355X_GEMM, fx.MI355X_PEAK_BF16),
                                                            abs=0.05)
    assert {i["spec"] for i in labels_of(metrics, "roofwatch_gpu_info").values()} == {"mi355x-dpx"}
    peaks = series(metrics, "roofwatch_gpu_peak_flops")
    assert all(v == pytest.approx(fx.MI355X_PEAK_BF16 / 2) for v in peaks.values()), peaks
    assert set(series(metrics, "roofwatch_gpu_power_watts")) == {f"{g}/0" for g in range(8)}

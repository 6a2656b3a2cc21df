"""The Prometheus exposition: valid for promtool, in sync with docs, honest about unknowns."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.collector import Collector
from agent.classifier.live import LiveClassifier
from agent.model.holders import Holder, HolderReport
from agent.model import (Attribution, DeviceInfo, GpuSample, GpuSpec, HostSample, LinkTraffic, NicPort, ProcessSample, RemappedRows, ServingReport,
                         SourceState, WorkloadReport,
                         XidCount)
from exporters import docgen
from exporters.metrics import JOB_ID_MAX_LEN, METRICS, OPTIONAL_GROUPS
from exporters.prometheus import ExpositionCache
from tests.agent_process import serving_collector

SPEC = GpuSpec(
    key="test-gpu", name="Test GPU", vendor="nvidia", peak_flops={"bf16": 1e15, "fp8": 2e15},
    mem_bandwidth_bytes_per_s=3e12, memory_bytes=80 * 2**30, tdp_w=700,
)


def full_sample(gpu: str, now: float, n_procs: int = 3) -> GpuSample:
    """A sample with every field known, so every metric family gets at least one series."""
    return GpuSample(
        ts=now, gpu=gpu, node="n1", uuid=f"GPU-{gpu}", vendor="nvidia", model="Test GPU", interval_s=1.0,
        gr_active=0.9, util_gpu=0.92, sm_active=0.8, sm_occupancy=0.4, tensor_active=0.6, fp64_active=0.0, fp32_active=0.1,
        fp16_active=0.05, dram_active=0.3, mem_busy=0.41, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=2e9,
        link_tx_bytes_per_s=5e10, link_rx_bytes_per_s=4e10, net_tx_bytes_per_s=1e10 + 1e9 * (int(now) % 3),
        net_rx_bytes_per_s=1e10,
        power_w=650.0 - 10.0 * (int(now) % 3), temperature_c=71.0, sm_clock_mhz=1755.0, sm_clock_max_mhz=1980.0,
        mem_used_bytes=60 * 2**30, mem_total_bytes=80 * 2**30, clock_event_reasons=0x4, power_limit_w=700.0,
        processes=tuple(
            ProcessSample(pid=1000 + i, name=f'py"thon\n{i}', used_memory_bytes=(i + 1) * 2**30, cpu_cores=1.5,
                          sm_util=0.3, cpu_main_cores=1.0, cpu_workers_cores=0.5, workers=4, cpu_limit_cores=8.0,
                          rss_bytes=3 * 2**30, io_read_bytes_per_s=1e6, io_write_bytes_per_s=0.0, user="alice",
                          command="python train.py", compute_units=38)
            for i in range(n_procs)
        ),
        host=HostSample(cpu_iowait_ratio=0.02, io_pressure_ratio=0.01, cpu_pressure_ratio=0.03,
                        cpu_utilization_ratio=0.4), dtype="bf16",
        workload=WorkloadReport(job="train", rank=int(gpu), world_size=2, step=int(now), step_time_s=1.0 + 0.1 * (int(now) % 3),
                                tokens_per_s=2e4, flops_per_token=4.8e10, model_bytes=16e9,
                                serving=ServingReport(server="vllm 127.0.0.1:8000", model="llama-8b", running=8, waiting=2,
                                                      kv_usage=0.2, tpot_s=0.01, prefill_share=0.1, preemptions_per_s=0.0,
                                                      generated_tokens_per_s=800.0) if gpu == "1" else None),
        memory_temperature_c=80.0, tensor_hmma_active=0.6, tensor_imma_active=0.0, tensor_dmma_active=0.0,
        tensor_dfma_active=0.0, clock_event_time_s={"sw_power_cap": 12.5, "hw_thermal_slowdown": 0.0},
        ecc_corrected_errors=3, ecc_uncorrected_errors=0, pcie_bytes_per_s=4e9, pcie_replays=2,
        links=(LinkTraffic(link=0, read_bytes=3e12, write_bytes=2e12, up=True), LinkTraffic(link=1, read_bytes=None, write_bytes=1e9, up=False)),
        remapped_rows=RemappedRows(correctable=1, uncorrectable=0, pending=False, failure=False), driver_calls=9,
        attribution=Attribution(job_id="train-" + "x" * 200, user="alice", partition="gpu", namespace="ml",
                                pod="trainer-0", container="main", holders=_SHARED if gpu == "1" else None),
    )


_SHARED = (Holder(kind="pod", via="time-slicing", namespace="ml", pod="trainer-0", container="main",
                  pids=(1000, 1001, 1002), report=HolderReport(world_size=1, tokens_per_s=1000.0, dtype="bf16",
                                                               flops_per_token=SPEC.peak_flops["bf16"] * 0.3 / 1000)),
           Holder(kind="pod", via="time-slicing", namespace="ml", pod="notebook", container="main"))
"""GPU 1 is time-sliced: its processes' pod, and a pod given a replica that runs nothing (issue 47's holder series)."""


class FullBackend:
    name = "test"

    def __init__(self, count: int = 2, n_procs: int = 3, unknown: bool = False) -> None:
        self.n_procs = n_procs
        self.unknown = unknown
        self.failing: set[str] = set()
        self.devices = [
            DeviceInfo(gpu=str(i), uuid=f"GPU-{i}", vendor="nvidia", model="Test GPU", spec=SPEC, pci_bus_id=f"0000:{i:02x}:00.0")
            for i in range(count)
        ]

    def discover(self):
        return self.devices

    def nic_ports(self) -> tuple[NicPort, ...]:
        return (NicPort(device="mlx5_0", port=1, link_layer="InfiniBand", active=True, rate_bytes_per_s=5e10,
                        tx_bytes=1e12, rx_bytes=2e12,
                        events={"port_xmit_wait": 1e6, "link_downed": 1.0, "symbol_error": 2.0, "rp_cnp_handled": 7.0}),)

    def device_events(self, gpu: str) -> tuple[XidCount, ...]:
        # and a code no GPU has: dropped, so roofwatch_source_rejected_values_total gets its series
        return (XidCount(xid=79, count=1, last_ts=1_800_000_000.0),
                XidCount(xid=10**6, count=1, last_ts=1_800_000_000.0)) if gpu == "1" else ()

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        return (SourceState("dcgm-exporter", "up"), SourceState("inference http://127.0.0.1:8000/metrics", "down", "refused"))

    def sample(self, gpu: str, now: float) -> GpuSample:
        if gpu in self.failing:
            raise RuntimeError("broken")
        if self.unknown:
            return GpuSample(ts=now, gpu=gpu, interval_s=1.0, gr_active=0.5)
        return full_sample(gpu, now, self.n_procs)

    def close(self) -> None:
        pass


def scrape_text(collector: Collector, max_processes: int = 16, optional: tuple[str, ...] = ()) -> str:
    return ExpositionCache(lambda: collector.snapshot, max_processes_per_gpu=max_processes,
                           optional_metrics=optional).render(generate_latest, "text/plain").decode()


def exported_names(text: str) -> set[str]:
    """The documented names of the families of ``text`` that carry a sample."""
    exported = set()
    for text_family in text_string_to_metric_families(text):
        if text_family.samples:
            exported.add(text_family.samples[0].name if text_family.type != "counter" else text_family.name + "_total")
    return exported


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture
def full_collector():
    """Every field known, and enough cycles (fake clock) for the classifier to publish verdicts."""
    clock = {"t": 1_800_000_000.0}
    collector = Collector(FullBackend(), node="n1", interval_s=1.0, clock=lambda: clock["t"],
                          monotonic=lambda: clock["t"], analyzer=LiveClassifier())
    for _ in range(25):
        collector.collect_once()
        clock["t"] += 1.0
    assert len(collector.snapshot.verdicts) == 2
    yield collector
    collector.stop()


@pytest.mark.slow
def test_promtool_check_metrics_is_silent(full_collector, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus'; ./dev.sh test installs it)"
    result = subprocess.run([promtool, "check", "metrics"], input=scrape_text(full_collector), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


WASTED_ONLY = {"roofwatch_gpu_waste_lost_ratio"}
"""Families only a wasted GPU has (agent.model.waste): the full backend's GPUs are busy."""
MIG_ONLY = {"roofwatch_gpu_mig_unattributed_energy_joules_total"}
"""Families only a GPU in MIG mode has: the full backend's GPUs are whole (tests/test_mig_energy.py exports it)."""


class StarvedBackend(FullBackend):
    """GPU 0 runs kernels every other second only: input-starved, so wasted, so it has a share of time lost."""

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = super().sample(gpu, now)
        busy = 0.4 if int(now) % 2 else 0.0
        return dataclasses.replace(sample, gr_active=busy, util_gpu=busy) if gpu == "0" else sample


def test_every_documented_metric_is_exported_and_vice_versa(full_collector):
    everything = scrape_text(full_collector, optional=tuple(OPTIONAL_GROUPS))
    assert exported_names(everything) == {d.name for d in METRICS} - WASTED_ONLY - MIG_ONLY
    assert exported_names(scrape_text(full_collector)) == {d.name for d in METRICS if not d.optional} - WASTED_ONLY - MIG_ONLY
    clock = {"t": 1_800_000_000.0}
    starved = Collector(StarvedBackend(), node="n1", interval_s=1.0, clock=lambda: clock["t"],
                        monotonic=lambda: clock["t"], analyzer=LiveClassifier())
    for _ in range(25):
        starved.collect_once()
        clock["t"] += 1.0
    try:
        fams = families(scrape_text(starved))
        (sample,) = fams["roofwatch_gpu_waste_lost_ratio"].samples
        assert (sample.labels["gpu"], sample.labels["waste"]) == ("0", "input_starved") and 0 < sample.value <= 1
        assert exported_names(scrape_text(starved)) >= WASTED_ONLY
    finally:
        starved.stop()


def test_docs_table_matches_code():
    committed = docgen.DOC.read_text(encoding="utf-8")
    assert docgen.render(committed) == committed, "docs/metrics.md is stale: run python -m exporters.docgen --write"
    for defn in METRICS:
        assert f"`{defn.name}`" in committed


def test_unknown_values_are_absent_not_zero():
    collector = Collector(FullBackend(unknown=True), node="n1")
    collector.collect_once()
    fams = families(scrape_text(collector))
    assert [s.value for s in fams["roofwatch_gpu_engine_active_ratio"].samples] == [0.5, 0.5]
    for name in ("roofwatch_gpu_tensor_active_ratio", "roofwatch_gpu_power_watts", "roofwatch_gpu_clock_event_active"):
        assert fams[name].samples == []
    for name in ("roofwatch_gpu_energy_joules", "roofwatch_gpu_pcie_bytes", "roofwatch_gpu_link_bytes"):
        assert fams[name].samples == [], f"{name}_total without power, energy or byte rates: absent, not 0"
    collector.stop()


class DeadProfilingBackend(FullBackend):
    """GPU 1's profiling duty reads 0.156 while its utilisation counter says 91 % (dcgm-exporter#662)."""

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = super().sample(gpu, now)
        return dataclasses.replace(sample, gr_active=0.156, util_gpu=0.91) if gpu == "1" else sample


def test_a_dead_profiling_counter_is_flagged_per_gpu_and_named_in_the_reason():
    clock = {"t": 1_800_000_000.0}
    collector = Collector(DeadProfilingBackend(), node="n1", interval_s=1.0, clock=lambda: clock["t"],
                          monotonic=lambda: clock["t"], analyzer=LiveClassifier())
    try:
        for _ in range(25):
            collector.collect_once()
            clock["t"] += 1.0
        fams = families(scrape_text(collector))
    finally:
        collector.stop()
    suspect = {s.labels["gpu"]: s.value for s in fams["roofwatch_gpu_counters_suspect"].samples}
    assert suspect == {"0": 0.0, "1": 1.0}
    reasons = {s.labels["gpu"]: s.labels["detail"] for s in fams["roofwatch_gpu_workload_reason_info"].samples}
    assert reasons["1"] == "counters_disagree" and reasons["0"] != "counters_disagree"


def test_each_side_source_is_one_series_with_its_state(full_collector):
    samples = {s.labels["source"]: (s.labels["state"], s.value)
               for s in families(scrape_text(full_collector))["roofwatch_source_up"].samples}
    assert samples == {"dcgm-exporter": ("up", 1.0), "inference http://127.0.0.1:8000/metrics": ("down", 0.0)}


def test_down_gpu_reports_up_zero_and_drops_activity(full_collector):
    full_collector.backend.failing.add("1")
    full_collector.collect_once()
    fams = families(scrape_text(full_collector))
    up = {s.labels["gpu"]: s.value for s in fams["roofwatch_gpu_up"].samples}
    assert up == {"0": 1.0, "1": 0.0}
    assert {s.labels["gpu"] for s in fams["roofwatch_gpu_power_watts"].samples} == {"0"}
    errors = {s.labels["gpu"]: s.value for s in fams["roofwatch_gpu_sample_errors"].samples}
    assert errors == {"0": 0.0, "1": 1.0}
    assert fams["roofwatch_gpus_visible"].samples[0].value == 1.0


def test_process_series_are_capped_largest_first():
    collector = Collector(FullBackend(count=1, n_procs=40), node="n1")
    collector.collect_once()
    fams = families(scrape_text(collector, max_processes=5))
    procs = fams["roofwatch_gpu_process_memory_used_bytes"].samples
    assert len(procs) == 5
    assert sorted(int(s.labels["pid"]) for s in procs) == list(range(1035, 1040))
    assert fams["roofwatch_gpu_processes"].samples[0].value == 40
    collector.stop()


def test_counters_accumulate_between_cycles(full_collector):
    fams = families(scrape_text(full_collector))
    energy = fams["roofwatch_gpu_energy_joules"].samples
    # The fixture ran 25 one-second cycles; the first sample opens the count. Power dips as the NIC
    # sends more (so the power-vs-fabric correlation has a value to export).
    expected = sum(650.0 - 10.0 * (int(1_800_000_000.0 + k) % 3) for k in range(25))
    assert all(s.value == pytest.approx(expected) for s in energy if s.name.endswith("_total"))
    link = {(s.labels["gpu"], s.labels["direction"]): s.value for s in fams["roofwatch_gpu_link_bytes"].samples if s.name.endswith("_total")}
    assert link[("0", "tx")] == pytest.approx(5e10 * 25) and link[("0", "rx")] == pytest.approx(4e10 * 25)


def test_each_snapshot_rendered_once(full_collector):
    calls = []

    def encoder(registry):
        calls.append(1)
        return generate_latest(registry)

    cache = ExpositionCache(lambda: full_collector.snapshot)
    first = cache.render(encoder, "text/plain")
    assert cache.render(encoder, "text/plain") is first and len(calls) == 1
    full_collector.collect_once()
    assert cache.render(encoder, "text/plain") != first and len(calls) == 2


# -- HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def server(full_collector):
    with serving_collector(full_collector) as srv:
        yield srv


def get(url: str, headers: dict[str, str] | None = None, method: str = "GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_http_metrics_plain_and_gzip(server):
    status, headers, body = get(server.url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'roofwatch_gpu_up{gpu="0",node="n1",uuid="GPU-0"} 1.0' in body
    status, headers, zipped = get(server.url + "metrics", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == body


def test_http_openmetrics_negotiation(server):
    status, headers, body = get(server.url + "metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_healthz_fails_when_snapshot_stale(server):
    status, _, body = get(server.url + "healthz")
    assert status == 200 and b"2/2 GPUs up" in body
    server.test_clock["t"] += 60
    status, _, body = get(server.url + "healthz")
    assert status == 503 and b"stuck" in body


def test_snapshot_api_and_status_page(server):
    status, headers, body = get(server.url + "api/v1/snapshot")
    data = json.loads(body)
    assert status == 200 and data["node"] == "n1" and len(data["devices"]) == 2
    assert data["devices"][0]["sample"]["tensor_active"] == 0.6
    status, headers, body = get(server.url)
    assert status == 200 and b"Test GPU" in body and b"/metrics" in body


def test_bad_requests_get_4xx(server):
    assert get(server.url + "nope")[0] == 404
    status, headers, _ = get(server.url + "metrics", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, _, body = get(server.url + "metrics", method="HEAD")
    assert status == 200 and body == b""



def test_job_info_names_the_holding_job_with_a_bounded_value(full_collector):
    """One job_info series per GPU; an overlong scheduler id is cut rather than bloating every index."""
    fams = families(scrape_text(full_collector))
    samples = fams["roofwatch_gpu_job_info"].samples
    assert sorted(s.labels["gpu"] for s in samples) == ["0", "1"]
    for s in samples:
        assert s.labels["job_id"].startswith("train-xxx")
        assert len(s.labels["job_id"]) == JOB_ID_MAX_LEN

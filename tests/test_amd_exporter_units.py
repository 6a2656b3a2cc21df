"""AMD Device Metrics Exporter as a source (issue 35), in process: names per release, units, the
profiler window, partitions, and the fixtures' own answers (tests/fixtures/amd-exporter/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.app.config import Settings
from agent.backends.amd_exporter.backend import AmdExporterBackend, amd_exporter_reader, profiler_advice
from agent.backends.amd_exporter.boards import board_model
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.amd_exporter.mapping import LINK_HOLD_S, LinkRates, profiled
from agent.backends.amd_exporter.names import split
from agent.backends.exposition_text import ExporterFormatError
from agent.diagnostics.amd_exporter import board_findings, partition_findings
from tests import amd_exporter_fixtures as fx

T0 = 1_000_000.0
LABELS = 'card_model="102-G30211-0C",gpu_compute_partition_type="spx",gpu_id="0",gpu_partition_id="0",' \
         'hostname="h",serial_number="1"'


def backend_over(body: str, window_us: float = 1000.0) -> AmdExporterBackend:
    data = body.encode()
    backend = AmdExporterBackend(amd_exporter_reader("http://dme/metrics", fetch=lambda u, t, m: data,
                                                     clock=lambda: T0), window_us=window_us)
    backend.first_read()
    backend.discover()
    backend.reader.close()
    return backend


def fixture(name: str) -> str:
    return (fx.FIXTURES / name).read_text()


def test_the_fixtures_are_what_the_generator_writes():
    for name, make in fx.FILES.items():
        assert fixture(name) == make(), f"{name}: rerun python -m tests.amd_exporter_fixtures"


@pytest.mark.parametrize(("printed", "prefix", "read"), [
    ("gpu_gfx_activity", "", "gpu_gfx_activity"),
    ("amd_gpu_gfx_activity", "amd_", "gpu_gfx_activity"),  # MetricsFieldPrefix, no separator added
    ("amdgpu_prof_total_16_ops", "amd", "gpu_prof_total_16_ops"),
    ("xgmi_neighbor_0_request_tx", "", "gpu_xgmi_nbr_0_req_tx"),  # 1.3.x -> 1.4.0 rename
    ("xgmi_neighbor_1_tx_throughput", "", "gpu_xgmi_nbr_1_tx_thrput"),
    ("gpu_violation_proc_hot_residency_accumulated", "", "gpu_violation_processor_hot_residency_accumulated"),
    ("gpu_xgmi_nbr_0_req_tx", "", "gpu_xgmi_nbr_0_req_tx"),
])
def test_names_of_every_release_are_read_as_one(printed, prefix, read):
    assert split(printed) == (prefix, read)


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_GPU_UTIL", "go_goroutines", "process_cpu_seconds_total", "1gpu_x"])
def test_other_series_are_not_the_exporters(name):
    assert split(name) is None


def test_a_body_without_dme_series_is_refused_with_the_reason():
    with pytest.raises(ExporterFormatError, match="no Device Metrics Exporter"):
        read_records('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5\n')


def test_release_hints_and_a_prefixed_body():
    body = (f"amd_gpu_gfx_activity{{{LABELS}}} 50\n"
            f'amd_xgmi_neighbor_0_nop_tx{{{LABELS}}} 7\n'
            f'amd_gpu_clock{{{LABELS},clock_index="0",clock_type="GPU_CLOCK_TYPE_SYSTEM"}} 2100\n')
    parsed = read_records(body)
    (record,) = parsed.records.values()
    assert record.values["gpu_gfx_activity"] == 50 and record.values["gpu_xgmi_nbr_0_nop_tx"] == 7
    assert record.indexed["gpu_clock"] == {"system/0": 2100}
    assert any("'amd_'" in n for n in parsed.notes) and any("1.3.x names" in n for n in parsed.notes)
    assert any("before 1.4.2" in n for n in parsed.notes) and "no profiler series (gpu_prof_*)" in parsed.notes
    v141 = read_records(fixture("mi300x-spx-v1.4.1-profiler.prom")).notes
    assert any("before 1.4.2" in n for n in v141) and "profiler series present (gpu_prof_*)" in v141


def test_units():
    body = (f"gpu_gfx_activity{{{LABELS}}} 42\ngpu_umc_activity{{{LABELS}}} 61\ngpu_package_power{{{LABELS}}} 700\n"
            f"gpu_energy_consumed{{{LABELS}}} 2.5e+12\ngpu_total_vram{{{LABELS}}} 196592\ngpu_used_vram{{{LABELS}}} 1024\n"
            f'gpu_clock{{{LABELS},clock_index="0",clock_type="system"}} 2000\n'
            f'gpu_clock{{{LABELS},clock_index="1",clock_type="system"}} 2100\n'
            f'gpu_clock{{{LABELS},clock_index="8",clock_type="memory"}} 1300\n'
            f"gpu_junction_temperature{{{LABELS}}} 70\ngpu_ecc_uncorrect_total{{{LABELS}}} 4294967295\n")
    s = backend_over(body).sample("0", T0)
    assert (s.gr_active, s.dram_active, s.power_w, s.energy_j) == (0.42, 0.61, 700.0, 2.5e6)
    assert (s.mem_total_bytes, s.mem_used_bytes) == (196592 * 1024 * 1024, 1024 * 1024 * 1024)
    assert s.sm_clock_mhz == 2050.0 and s.temperature_c == 70.0
    assert s.ecc_uncorrected_errors is None, "0xFFFFFFFF is gpuagent's not-applicable value"
    assert s.tensor_active is None and s.sm_active is None, "no profiler series: no compute counter"


def test_xgmi_rate_only_between_changed_values():
    rates = LinkRates()
    assert rates.rate("rx", "1", 1000.0, T0) is None
    assert rates.rate("rx", "1", 1000.0, T0 + 5) is None, "the exporter's 15 s cache: no new observation"
    assert rates.rate("rx", "1", 1000.0 + 15 * 1024, T0 + 15) == pytest.approx(1024 * 1024.0)
    assert rates.rate("rx", "1", 1000.0 + 15 * 1024, T0 + 20) == pytest.approx(1024 * 1024.0), "held"
    assert rates.rate("rx", "1", 1000.0 + 15 * 1024, T0 + 16 + LINK_HOLD_S) == 0.0, "unchanged past the hold"
    assert rates.rate("rx", "1", 10.0, T0 + 60) is None, "a counter that went back starts again"


def test_the_profiler_window_turns_counts_into_rates():
    values = {"gpu_prof_total_16_ops": 6.5e11, "gpu_prof_fetch_size": 3.0e6, "gpu_prof_write_size": 1.0e6}
    p = profiled(values, 1000.0)
    assert p.flops["16"] == pytest.approx(6.5e14) and p.hbm_bytes_per_s == pytest.approx(4.0e6 * 1024 / 1e-3)
    assert profiled(values, 10.0).flops["16"] == pytest.approx(6.5e16), "a 10 us window: 100 x the rate"
    assert profiled({"gpu_gfx_activity": 5}, 1000.0) is None
    body = fixture("mi300x-spx-profiler.prom")
    assert "10 us" in profiler_advice(read_records(body).records, 10.0)
    assert "ProfilerMetrics" in profiler_advice(read_records(fixture("mi300x-spx-no-profiler.prom")).records, 1000.0)


def test_counter_mfu_and_hbm_of_the_spx_fixture():
    backend = backend_over(fixture("mi300x-spx-profiler.prom"))
    for gpu, work in enumerate(fx.WORKLOADS):
        s = backend.sample(str(gpu), T0)
        assert s.tensor_active == pytest.approx(fx.expected_mfu(work), abs=0.05), gpu
        assert s.dram_active == pytest.approx(work[3] / fx.BANDWIDTH, abs=0.01), gpu
        assert backend.device_info(str(gpu)).spec.key == "mi300x" and s.model == "AMD Instinct MI300X"
    without = backend_over(fixture("mi300x-spx-no-profiler.prom")).sample("4", T0)
    assert without.tensor_active is None and without.dram_active == 0.79, "UMC activity, as amdsmi"


def test_cpx_partitions_never_show_partition_0s_power_or_activity():
    backend = backend_over(fixture("mi300x-cpx-profiler.prom"))
    assert list(backend.devices) == [f"{g}/{p}" for g in range(2) for p in range(8)]
    for key, info in backend.devices.items():
        g, p = map(int, key.split("/"))
        s = backend.sample(key, T0)
        assert s.gr_active == fx.CPX_BUSY[g][p] / 100, key
        assert info.spec.key == "mi300x-cpx" and info.spec.peak_flops["bf16"] == pytest.approx(1307.4e12 / 8)
        if p:
            assert s.power_w is None and s.energy_j is None and s.sm_clock_mhz is None, key
        else:
            assert s.power_w == 688.0
    idle = backend.sample("0/0", T0)
    assert idle.gr_active == 0.09 and idle.tensor_active < 0.01, "partition 0's own XCC, not gpu_gfx_activity 71"


def test_settings_are_documented():
    settings_doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        if name.startswith("amd_exporter_"):
            assert f"`{name}`" in settings_doc, name


@pytest.mark.parametrize(("name", "status", "basis"), [("mi300x-spx-profiler.prom", "ok", "(basis counters)"),
                                                        ("mi300x-spx-no-profiler.prom", "warn", "(basis power_and_dram)")])
def test_doctor_says_whether_the_profiler_is_on_and_how_to_turn_it_on(name, status, basis):
    from agent.app.config import load_settings
    from agent.diagnostics.doctor import run_doctor
    from tests.dcgm_exporter_server import FakeExporter

    with FakeExporter(fixture(name)) as exporter:
        report = run_doctor(load_settings(backend="amd-exporter", amd_exporter_url=exporter.url))
    by_check = {f.check: f for f in report.findings}
    profiler = by_check["amd-exporter profiler"]
    assert profiler.status == status
    assert ("ProfilerMetrics" in profiler.detail) == (status == "warn"), profiler.detail
    assert basis in by_check["verdict basis"].detail, by_check["verdict basis"]


@pytest.mark.parametrize("card, market", [("102-G30211-0C", "AMD Instinct MI300X"), ("102-G36218-0C", "AMD Instinct MI355X"),
                                          ("102-G36212-0C", "AMD Instinct MI350X"), ("102-D65201", "AMD Instinct MI250X"),
                                          ("102-d65201-0a", "AMD Instinct MI250X"), ("102-G39999-0C", None),
                                          ("AMD Instinct MI300X OAM", None), ("", None)])
def test_board_part_numbers_match_with_any_revision_suffix(card, market):
    assert board_model(card) == market


def test_mi250x_gcds_are_eight_gpus_with_per_gcd_peaks_and_ids_of_their_own():
    backend = backend_over(fixture("mi250x-profiler.prom"))
    infos = backend.devices
    assert sorted(infos) == [str(g) for g in range(8)]
    assert {i.spec.key for i in infos.values()} == {"mi250x"} and {i.partition for i in infos.values()} == {None}
    assert infos["0"].spec.peak_flops["bf16"] == pytest.approx(fx.MI250X_PEAK_BF16)
    assert len({i.uuid for i in infos.values()}) == 8 and infos["1"].uuid == "PCB046982-0071/gpu1"
    sample = backend.sample("0", T0)
    assert sample.power_w == fx.MI250X_GEMM[7], "MI2xx power: gpu_power_usage / gpu_average_package_power"
    assert sample.temperature_c == 44 and sample.gr_active == pytest.approx(0.96), "edge temperature, gfx activity"
    alone = fixture("mi250x-profiler.prom").replace("gpu_power_usage", "gpu_other_usage")
    assert backend_over(alone).sample("0", T0).power_w == fx.MI250X_GEMM[7], "gpu_average_package_power alone"


def test_mi355x_partitions_and_the_partition_0_only_exposition():
    dpx = backend_over(fixture("mi355x-dpx-profiler.prom")).devices
    assert len(dpx) == 16 and dpx["5/1"].spec.key == "mi355x-dpx" and dpx["5/1"].partition == "DPX/NPS1"
    assert dpx["5/1"].spec.peak_flops["bf16"] == pytest.approx(fx.MI355X_PEAK_BF16 / 2)
    only0 = read_records(fixture("mi355x-dpx-partition0-only.prom")).records
    assert sorted(only0) == [f"{g}/0" for g in range(8)]
    (finding,) = partition_findings(only0)
    assert finding.status == "warn" and "8 partitioned GPU(s) list fewer partitions" in finding.detail
    assert partition_findings(read_records(fixture("mi355x-dpx-profiler.prom")).records) == []
    assert partition_findings(read_records(fixture("mi250x-profiler.prom")).records) == [], "GCDs are not partitions"
    doubled = fixture("mi355x-dpx-profiler.prom").replace('gpu_partition_id="1"', 'gpu_partition_id="0"')
    (repeat,) = partition_findings(read_records(doubled).records)
    assert "partition id 0 on gpu_id 0, 1" in repeat.detail and "matched by gpu_id" in repeat.detail


def test_an_unknown_board_gets_the_specs_entry_keyed_by_its_card_model():
    body = fixture("mi355x-spx-profiler.prom").replace("102-G36218-0C", "102-G39999-0A")
    backend = backend_over(body)
    (finding,) = board_findings(backend.reader.records(), backend.devices)
    assert "card_model '102-G39999-0A' on GPU(s) 0, 1, 2, 3, 4, 5, 6, 7" in finding.detail
    assert 'specs: {"102-G39999-0A": {vendor: amd, bf16_tflops:' in finding.fix
    assert board_findings(backend_over(fixture("mi355x-spx-profiler.prom")).reader.records(),
                          backend_over(fixture("mi355x-spx-profiler.prom")).devices) == []

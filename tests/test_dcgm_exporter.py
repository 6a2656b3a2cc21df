"""dcgm-exporter as a source: parsing its exposition, the units of each field, MIG and pod labels,
partial and hostile bodies, and the reader's down / stale / frozen / restarted judgements, over real
HTTP from a stand-in exporter serving the fixtures (tests/fixtures/dcgm_exporter/)."""

from __future__ import annotations

import functools
import socket

import pytest

from agent.backends.base import BackendUnavailable, DeviceError
from agent.backends.dcgm_exporter import DcgmExporterBackend, ExporterReader
from agent.backends.dcgm_exporter.backend import device_info
from agent.backends.dcgm_exporter.exposition import ExporterFormatError, gpu_records, parse_exposition
from agent.backends.dcgm_exporter.mapping import sample_values
from tests.dcgm_exporter_server import FakeExporter, drop_gpu, fixture, set_value

MIB = 1024 * 1024
A100, H100 = "a100-8x-pods.prom", "h100-8x-mig.prom"
T0 = 1_800_000_000.0


def records(body: str):
    return gpu_records(parse_exposition(body).series)


@functools.lru_cache(maxsize=4)
def reference_samples(body: str) -> tuple:
    """Every sample of a body, read once with the Prometheus reference parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return tuple(s for family in text_string_to_metric_families(body) for s in family.samples)


def series_value(body: str, metric: str, gpu: str, instance: str | None = None) -> float:
    """The fixture's own number for one series, read with the Prometheus reference parser."""
    for s in reference_samples(body):
        if s.name in (metric, metric + "_total") and s.labels["gpu"] == gpu and s.labels.get("GPU_I_ID") == instance:
            return s.value
    raise KeyError(metric)


# ---------------------------------------------------------------- mapping and units


def test_a100_node_units_attribution_and_identity():
    body = fixture(A100)
    recs = records(body)
    assert list(recs) == [str(i) for i in range(8)]
    for gpu, record in recs.items():
        values = sample_values(record)
        v = lambda metric: series_value(body, metric, gpu)  # noqa: E731
        assert values["power_w"] == v("DCGM_FI_DEV_POWER_USAGE")
        assert values["energy_j"] == pytest.approx(v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") / 1000.0)
        assert values["mem_used_bytes"] == v("DCGM_FI_DEV_FB_USED") * MIB
        assert values["mem_total_bytes"] == 81920 * MIB, "used + free + reserved is the 80 GB card's framebuffer"
        assert values["sm_clock_mhz"] == v("DCGM_FI_DEV_SM_CLOCK")
        assert values["gr_active"] == v("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        assert values["sm_active"] == v("DCGM_FI_PROF_SM_ACTIVE")
        assert values["tensor_active"] == v("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        assert values["dram_active"] == v("DCGM_FI_PROF_DRAM_ACTIVE"), "DRAM activity from the profiling field"
        assert values["mem_busy"] == pytest.approx(v("DCGM_FI_DEV_MEM_COPY_UTIL") / 100.0), "copy util is mem_busy"
        assert values["pcie_rx_bytes_per_s"] == v("DCGM_FI_PROF_PCIE_RX_BYTES")
        assert values["link_tx_bytes_per_s"] == v("DCGM_FI_PROF_NVLINK_TX_BYTES")
        info = device_info(record)
        assert info.spec is not None and info.spec.key == "a100-sxm-80gb"
        assert info.uuid == record.uuid and info.uuid.startswith("GPU-")
        assert record.hostname == "dgx-a100-017" and record.driver == "535.183.01"
        assert "remapped_rows" not in values, "pending is not exported: no guessed remap state"
    assert recs["0"].attribution.pod == "llm-pretrain-worker-0"
    assert (recs["6"].attribution.namespace, recs["6"].attribution.container) == ("inference", "triton-server")
    assert recs["7"].attribution is None, "an unallocated GPU has no owner"


def test_h100_mig_instances_are_named_and_sliced_and_missing_fields_stay_unknown():
    recs = records(fixture(H100))
    assert list(recs) == ["0/1", "0/2", *(f"1/{gi}" for gi in range(7, 14)), "2", "3", "4", "5", "6", "7"]
    mig = recs["0/1"]
    info = device_info(mig)
    assert info.model == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert info.spec is not None and info.spec.key == "h100-sxm-mig-3g.40gb"
    assert info.uuid == "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/1", "the parent's UUID and the GPU instance"
    values = sample_values(mig)
    assert values["gr_active"] == 0.934 and values["tensor_active"] == 0.512
    for absent in ("mem_used_bytes", "mem_total_bytes", "power_w", "energy_j", "sm_active"):
        assert absent not in values, f"{absent}: not exported for a MIG instance, so unknown (never zero)"
    whole = sample_values(recs["2"])
    assert whole["mem_total_bytes"] == 81559 * MIB and whole["power_w"] == 641.7
    assert "sm_active" not in whole and "fp16_active" not in whole, "commented out in the default CSV"
    assert recs["5"].xid == 13


def test_gpu_util_stands_in_for_engine_activity_only_without_the_profiling_field():
    body = fixture(A100)
    without = "\n".join(line for line in body.splitlines() if "PROF_GR_ENGINE_ACTIVE" not in line)
    assert sample_values(records(without)["6"])["gr_active"] == pytest.approx(0.97)
    assert sample_values(records(body)["6"])["gr_active"] == 0.618


@pytest.mark.parametrize("sentinel", ["9223372036854775794", "140737488355330.000000", "2147483634"])
def test_dcgm_blank_sentinels_are_unknown(sentinel):
    """Older exporters print DCGM's NOT_SUPPORTED values as numbers (the README's MEMORY_TEMP)."""
    body = set_value(fixture(A100), "DCGM_FI_DEV_MEMORY_TEMP", "3", sentinel)
    assert "memory_temperature_c" not in sample_values(records(body)["3"])
    assert sample_values(records(body)["4"])["memory_temperature_c"] == series_value(body, "DCGM_FI_DEV_MEMORY_TEMP", "4")


def test_lenient_parsing_of_old_namespaces_timestamps_escapes_and_junk():
    body = "\n".join([
        "# a comment", "garbage line here", 'DCGM_FI_DEV_GPU_TEMP{gpu="0" 41',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",uuid="GPU-1",modelName="NVIDIA A10",hostname="n\\"1",pod_name="p",'
        'pod_namespace="ns",container_name="c"} 41 1700000000000',
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_L0{nvlink="0",gpu="0",gpu_uuid="GPU-1"} 5',
        'go_goroutines 12',
    ])
    parsed = parse_exposition(body)
    assert parsed.skipped == 2 and "line 2" in parsed.first_bad
    (record,) = gpu_records(parsed.series).values()
    assert (record.uuid, record.model, record.hostname) == ("GPU-1", "NVIDIA A10", 'n"1')
    assert (record.attribution.pod, record.attribution.namespace, record.attribution.container) == ("p", "ns", "c")
    assert record.newest_ts_s == 1_700_000_000.0
    assert record.values == {"DCGM_FI_DEV_GPU_TEMP": 41.0}, "link series are not the GPU's"


@pytest.mark.parametrize(("body", "says"), [
    ("<html><body>Grafana</body></html>", r"no DCGM_\* series .*line 1: '<html>"),
    ("go_goroutines 12\nprocess_open_fds 9\n", "2 other series"),
    ("DCGM_FI_DEV_GPU_TEMP " + "9" * 20_000 + "\n", "over 16 KiB"),
])
def test_bodies_that_are_no_exposition_get_a_clear_error(body, says):
    with pytest.raises(ExporterFormatError, match=says):
        parse_exposition(body)


def test_series_count_is_bounded():
    body = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}"}} 40\n' for i in range(50))
    with pytest.raises(ExporterFormatError, match="more than 20 series"):
        parse_exposition(body, max_series=20)


# ---------------------------------------------------------------- the reader, over HTTP


@pytest.fixture
def exporter():
    with FakeExporter(fixture(A100)) as server:
        yield server


def reader_for(url: str, **kw) -> ExporterReader:
    return ExporterReader(url, interval_s=60.0, timeout_s=kw.pop("timeout_s", 2.0), stale_s=kw.pop("stale_s", 30.0),
                          **kw)


def test_exporter_down_then_back(exporter):
    reader = reader_for(exporter.url)
    assert reader.read_once(now=T0) is None
    assert reader.lookup("0", T0)[0] is not None
    exporter.stop()
    assert "connection refused" in reader.read_once(now=T0 + 5)
    record, problem = reader.lookup("0", T0 + 5)
    assert record is None and exporter.url in problem and "connection refused" in problem
    exporter.start()
    assert reader.read_once(now=T0 + 10) is None
    assert reader.lookup("0", T0 + 10)[0] is not None
    assert reader.status().failures_total == 1


def test_the_exporters_own_state_is_up_stale_or_down(exporter):
    reader = reader_for(exporter.url, stale_s=30.0)
    assert reader.source_state(T0).state == "down", "not read yet"
    assert reader.read_once(now=T0) is None
    assert (reader.source_state(T0 + 1).name, reader.source_state(T0 + 1).state) == ("dcgm-exporter", "up")
    assert reader.source_state(T0 + 31).state == "stale"
    exporter.stop()
    reader.read_once(now=T0 + 40)
    down = reader.source_state(T0 + 40)
    assert down.state == "down" and "connection refused" in down.detail


def test_oversized_and_hanging_exporters_are_cut_off(exporter):
    assert "larger than 1000 bytes" in reader_for(exporter.url, max_bytes=1000).read_once(now=T0)
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/metrics"
        assert "timed out after 0.3 s" in reader_for(url, timeout_s=0.3).read_once(now=T0)


def test_an_html_page_is_not_an_exporter(exporter):
    exporter.set_body("<html>login</html>")
    error = reader_for(exporter.url).read_once(now=T0)
    assert "no DCGM_* series" in error and "dcgm-exporter's /metrics" in error


def test_no_good_read_for_longer_than_stale_s(exporter):
    reader = reader_for(exporter.url, stale_s=30.0)
    reader.read_once(now=T0)
    assert reader.lookup("2", T0 + 29)[0] is not None
    record, problem = reader.lookup("2", T0 + 31)
    assert record is None and "last good read 31 s ago" in problem


def test_frozen_energy_counter_of_a_powered_gpu_is_stale(exporter):
    reader = reader_for(exporter.url, stale_s=30.0)
    reader.read_once(now=T0)
    reader.read_once(now=T0 + 31)  # the same body: DCGM has not refreshed for 31 s
    record, problem = reader.lookup("0", T0 + 31)
    assert record is None and "energy counter unchanged for 31 s" in problem and "353 W" in problem
    body = set_value(exporter.body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", "129941554972")
    exporter.set_body(body)
    reader.read_once(now=T0 + 32)
    assert reader.lookup("0", T0 + 32)[0] is not None, "the counter moved: fresh again"
    assert reader.lookup("1", T0 + 32)[0] is None, "GPU 1's counter is still frozen"


def test_exporters_own_timestamps(exporter):
    stamped = "\n".join(line + (f" {int((T0 - 100) * 1000)}" if line.startswith("DCGM_") and 'gpu="4"' in line
                                else "") for line in exporter.body.splitlines())
    exporter.set_body(stamped)
    reader = reader_for(exporter.url, stale_s=30.0)
    reader.read_once(now=T0)
    record, problem = reader.lookup("4", T0)
    assert record is None and "own timestamps for GPU 4 are 100 s old" in problem
    assert reader.lookup("3", T0)[0] is not None


def test_restarted_exporter_with_fewer_gpus_and_a_reset_counter(exporter):
    reader = reader_for(exporter.url)
    reader.read_once(now=T0)
    body = drop_gpu(exporter.body, "7")
    body = set_value(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "2", "1200")
    exporter.set_body(body)
    reader.read_once(now=T0 + 5)
    record, problem = reader.lookup("7", T0 + 5)
    assert record is None and "not in dcgm-exporter's exposition (7 GPU(s) listed" in problem
    record, _ = reader.lookup("2", T0 + 5)
    assert sample_values(record)["energy_j"] == 1.2, "a counter that went back is passed on as read"


def test_xids_count_changes_of_the_last_xid_after_start(exporter):
    exporter.set_body(set_value(exporter.body, "DCGM_FI_DEV_XID_ERRORS", "1", "13"))
    reader = reader_for(exporter.url)
    reader.read_once(now=T0)
    assert reader.xids("1") == (), "the XID seen at start happened before the agent"
    for t, code in ((T0 + 1, "79"), (T0 + 2, "79"), (T0 + 3, "13"), (T0 + 4, "79")):
        exporter.set_body(set_value(exporter.body, "DCGM_FI_DEV_XID_ERRORS", "1", code))
        reader.read_once(now=t)
    counts = {x.xid: (x.count, x.last_ts) for x in reader.xids("1")}
    assert counts == {79: (2, T0 + 4), 13: (1, T0 + 3)}


# ---------------------------------------------------------------- the standalone backend


def test_backend_discovers_samples_and_marks_gpus_down_with_the_reason(exporter):
    backend = DcgmExporterBackend(reader_for(exporter.url, clock=lambda: T0))
    try:
        infos = backend.discover()
        assert [i.gpu for i in infos] == [str(i) for i in range(8)] and backend.node == "dgx-a100-017"
        sample = backend.sample("6", T0)
        assert (sample.node, sample.model, sample.power_w, sample.sm_active) == (
            "dgx-a100-017", "NVIDIA A100-SXM4-80GB", 268.4, 0.352)
        assert sample.attribution.pod == "triton-llama-7b-5f7c9d8b6-x2kqp"
        assert set(backend.counter_sources("6").values()) == {"dcgm-exporter"}
        exporter.stop()
        backend.reader.read_once(now=T0 + 1)
        with pytest.raises(DeviceError, match="connection refused"):
            backend.sample("6", T0 + 1)
    finally:
        backend.close()


def test_backend_that_cannot_reach_the_exporter_says_so(exporter):
    exporter.stop()
    with pytest.raises(BackendUnavailable, match=r"dcgm-exporter at http://127\.0\.0\.1:\d+/metrics: connection refused"):
        DcgmExporterBackend(reader_for(exporter.url)).discover()

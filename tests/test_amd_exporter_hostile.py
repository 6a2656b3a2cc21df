"""A Device Metrics Exporter whose values cannot be converted, whose index labels are no index, or whose
``/gpumetrics`` is huge (issue 42, findings 5 and 8), in process: the parser, the backend, the reader and the
collector over the stand-in exposition handed to the reader's fetch. Each must cost the agent one skipped, counted
line naming the series (every other reading of the GPU kept), or one refused ``/gpumetrics`` read in bounded memory;
never a traceback, a failed start or a GPU marked down. tests/test_amd_exporter_hostile_e2e.py does the same to a
real agent process."""

from __future__ import annotations

import json
import logging
import tracemalloc

import pytest

from agent.app.config import ConfigError, load_settings
from agent.backends.amd_exporter import AmdExporterBackend, amd_exporter_reader
from agent.backends.amd_exporter.backend import device_spec
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.amd_exporter.gpumetrics import BdfWatch, GpuMetricsError, parse_gpumetrics, read_gpumetrics
from agent.backends.amd_exporter.mapping import sample_values
from agent.backends.dcgm_exporter.exposition import parse_exposition
from agent.context.attribution.slurm import job_gpus, slurm_uid_from_cgroup
from agent.context.workload.report_devices import resolve_devices
from agent.context.workload.report_schema import ReportHints
from agent.diagnostics.amd_exporter import standalone_findings
from tests import amd_exporter_fixtures as fx

URL = "http://dme.invalid:5000/metrics"
MAX_BYTES = 4 * 2**20
"""/gpumetrics read at most (agent.backends.amd_exporter.gpumetrics.MAX_BYTES): "a few MiB" for a few KiB per device."""
T0 = 1_800_000_000.0
BODY = fx.FILES["mi300x-spx-profiler.prom"]()
CLEAN = read_records(BODY).records

NOT_INDEXES = pytest.mark.parametrize("index", [
    "\u00b2",      # '²'.isdigit() is True and int('²') raises: the agent refused to start
    "\u0663",      # ARABIC-INDIC DIGIT THREE: int() reads 3, a second index 3 under another name
    "1" * 4301,    # more digits than int() converts
    "123456",      # past five digits
    "-1", "07",
], ids=["superscript-two", "arabic-indic-three", "4301-digits", "six-digits", "negative", "leading-zero"])

ID_LINES = {
    # label -> a line of GPU 0 carrying it (its other labels as DME prints them)
    "gpu_id": 'gpu_package_power{{gpu_id="{index}",serial_number="692407004230"}} 700',
    "link_index": 'gpu_xgmi_link_rx{{gpu_id="0",link_index="{index}",serial_number="692407004230"}} 5',
    "xcc_index": 'gpu_gfx_busy_instantaneous{{gpu_id="0",serial_number="692407004230",xcc_index="{index}"}} 50',
    "clock_index": 'gpu_clock{{clock_index="{index}",clock_type="system",gpu_id="0",serial_number="692407004230"}} 90',
    "hbm_index": 'gpu_hbm_temperature{{gpu_id="0",hbm_index="{index}",serial_number="692407004230"}} 50',
    "gpu_partition_id": 'gpu_used_vram{{gpu_id="0",gpu_partition_id="{index}",serial_number="692407004230"}} 5',
}


def reader_of(bodies: dict[str, str | bytes], **kw):
    """The shared reader over ``bodies`` (path -> body), handed to its fetch as the HTTP server would answer."""
    def fetch(url, timeout_s, max_bytes):
        body = bodies["/" + url.rsplit("/", 1)[1]]
        body = body.encode() if isinstance(body, str) else body
        if len(body) > max_bytes:
            from agent.context.workload.inference.fetch import ResponseTooLarge
            raise ResponseTooLarge(f"answer larger than {max_bytes} bytes")
        return body
    return amd_exporter_reader(URL, fetch=fetch, clock=lambda: T0, **kw)


# ---------------------------------------------------------------------------------------------- index labels


@pytest.mark.parametrize("label", sorted(ID_LINES))
@NOT_INDEXES
def test_an_id_label_that_is_no_index_is_a_skipped_counted_line_and_the_rest_reads_as_ever(label, index):
    body = BODY + ID_LINES[label].format(index=index) + "\n"
    parsed = read_records(body)
    assert parsed.skipped == 1, parsed.first_bad
    assert f"({label} " in parsed.first_bad and "is no index" in parsed.first_bad, parsed.first_bad
    assert parsed.records == CLEAN, "every GPU's record as without the line"


def test_the_backend_starts_and_samples_past_a_link_index_that_is_no_index():
    """The finding: an extra ``gpu_xgmi_link_rx{...,link_index="²"}`` stopped the start with a ValueError."""
    body = BODY + ID_LINES["link_index"].format(index="\u00b2") + "\n"
    backend = AmdExporterBackend(reader_of({"/metrics": body}))
    try:
        assert [d.gpu for d in backend.discover()] == [str(g) for g in range(8)]
        sample = backend.sample("0", T0)
        assert sorted(link.link for link in sample.links) == [1, 2, 3, 4, 5, 6, 7], "GPU 0's seven peers as ever"
        assert backend.reader.status().skipped_lines == 1
    finally:
        backend.close()


def test_one_rule_for_an_index_in_every_source():
    """agent.model.indexes: ASCII digits, at most five, no leading zero; every source reads indexes through it."""
    from agent.model.indexes import MAX_INDEX_DIGITS, index_value, is_index

    for good in ("0", "7", "99999"):
        assert is_index(good) and index_value(good) == int(good)
    for bad in ("\u00b2", "\u0663", "1" * 4301, "1" * (MAX_INDEX_DIGITS + 1), "-1", "07", "", " 1", "1\n", None, 3):
        assert not is_index(bad) and index_value(bad) is None, repr(bad)
    assert is_index("07", leading_zeros=True) and index_value("07", leading_zeros=True) == 7
    assert not is_index("\u0663", leading_zeros=True)
    # dcgm-exporter: a gpu label "٣" was read as GPU 3 by int() before round 2; still a skipped line
    assert parse_exposition('DCGM_FI_DEV_GPU_TEMP{gpu="\u0663",UUID="GPU-x"} 40\nDCGM_FI_DEV_GPU_TEMP{gpu="0",'
                            'UUID="GPU-y"} 41\n').skipped == 1
    # Slurm: a uid or job id in a cgroup path in another script's digits is no uid (\d matched it)
    assert slurm_uid_from_cgroup("0::/slurm/uid_\u0661\u0660\u0660\u0660/job_7/step_0") is None
    assert slurm_uid_from_cgroup("0::/slurm/uid_1000/job_7/step_0") == 1000
    assert job_gpus({"SLURM_STEP_GPUS": "\u00b2,1,\u0663"}, trust_indices=True) == ("index:1",)
    # a report's visible devices: CUDA's "01" is still index 1, "²" no index
    assert resolve_devices(ReportHints(CUDA_VISIBLE_DEVICES="01,\u00b2")).indices == ("1",)


# ---------------------------------------------------------------------------------------------- values


CASES = {
    # series, GPU 0's index labels, value -> the sample fields that lose their reading (nothing else may change)
    "total-vram-1e308": ("gpu_total_vram", {}, "1e308", {"mem_total_bytes"}),
    "used-vram-1e308": ("gpu_used_vram", {}, "1e308", {"mem_used_bytes"}),
    "used-vram-nan": ("gpu_used_vram", {}, "NaN", {"mem_used_bytes"}),
    "ecc-inf": ("gpu_ecc_uncorrect_total", {}, "+Inf", {"ecc_uncorrected_errors"}),
    "ecc-nan": ("gpu_ecc_uncorrect_total", {}, "NaN", {"ecc_uncorrected_errors"}),
    "xgmi-1e308": ("gpu_xgmi_link_rx", {"link_index": "3"}, "1e308", {"links"}),
    "fetch-1e300": ("gpu_prof_fetch_size", {}, "1e300", {"dram_active"}),
    "ops-1e305": ("gpu_prof_total_16_ops", {}, "1e305", set()),  # MFMA busy is read first: ops only stand in
    "power-nan": ("gpu_package_power", {}, "NaN", {"power_w"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_value_that_cannot_be_converted_is_a_skipped_line_naming_the_series_and_nothing_else_is_lost(case):
    name, labels, value, lost = CASES[case]
    parsed = read_records(fx.set_value(BODY, name, 0, value, **labels))
    assert parsed.skipped == 1 and f"({name} " in parsed.first_bad, parsed.first_bad
    assert {k: r for k, r in parsed.records.items() if k != "0"} == {k: r for k, r in CLEAN.items() if k != "0"}
    spec = device_spec(CLEAN["0"])
    assert spec is not None and spec.key == "mi300x"
    clean = sample_values(CLEAN["0"], spec, fx.WINDOW_US)
    hostile = sample_values(parsed.records["0"], spec, fx.WINDOW_US)  # used to raise OverflowError
    changed = {f for f in clean.keys() | hostile.keys() if clean.get(f) != hostile.get(f)}
    assert changed == lost, changed
    if name == "gpu_xgmi_link_rx":
        link3 = next(link for link in hostile["links"] if link.link == 3)
        assert link3.read_bytes is None and link3.write_bytes is not None, "only that link's rx reading is lost"


def test_the_largest_factors_hold_every_value_the_parser_lets_through():
    """At the edge: a value just under max / factor converts without overflow, one past it is skipped. The profiler
    factors assume the setting's shortest window, which the settings hold to."""
    from agent.backends.amd_exporter.units import LARGEST_FACTOR, MIN_WINDOW_US

    for name, (factor, _) in LARGEST_FACTOR.items():
        edge = 1.7976931348623157e308 / factor
        under, past = (read_records(with_value(name, repr(edge * k))) for k in (0.999, 1.001))
        assert under.skipped == 0 and past.skipped == 1 and name in past.first_bad, name
        backend = AmdExporterBackend(reader_of({"/metrics": with_value(name, repr(edge * 0.999))}),
                                     window_us=MIN_WINDOW_US)
        try:
            backend.discover()
            backend.sample("0", T0)  # no OverflowError at the edge, with the shortest window
        finally:
            backend.close()
    with pytest.raises(ConfigError, match="amd_exporter_profiler_window_us"):
        load_settings(amd_exporter_profiler_window_us=MIN_WINDOW_US / 2)


def with_value(name: str, value: str) -> str:
    """The fixture with GPU 0's ``name`` at ``value`` (link 1 for XGMI), or that line added where it has none."""
    labels = {"link_index": "1"} if name.startswith("gpu_xgmi") else {}
    if f"\n{name}{{" in BODY:
        return fx.set_value(BODY, name, 0, value, **labels)
    return BODY + f'{name}{{gpu_id="0",serial_number="692407004230"}} {value}\n'


def test_start_up_with_a_total_vram_of_1e308_and_a_link_index_that_is_no_index():
    """The finding: either line stopped ``--backend amd-exporter`` at start with a traceback."""
    body = fx.set_value(BODY, "gpu_total_vram", 0, "1e308") + ID_LINES["link_index"].format(index="\u00b2") + "\n"
    backend = AmdExporterBackend(reader_of({"/metrics": body}))
    try:
        infos = {d.gpu: d for d in backend.discover()}
        assert sorted(infos) == [str(g) for g in range(8)]
        assert infos["0"].memory_total_bytes is None and infos["0"].spec.key == "mi300x", "the model still resolves"
        assert infos["1"].memory_total_bytes == 196592 * 2**20
        assert backend.sample("0", T0).power_w == fx.GEMM[7]
        status = backend.reader.status()
        assert status.skipped_lines == 2 and "gpu_total_vram" in status.first_bad_line
        findings, _ = standalone_findings(backend)
        skipped = [f for f in findings if "skipped" in f.detail]
        assert len(skipped) == 1 and "2 line(s)" in skipped[0].detail and "gpu_total_vram" in skipped[0].detail
    finally:
        backend.close()


def test_a_used_vram_of_1e308_while_running_keeps_the_gpu_up_with_its_other_readings(caplog):
    """The finding: ``gpu_used_vram 1e308`` served while the agent ran marked GPU 0 down for as long as it lasted.
    Through the collector, as the agent samples: GPU 0 stays up, only its used memory is unknown, and the log
    says so once however many reads carry it."""
    from agent.collector import Collector

    bodies: dict[str, str | bytes] = {"/metrics": BODY}
    backend = AmdExporterBackend(reader_of(bodies))
    backend.first_read()
    collector = Collector(backend, node="n", interval_s=1.0, sample_timeout_s=30.0)
    try:
        before = {d.info.gpu: d for d in collector.collect_once().devices}
        bodies["/metrics"] = fx.set_value(BODY, "gpu_used_vram", 0, "1e308")
        with caplog.at_level(logging.INFO, logger="roofwatch"):
            for _ in range(3):
                assert backend.reader.read_once() is None, "the read stands"
                snapshot = collector.collect_once()
        after = {d.info.gpu: d for d in snapshot.devices}
        assert all(d.up for d in after.values()), {g: d.error for g, d in after.items() if not d.up}
        assert before["0"].sample.mem_used_bytes is not None and after["0"].sample.mem_used_bytes is None
        assert after["0"].sample.power_w == before["0"].sample.power_w == fx.GEMM[7]
        assert after["1"].sample.mem_used_bytes == before["1"].sample.mem_used_bytes
        lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(lines) == 1 and "gpu_used_vram" in lines[0] and "1 unreadable line(s)" in lines[0], lines
    finally:
        collector.stop()


# ---------------------------------------------------------------------------------------------- /gpumetrics


def tiny_entries(size: int) -> bytes:
    """``{"Response": [{}, {}, ...]}`` of about ``size`` bytes: the finding's document."""
    return b'{"Response": [' + b",".join([b"{}"] * (size // 3)) + b"]}"


def test_a_15_mib_gpumetrics_is_refused_at_the_cap_in_one_line():
    reader = reader_of({"/metrics": BODY, "/gpumetrics": tiny_entries(15 * 2**20)})
    reader.read_once()
    watch = BdfWatch(reader)
    error = watch.read_once()
    from agent.backends.amd_exporter import gpumetrics

    assert gpumetrics.MAX_BYTES == MAX_BYTES
    assert error == f"answer larger than {MAX_BYTES} bytes" and "\n" not in error
    assert watch.bdfs() is None and watch.state()[1] == error
    assert reader.max_bytes == 16 * 2**20, "the /metrics cap is unchanged"


def test_a_document_of_tiny_entries_under_the_cap_is_refused_without_decoding_them():
    body = tiny_entries(MAX_BYTES - 1024)
    tracemalloc.start()
    try:
        found, error = read_gpumetrics(lambda url: body, "u", 2.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found is None and error.startswith("more than 128 GPU entries (max_devices)"), error
    assert peak < 3 * MAX_BYTES, f"{peak / 2**20:.0f} MiB: the text and its decoding, not a million dicts"


@pytest.mark.parametrize("doc, words", [
    (b'{"Response": [{"Status": {"Index": 1, "x": [' + b",".join([b"{}"] * 200_000) + b"]}}]}", "entry 0"),
    (b'{"ApiStatus": [' + b",".join([b"{}"] * 200_000) + b'], "Response": []}', "member 'ApiStatus'"),
    (b'{"Response": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", "not JSON"),
    (b'{"Response": [], "Response": []}', "Response listed twice"),
    (b'{"Response": [] "ApiStatus": 1}', "not JSON (line 1, column 17)"),
])
def test_an_entry_too_large_or_too_deep_is_refused_in_one_line(doc, words):
    found, error = read_gpumetrics(lambda url: doc, "u", 2.0)
    assert found is None and words in error and "\n" not in error and len(error) < 200, error


def test_the_max_devices_setting_bounds_the_entries_the_join_takes(tmp_path):
    from agent.backends.amd_exporter.join import AmdExporterJoin

    class Inner:
        name = "amd"

    join = AmdExporterJoin(Inner(), reader_of({"/metrics": BODY}))
    join.limit_devices(4)
    assert join.bdf.max_entries == 4
    entries = [{"Status": {"Index": i, "PCIeStatus": {"PCIeBusId": f"0000:{i + 5:02x}:00.0"}}} for i in range(5)]
    with pytest.raises(GpuMetricsError, match="more than 4 GPU entries"):
        parse_gpumetrics(json.dumps({"Response": entries}), join.bdf.max_entries)

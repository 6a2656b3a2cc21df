"""DME's ``/gpumetrics`` (agent.backends.amd_exporter.gpumetrics): each ``gpu_id``'s PCI address, so the amdsmi join
matches devices without a board serial by BDF instead of by enumeration order. The fast tests run the join over
``amd-virtual`` in process, the virtual exporter's bodies handed to the reader's fetch; the slow ones over HTTP."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent.app.config import Settings
from agent.backends.amd_exporter import amd_exporter_reader
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.amd_exporter.gpumetrics import (BdfWatch, GpuMetricsError, gpumetrics_url, normalise_bdf,
                                                    parse_gpumetrics, read_gpumetrics)
from agent.backends.amd_exporter.join import AmdExporterJoin, DmeKey, fallback, select
from agent.backends.amd_virtual import VirtualAmdBackend
from agent.backends.options import BackendOptions
from agent.backends.registry import open_backend, open_virtual, with_amd_exporter
from agent.context.workload.inference.fetch import HttpStatus
from agent.diagnostics.amd import exporter_join_findings
from agent.virtual.fake_dme import render, render_gpumetrics
from tests import amd_exporter_fixtures as fx
from tests.agent_process import poll
from tests.dcgm_exporter_server import FakeExporter

FIXTURE = fx.FIXTURES / "mi300x-gpumetrics.json"
FIXTURE_BDFS = {"0": "0000:05:00.0", "1": "0000:26:00.0", "2": "0000:46:00.0", "3": "0000:65:00.0",
                "4": "0000:85:00.0", "5": "0000:a6:00.0", "6": "0000:c6:00.0", "7": "0000:e5:00.0"}
URL = "http://dme.invalid:5000/metrics"
SCENARIO = """\
name: bdf-join
seed: 41
nodes:
  - name: bdf-node
    model: mi300x
    gpus: 2
    amd: {{device_metrics_exporter: {dme}}}
    workloads:
      - {{job: gemm, gpus: [0], phases: [{{kind: compute, duration_s: 900, mfu: 0.45}}]}}
      - {{job: decode, gpus: [1], phases: [{{kind: memory, duration_s: 900, mbu: 0.7}}]}}
"""


def scenario(tmp_path: Path, dme: bool) -> str:
    path = tmp_path / f"bdf-{dme}.yaml"
    path.write_text(SCENARIO.format(dme=str(dme).lower()))
    return str(path)


# ---------------------------------------------------------------------------------------------- the parser


def test_the_fixture_maps_every_gpu_id_to_its_lower_case_bdf():
    parsed = parse_gpumetrics(FIXTURE.read_text())
    assert parsed.bdfs == FIXTURE_BDFS and parsed.skipped == 0 and parsed.first_skip is None
    doc = json.loads(FIXTURE.read_text())
    assert "Index" not in doc["Response"][0]["Status"], "encoding/json's omitempty drops gpu_id 0's Index"
    assert doc["Response"][5]["Status"]["PCIeStatus"]["PCIeBusId"] == "0000:A6:00.0", "gpuagent prints upper case"
    serials = [e["Status"]["SerialNum"] for e in doc["Response"]]
    assert serials == [read_records(fx.FILES["mi300x-spx-profiler.prom"]()).records[str(i)].serial for i in range(8)]


@pytest.mark.parametrize("text, bdf", [("0000:0C:00.0", "0000:0c:00.0"), ("0c:00.3", "0000:0c:00.3"),
                                       (" 0001:C1:1F.7 ", "0001:c1:1f.7"), ("0000:0c:20.0", None),
                                       ("0000:0c:00.8", None), ("pcie0", None), ("", None), (None, None), (12, None)])
def test_normalise_bdf(text, bdf):
    assert normalise_bdf(text) == bdf


def test_the_url_is_the_same_exporters_path():
    assert gpumetrics_url("http://10.0.0.7:5000/metrics") == "http://10.0.0.7:5000/gpumetrics"
    assert gpumetrics_url("https://h/dme/metrics?x=1") == "https://h/dme/gpumetrics"
    assert gpumetrics_url("http://h:5000/") == "http://h:5000/gpumetrics"


@pytest.mark.parametrize("body, words", [("gpu_package_power{gpu_id=\"0\"} 5\n", "not JSON"), ("[1, 2]", "JSON list"),
                                         ('{"Response": {"Status": {}}}', "not a list"),
                                         ('{"ApiStatus": 3}', "ApiStatus 3"), ("", "not JSON")])
def test_a_body_that_is_not_a_gpu_get_response_is_one_clear_error(body, words):
    with pytest.raises(GpuMetricsError, match=words):
        parse_gpumetrics(body)


def entry(index, bdf, **status):
    pcie = {"PCIeBusId": bdf} if bdf is not None else {}
    return {"Status": {**({"Index": index} if index is not None else {}), "PCIeStatus": pcie, **status}}


def test_entries_without_a_gpu_id_or_bdf_or_sharing_one_are_skipped_and_the_rest_kept():
    response = [entry(None, "0000:05:00.0"),  # Index 0, left out by omitempty
                entry(1, None), entry("2", "0000:46:00.0"), entry(3, "pcie3"), {"Spec": {}}, "junk",
                entry(4, "0000:85:00.0"), entry(4, "0000:86:00.0"),  # one gpu_id twice: neither
                entry(6, "0000:c6:00.0"), entry(7, "0000:C6:00.0"),  # one BDF twice: neither
                entry(8, "0000:e5:00.0", GPUPartition=["AAAA", "BBBB"]),  # a parent object: skipped, not counted
                entry(9, "0000:e5:00.1", PartitionId=1), entry(-1, "0000:f5:00.0"), entry(True, "0000:f6:00.0")]
    parsed = parse_gpumetrics(json.dumps({"Response": response}))
    assert parsed.bdfs == {"0": "0000:05:00.0", "9": "0000:e5:00.1"}
    assert parsed.skipped == 11 and parsed.first_skip == "entry 1: no PCIeBusId"
    assert parse_gpumetrics("{}").bdfs == {}, "no GPUs: omitempty leaves Response out"


def test_a_list_longer_than_max_devices_is_refused_and_one_within_it_read_whole():
    def body(count):
        return json.dumps({"Response": [entry(i, f"{i >> 8:04x}:{i & 0xFF:02x}:00.0") for i in range(count)]})

    with pytest.raises(GpuMetricsError, match=r"more than 128 GPU entries \(max_devices\)"):
        parse_gpumetrics(body(5000))
    parsed = parse_gpumetrics(body(128))
    assert len(parsed.bdfs) == 128 and parsed.bdfs["127"] == "0000:7f:00.0" and parsed.skipped == 0
    with pytest.raises(GpuMetricsError, match="more than 8 GPU entries"):
        parse_gpumetrics(body(9), max_entries=8)


def test_a_read_says_why_it_failed_in_one_line():
    def missing(url):
        raise HttpStatus(404, "Not Found")

    found, error = read_gpumetrics(missing, "http://h:5000/gpumetrics", 2.0)
    assert found is None and error.startswith("HTTP 404") and "1.4.0" in error
    found, error = read_gpumetrics(lambda url: b"<html>oops</html>", "u", 2.0)
    assert found is None and "not JSON" in error
    found, error = read_gpumetrics(lambda url: FIXTURE.read_bytes(), "u", 2.0)
    assert error is None and found.bdfs == FIXTURE_BDFS


# ---------------------------------------------------------------------------------------------- matching


def test_without_serials_select_matches_by_bdf_and_partitions_by_their_own_function():
    records = read_records(fx.FILES["mi300x-cpx-profiler.prom"]().replace('serial_number="6924070042', 'x="')).records
    bdfs = {str(i): f"0000:{0x05 + 0x21 * (i // 8):02x}:00.{i % 8}" for i in range(16)}
    reversed_ids = {str(15 - int(g)): b for g, b in bdfs.items()}  # DME enumerates the other way round
    key = DmeKey(None, 5, 13, bdf="0000:26:00.5")
    assert select(records, key).key == "1/5", "without a map: gpu_id = enumeration index"
    assert select(records, key, reversed_ids).key == "0/2", "gpu_id 2 has this BDF"
    assert fallback(key, reversed_ids) == ("2", "bdf")
    unknown = DmeKey(None, None, 13, bdf="0000:99:00.0")
    assert fallback(unknown, reversed_ids) == (None, "gpu_id"), "gpu_id 13 is another device's address"
    assert fallback(unknown, {"1": "0000:05:00.0"}) == ("13", "gpu_id"), "an unlisted gpu_id is still enumeration's"
    assert str(key) == "gpu_id 13 / bdf 0000:26:00.5"


class Dme:
    """The virtual DME's two endpoints for the reader's fetch, with DME enumerating ``order`` (amdsmi ordinals)."""

    def __init__(self, library, order, gpumetrics=True):
        self.library, self.order, self.gpumetrics = library, order, gpumetrics
        self.calls = {"/metrics": 0, "/gpumetrics": 0}
        self.metrics: str | None = None
        """A ``/metrics`` body in place of the rendered one."""

    def fetch(self, url, timeout_s, max_bytes):
        path = "/" + url.rsplit("/", 1)[1]
        self.calls[path] += 1
        if path == "/metrics":
            return (self.metrics or render(self.library, self.order)).encode()
        if not self.gpumetrics:
            raise HttpStatus(404, "Not Found")
        return render_gpumetrics(self.library, self.order).encode()


def amd_virtual(tmp_path):
    """``amd-virtual`` over a scenario whose simulation feeds DME's profiler, without the virtual DME's HTTP server
    (the tests hand its bodies to the reader's fetch)."""
    settings = Settings(backend="amd-virtual", scenario=scenario(tmp_path, dme=True))
    return VirtualAmdBackend(open_virtual(BackendOptions.of(settings)))


def without_serials(monkeypatch, amdsmi):
    board = amdsmi.amdsmi_get_gpu_board_info
    monkeypatch.setattr(amdsmi, "amdsmi_get_gpu_board_info", lambda h: {**board(h), "product_serial": "N/A"})


def joined(tmp_path, monkeypatch, gpumetrics=True, interval_s=5.0):
    inner = amd_virtual(tmp_path)
    dme = Dme(inner.library, order=[1, 0], gpumetrics=gpumetrics)
    without_serials(monkeypatch, inner.amdsmi)
    backend = AmdExporterJoin(inner, amd_exporter_reader(URL, fetch=dme.fetch, interval_s=interval_s))
    return backend, dme


def sample_all(backend, rounds=3):
    for _ in range(rounds):
        now = time.time()
        for gpu in ("0", "1"):
            backend.sample(gpu, now)
        time.sleep(0.02)  # samples spaced in time, as the collector's cycles are (rates need it)
    backend.reader.read_once()
    now = time.time()
    return {gpu: backend.sample(gpu, now) for gpu in ("0", "1")}


def test_without_serials_and_another_enumeration_each_device_gets_its_own_gpus_counters(tmp_path, monkeypatch):
    backend, dme = joined(tmp_path, monkeypatch)
    try:
        backend.discover()
        assert dme.calls["/gpumetrics"] == 1, "read once at set-up, since no device has a serial"
        assert backend.bdf.bdfs() == {"0": "0000:2a:00.0", "1": "0000:18:00.0"}, "DME's gpu_id 0 is amdsmi's GPU 1"
        samples = sample_all(backend)
        truth = {gpu: backend.inner.library.latest_sample(gpu).tensor_active or 0.0 for gpu in ("0", "1")}
        assert truth["0"] > 0.3 > truth["1"], "the GEMM is on GPU 0, the decode on 1"
        for gpu, sample in samples.items():
            assert backend.counter_sources(gpu)["tensor_active"] == "amd-exporter"
            assert sample.tensor_active == pytest.approx(truth[gpu], abs=0.05), gpu
        assert backend.matched_by() == "bdf" and backend.unmatched() == []
        assert backend.join_state("0").key.bdf == "0000:18:00.0"
        lines = [f.detail for f in exporter_join_findings(backend, time.time()) if "PCI address" in f.detail]
        assert lines and "matched by PCI address" in lines[0] and "/gpumetrics" in lines[0], lines
        metrics_reads = dme.calls["/metrics"]
        for _ in range(20):
            backend.sample("0", time.time())
        assert dme.calls == {"/metrics": metrics_reads, "/gpumetrics": 1}, "a sample never touches the network"
    finally:
        backend.close()


def test_without_gpumetrics_the_gpu_id_fallback_still_matches_and_doctor_says_why(tmp_path, monkeypatch):
    backend, dme = joined(tmp_path, monkeypatch, gpumetrics=False)
    try:
        backend.discover()
        samples = sample_all(backend)
        truth = {gpu: backend.inner.library.latest_sample(gpu).tensor_active or 0.0 for gpu in ("0", "1")}
        # enumeration differs, so gpu_id 0 is GPU 1's record: the fallback's known fault, unchanged
        assert samples["0"].tensor_active == pytest.approx(truth["1"], abs=0.05)
        assert samples["1"].tensor_active == pytest.approx(truth["0"], abs=0.05)
        assert backend.bdf.bdfs() is None and backend.matched_by() == "gpu_id"
        warned = [f for f in exporter_join_findings(backend, time.time()) if "matched by gpu_id" in f.detail]
        assert len(warned) == 1 and warned[0].status == "warn"
        assert "HTTP 404" in warned[0].detail and "1.4.0" in warned[0].fix
    finally:
        backend.close()


def test_with_serials_gpumetrics_is_never_read(tmp_path):
    inner = amd_virtual(tmp_path)
    dme = Dme(inner.library, order=None)
    backend = AmdExporterJoin(inner, amd_exporter_reader(URL, fetch=dme.fetch, interval_s=0.02))
    try:
        backend.discover()
        poll(lambda: dme.calls["/metrics"] >= 3, 5, what="background reads of /metrics")
        assert dme.calls["/gpumetrics"] == 0 and backend.matched_by() == "serial" and not backend.needs_fallback()
    finally:
        backend.close()


def test_the_map_is_read_again_when_the_gpu_ids_change_and_dropped_if_that_read_fails(tmp_path, monkeypatch):
    backend, dme = joined(tmp_path, monkeypatch, interval_s=0.02)
    try:
        backend.discover()
        assert backend.bdf.bdfs() == {"0": "0000:2a:00.0", "1": "0000:18:00.0"}
        poll(lambda: dme.calls["/metrics"] >= 4, 5, what="background reads of /metrics")
        assert dme.calls["/gpumetrics"] == 1, "same gpu_ids, refresh_s not over: no re-read"
        dme.gpumetrics = False
        dme.metrics = fx.FILES["mi300x-spx-profiler.prom"]()  # another exporter answers, with gpu_ids 0-7
        poll(lambda: backend.bdf.bdfs() is None, 5, what="the map dropped after a failed re-read")
        assert dme.calls["/gpumetrics"] == 2 and "HTTP 404" in backend.bdf.state()[1]
        assert backend.matched_by() == "gpu_id"
    finally:
        backend.close()


def test_a_failed_periodic_read_keeps_the_map():
    now = [1000.0]
    fetches = {"/gpumetrics": FIXTURE.read_bytes(), "/metrics": fx.FILES["mi300x-spx-profiler.prom"]().encode()}

    def fetch(url, timeout_s, max_bytes):
        body = fetches["/" + url.rsplit("/", 1)[1]]
        if body is None:
            raise ConnectionRefusedError()
        return body

    reader = amd_exporter_reader(URL, fetch=fetch)
    reader.read_once()
    watch = BdfWatch(reader, refresh_s=300, clock=lambda: now[0])
    assert watch.due() and watch.read_once() is None and not watch.due()
    now[0] += 301
    assert watch.due(), "refresh_s elapsed"
    fetches["/gpumetrics"] = None
    assert "connection refused" in watch.read_once()
    assert watch.bdfs() == FIXTURE_BDFS, "the gpu_id set did not change: the last good map stands"


def test_doctor_names_the_devices_left_on_gpu_id_when_gpumetrics_lists_only_some(tmp_path, monkeypatch):
    inner = amd_virtual(tmp_path)
    dme = Dme(inner.library, order=[1, 0])
    without_serials(monkeypatch, inner.amdsmi)
    only_gpu_1 = json.dumps({"Response": [entry(1, "0000:18:00.0")]}).encode()  # amdsmi's GPU 0 is DME's gpu_id 1
    backend = AmdExporterJoin(inner, amd_exporter_reader(
        URL, fetch=lambda url, t, n: only_gpu_1 if url.endswith("/gpumetrics") else dme.fetch(url, t, n)))
    try:
        backend.discover()
        assert backend.fallback_rules() == {"0": "bdf", "1": "gpu_id"}
        assert backend.matched_by() == "bdf+gpu_id"
        assert select(backend.reader.records(), backend.join_keys()["1"], backend.bdf.bdfs()) is None, \
            "GPU 1's enumeration index is gpu_id 1, which /gpumetrics gives to GPU 0's address"
        warned = [f for f in exporter_join_findings(backend, time.time()) if "by PCI address through" in f.detail]
        assert len(warned) == 1 and warned[0].status == "warn" and warned[0].detail.endswith("instead: GPU(s) 1")
    finally:
        backend.close()


# ---------------------------------------------------------------------------------------------- over HTTP


@pytest.mark.slow  # the virtual exporter is an HTTP server on loopback
def test_the_virtual_exporter_serves_gpumetrics_and_the_join_matches_by_bdf_over_http(tmp_path, monkeypatch):
    options = BackendOptions.of(Settings(backend="amd-virtual", scenario=scenario(tmp_path, dme=True)))
    inner = VirtualAmdBackend(open_virtual(options))
    served = inner.start_dme(serve=True)  # the demo reads it in process; here over loopback HTTP, as a real DME
    backend = with_amd_exporter(options.replace(amd_exporter_url=served.url), inner)
    try:
        assert isinstance(backend, AmdExporterJoin)
        dme = backend.inner.dme
        dme.order = [1, 0]
        without_serials(monkeypatch, backend.inner.amdsmi)
        backend.discover()
        assert backend.bdf.url == dme.url.replace("/metrics", "/gpumetrics")
        assert backend.bdf.bdfs() == {"0": "0000:2a:00.0", "1": "0000:18:00.0"}
        samples = sample_all(backend)
        truth = {gpu: backend.inner.library.latest_sample(gpu).tensor_active or 0.0 for gpu in ("0", "1")}
        for gpu, sample in samples.items():
            assert sample.tensor_active == pytest.approx(truth[gpu], abs=0.05), gpu
        assert backend.matched_by() == "bdf"
        dme.gpumetrics = False
        assert "HTTP 404" in backend.bdf.read_once(), "over HTTP a DME before 1.4.0 answers 404"
    finally:
        backend.close()


@pytest.mark.slow  # an HTTP server on loopback
def test_a_gpumetrics_body_over_the_size_cap_is_refused_by_the_readers_fetch():
    huge = json.dumps({"Response": [entry(i, f"{i >> 8:04x}:{i & 0xFF:02x}:00.0") for i in range(5000)]})
    with FakeExporter(huge) as exporter:  # serves its body on /metrics only: read here as if it were /gpumetrics
        small = amd_exporter_reader(exporter.url, max_bytes=64 * 1024)
        found, error = read_gpumetrics(small.get, exporter.url, small.timeout_s)
        assert found is None and "larger than 65536 bytes" in error, error
        found, error = read_gpumetrics(amd_exporter_reader(exporter.url).get, exporter.url, 2.0, max_entries=5000)
        assert error is None and len(found.bdfs) == 5000, "under the cap and the bound: read whole"
        found, error = read_gpumetrics(small.get, gpumetrics_url(exporter.url), small.timeout_s)
        assert found is None and error.startswith("HTTP 404"), "FakeExporter has no /gpumetrics"

"""dcgm-exporter bodies that list absurd GPUs or labels: a GPU index that is no index, more GPUs than a
node has, labels kilobytes long. Each must cost the agent a skipped line, a bounded set of devices and
one log line, or a clipped label; never a failed read, a thread per GPU or a 2,200-character series.
In process, over real HTTP from the stand-in exporter (tests/dcgm_exporter_server.py)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.dcgm_exporter import DcgmExporterBackend, ExporterReader
from agent.backends.dcgm_exporter.exposition import gpu_records, parse_exposition
from tests.dcgm_exporter_server import FakeExporter, fixture, lengthen_labels, many_gpus

A100 = "a100-8x-pods.prom"
T0 = 1_800_000_000.0
LINE = 'DCGM_FI_DEV_GPU_TEMP{{gpu="{gpu}",UUID="GPU-bad",modelName="NVIDIA A100-SXM4-80GB"{extra}}} 40'

NOT_INDEXES = pytest.mark.parametrize("index", [
    "\u00b2",      # '²'.isdigit() is True and int('²') raises: the read failed and the agent would not start
    "\u0663",      # ARABIC-INDIC DIGIT THREE: int() reads 3, a second "GPU 3" under another name
    "1" * 4301,    # more digits than int() converts
    "123456",      # no node numbers its GPUs past five digits
    "-1", "07",
], ids=["superscript-two", "arabic-indic-three", "4301-digits", "six-digits", "negative", "leading-zero"])


def reader_for(url: str, **kw) -> ExporterReader:
    return ExporterReader(url, interval_s=60.0, timeout_s=5.0, stale_s=30.0, **kw)


@NOT_INDEXES
def test_a_gpu_label_that_is_no_index_is_a_skipped_line_not_a_failed_read(index):
    body = fixture(A100) + LINE.format(gpu=index, extra="") + "\n"
    parsed = parse_exposition(body)
    assert parsed.skipped == 1 and "no index" in parsed.first_bad, parsed.first_bad
    assert list(gpu_records(parsed.series)) == [str(i) for i in range(8)], "the other GPUs read as ever"


@NOT_INDEXES
def test_a_mig_instance_id_that_is_no_index_is_a_skipped_line(index):
    body = fixture(A100) + LINE.format(gpu="3", extra=f',GPU_I_ID="{index}",GPU_I_PROFILE="1g.10gb"') + "\n"
    parsed = parse_exposition(body)
    assert parsed.skipped == 1
    assert list(gpu_records(parsed.series)) == [str(i) for i in range(8)]


def test_the_reader_and_backend_read_on_past_a_bad_index_and_count_it():
    bad = "".join(LINE.format(gpu=g, extra="") + "\n" for g in ("\u00b2", "1" * 4301))
    with FakeExporter(fixture(A100) + bad) as exporter:
        backend = DcgmExporterBackend(reader_for(exporter.url, clock=lambda: T0))
        try:
            assert backend.reader.read_once(now=T0) is None, "one bad line used to fail the whole read"
            assert backend.reader.status().skipped_lines == 2
            assert [d.gpu for d in backend.discover()] == [str(i) for i in range(8)]
            assert backend.sample("3", T0).power_w is not None
        finally:
            backend.close()


def test_more_gpus_than_max_devices_are_refused_in_one_line_and_a_doctor_finding(caplog):
    from agent.diagnostics.dcgm_exporter import standalone_findings

    with FakeExporter(many_gpus(300)) as exporter:
        backend = DcgmExporterBackend(reader_for(exporter.url, clock=lambda: T0), max_devices=128)
        try:
            with caplog.at_level(logging.WARNING, logger="roofwatch"):
                devices = backend.discover()
                for t in range(1, 4):  # reads go on in the background: nothing more is said
                    backend.reader.read_once(now=T0 + t)
            assert [d.gpu for d in devices] == [str(i) for i in range(128)]
            assert len(backend.refused) == 172 and backend.refused[0] == "128"
            lines = [r.getMessage() for r in caplog.records]
            assert len(lines) == 1, lines
            assert "lists 300 GPUs and MIG instances, more than max_devices (128)" in lines[0]
            assert "refusing 172 (128, 129, 130, 131 and 168 more)" in lines[0] and len(lines[0]) < 600
            findings, usable = standalone_findings(backend, now=T0 + 1)
            refused = [f for f in findings if "max_devices" in f.detail]
            assert len(refused) == 1 and refused[0].status == "warn" and "172 refused" in refused[0].detail
            assert "this node's own exporter" in refused[0].fix
            assert usable == 128 and len(findings) < 128 * 3 + 8, "findings per device read, none per refused"
        finally:
            backend.close()


def test_the_reader_keeps_a_bounded_number_of_gpus_and_names_a_few_in_its_errors(caplog):
    with FakeExporter(many_gpus(1100)) as exporter:
        reader = reader_for(exporter.url)
        with caplog.at_level(logging.WARNING, logger="roofwatch"):
            for t in range(3):
                assert reader.read_once(now=T0 + t) is None
        status = reader.status()
        assert len(status.gpus) == 1024 and len(status.refused) == 76 and status.refused[0] == "1024"
        assert caplog.records == [], "nothing per read: discovery says it once (the backend, the join)"
        record, problem = reader.lookup("5000", T0 + 2)
        assert record is None and "1024 GPU(s) listed: 0, 1, 2" in problem and "and 1008 more" in problem
        assert len(problem) < 400, "an error names a few GPUs, not every one the exporter lists"


def test_labels_kilobytes_long_from_the_exporter_are_clipped_in_metrics_and_json():
    from agent.collector import Collector
    from exporters.prometheus import ExpositionCache
    from exporters.snapshot_json import snapshot_to_dict
    from prometheus_client.exposition import generate_latest

    body = lengthen_labels(fixture(A100), 2200, ("Hostname", "UUID", "modelName", "pci_bus_id", "pod"))
    with FakeExporter(body) as exporter:
        backend = DcgmExporterBackend(reader_for(exporter.url))
        backend.first_read()
        collector = Collector(backend, node=backend.node, interval_s=1.0, sample_timeout_s=5.0)
        try:
            snapshot = collector.collect_once()
            assert len(snapshot.node) == 2200 and len(snapshot.devices[0].info.uuid) == 2200, "as the exporter said"
            text = ExpositionCache(lambda: snapshot).render(generate_latest, "text/plain").decode()
        finally:
            collector.stop()
    values = {(s.name, name): value for family in text_string_to_metric_families(text) for s in family.samples
              for name, value in s.labels.items()}
    longest = max(values.items(), key=lambda kv: len(kv[1]))
    assert len(longest[1]) <= 128, f"{longest[0]}: {len(longest[1])} characters"
    assert values[("roofwatch_gpu_up", "node")] == snapshot.node[:128]
    assert values[("roofwatch_gpu_info", "model")] == snapshot.devices[0].info.model[:128]
    data = snapshot_to_dict(snapshot)
    assert data["node"] == snapshot.node[:128]
    for device in data["devices"]:
        assert len(device["info"]["uuid"]) == 128 and len(device["info"]["model"]) == 128
        assert len(device["sample"]["node"]) == 128 and len(device["sample"]["uuid"]) == 128


def test_the_max_devices_setting_is_bounded_and_reaches_the_backend_and_the_collector():
    from agent.app.assemble import make_collector
    from agent.app.config import ConfigError, load_settings

    for bad in (0, 1025):
        with pytest.raises(ConfigError, match="max_devices"):
            load_settings(max_devices=bad)
    settings = load_settings(max_devices=4, classify=False)
    with FakeExporter(fixture(A100)) as exporter:
        backend = DcgmExporterBackend(reader_for(exporter.url))
        backend.first_read()
        collector = make_collector(settings, backend)
        try:
            assert [d.gpu for d in collector.devices] == ["0", "1", "2", "3"]
            assert backend.refused == ("4", "5", "6", "7")
        finally:
            collector.stop()


def test_doctor_applies_the_configured_max_devices():
    from agent.app.config import load_settings
    from agent.diagnostics.doctor import run_doctor

    with FakeExporter(many_gpus(12)) as exporter:
        report = run_doctor(load_settings(backend="dcgm-exporter", dcgm_exporter_url=exporter.url, max_devices=4))
    refused = [f.detail for f in report.findings if "max_devices" in f.detail]
    assert len(refused) == 1 and "more than max_devices (4)" in refused[0] and "8 refused" in refused[0], refused

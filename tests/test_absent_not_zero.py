"""Unknown is absent, never 0: every family over every published capture and every virtual backend.

docs/metrics.md promises that a value a source did not give is absent. A 0 can still come from
absence when a source says 0 for "not supported" (DCGM's MEMORY_TEMP on a GDDR board) or when a
flag is computed without its input (``throttled`` without clock-event reasons). This walks every
family the agent exports for each source and fails on such zeros:

* families where 0 is no reading of a working GPU (a temperature, a maximum clock, a power limit, a
  memory size) must never read 0;
* ``roofwatch_gpu_throttled`` exists only for GPUs whose samples carry clock-event reasons.

The captures (tests/fixtures/captures/dcgm-exporter) are read through the real dcgm-exporter
backend; the virtual backends through the real NVML and amdsmi backends over their fakes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import load_settings
from agent.backends.dcgm_exporter import DcgmExporterBackend, ExporterReader
from agent.backends.options import BackendOptions
from agent.backends.registry import open_backend
from agent.classifier.live import LiveClassifier
from agent.classifier.thresholds import Thresholds
from agent.collector import Collector
from exporters.prometheus import ExpositionCache
from tests.dcgm_exporter_server import FakeExporter

CAPTURES = sorted((Path(__file__).parent / "fixtures" / "captures" / "dcgm-exporter").glob("*.txt"))
NEVER_ZERO = ("roofwatch_gpu_temperature_celsius", "roofwatch_gpu_memory_temperature_celsius",
              "roofwatch_gpu_sm_clock_max_hertz", "roofwatch_gpu_power_limit_watts", "roofwatch_gpu_memory_total_bytes")
"""Families whose 0 is no reading of a powered GPU: it would be a source's 'not supported' passed on."""


FAST = Thresholds(window_s=4.0, long_window_s=8.0, evaluate_every_s=1.0)
"""Short windows, so a dozen cycles give every GPU a verdict and the flags are computed."""


def exposition(backend, cycles: int = 12) -> tuple[dict[str, list], Collector]:
    clock = {"t": 1_800_000_000.0}
    collector = Collector(backend, node="n", interval_s=1.0, clock=lambda: clock["t"], monotonic=lambda: clock["t"],
                          analyzer=LiveClassifier(FAST))
    for _ in range(cycles):
        collector.collect_once()
        clock["t"] += 1.0
    text = ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}, collector


def check(families: dict[str, list], collector: Collector) -> None:
    for name in NEVER_ZERO:
        zeros = [s.labels["gpu"] for s in families.get(name, []) if s.value == 0]
        assert not zeros, f"{name} is 0 for GPU(s) {zeros}: a source's 'not supported' exported as a reading"
    reasons_known = {d.info.gpu for d in collector.snapshot.devices
                     if d.sample is not None and d.sample.clock_event_reasons is not None}
    flagged = {s.labels["gpu"] for s in families.get("roofwatch_gpu_throttled", [])}
    assert flagged <= reasons_known, f"throttled exported without clock-event reasons for {sorted(flagged - reasons_known)}"


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_every_capture_exports_no_zero_from_absence(capture):
    with FakeExporter(capture.read_text()) as exporter:
        backend = DcgmExporterBackend(ExporterReader(exporter.url, interval_s=3600.0, timeout_s=5.0, stale_s=1e9))
        backend.first_read()
        families, collector = exposition(backend)
        collector.stop()
    assert any(s.value == 1 for s in families["roofwatch_gpu_up"]), "the capture's GPUs are read"
    assert collector.snapshot.verdicts, "verdicts computed, so the throttled flag is checked"
    check(families, collector)


@pytest.mark.slow  # opening a virtual node and a dozen cycles of its fake driver take about 2 s
@pytest.mark.parametrize("name", ["virtual", "nvml-virtual", "amd-virtual"])
def test_every_virtual_backend_exports_no_zero_from_absence(name):
    backend = open_backend(BackendOptions.of(load_settings(backend=name)))
    families, collector = exposition(backend)
    collector.stop()
    assert families["roofwatch_gpu_up"], name
    assert families["roofwatch_gpu_throttled"], "the fakes give clock-event reasons: the flag is known"
    check(families, collector)

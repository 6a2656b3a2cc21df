"""Each GPU's verdict names the source its counters actually came from (issue 43, item 7).

Until now every NVIDIA card and doctor said the verdict rests on "compute-pipe and DRAM bandwidth counters (GPM,
DCGM, AMD's profiler through its Device Metrics Exporter)": a list of every source roofwatch knows, whichever
this GPU used. Each node below is read through the real backend code over the fakes of its vendor library (NVML
with GPM on an H100; NVML with DCGM's profiling on an A100, and NVML alone; amdsmi alone and amdsmi with AMD's
Device Metrics Exporter on an MI300X), collected in process, and its one snapshot read the way each view reads
it: ``/api/v1/snapshot``'s verdict, the ``basis_source`` label of ``/metrics``, the status page's card and
doctor's basis line. The expected source is the one the node was built with, not what agent.model.counter_source
computes; a dcgm-exporter beside NVML, as a real agent process, is in tests/test_verdict_source_e2e.py.
"""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest
import yaml
from prometheus_client.exposition import generate_latest

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from agent.backends.dcgm import dcgm_join
from agent.backends.dcgm_virtual import virtual_loader
from agent.backends.nvml_virtual import VirtualNvmlBackend
from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.diagnostics.doctor import run_doctor
from agent.views.status_page import status_page
from agent.views.top_render import TopState, render_header
from agent.views.top_source import parse_exposition
from agent.virtual.fake_dcgm import BINDINGS_DIR
from exporters.prometheus import ExpositionCache
from exporters.snapshot_json import snapshot_to_dict
from agent.virtual.scenario import resolve_scenario
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S
from tests.fake_nvml_rig import START
from tests.nvml_harness import ManualClock
from tests.top_exposition import series

pytestmark = pytest.mark.slow  # each node is collected over its fake vendor library, a second or more apiece

GENERIC = "GPM, DCGM, AMD's profiler"
"""The old words: every source at once, whichever the GPU used."""
SOURCES = ("gpm", "dcgm", "dcgm-exporter", "amd-exporter", "nvml", "amdsmi")
"""The fixed set the issue names (GPM, DCGM, dcgm-exporter, DME, NVML, amdsmi): the label's bounded values."""


def _scenario(tmp: Path, model: str) -> str:
    """Two GPUs of ``model`` on one node: a trainer (compute) and a decode (memory)."""
    path = tmp / f"{model}.yaml"
    path.write_text(yaml.safe_dump({"name": "sources", "seed": 7, "nodes": [{
        "name": "src-node", "model": model, "gpus": 2, "workloads": [
            {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
            {"job": "decode", "gpus": [1], "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]}]}]}))
    return str(path)


NODES = {
    # name: (settings, scenario model or None for the named scenario, label, how a sentence names it, basis)
    "h100-gpm": ({"backend": "nvml-virtual", "dcgm": "off"}, "h100-sxm", "gpm", "counters from GPM", "counters"),
    "a100-dcgm": ({"backend": "nvml-virtual", "dcgm": "on", "dcgm_bindings_path": [str(BINDINGS_DIR)]},
                  "a100-sxm-80gb", "dcgm", "counters from DCGM", "counters"),
    "a100-nvml": ({"backend": "nvml-virtual", "dcgm": "off"}, "a100-sxm-80gb", "nvml",
                  "memory busy time (utilization.memory) from NVML", "power_and_mem_busy"),
    "mi300x-amdsmi": ({"backend": "amd-virtual"}, "mi300x", "amdsmi",
                      "a DRAM activity counter from amdsmi", "power_and_dram"),
    "mi300x-dme": ({"backend": "amd-virtual", "scenario": "mi300x-dme"}, None, "amd-exporter",
                   "counters from DME (AMD's Device Metrics Exporter)", "counters"),
}
CYCLES = 25
"""Collection cycles of 1 s on the NVML nodes' manual clock: a full classification window of joined samples."""


def _nvml_snapshot(scenario_file: str, dcgm: str):
    """The real NVML backend over the fake driver, with DCGM's profiling joined over the fake bindings and host
    engine (``dcgm`` on) or not, collected on a manual clock until the verdicts rest on its own samples."""
    clock = ManualClock()
    virtual = VirtualBackend(resolve_scenario(scenario_file), clock=clock, start_time=START)
    nvml = VirtualNvmlBackend(virtual, wall=clock, clock=clock, sleep=lambda s: setattr(clock, "t", clock.t + s))
    backend = dcgm_join(nvml, mode=dcgm, host="localhost:5555", paths=[str(BINDINGS_DIR)], interval_s=1.0,
                        load=virtual_loader(virtual))
    collector = Collector(backend, node="src-node", interval_s=1.0, clock=lambda: clock.t, monotonic=lambda: clock.t,
                          analyzer=LiveClassifier())
    try:
        for _ in range(CYCLES):
            clock.t += 1.0
            snapshot = collector.collect_once()
    finally:
        collector.stop()
    return snapshot


class Node:
    """One node's snapshot, as the JSON API, ``/metrics``, the status page and doctor show it."""

    def __init__(self, name: str, tmp: Path) -> None:
        given, model, *_ = NODES[name]
        scenario = {"scenario": _scenario(tmp, model)} if model else {}
        self.settings = Settings(sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S, **{**given, **scenario})
        if self.settings.backend == "nvml-virtual":
            snapshot = _nvml_snapshot(scenario["scenario"], self.settings.dcgm)
        else:  # amdsmi's fakes on the wall clock, the verdicts from the first scrape (warm samples)
            collector = make_collector(self.settings, open_backend_or_fail(self.settings))
            try:
                snapshot = collector.collect_once()
            finally:
                collector.stop()
        self.data = snapshot_to_dict(snapshot)
        self.exposition = ExpositionCache(lambda: snapshot).render(generate_latest, "text/plain").decode()
        self.page = status_page(self.data, refresh_s=0)


_BUILT: dict[str, Node] = {}


@pytest.fixture(params=sorted(NODES))
def node(request, tmp_path_factory) -> tuple[str, Node]:
    if request.param not in _BUILT:
        _BUILT[request.param] = Node(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, _BUILT[request.param]


def _counter_verdicts(data: dict) -> list[dict]:
    """The verdicts that rest on counters the node reads (a straggler's rank spread reads its peers too)."""
    return [v for v in data["verdicts"] if v["basis"] not in ("step_reports", "network_counters", "none")]


def test_the_snapshot_names_the_source_each_verdict_rests_on(node) -> None:
    name, built = node
    _, _, label, _, basis = NODES[name]
    verdicts = _counter_verdicts(built.data)
    assert any(v["basis"] == basis for v in verdicts), built.data["verdicts"]
    assert {v["basis_source"] for v in verdicts} == {label}, [(v["gpu"], v["basis"], v["basis_source"]) for v in verdicts]
    assert all(v["basis_sources"] == [label] for v in verdicts)


def test_metrics_label_the_reason_with_the_source_from_a_fixed_set(node) -> None:
    name, built = node
    label = NODES[name][2]
    reasons = {labels["gpu"]: labels for labels, _ in series(built.exposition, "roofwatch_gpu_workload_reason_info")}
    bases = {v["gpu"]: v["basis"] for v in _counter_verdicts(built.data)}
    assert bases and {reasons[gpu]["basis_source"] for gpu in bases} == {label}
    known = set(SOURCES) | {"none"}
    assert all(set(r["basis_source"].split("+")) <= known for r in reasons.values()), "a bounded label"


def test_each_card_says_where_its_verdict_rests(node) -> None:
    name, built = node
    words = NODES[name][3]
    said = {gpu: unescape(text) for gpu, text in re.findall(
        r'<div class="card" data-gpu="([^"]+)".*?<li class="basis muted"[^>]*>verdict rests on: (.*?)</li>', built.page,
        re.S)}
    for verdict in _counter_verdicts(built.data):
        assert GENERIC not in said[verdict["gpu"]]
        if verdict["basis"] == NODES[name][4]:
            assert words in said[verdict["gpu"]], (verdict["gpu"], said[verdict["gpu"]])
    assert GENERIC not in built.page


SHORT = {"gpm": "GPM", "dcgm": "DCGM", "nvml": "NVML", "amdsmi": "amdsmi", "amd-exporter": "DME"}
"""How ``top``'s header names each source."""


def test_tops_header_says_where_the_counters_came_from(node) -> None:
    name, built = node
    state = TopState(url="http://node:9477/metrics")
    state.apply(parse_exposition(built.exposition, state.url))
    header = render_header(state).plain
    assert f"counters from {SHORT[NODES[name][2]]}" in header, header


def test_doctor_names_the_source_the_agent_will_read(node) -> None:
    name, built = node
    words, basis = NODES[name][3], NODES[name][4]
    report = run_doctor(built.settings)
    lines = [f.detail for f in report.findings if f.check == "verdict basis"]
    assert any(words in line and f"(basis {basis})" in line for line in lines), lines
    assert not any(GENERIC in line for line in lines)


def test_the_source_names_are_the_ones_the_docs_list() -> None:
    """docs/metrics.md's label and docs/classification.md name the same fixed set."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    metrics = (docs / "metrics.md").read_text()
    row = next(line for line in metrics.splitlines() if line.startswith("| `roofwatch_gpu_workload_reason_info`"))
    assert "basis_source" in row and all(source in row for source in SOURCES)
    assert all(f"`{source}`" in (docs / "classification.md").read_text() for source in SOURCES)

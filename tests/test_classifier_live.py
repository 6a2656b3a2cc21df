"""The classifier inside the agent and behind ``roofwatch classify``: wiring, errors, contract."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.model import WORKLOAD_CLASSES
from agent.trace import TraceWriter
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import builtin_scenario
from exporters.prometheus import ExpositionCache
from tests.agent_process import clean_env, roofwatch_cmd

START = 1_800_000_000.0
CONTRACT = {"node", "gpu", "window_start", "window_end", "class", "confidence", "throttled", "mfu", "mbu", "reasons", "scores"}


def run_demo(cycles: int, analyzer=None):
    clock = {"t": START}
    backend = VirtualBackend("demo", start_time=START - 60.0, interval_s=1.0, clock=lambda: clock["t"])
    collector = Collector(backend, node="n", interval_s=1.0, clock=lambda: clock["t"], monotonic=lambda: clock["t"],
                          analyzer=analyzer)
    for _ in range(cycles):
        collector.collect_once()
        clock["t"] += 1.0
    return collector, backend, clock


def series_per_gpu(collector: Collector) -> dict[str, int]:
    text = ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(("roofwatch_gpu_workload", "roofwatch_gpu_throttled")):
            for s in family.samples:
                counts[s.labels["gpu"]] = counts.get(s.labels["gpu"], 0) + 1
    return counts


@pytest.mark.slow
def test_verdict_series_per_gpu_stay_fixed_while_classes_change() -> None:
    collector, _, clock = run_demo(25, LiveClassifier())
    first = series_per_gpu(collector)
    seen = set()
    for _ in range(120):  # GPU 7 goes from a capped GEMM to idle and back
        collector.collect_once()
        clock["t"] += 1.0
        seen.add(next(v.cls for v in collector.snapshot.verdicts if v.gpu == "7"))
        assert series_per_gpu(collector) == first
    collector.stop()
    assert {"compute_bound", "idle"} <= seen
    assert set(first.values()) == {1 + 1 + 1 + 1}  # the class's one-hot series, confidence, reason, throttled


def test_a_down_gpu_reads_unknown_and_the_others_keep_their_verdicts() -> None:
    collector, backend, clock = run_demo(25, LiveClassifier())
    backend.inject_fault(2, "error", duration_s=1000.0)
    for _ in range(3):
        collector.collect_once()
        clock["t"] += 1.0
    text = ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    published = {s.labels["gpu"]: s.labels["class"] for s in families["roofwatch_gpu_workload_class"].samples if s.value == 1}
    reasons = {s.labels["gpu"]: s.labels["detail"] for s in families["roofwatch_gpu_workload_reason_info"].samples}
    assert published["2"] == "unknown" and reasons["2"] == "gpu_down"
    assert published["0"] == "compute_bound" and published["3"] == "input_starved"
    collector.stop()


def test_a_failing_classifier_never_stops_the_raw_metrics() -> None:
    def broken(snapshot):
        raise RuntimeError("bug")

    collector, _, _ = run_demo(3, broken)
    assert collector.snapshot.verdicts == () and collector.snapshot.health.cycles_total == 3
    assert all(d.up for d in collector.snapshot.devices)
    collector.stop()


def test_priming_gives_verdicts_before_the_first_live_window() -> None:
    backend = VirtualBackend("demo", start_time=START - 61.0, interval_s=1.0)
    live = LiveClassifier()
    live.prime(backend.warm_samples(START, 60.0), {d.gpu: d.spec for d in backend.discover()})
    collector = Collector(backend, node="n", interval_s=1.0, clock=lambda: START, monotonic=lambda: START, analyzer=live)
    collector.collect_once()
    assert len(collector.snapshot.verdicts) == 8
    assert "unknown" not in {v.cls for v in collector.snapshot.verdicts}
    collector.stop()


def _write_trace(path: Path, seconds: float = 60.0, drop: tuple[str, ...] = ()) -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    with TraceWriter(path, node="demo-node") as writer:
        for s in engine.iter_trace(seconds, 1.0, start_ts=START):
            writer.write(s.__class__(**{f: (None if f in drop else getattr(s, f)) for f in s.__dataclass_fields__}))


@pytest.mark.slow
def test_classify_prints_contract_verdict_lines(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    result = subprocess.run(roofwatch_cmd("classify", str(trace)), capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and all(CONTRACT <= set(v) for v in lines)
    assert {v["gpu"] for v in lines} == {str(i) for i in range(8)}
    assert all(v["class"] in WORKLOAD_CLASSES and 0.0 <= v["confidence"] <= 1.0 for v in lines)
    last = {v["gpu"]: v for v in lines}
    assert last["2"]["class"] == "memory_bound" and last["2"]["reasons"]


@pytest.mark.slow
def test_classify_without_utilisation_counters_says_unknown(tmp_path: Path) -> None:
    trace = tmp_path / "bare.jsonl.gz"
    _write_trace(trace, drop=("gr_active", "sm_active", "tensor_active", "dram_active", "sm_occupancy",
                              "fp16_active", "fp32_active", "fp64_active"))
    result = subprocess.run(roofwatch_cmd("classify", str(trace)), capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert {json.loads(line)["class"] for line in result.stdout.splitlines()} == {"unknown"}


@pytest.mark.slow
def test_classify_names_the_malformed_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"ts": 1, "gpu": "0", "gr_active": 0.5}\n{"ts": 2, "gpu": "0", "gr_active": "lots"}\n')
    result = subprocess.run(roofwatch_cmd("classify", str(trace)), capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 2 and result.stdout == ""  # bad input is a usage error (docs/reliability.md)
    assert f"{trace}:2" in result.stderr and "gr_active" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_classify_evaluate_needs_labels_and_bad_thresholds_are_named(tmp_path: Path) -> None:
    trace = tmp_path / "unlabelled.jsonl"
    _write_trace(trace, drop=("label",))
    result = subprocess.run(roofwatch_cmd("classify", str(trace), "--evaluate", "-q"), capture_output=True, text=True,
                            timeout=60, env=clean_env())
    assert result.returncode == 1 and "no labelled samples" in result.stderr
    config = tmp_path / "c.yaml"
    config.write_text("classifier:\n  window_s: -3\n")
    result = subprocess.run(roofwatch_cmd("classify", str(trace), "--config", str(config)), capture_output=True,
                            text=True, timeout=60, env=clean_env())
    assert result.returncode == 2 and "classifier.window_s" in result.stderr


def test_verdicts_keep_coming_after_the_wall_clock_goes_back(caplog) -> None:
    """An NTP step or a restored VM sets the clock back an hour: verdicts follow the new clock at
    once instead of freezing until it catches up with the old one."""
    collector, _, clock = run_demo(60, LiveClassifier())
    before = max(v.window_end for v in collector.snapshot.verdicts)
    clock["t"] -= 3600.0
    with caplog.at_level("WARNING", logger="roofwatch.classifier"):
        for _ in range(30):
            collector.collect_once()
            clock["t"] += 1.0
    verdicts = collector.snapshot.verdicts
    collector.stop()
    assert len(verdicts) == 8
    assert all(v.window_end >= clock["t"] - 10.0 for v in verdicts), "evaluated on the new clock"
    assert all(v.window_end < before for v in verdicts)
    assert any("wall clock went back" in r.getMessage() for r in caplog.records)

"""Tests for scenarios: the built-in ones load and behave as documented, and bad files are
rejected with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.model import WORKLOAD_CLASSES
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import (
    BUILTIN_SCENARIOS,
    Scenario,
    ScenarioError,
    builtin_scenario,
    load_scenario,
    parse_scenario,
    resolve_scenario,
)
from tests.virtual_engine_helpers import one_gpu, series

# ----------------------------------------------------------------------------- built-in scenarios


def test_demo_has_eight_gpus_covering_every_class() -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    assert engine.nodes == ["demo-node"]
    devices = engine.devices("demo-node")
    assert len(devices) == 8 and {d.model for d in devices} == {"NVIDIA H100 80GB HBM3"}
    labels = {s.label for s in engine.iter_trace(300)}
    assert labels == set(WORKLOAD_CLASSES) - {"unknown"}
    at_once = {engine.true_class("demo-node", g, 10.0) for g in range(8)}
    assert len(at_once) >= 5


def test_cluster_job_spans_both_nodes() -> None:
    engine = VirtualEngine(builtin_scenario("cluster"))
    assert len(engine.nodes) == 2
    assert {d.model for n in engine.nodes for d in engine.devices(n)} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    samples = [engine.sample(n, g, 5.0, 6.0) for n in engine.nodes for g in range(8)]
    assert sorted(s.workload.rank for s in samples) == list(range(16))
    assert {s.workload.world_size for s in samples} == {16}
    assert len({s.workload.step_time_s for s in samples}) == 1
    net = [s.net_tx_bytes_per_s for s in series(engine, 0, seconds=40, node="node-h100")]
    assert max(net) > 1e10  # the all-reduce crosses InfiniBand


def test_mi300x_scenario_is_amd() -> None:
    engine = VirtualEngine(builtin_scenario("mi300x"))
    devices = engine.devices(engine.nodes[0])
    assert len(devices) == 8
    assert all(d.vendor == "amd" and d.model == "AMD Instinct MI300X" and not d.uuid.startswith("GPU-")
               for d in devices)
    s = engine.sample(engine.nodes[0], 4, 0.0, 1.0)
    assert s.vendor == "amd" and s.dtype == "fp8" and s.dram_active == pytest.approx(0.55, abs=0.03)
    assert s.gr_active is not None and s.sm_active is None and s.tensor_active is None  # amdsmi: no pipes
    assert "tensor_active" not in devices[0].capabilities and "xgmi" in devices[0].capabilities


@pytest.mark.parametrize("name", BUILTIN_SCENARIOS)
def test_builtin_scenarios_load_and_resolve(name: str) -> None:
    scenario = builtin_scenario(name)
    assert isinstance(scenario, Scenario) and scenario.name == name
    assert resolve_scenario(name) == scenario


# ----------------------------------------------------------------------------- validation

GOOD = """\
name: bad
nodes:
  - name: n
    model: h100-sxm
    gpus: 4
    workloads:
      - job: a
        gpus: [0]
        phases:
          - {kind: idle, duration_s: 5}
          - {kind: compute, duration_s: 5, mfu: 0.5}
"""


def load_text(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    return load_scenario(path)


def scenario_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, text)
    return str(info.value)


def test_good_scenario_loads(tmp_path: Path) -> None:
    assert load_text(tmp_path, GOOD).nodes[0].workloads[0].phases[1].mfu == 0.5


@pytest.mark.parametrize(("change", "path", "message"), [
    (("mfu: 0.5", "mfu: 1.5"), "nodes.0.workloads.0.phases.1.mfu", "less than or equal to 0.97"),
    (("kind: compute", "kind: bogus"), "nodes.0.workloads.0.phases.1", "bogus"),
    (("model: h100-sxm", "model: h900"), "nodes.0.model", "valid keys: "),
    (("mfu: 0.5", "mfuu: 0.5"), "nodes.0.workloads.0.phases.1.mfuu", "Extra inputs are not permitted"),
    (("gpus: [0]", "gpus: [7]"), "nodes.0.workloads.0.gpus", "GPU 7 does not exist"),
    (("duration_s: 5}", "duration_s: -5}"), "nodes.0.workloads.0.phases.0.duration_s", "greater than 0"),
    (("gpus: 4", "gpuz: 4"), "nodes.0.gpuz", "Extra inputs"),
])
def test_validation_errors_name_file_and_field(tmp_path: Path, change: tuple[str, str], path: str, message: str) -> None:
    text = scenario_error(tmp_path, GOOD.replace(*change, 1))
    assert text.startswith(str(tmp_path / "bad.yaml") + ": ")
    assert f": {path}: " in text and message in text


def test_unknown_model_lists_catalogue_keys(tmp_path: Path) -> None:
    text = scenario_error(tmp_path, GOOD.replace("model: h100-sxm", "model: h900"))
    assert "h100-sxm" in text and "mi300x" in text


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    assert "invalid YAML" in scenario_error(tmp_path, "name: [unclosed")
    assert "top level" in scenario_error(tmp_path, "- just\n- a list\n")
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    with pytest.raises(ScenarioError, match="built-in: demo"):
        builtin_scenario("nope")


def test_job_ranks_must_share_schedule_and_straggler_must_exist() -> None:
    node = {"model": "h100-sxm", "gpus": 2}
    jitter = {"kind": "comm_jitter", "duration_s": 5, "straggler_rank": 3}
    doc = {"name": "x", "nodes": [
        {**node, "name": "a", "workloads": [{"job": "j", "gpus": [0, 1], "phases": [jitter]}]},
        {**node, "name": "b", "workloads": [{"job": "j", "gpus": [0, 1], "phases": [{**jitter, "mfu": 0.3}]}]}]}
    with pytest.raises(ScenarioError, match=r"nodes\.1\.workloads\.0: job 'j' also runs"):
        parse_scenario(doc, "x.yaml")
    doc["nodes"][1]["workloads"][0]["phases"] = [jitter]
    assert parse_scenario(doc, "x.yaml").nodes[1].name == "b"
    doc["nodes"][1]["workloads"][0]["phases"] = doc["nodes"][0]["workloads"][0]["phases"] = [
        {**jitter, "straggler_rank": 4}]
    with pytest.raises(ScenarioError, match="straggler_rank: 4 but job 'j' has 4 ranks"):
        parse_scenario(doc, "x.yaml")
    solo = {"name": "x", "nodes": [{**node, "name": "a", "workloads": [
        {"job": "j", "gpus": [0], "phases": [{"kind": "comm_jitter", "duration_s": 5}]}]}]}
    with pytest.raises(ScenarioError, match="at least 2 GPUs"):
        parse_scenario(solo, "x.yaml")


def test_memory_and_power_cap_limits_checked() -> None:
    with pytest.raises(ScenarioError, match=r"phases\.0\.mem_used_gib: .*exceeds"):
        one_gpu({"kind": "memory", "duration_s": 5, "mbu": 0.5, "mem_used_gib": 100})
    with pytest.raises(ScenarioError, match=r"phases\.0\.power_cap_w: .*outside"):
        one_gpu({"kind": "compute", "duration_s": 5, "mfu": 0.5, "power_cap_w": 900})


def test_fp8_on_a100_is_rejected() -> None:
    with pytest.raises(ScenarioError, match=r"nodes\.0\.workloads\.0\.dtype: fp8 not supported"):
        one_gpu({"kind": "compute", "duration_s": 1, "mfu": 0.5}, model="a100-sxm-80gb", dtype="fp8")

"""Tests for MIG instances in the virtual engine: identity, scaled peaks, per-instance samples, validation."""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.model import CLOCK_EVENT_REASONS
from agent.model.specs import achieved_flops, spec_by_key
from agent.virtual.devices import GIB
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import ScenarioError, parse_scenario

MIB = 1024**2
RATIO_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
                "fp16_active", "dram_active")
WHOLE_GPU_ONLY = ("power_w", "energy_j", "power_limit_w", "temperature_c", "pcie_tx_bytes_per_s",
                  "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s")
POWER_CAP = CLOCK_EVENT_REASONS["sw_power_cap"]


def mig_node(mig: dict[Any, list[str]], workloads: list[dict[str, Any]], *, model: str = "h100-sxm", gpus: int = 2,
             **node: Any) -> dict[str, Any]:
    return {"name": "m", "seed": 11, "nodes": [{"name": "n", "model": model, "gpus": gpus, "mig": mig,
                                                "workloads": workloads, **node}]}


def engine_of(doc: dict[str, Any]) -> VirtualEngine:
    return VirtualEngine(parse_scenario(doc, "mig.yaml"))


def compute(mfu: float = 0.75, **extra: Any) -> dict[str, Any]:
    return {"kind": "compute", "duration_s": 600, "mfu": mfu, **extra}


LAYOUT = {0: ["3g.40gb", "3g.40gb"], 1: ["1g.10gb", "2g.20gb", "4g.40gb"]}


# ----------------------------------------------------------------------------- identity


def test_discovery_lists_instances_not_parents() -> None:
    engine = engine_of(mig_node(LAYOUT, [], gpus=3))
    devices = engine.devices("n")
    assert [d.gpu for d in devices] == ["0/1", "0/2", "1/1", "1/2", "1/3", "2"]
    assert [d.model for d in devices] == [
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb", "NVIDIA H100 80GB HBM3 MIG 4g.40gb", "NVIDIA H100 80GB HBM3"]
    uuids = [d.uuid for d in devices[:5]]
    assert all(re.fullmatch(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids)
    assert len(set(uuids)) == 5 and devices[5].uuid.startswith("GPU-")
    assert uuids == [d.uuid for d in engine_of(mig_node(LAYOUT, [], gpus=3)).devices("n")[:5]]  # stable
    # Driver-reported memory: 98% of the profile's GiB in 256 MiB steps (documented rule).
    assert [d.memory_total_bytes // MIB for d in devices[:5]] == [39936, 39936, 9984, 19968, 39936]
    assert [d.pci_bus_id for d in devices] == ["00000000:18:00.0"] * 2 + ["00000000:2A:00.0"] * 3 + ["00000000:3A:00.0"]
    assert all(d.link_count == 0 for d in devices[:5]) and devices[5].link_count == 18
    with pytest.raises(KeyError, match="MIG mode; its instances: 0/1, 0/2"):
        engine.sample("n", 0, 0.0, 1.0)
    with pytest.raises(KeyError, match="no GPU '0/3'"):
        engine.sample("n", "0/3", 0.0, 1.0)


@pytest.mark.parametrize(("gpu", "slices", "gb"), [("0/1", 3, 40), ("1/1", 1, 10), ("1/2", 2, 20), ("1/3", 4, 40)])
def test_instance_spec_scales_flops_by_slices_and_bandwidth_by_memory(gpu: str, slices: int, gb: int) -> None:
    parent = spec_by_key("h100-sxm")
    info = engine_of(mig_node(LAYOUT, [])).device("n", gpu)
    spec = info.spec
    assert spec is not None and spec.key.startswith("h100-sxm-mig-")
    assert set(spec.peak_flops) == set(parent.peak_flops)
    for dtype, peak in parent.peak_flops.items():
        assert spec.peak_flops[dtype] == pytest.approx(peak * slices / 7)
    assert spec.mem_bandwidth_bytes_per_s == pytest.approx(parent.mem_bandwidth_bytes_per_s * gb / 80)
    assert spec.memory_bytes == gb * GIB
    assert info.sm_count == spec.sm_count == round(132 * slices / 7)
    assert info.sm_clock_max_mhz == parent.max_clock_mhz and spec.ref_clock_mhz == parent.ref_clock_mhz
    caps = set(info.capabilities)
    assert {"gpm", "tensor_active", "sm_active", "clocks", "memory", "processes"} <= caps
    assert not caps & {"power", "energy", "temperature", "pcie", "nvlink"}


# ----------------------------------------------------------------------------- samples


def test_instance_samples_follow_their_own_workload_against_scaled_peaks() -> None:
    doc = mig_node(LAYOUT, [
        {"job": "train", "gpus": ["0/1"], "phases": [compute(0.75, flops_per_token=1e9)]},
        {"job": "decode", "gpus": ["0/2"], "phases": [{"kind": "memory", "duration_s": 600, "mbu": 0.6}]},
        {"job": "small", "gpus": ["1/1"], "phases": [compute(0.75, flops_per_token=1e9)]},
    ])
    engine = engine_of(doc)
    parent = spec_by_key("h100-sxm")
    for gpu, slices in (("0/1", 3), ("1/1", 1)):
        spec = engine.device("n", gpu).spec
        samples = [engine.sample("n", gpu, k, k + 1.0) for k in range(30)]
        flops = [achieved_flops(spec, "bf16", s.tensor_active, s.sm_clock_mhz) for s in samples]
        assert all(f <= spec.peak_flops["bf16"] for f in flops)
        assert statistics.fmean(flops) / spec.peak_flops["bf16"] == pytest.approx(0.75, abs=0.05)
        # The same MFU on a g/7 slice is g/7 of the whole GPU's FLOP/s.
        assert statistics.fmean(flops) / parent.peak_flops["bf16"] == pytest.approx(0.75 * slices / 7, abs=0.05)
        report = samples[-1].workload
        assert report is not None and report.world_size == 1
        assert report.tokens_per_s * report.flops_per_token == pytest.approx(
            0.75 * spec.peak_flops["bf16"] * min(1.0, samples[-1].sm_clock_mhz / spec.ref_clock_mhz), rel=0.02)
    decode = [engine.sample("n", "0/2", k, k + 1.0) for k in range(30)]
    assert statistics.fmean(s.dram_active for s in decode) == pytest.approx(0.6, abs=0.03)
    assert max(s.tensor_active for s in decode) <= 0.1
    idle = engine.sample("n", "1/2", 0.0, 1.0)
    assert idle.gr_active == 0.0 and idle.processes == () and idle.mem_used_bytes == 0


def test_instances_report_no_power_temperature_or_bus_rates() -> None:
    engine = engine_of(mig_node(LAYOUT, [{"job": "t", "gpus": ["0/1", "1/3"], "phases": [compute(0.8)]}], gpus=3))
    for gpu in ("0/1", "0/2", "1/3"):
        for k in range(5):
            s = engine.sample("n", gpu, k, k + 1.0)
            assert all(getattr(s, name) is None for name in WHOLE_GPU_ONLY), gpu
            assert s.sm_clock_mhz is not None and s.mem_total_bytes == engine.device("n", gpu).memory_total_bytes
            assert 0 <= s.mem_used_bytes <= s.mem_total_bytes
            assert s.gpu == gpu and s.uuid == engine.device("n", gpu).uuid
    whole = engine.sample("n", 2, 0.0, 1.0)
    assert all(getattr(whole, name) is not None for name in WHOLE_GPU_ONLY)


def test_processes_and_ranks_are_per_instance() -> None:
    doc = mig_node({0: ["3g.40gb", "3g.40gb"]}, [
        {"job": "dp", "gpus": ["0/1", "0/2", 1], "phases": [{"kind": "comm_jitter", "duration_s": 600}]}])
    engine = engine_of(doc)
    samples = [engine.sample("n", g, 5.0, 6.0) for g in ("0/1", "0/2", "1")]
    assert [s.workload.rank for s in samples] == [0, 1, 2]
    assert {s.workload.world_size for s in samples} == {3}
    pids = [s.processes[0].pid for s in samples]
    assert len(set(pids)) == 3
    assert samples[0].processes[0].used_memory_bytes <= samples[0].mem_total_bytes < samples[2].mem_total_bytes


def test_workloads_on_instances_get_their_own_labels() -> None:
    doc = mig_node({0: ["3g.40gb", "2g.20gb", "1g.10gb"]}, [
        {"job": "gemm", "gpus": ["0/1"], "phases": [compute()]},
        {"job": "decode", "gpus": ["0/2"], "phases": [{"kind": "memory", "duration_s": 600, "mbu": 0.5}]},
        {"job": "svc", "gpus": [1], "phases": [{"kind": "latency", "duration_s": 600}]},
    ])
    engine = engine_of(doc)
    want = {"0/1": "compute_bound", "0/2": "memory_bound", "0/3": "idle", "1": "latency_bound"}
    assert {g: engine.true_class("n", g, 10.0) for g in want} == want
    trace = list(engine.iter_trace(6))
    assert [s.gpu for s in trace[:4]] == ["0/1", "0/2", "0/3", "1"] and len(trace) == 24
    assert {s.gpu: s.label for s in trace} == want


def test_counter_presets_apply_to_instances() -> None:
    a100 = engine_of(mig_node({0: ["3g.40gb", "4g.40gb"]}, [{"job": "t", "gpus": ["0/1"], "phases": [compute(0.5)]}],
                              model="a100-sxm-80gb"))
    s = a100.sample("n", "0/1", 0.0, 1.0, labelled=True)
    assert s.tensor_active is None and s.sm_active is None and s.gr_active is not None and s.power_w is None
    assert s.label == "compute_bound"
    assert not {"gpm", "tensor_active"} & set(a100.device("n", "0/1").capabilities)
    minimal = engine_of(mig_node({0: ["7g.80gb"]}, [{"job": "t", "gpus": ["0/1"], "phases": [compute(0.5)]}],
                                 counters="minimal"))
    s = minimal.sample("n", "0/1", 0.0, 1.0, labelled=True)
    assert s.gr_active is None and s.dram_active is None and s.label == "unknown"
    assert minimal.true_class("n", "0/1", 3.0) == "unknown"


def test_power_cap_throttles_an_instance_like_the_whole_gpu() -> None:
    """A cap is the GPU's limit; each instance takes its g/7 share, so it slows down as the GPU would."""
    phase = compute(0.9, power_cap_w=350)
    engine = engine_of(mig_node({0: ["3g.40gb", "3g.40gb"]}, [
        {"job": "a", "gpus": ["0/1"], "phases": [phase]}, {"job": "b", "gpus": [1], "phases": [phase]}]))
    inst = [engine.sample("n", "0/1", k, k + 1.0) for k in range(5)]
    whole = [engine.sample("n", 1, k, k + 1.0) for k in range(5)]
    assert all(s.clock_event_reasons & POWER_CAP and s.sm_clock_mhz < s.sm_clock_max_mhz for s in inst)
    assert statistics.fmean(s.sm_clock_mhz for s in inst) == pytest.approx(
        statistics.fmean(s.sm_clock_mhz for s in whole), rel=0.01)
    assert all(s.power_w is None and s.power_limit_w is None for s in inst)


def test_mig_samples_are_deterministic() -> None:
    doc = mig_node(LAYOUT, [{"job": "t", "gpus": ["1/2"], "phases": [{"kind": "input_starved", "duration_s": 60,
                                                                      "duty": 0.4}]}])
    assert list(engine_of(doc).iter_trace(10)) == list(engine_of(doc).iter_trace(10))


# ----------------------------------------------------------------------------- property


@st.composite
def mig_layouts(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(["h100-sxm", "h200-sxm", "a100-sxm-80gb", "a100-sxm-40gb", "b200"]))
    spec = spec_by_key(model)
    mem_gb = int(spec.memory_bytes / GIB)
    profiles: list[str] = []
    slices = gb = 0
    for _ in range(draw(st.integers(1, 7))):
        g = draw(st.integers(1, 7))
        m = draw(st.integers(1, mem_gb))
        if slices + g > 7 or gb + m > mem_gb:
            break
        profiles.append(f"{g}g.{m}gb")
        slices, gb = slices + g, gb + m
    if not profiles:
        profiles = ["1g.1gb"]
    dtype = draw(st.sampled_from(sorted(spec.peak_flops)))
    cap = draw(st.none() | st.floats(0.25 * spec.tdp_w, spec.tdp_w))
    kinds = st.sampled_from(["compute", "memory", "latency", "input_starved", "idle"])
    workloads = []
    for j in range(1, len(profiles) + 1):
        kind = draw(kinds)
        phase: dict[str, Any] = {"kind": kind, "duration_s": draw(st.floats(0.5, 60.0)), "power_cap_w": cap,
                                 "thermal": draw(st.booleans())}
        phase.update({"compute": {"mfu": draw(st.floats(0.01, 0.97))}, "memory": {"mbu": draw(st.floats(0.01, 0.9))},
                      "input_starved": {"duty": draw(st.floats(0.05, 0.95))}}.get(kind, {}))
        workloads.append({"job": f"j{j}", "gpus": [f"0/{j}"], "dtype": dtype, "phases": [phase]})
    return {"name": "p", "seed": draw(st.integers(0, 2**31)), "nodes": [
        {"name": "n", "model": model, "gpus": 1, "counters": "full", "mig": {0: profiles}, "workloads": workloads}]}


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=mig_layouts(), steps=st.lists(st.floats(0.05, 5.0), min_size=2, max_size=6))
def test_instance_invariants_hold_for_any_layout(doc: dict[str, Any], steps: list[float]) -> None:
    engine = engine_of(doc)
    node = doc["nodes"][0]
    parent = spec_by_key(node["model"])
    for j, profile in enumerate(node["mig"][0], start=1):
        info = engine.device("n", f"0/{j}")
        spec = info.spec
        slices = int(profile[0])
        t = 0.0
        for dt in steps:
            s = engine.sample("n", info.gpu, t, t + dt)
            for name in RATIO_FIELDS:
                assert 0.0 <= getattr(s, name) <= 1.0, name
            dtype = s.dtype or "bf16"
            if dtype in spec.peak_flops:
                flops = achieved_flops(spec, dtype, s.tensor_active, s.sm_clock_mhz)
                assert flops <= spec.peak_flops[dtype] <= parent.peak_flops[dtype] * slices / 7 * (1 + 1e-12)
            assert s.dram_active <= 0.9
            assert 0 < s.sm_clock_mhz <= s.sm_clock_max_mhz == parent.max_clock_mhz
            if s.clock_event_reasons & POWER_CAP:
                assert s.sm_clock_mhz < s.sm_clock_max_mhz
            assert 0 <= s.mem_used_bytes <= s.mem_total_bytes == info.memory_total_bytes
            assert all(getattr(s, name) is None for name in WHOLE_GPU_ONLY)
            t += dt


# ----------------------------------------------------------------------------- validation


def error_of(doc: dict[str, Any]) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, "mig.yaml")
    return str(info.value)


ONE = [{"job": "a", "gpus": ["0/1"], "phases": [compute()]}]


@pytest.mark.parametrize(("mig", "workloads", "extra", "path", "message"), [
    ({0: ["3g.40"]}, [], {}, "nodes.0.mig.0.0", "invalid MIG profile '3g.40'"),
    ({0: ["3g.40gb", "8g.10gb"]}, [], {}, "nodes.0.mig.0.1", "invalid MIG profile '8g.10gb'"),
    ({0: ["1g.0gb"]}, [], {}, "nodes.0.mig.0.0", "invalid MIG profile"),
    ({0: ["4g.40gb", "4g.40gb"]}, [], {}, "nodes.0.mig.0", "8 compute slices; a GPU has 7"),
    ({0: ["3g.40gb", "3g.50gb"]}, [], {}, "nodes.0.mig.0", "90 GB of memory; h100-sxm has 80 GB"),
    ({0: []}, [], {}, "nodes.0.mig.0", "at least one instance"),
    ({5: ["1g.10gb"]}, [], {}, "nodes.0.mig.5", "GPU 5 does not exist (node has 2)"),
    ({0: ["3g.24gb"]}, [], {"model": "l40s"}, "nodes.0.mig", "l40s does not support MIG"),
    ({0: ["3g.40gb"]}, [], {"model": "mi300x"}, "nodes.0.mig", "mi300x does not support MIG"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": [0], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "GPU 0 is in MIG mode; use its instances (0/1)"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["0/2"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "MIG instance 0/2 does not exist (GPU 0 has 1)"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["1/1"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "GPU 1 is not in MIG mode"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["4/1"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "GPU 4 does not exist"),
    ({0: ["3g.40gb"]}, ONE + [{"job": "b", "gpus": ["0/1"], "phases": [compute()]}], {},
     "nodes.0.workloads.1.gpus", "GPU 0/1 already used by job 'a'"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["0/1", "0/01"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "GPU listed twice"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["0-1"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus.0", "neither a GPU index nor a MIG instance or partition"),
    ({0: ["3g.40gb"]}, [{"job": "a", "gpus": ["0/0"], "phases": [compute()]}], {},
     "nodes.0.workloads.0.gpus", "MIG instances are numbered from 1"),
    ({0: ["1g.10gb"]}, [{"job": "a", "gpus": ["0/1"], "phases": [compute(mem_used_gib=20)]}], {},
     "nodes.0.workloads.0.phases.0.mem_used_gib", "exceeds the h100-sxm MIG 1g.10gb memory (10 GiB)"),
    ({0: ["3g.40gb"]}, ONE, {"faults": [{"gpu": "0/4", "kind": "error", "start_s": 0, "duration_s": 1}]},
     "nodes.0.faults.0.gpu", "MIG instance 0/4 does not exist"),
])
def test_mig_validation_errors_name_the_field(mig: dict[Any, list[str]], workloads: list[dict[str, Any]],
                                              extra: dict[str, Any], path: str, message: str) -> None:
    text = error_of(mig_node(mig, workloads, **extra))
    assert text.startswith(f"mig.yaml: {path}: "), text
    assert message in text, text


def test_valid_layouts_and_gpu_references() -> None:
    doc = mig_node({0: ["1g.10gb"] * 7, "1": ["7g.80gb"]}, [
        {"job": "a", "gpus": ["0/1", "0/7", "1/1"], "phases": [compute()]}],
        faults=[{"gpu": 0, "kind": "error", "start_s": 0, "duration_s": 1},
                {"gpu": "1/1", "kind": "lost", "start_s": 0, "duration_s": 1}])
    node = parse_scenario(doc).nodes[0]
    assert node.mig == {0: ["1g.10gb"] * 7, 1: ["7g.80gb"]}
    assert node.workloads[0].gpus == ["0/1", "0/7", "1/1"] and [f.gpu for f in node.faults] == [0, "1/1"]
    plain = parse_scenario(mig_node({}, [{"job": "a", "gpus": ["1", 0], "phases": [compute()]}])).nodes[0]
    assert plain.workloads[0].gpus == [1, 0]  # "1" is GPU 1
    for model, profile in (("h200-sxm", "7g.141gb"), ("b200", "7g.180gb"), ("gh200-96gb", "3g.48gb"),
                           ("a100-sxm-40gb", "7g.40gb"), ("h100-nvl", "1g.12gb")):
        engine = engine_of(mig_node({0: [profile]}, [], model=model, gpus=1))
        info = engine.device("n", "0/1")
        assert info.memory_total_bytes <= engine_of(mig_node({}, [], model=model, gpus=1)).device("n", 0).memory_total_bytes

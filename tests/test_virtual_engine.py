"""Tests for the virtual GPU engine: determinism, physics invariants over any scenario, time structure.

Per-kind signatures and counter presets are in ``test_virtual_engine_kinds.py``; built-in
scenarios and validation in ``test_virtual_engine_scenarios.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.model import GpuSample
from agent.model.specs import achieved_flops, spec_by_key
from agent.virtual.devices import GIB
from agent.virtual.engine import VirtualEngine
from agent.virtual.physics import idle_power_w
from agent.virtual.scenario import builtin_scenario, parse_scenario
from agent.virtual.timeline import periodic_on_time
from tests.virtual_engine_helpers import POWER_CAP, RATIO_FIELDS, one_gpu

# ----------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_samples() -> None:
    a = list(VirtualEngine(builtin_scenario("demo")).iter_trace(20))
    b = list(VirtualEngine(builtin_scenario("demo")).iter_trace(20))
    assert a == b
    e1, e2 = VirtualEngine(builtin_scenario("demo")), VirtualEngine(builtin_scenario("demo"))
    for k in range(5):
        assert e1.sample("demo-node", 3, k * 0.7, (k + 1) * 0.7) == e2.sample("demo-node", 3, k * 0.7, (k + 1) * 0.7)


def test_different_seed_gives_different_samples() -> None:
    scenario = builtin_scenario("demo")
    other = scenario.model_copy(update={"seed": scenario.seed + 1})
    a = list(VirtualEngine(scenario).iter_trace(5))
    b = list(VirtualEngine(other).iter_trace(5))
    assert [s.gr_active for s in a] != [s.gr_active for s in b]
    assert [s.uuid for s in a] != [s.uuid for s in b]


def test_iter_trace_does_not_disturb_live_state() -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    engine.sample("demo-node", 0, 0.0, 1.0)
    list(engine.iter_trace(10))
    fresh = VirtualEngine(builtin_scenario("demo"))
    fresh.sample("demo-node", 0, 0.0, 1.0)
    assert engine.sample("demo-node", 0, 1.0, 2.0) == fresh.sample("demo-node", 0, 1.0, 2.0)


# ----------------------------------------------------------------------------- property invariants

MODELS = ("h100-sxm", "h200-sxm", "a100-sxm-80gb", "mi300x", "h100-pcie", "l40s", "b200")
_f = st.floats


def phase_strategy(kind: str, spec: Any) -> st.SearchStrategy[dict[str, Any]]:
    base: dict[str, st.SearchStrategy[Any]] = {
        "kind": st.just(kind), "duration_s": _f(0.5, 90.0), "thermal": st.booleans(),
        "mem_used_gib": st.none() | _f(0.0, spec.memory_bytes / GIB * 0.95),
    }
    extra: dict[str, st.SearchStrategy[Any]] = {
        "compute": {"mfu": _f(0.01, 0.97)},
        "memory": {"mbu": _f(0.01, 0.9)},
        "input_starved": {"duty": _f(0.05, 0.95), "busy_mfu": _f(0.05, 0.97), "period_s": _f(0.1, 3.0),
                          "iowait": _f(0.0, 0.5)},
        "comm_jitter": {"mfu": _f(0.05, 0.95), "compute_s": _f(0.1, 3.0), "comm_s": _f(0.0, 2.0),
                        "stall_prob": _f(0.0, 1.0), "stall_s": _f(0.0, 4.0), "straggler_rank": st.none() | st.just(1)},
        "latency": {},
        "idle": {"held": st.booleans()},
        "idle_held": {},
    }[kind]
    return st.fixed_dictionaries({**base, **extra})


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(MODELS))
    spec = spec_by_key(model)
    dtype = draw(st.sampled_from(sorted(spec.peak_flops)))
    cap = draw(st.none() | _f(0.25 * spec.tdp_w, spec.tdp_w))
    solo_kinds = st.sampled_from(["compute", "memory", "input_starved", "latency", "idle", "idle_held"])

    def phases(kinds: st.SearchStrategy[str], n: int) -> list[dict[str, Any]]:
        out = [draw(phase_strategy(draw(kinds), spec)) for _ in range(n)]
        return [{**p, "power_cap_w": cap} for p in out]

    solo = {"job": "solo", "gpus": [0], "dtype": dtype, "repeat": draw(st.booleans()),
            "phases": phases(solo_kinds, draw(st.integers(1, 3)))}
    pair_kinds = st.sampled_from(["comm_jitter", "comm_jitter", "compute", "idle"])
    pair_phases = phases(pair_kinds, draw(st.integers(1, 3)))
    pair_phases[0] = {**draw(phase_strategy("comm_jitter", spec)), "power_cap_w": cap}
    pair = {"job": "pair", "gpus": [1, 2], "dtype": dtype, "phases": pair_phases}
    # counters: full on every model, so the whole physics is checked (presets only hide fields).
    return {"name": "prop", "seed": draw(st.integers(0, 2**31)),
            "nodes": [{"name": "n", "model": model, "gpus": 4, "counters": "full", "workloads": [solo, pair]}]}


def check_invariants(s: GpuSample, engine: VirtualEngine, t0: float, t1: float, cap: float | None) -> None:
    info = engine.device(s.node, s.gpu)
    spec = info.spec
    assert spec is not None
    for name in RATIO_FIELDS:
        value = getattr(s, name)
        assert value is not None and 0.0 <= value <= 1.0, (name, value)
    assert s.dram_active <= 0.9
    assert s.dram_active * spec.mem_bandwidth_bytes_per_s <= spec.mem_bandwidth_bytes_per_s
    dtype = s.dtype or "bf16"
    if dtype in spec.peak_flops:
        flops = achieved_flops(spec, dtype, s.tensor_active, s.sm_clock_mhz)
        assert flops is not None and flops <= spec.peak_flops[dtype]
    assert s.tensor_active <= 0.97
    limit = min(spec.tdp_w, cap) if cap else spec.tdp_w
    assert idle_power_w(spec.tdp_w) <= s.power_w <= s.power_limit_w <= limit + 1e-9
    assert 0 < s.sm_clock_mhz <= s.sm_clock_max_mhz == spec.max_clock_mhz
    if s.clock_event_reasons & POWER_CAP:
        assert s.sm_clock_mhz < s.sm_clock_max_mhz
    assert 0 <= s.mem_used_bytes <= s.mem_total_bytes == info.memory_total_bytes
    for name in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
        assert 0.0 <= getattr(s, name) < 64e9
    link_peak = spec.link_bandwidth_bytes_per_s or 1e12
    assert 0.0 <= s.link_tx_bytes_per_s < link_peak and 0.0 <= s.link_rx_bytes_per_s < link_peak
    assert 0.0 <= s.net_tx_bytes_per_s < 50e9 and 0.0 <= s.net_rx_bytes_per_s < 50e9
    assert s.interval_s == pytest.approx(t1 - t0)
    assert 20.0 <= s.temperature_c <= 110.0
    assert 0.0 <= s.host.cpu_iowait_ratio <= 1.0 and 0.0 <= s.host.io_pressure_ratio <= 1.0


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=scenarios(), data=st.data())
def test_physical_invariants_hold_for_any_scenario(doc: dict[str, Any], data: st.DataObject) -> None:
    engine = VirtualEngine(parse_scenario(doc))
    cap = doc["nodes"][0]["workloads"][0]["phases"][0]["power_cap_w"]
    start = data.draw(_f(0.0, 400.0), label="start")
    steps = data.draw(st.lists(_f(0.05, 5.0), min_size=2, max_size=8), label="intervals")
    for gpu in range(4):
        t, energy = start, None
        for dt in steps:
            s = engine.sample("n", gpu, t, t + dt)
            check_invariants(s, engine, t, t + dt, cap if gpu < 3 else None)  # GPU 3 runs nothing
            if energy is not None:
                assert s.energy_j == pytest.approx(energy + s.power_w * dt)
                assert s.energy_j > energy
            energy, t = s.energy_j, t + dt


@settings(max_examples=200, deadline=None)
@given(a=_f(-20.0, 20.0), width=_f(0.0, 10.0), period=_f(0.2, 3.0), duty=_f(0.0, 1.0), offset=_f(0.0, 1.0))
def test_periodic_on_time_matches_brute_force(a: float, width: float, period: float, duty: float, offset: float) -> None:
    on_start, on_len = offset * period, duty * period
    b = a + width
    exact = periodic_on_time(a, b, period, on_start, on_len)
    k0, k1 = math.floor((a - on_start) / period) - 1, math.floor((b - on_start) / period) + 1
    brute = sum(max(0.0, min(b, k * period + on_start + on_len) - max(a, k * period + on_start)) for k in range(k0, k1 + 1))
    assert exact == pytest.approx(brute, abs=1e-9)


# ----------------------------------------------------------------------------- time structure


def test_phases_change_over_time_and_repeat() -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    assert [engine.true_class("demo-node", 7, t) for t in (10, 130, 200, 240)] == [
        "compute_bound", "idle", "compute_bound", "compute_bound"]
    early, late = engine.sample("demo-node", 7, 10, 11), engine.sample("demo-node", 7, 130, 131)
    assert early.tensor_active > 0.3 > late.tensor_active


def test_non_repeating_workload_holds_last_phase() -> None:
    engine = one_gpu({"kind": "compute", "duration_s": 10, "mfu": 0.5}, {"kind": "memory", "duration_s": 10, "mbu": 0.5},
                     repeat=False)
    assert [engine.true_class("n", 0, t) for t in (5, 15, 25, 5000)] == [
        "compute_bound", "memory_bound", "memory_bound", "memory_bound"]


def test_interval_spanning_a_phase_change_is_a_weighted_average() -> None:
    engine = one_gpu({"kind": "compute", "duration_s": 10, "mfu": 0.8}, {"kind": "idle", "duration_s": 10})
    inside_c, inside_i = engine.sample("n", 0, 8, 9), engine.sample("n", 0, 11, 12)
    across = engine.sample("n", 0, 9.5, 10.5)
    assert across.tensor_active == pytest.approx((inside_c.tensor_active + inside_i.tensor_active) / 2, abs=0.02)


def test_before_time_zero_is_idle() -> None:
    engine = one_gpu({"kind": "compute", "duration_s": 10, "mfu": 0.8})
    assert engine.true_class("n", 0, -1.0) == "idle"
    s = engine.sample("n", 0, -1.0, -0.5)
    assert s.gr_active == 0.0 and s.processes == ()


def test_iter_trace_labels_match_true_class_and_order() -> None:
    engine = VirtualEngine(builtin_scenario("cluster"))
    samples = list(engine.iter_trace(12, 2.0, start_ts=1000.0))
    assert len(samples) == 6 * 16
    keys = [(s.ts, engine.nodes.index(s.node), int(s.gpu)) for s in samples]
    assert keys == sorted(keys)
    for s in samples:
        t1 = s.ts - 1000.0
        assert s.label == engine.true_class(s.node, int(s.gpu), t1 - 1.0)
        assert s.interval_s == 2.0
    only = list(engine.iter_trace(3, nodes=["node-h200"]))
    assert {s.node for s in only} == {"node-h200"} and len(only) == 24


def test_iter_trace_labels_follow_phase_changes() -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    labels = [s.label for s in engine.iter_trace(240) if s.gpu == "7"]
    assert labels[:120] == ["compute_bound"] * 120 and labels[125:160] == ["idle"] * 35

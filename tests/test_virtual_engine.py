"""Tests for the virtual GPU engine: determinism, physics invariants, kind signatures, scenarios."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.model import CLOCK_EVENT_REASONS, SAMPLE_FIELDS, WORKLOAD_CLASSES, GpuSample
from agent.model.specs import achieved_flops, spec_by_key
from agent.virtual.devices import default_counters
from agent.virtual.engine import VirtualEngine
from agent.virtual.physics import idle_power_w
from agent.virtual.scenario import (
    BUILTIN_SCENARIOS,
    GIB,
    Scenario,
    ScenarioError,
    builtin_scenario,
    load_scenario,
    parse_scenario,
    resolve_scenario,
)
from agent.virtual.timeline import periodic_on_time

RATIO_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
                "fp16_active", "dram_active", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active",
                "tensor_dfma_active")
POWER_CAP = CLOCK_EVENT_REASONS["sw_power_cap"]


def one_gpu(*phases: dict[str, Any], model: str = "h100-sxm", seed: int = 1, counters: str | None = None,
            **workload: Any) -> VirtualEngine:
    """An engine with one node of one GPU running ``phases`` (``counters``: the node's preset)."""
    node: dict[str, Any] = {"name": "n", "model": model, "gpus": 1,
                            "workloads": [{"job": "j", "gpus": [0], "phases": list(phases), **workload}]}
    if counters is not None:
        node["counters"] = counters
    return VirtualEngine(parse_scenario({"name": "t", "seed": seed, "nodes": [node]}))


def series(engine: VirtualEngine, gpu: int = 0, *, start: float = 0.0, seconds: float = 60.0,
           interval: float = 1.0, node: str = "n") -> list[GpuSample]:
    count = int(round(seconds / interval))
    return [engine.sample(node, gpu, start + k * interval, start + (k + 1) * interval) for k in range(count)]


def mean(samples: list[GpuSample], name: str) -> float:
    return statistics.fmean(getattr(s, name) for s in samples)


def comm_wait_share(samples: list[GpuSample], link_peak: float) -> float:
    """classification.md §7.2 comm_wait_frac: resident kernels doing nothing."""
    waiting = [s for s in samples if s.gr_active >= 0.8 and s.sm_active <= 0.3 and s.tensor_active <= 0.05
               and s.dram_active <= 0.15 and s.link_tx_bytes_per_s <= 0.2 * link_peak]
    return len(waiting) / len(samples)


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


# ----------------------------------------------------------------------------- kind signatures


def test_compute_signature_matches_requested_mfu() -> None:
    engine = one_gpu({"kind": "compute", "duration_s": 600, "mfu": 0.75})
    samples = series(engine)
    spec = spec_by_key("h100-sxm")
    mfus = [achieved_flops(spec, "bf16", s.tensor_active, s.sm_clock_mhz) / spec.peak_flops["bf16"] for s in samples]
    assert statistics.fmean(mfus) == pytest.approx(0.75, abs=0.05)
    assert all(abs(m - 0.75) <= 0.05 for m in mfus)
    assert mean(samples, "tensor_active") >= 0.7
    assert mean(samples, "gr_active") >= 0.97 and mean(samples, "sm_active") >= 0.95
    assert 0.15 <= mean(samples, "dram_active") <= 0.35
    assert mean(samples, "power_w") > 0.8 * spec.tdp_w
    assert all(s.label is None and s.dtype == "bf16" for s in samples)


def test_memory_signature_tracks_mbu() -> None:
    samples = series(one_gpu({"kind": "memory", "duration_s": 600, "mbu": 0.6}))
    assert mean(samples, "dram_active") == pytest.approx(0.6, abs=0.03)
    assert max(s.tensor_active for s in samples) <= 0.1
    assert 0.5 <= mean(samples, "sm_active") <= 0.7
    assert mean(samples, "gr_active") >= 0.95


def test_input_starved_duty_cycle_and_loader_cpu() -> None:
    engine = one_gpu({"kind": "input_starved", "duration_s": 600, "duty": 0.55, "dataloader_cpu_cores": 7.5,
                      "iowait": 0.1})
    samples = series(engine, seconds=60)
    assert mean(samples, "gr_active") == pytest.approx(0.55, abs=0.03)
    assert max(s.link_tx_bytes_per_s for s in samples) == 0.0
    process = samples[0].processes[0]
    assert process.cpu_cores >= 8.5 and process.used_memory_bytes > 0
    assert samples[0].host.cpu_iowait_ratio >= 0.08
    fine = series(engine, seconds=4, interval=0.05)
    rx = [s.pcie_rx_bytes_per_s for s in fine]
    assert max(rx) > 10 * min(rx) and max(rx) > 1e10  # PCIe bursts at the start of busy periods
    assert min(s.gr_active for s in fine) < 0.05  # real gaps between bursts
    assert samples[0].workload is not None and samples[0].workload.job == "j"


@pytest.mark.parametrize("start", [0.0, 3.37, 41.9])
def test_input_starved_average_is_consistent_across_intervals(start: float) -> None:
    engine = one_gpu({"kind": "input_starved", "duration_s": 600, "duty": 0.4, "period_s": 0.7})
    one = engine.sample("n", 0, start, start + 1.0)
    tenths = [engine.sample("n", 0, start + k / 10, start + (k + 1) / 10) for k in range(10)]
    for name in ("gr_active", "sm_active", "tensor_active", "dram_active"):
        assert statistics.fmean(getattr(s, name) for s in tenths) == pytest.approx(getattr(one, name), abs=0.02)


def test_comm_jitter_straggler_waits_least_and_ranks_share_stalls() -> None:
    engine = VirtualEngine(builtin_scenario("demo"))
    link_peak = spec_by_key("h100-sxm").link_bandwidth_bytes_per_s
    victim = series(engine, 4, seconds=300, interval=0.25, node="demo-node")
    straggler = series(engine, 5, seconds=300, interval=0.25, node="demo-node")
    assert comm_wait_share(straggler, link_peak) < comm_wait_share(victim, link_peak)
    assert comm_wait_share(victim, link_peak) >= 0.25
    steps: dict[int, float] = {}
    for v, s in zip(victim, straggler):
        assert v.workload.step == s.workload.step and v.workload.step_time_s == s.workload.step_time_s
        assert (v.workload.rank, s.workload.rank, v.workload.world_size) == (0, 1, 2)
        steps[v.workload.step] = v.workload.step_time_s
    durations = list(steps.values())
    assert statistics.pstdev(durations) / statistics.fmean(durations) >= 0.15
    waits = [s for s in victim if s.tensor_active <= 0.05 and s.sm_active <= 0.3]
    assert waits and all(s.gr_active >= 0.9 for s in waits)


def test_comm_jitter_without_stalls_is_steady() -> None:
    doc = {"name": "t", "nodes": [{"name": "n", "model": "h100-sxm", "gpus": 2, "workloads": [
        {"job": "dp", "gpus": [0, 1], "phases": [{"kind": "comm_jitter", "duration_s": 600, "stall_prob": 0.0,
                                                   "step_jitter": 0.0}]}]}]}
    engine = VirtualEngine(parse_scenario(doc))
    times = [s.workload.step_time_s for s in series(engine, seconds=30)]
    assert max(times) - min(times) < 1e-9 and times[0] == pytest.approx(1.5 + 0.8)


def test_latency_signature() -> None:
    samples = series(one_gpu({"kind": "latency", "duration_s": 600}), seconds=30)
    assert mean(samples, "gr_active") == pytest.approx(0.9, abs=0.03)
    assert 0.2 <= mean(samples, "sm_active") <= 0.35
    assert 0.05 <= mean(samples, "tensor_active") <= 0.15
    assert 0.1 <= mean(samples, "dram_active") <= 0.2


def test_latency_defaults_are_the_old_signature() -> None:
    plain = series(one_gpu({"kind": "latency", "duration_s": 600}), seconds=10)
    explicit = series(one_gpu({"kind": "latency", "duration_s": 600, "sm": 0.28, "tensor": 0.1, "dram": 0.15}),
                      seconds=10)
    assert plain == explicit


def test_latency_overrides_change_the_signature() -> None:
    """Batch-1 decode of a small model on a big GPU: few SMs, almost no tensor work, more DRAM."""
    default = series(one_gpu({"kind": "latency", "duration_s": 600}), seconds=30)
    hard = series(one_gpu({"kind": "latency", "duration_s": 600, "sm": 0.12, "tensor": 0.02, "dram": 0.35}),
                  seconds=30)
    assert mean(hard, "gr_active") == pytest.approx(0.9, abs=0.03)  # engine busy as before
    assert mean(hard, "sm_active") == pytest.approx(0.12, abs=0.01)
    assert mean(hard, "tensor_active") == pytest.approx(0.02, abs=0.005)
    assert mean(hard, "dram_active") == pytest.approx(0.35, abs=0.02)
    assert all(s.sm_occupancy <= s.sm_active * 1.1 for s in hard)  # occupancy measured on active SMs
    assert mean(hard, "dram_active") > mean(default, "dram_active") + 0.15
    assert mean(hard, "sm_active") < mean(default, "sm_active") - 0.1
    assert all(s.label is None for s in hard)
    assert one_gpu({"kind": "latency", "duration_s": 9, "sm": 0.1}).true_class("n", 0, 1.0) == "latency_bound"


@pytest.mark.parametrize(("extra", "path", "message"), [
    ({"dram": 0.95}, "phases.0.dram", "less than or equal to 0.9"),
    ({"tensor": 0.98, "sm": 1.0}, "phases.0.tensor", "less than or equal to 0.97"),
    ({"sm": 1.2}, "phases.0.sm", "less than or equal to 1"),
    ({"tensor": 0.3}, "phases.0.tensor", "exceeds sm (0.28)"),
    ({"gr": 0.5}, "phases.0.gr", "Extra inputs"),
])
def test_latency_override_limits(extra: dict[str, float], path: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        one_gpu({"kind": "latency", "duration_s": 5, **extra})
    assert f"nodes.0.workloads.0.{path}: " in str(info.value) and message in str(info.value)


def test_idle_clocks_down_and_held_idle_keeps_memory() -> None:
    idle = series(one_gpu({"kind": "idle", "duration_s": 600}), seconds=20)
    held = series(one_gpu({"kind": "idle_held", "duration_s": 600, "mem_used_gib": 24}), seconds=20)
    idle_w = idle_power_w(700)
    for s in idle + held:
        assert s.gr_active < 0.02 and s.tensor_active == 0.0 and s.dram_active == 0.0
        assert s.power_w <= idle_w + 5.0
        assert s.sm_clock_mhz < 0.3 * s.sm_clock_max_mhz
        assert s.clock_event_reasons & CLOCK_EVENT_REASONS["gpu_idle"]
        assert s.workload is None and s.dtype is None
    assert all(s.processes == () for s in idle)
    assert all(s.processes[0].used_memory_bytes == 24 * GIB for s in held)
    assert all(s.mem_used_bytes > 24 * GIB for s in held)
    assert one_gpu({"kind": "idle_held", "duration_s": 9}).true_class("n", 0, 1.0) == "idle"


def test_power_cap_lowers_clock_in_proportion_and_sets_reason() -> None:
    clocks = []
    for cap in (None, 600, 450, 300):
        s = series(one_gpu({"kind": "compute", "duration_s": 600, "mfu": 0.75, "power_cap_w": cap}), seconds=5)
        if cap is None:
            assert all(x.clock_event_reasons & POWER_CAP == 0 for x in s)
            assert all(x.sm_clock_mhz == x.sm_clock_max_mhz for x in s)
        else:
            assert all(x.clock_event_reasons & POWER_CAP for x in s)
            assert all(x.power_w <= cap and x.power_limit_w == cap for x in s)
        clocks.append(mean(s, "sm_clock_mhz"))
    assert clocks == sorted(clocks, reverse=True) and clocks[-1] < 0.8 * clocks[0]


def test_power_follows_activity() -> None:
    powers = [mean(series(one_gpu({"kind": "compute", "duration_s": 60, "mfu": m}), seconds=10), "power_w")
              for m in (0.2, 0.5, 0.8)]
    assert powers[0] < powers[1] < powers[2]
    memory = [mean(series(one_gpu({"kind": "memory", "duration_s": 60, "mbu": m}), seconds=10), "power_w")
              for m in (0.3, 0.7)]
    assert idle_power_w(700) + 100 < memory[0] < memory[1] < powers[2]


def test_thermal_phase_sets_slowdown_bits() -> None:
    s = series(one_gpu({"kind": "compute", "duration_s": 60, "mfu": 0.6, "thermal": True}), seconds=3)
    bits = CLOCK_EVENT_REASONS["hw_slowdown"] | CLOCK_EVENT_REASONS["sw_thermal_slowdown"]
    assert all(x.clock_event_reasons & bits == bits for x in s)
    assert all(x.sm_clock_mhz < 0.8 * x.sm_clock_max_mhz for x in s)


def test_temperature_lags_power_and_energy_is_monotonic() -> None:
    engine = one_gpu({"kind": "idle", "duration_s": 30}, {"kind": "compute", "duration_s": 300, "mfu": 0.8})
    samples = series(engine, seconds=120)
    assert samples[31].temperature_c < samples[60].temperature_c < samples[119].temperature_c
    assert samples[31].power_w > 0.8 * samples[119].power_w  # power jumps at once, temperature does not
    energies = [s.energy_j for s in samples]
    assert all(b > a for a, b in zip(energies, energies[1:]))


# ----------------------------------------------------------------------------- counter presets

PIPES = {"sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
         "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active", "tensor_dfma_active"}
PRESET_HIDES = {"full": set(), "amdsmi": PIPES, "nvml_basic": PIPES, "minimal": PIPES | {"gr_active", "dram_active"}}
PRESET_LACKS = {"full": set(), "amdsmi": {"gpm", "sm_active", "sm_occupancy", "tensor_active", "pipe_activity"},
                "nvml_basic": {"gpm", "sm_active", "sm_occupancy", "tensor_active", "pipe_activity"},
                "minimal": {"gpm", "sm_active", "sm_occupancy", "tensor_active", "pipe_activity", "gr_active",
                            "dram_active"}}
FULL_CAPS = {"gpm", "gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "pipe_activity",
             "pcie", "power", "energy", "temperature", "clocks", "clock_event_reasons", "memory", "processes",
             "nvlink"}


@pytest.mark.parametrize("preset", ["full", "amdsmi", "nvml_basic", "minimal"])
def test_counter_preset_nulls_exactly_its_fields(preset: str) -> None:
    phase = {"kind": "comm_jitter", "duration_s": 600}
    doc = {"name": "t", "seed": 4, "nodes": [{"name": "n", "model": "h100-sxm", "gpus": 2, "counters": "full",
                                              "workloads": [{"job": "j", "gpus": [0, 1], "phases": [phase]}]}]}
    full = VirtualEngine(parse_scenario(doc))
    doc["nodes"][0]["counters"] = preset
    engine = VirtualEngine(parse_scenario(doc))
    for k in range(20):
        want, got = full.sample("n", 0, k * 0.5, (k + 1) * 0.5), engine.sample("n", 0, k * 0.5, (k + 1) * 0.5)
        for name in SAMPLE_FIELDS:
            if name in PRESET_HIDES[preset]:
                assert getattr(got, name) is None and getattr(want, name) is not None, name
            else:
                assert getattr(got, name) == getattr(want, name), name
    caps = set(engine.device("n", 0).capabilities)
    assert caps == FULL_CAPS - PRESET_LACKS[preset]


@pytest.mark.parametrize(("model", "preset"), [
    ("h100-sxm", "full"), ("h100-pcie", "full"), ("h100-nvl", "full"), ("h200-sxm", "full"),
    ("gh200-96gb", "full"), ("gh200-144gb", "full"), ("b200", "full"),
    ("a100-sxm-80gb", "nvml_basic"), ("a100-pcie-40gb", "nvml_basic"), ("l40s", "nvml_basic"), ("l4", "nvml_basic"),
    ("a10", "nvml_basic"), ("a10g", "nvml_basic"),
    ("mi250x", "amdsmi"), ("mi300x", "amdsmi"), ("mi325x", "amdsmi"), ("mi355x", "amdsmi"),
])
def test_default_counter_preset_by_vendor_and_architecture(model: str, preset: str) -> None:
    assert default_counters(model, spec_by_key(model).vendor) == preset
    engine = VirtualEngine(parse_scenario({"name": "t", "nodes": [{"name": "n", "model": model, "gpus": 1}]}))
    s = engine.sample("n", 0, 0.0, 1.0)
    hidden = {name for name in RATIO_FIELDS if getattr(s, name) is None}
    assert hidden == PRESET_HIDES[preset]
    caps = set(engine.device("n", 0).capabilities)
    assert not caps & PRESET_LACKS[preset]
    assert {"gr_active", "dram_active", "power", "clocks"} <= caps
    assert ("gpm" in caps) == (preset == "full")
    assert s.power_w is not None and s.sm_clock_mhz is not None and s.mem_total_bytes


def test_counters_full_is_allowed_on_any_model_and_shows_the_physics() -> None:
    for model in ("mi300x", "a100-sxm-80gb", "l40s"):
        spec = spec_by_key(model)
        samples = series(one_gpu({"kind": "compute", "duration_s": 60, "mfu": 0.5}, model=model, counters="full"),
                         seconds=10)
        mfus = [achieved_flops(spec, "bf16", s.tensor_active, s.sm_clock_mhz) / spec.peak_flops["bf16"]
                for s in samples]
        assert statistics.fmean(mfus) == pytest.approx(0.5, abs=0.05), model
        default = series(one_gpu({"kind": "compute", "duration_s": 60, "mfu": 0.5}, model=model), seconds=3)
        assert all(s.tensor_active is None and s.gr_active is not None for s in default)
    with pytest.raises(ScenarioError, match=r"nodes\.0\.counters: Input should be 'full'"):
        one_gpu({"kind": "idle", "duration_s": 5}, counters="dcgm")


def test_minimal_preset_labels_are_unknown() -> None:
    doc = {"name": "t", "nodes": [{"name": "n", "model": "h100-sxm", "gpus": 3, "counters": "minimal", "workloads": [
        {"job": "a", "gpus": [0], "phases": [{"kind": "compute", "duration_s": 60, "mfu": 0.6}]},
        {"job": "b", "gpus": [1], "phases": [{"kind": "memory", "duration_s": 60, "mbu": 0.6}]}]}]}
    engine = VirtualEngine(parse_scenario(doc))
    trace = list(engine.iter_trace(20))
    assert len(trace) == 60 and {s.label for s in trace} == {"unknown"}
    assert all(s.gr_active is None and s.dram_active is None and s.tensor_active is None for s in trace)
    assert all(s.power_w is not None and s.sm_clock_mhz is not None for s in trace)
    assert {engine.true_class("n", g, t) for g in range(3) for t in (-1.0, 5.0)} == {"unknown"}
    assert engine.sample("n", 0, 1.0, 2.0, labelled=True).label == "unknown"
    doc["nodes"][0]["counters"] = "nvml_basic"
    basic = VirtualEngine(parse_scenario(doc))
    assert [basic.true_class("n", g, 5.0) for g in range(3)] == ["compute_bound", "memory_bound", "idle"]
    assert {s.label for s in basic.iter_trace(5) if s.gpu == "1"} == {"memory_bound"}


def test_fp8_on_a100_is_rejected() -> None:
    with pytest.raises(ScenarioError, match=r"nodes\.0\.workloads\.0\.dtype: fp8 not supported"):
        one_gpu({"kind": "compute", "duration_s": 1, "mfu": 0.5}, model="a100-sxm-80gb", dtype="fp8")


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

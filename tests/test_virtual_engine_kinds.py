"""Tests for the virtual engine's per-kind signatures (compute, memory, input-starved,
comm-jitter, latency, idle; power caps, thermal) and for what each counter preset hides."""

from __future__ import annotations

import statistics

import pytest

from agent.model import CLOCK_EVENT_REASONS, SAMPLE_FIELDS, GpuSample
from agent.model.specs import achieved_flops, spec_by_key
from agent.virtual.devices import GIB, default_counters
from agent.virtual.engine import VirtualEngine
from agent.virtual.physics import idle_power_w
from agent.virtual.scenario import ScenarioError, builtin_scenario, parse_scenario
from agent.virtual.sampling import mem_busy_share
from tests.virtual_engine_helpers import POWER_CAP, RATIO_FIELDS, mean, one_gpu, series


def comm_wait_share(samples: list[GpuSample], link_peak: float) -> float:
    """classification.md §7.2 comm_wait_frac: resident kernels doing nothing."""
    waiting = [s for s in samples if s.gr_active >= 0.8 and s.sm_active <= 0.3 and s.tensor_active <= 0.05
               and s.dram_active <= 0.15 and s.link_tx_bytes_per_s <= 0.2 * link_peak]
    return len(waiting) / len(samples)


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
PRESET_HIDES = {"full": set(), "amdsmi": PIPES, "nvml_basic": PIPES | {"dram_active"},
                "minimal": PIPES | {"gr_active", "dram_active"}}
PRESET_ADDS = {"nvml_basic": {"mem_busy"}}
"""Fields a preset reads that the full set does not: NVML utilization.memory (busy time)."""
PRESET_LACKS = {"full": set(), "amdsmi": {"gpm", "sm_active", "sm_occupancy", "tensor_active", "pipe_activity"},
                "nvml_basic": {"gpm", "sm_active", "sm_occupancy", "tensor_active", "pipe_activity", "dram_active"},
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
            elif name in PRESET_ADDS.get(preset, ()):
                assert getattr(got, name) == mem_busy_share(want.dram_active) and getattr(want, name) is None, name
            else:
                assert getattr(got, name) == getattr(want, name), name
    caps = set(engine.device("n", 0).capabilities)
    assert caps == (FULL_CAPS - PRESET_LACKS[preset]) | PRESET_ADDS.get(preset, set())


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
    assert {"gr_active", "power", "clocks"} <= caps and ({"dram_active", "mem_busy"} & caps)
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

"""Sampling one simulated device over an interval of virtual time: the engine's hot path.

A sample is a function of the compiled :class:`~agent.virtual.plans.GpuPlan`, the interval and
two small per-device accumulators (:class:`GpuState`). Interval averages are computed in closed
form from the phase pattern (:func:`_integrate`), so any sampling interval sees the same averages;
noise comes from a hash of (seed, node, GPU, time), so the same seed gives the same samples.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable

from agent.model import GpuSample, HostSample, ProcessSample
from agent.virtual.kinds import PhasePlan
from agent.virtual.physics import (
    DRAM_MAX,
    TENSOR_MAX,
    State,
    clamp,
    lagged_temperature_c,
    noise16,
    steady_temperature_c,
)
from agent.virtual.plans import GpuPlan, true_label
from agent.virtual.timeline import Occurrence

DRIVER_RESERVE = 512 * 1024**2
"""Device memory the driver and CUDA context take once any process is attached."""


@dataclass(slots=True)
class GpuState:
    """The only history a GPU keeps: its energy counter and its (lagging) temperature."""

    energy_j: float
    temp_c: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def sample_device(plan: GpuPlan, state: GpuState, t0: float, t1: float, ts: float, labelled: bool,
                  host_of: Callable[[str, float], HostSample]) -> GpuSample:
    """The interval-average sample of one device over virtual time [t0, t1), stamped ``ts``.

    Advances ``state`` (energy counter, lagging temperature); ``host_of(node, t1)`` gives the
    node-wide host facts, which the engine caches per node since every device shares them.
    """
    dt = t1 - t0
    if not dt > 0.0:
        raise ValueError(f"empty interval [{t0}, {t1})")
    mix, end_plan, end_occ = _integrate(plan, t0, t1)
    act, clock, power, limit, reasons, temp_offset = mix
    dev = plan.dev
    n = noise16(plan.noise_key, t1)
    power = clamp(power + n[13] * (0.015 * (power - dev.idle_w) + 1.5), dev.idle_w, limit)
    if dev.idle_clock_mhz < clock < dev.max_clock_mhz:  # boost and idle clocks are exact bins
        clock *= 1.0 - 0.003 * abs(n[15])  # DVFS wobble, only ever downwards from where it was
    with state.lock:
        state.energy_j += power * dt
        state.temp_c = lagged_temperature_c(state.temp_c, steady_temperature_c(power, dev, temp_offset), dt)
        energy, temp = state.energy_j, state.temp_c
    processes = _processes(plan, end_plan)
    if plan.holders and processes:
        processes = _holder_processes(plan, processes[0], act[1])
    used = sum(p.used_memory_bytes or 0 for p in processes)
    mem_used = min(dev.mem_total_bytes, used + DRIVER_RESERVE) if processes else 0
    busy = end_plan.kind != "idle" and end_plan.kind != "idle_held"
    report = end_plan.report(end_occ, t1) if end_occ is not None else None
    values = dict(
        ts=ts, gpu=plan.info.gpu, node=plan.node, uuid=plan.info.uuid, vendor=plan.info.vendor,
        model=plan.info.model, interval_s=dt,
        gr_active=_ratio(act[0], 0.01 * n[0]),
        sm_active=_ratio(act[1], 0.02 * n[1]),
        sm_occupancy=_ratio(act[2], 0.03 * n[2]),
        tensor_active=_ratio(act[3], 0.015 * n[3], TENSOR_MAX),
        fp64_active=_ratio(act[4], 0.03 * n[4]),
        fp32_active=_ratio(act[5], 0.03 * n[5]),
        fp16_active=_ratio(act[6], 0.03 * n[6]),
        dram_active=_ratio(act[7], 0.02 * n[7], DRAM_MAX),
        pcie_tx_bytes_per_s=_rate(act[8], n[8], dev.pcie_bytes_per_s),
        pcie_rx_bytes_per_s=_rate(act[9], n[9], dev.pcie_bytes_per_s),
        link_tx_bytes_per_s=_rate(act[10], n[10], dev.link_bytes_per_s),
        link_rx_bytes_per_s=_rate(act[10], n[11], dev.link_bytes_per_s),
        net_tx_bytes_per_s=_rate(act[11], n[12], dev.net_bytes_per_s),
        net_rx_bytes_per_s=_rate(act[11], -n[12], dev.net_bytes_per_s),
        power_w=power, temperature_c=round(temp + 0.3 * n[14], 2),
        sm_clock_mhz=round(clock, 1), sm_clock_max_mhz=dev.max_clock_mhz,
        mem_used_bytes=mem_used, mem_total_bytes=dev.mem_total_bytes,
        clock_event_reasons=reasons, dtype=plan.dtype if busy else None,  # type: ignore[arg-type]
        processes=processes, host=host_of(plan.node, t1), workload=report,
        label=true_label(plan, t0 + dt / 2) if labelled else None,
        energy_j=energy, power_limit_w=limit,
        attribution=plan.attribution,
    )
    values.update(_tensor_split(values["tensor_active"], plan.dtype))
    if plan.mem_busy:
        values["mem_busy"] = mem_busy_share(values["dram_active"])
    for name in plan.hidden:
        values[name] = None
    return GpuSample(**values)  # type: ignore[arg-type]


def _processes(plan: GpuPlan, phase: PhasePlan) -> tuple[ProcessSample, ...]:
    """The (cached, immutable) process list while ``phase`` runs: one process or none."""
    key = id(phase)
    cached = plan.processes.get(key)
    if cached is None:
        cached = ()
        if phase.holds_process:
            cached = (ProcessSample(pid=plan.pid, name=plan.process_name, used_memory_bytes=phase.process_bytes,
                                    cpu_cores=phase.cpu_cores, cpu_main_cores=phase.cpu_cores - phase.cpu_workers_cores,
                                    cpu_workers_cores=phase.cpu_workers_cores, workers=phase.workers),)
        plan.processes[key] = cached
    return cached


def _holder_processes(plan: GpuPlan, job: ProcessSample, sm_active: float) -> tuple[ProcessSample, ...]:
    """A shared GPU's processes: one per holder, splitting the interval's SM time by the holders' shares; on AMD
    also the compute units its queues occupy (amdsmi ``cu_occupancy``), the same share of the busy CUs."""
    cus = plan.info.sm_count if plan.info.vendor == "amd" else None
    return tuple(ProcessSample(pid=holder.pids[0], name=job.name, used_memory_bytes=memory,
                               sm_util=round(min(1.0, max(0.0, sm_active * share)), 4), cpu_cores=job.cpu_cores,
                               compute_units=round(cus * min(1.0, max(0.0, sm_active * share))) if cus else None)
                 for holder, share, memory in plan.holders)


def _tensor_split(tensor: float | None, dtype: str | None) -> dict[str, float | None]:
    """GPM's per-pipe tensor activity: FP64 matrix math runs on DMMA, FP8/16/BF16/TF32 on HMMA."""
    if tensor is None:
        return {}
    fp64 = dtype == "fp64"
    return {"tensor_hmma_active": 0.0 if fp64 else tensor, "tensor_dmma_active": tensor if fp64 else 0.0,
            "tensor_imma_active": 0.0, "tensor_dfma_active": 0.0}


MEM_BUSY_PER_BANDWIDTH = 1.25
"""Memory busy time per unit of bandwidth share: the interface is busy whenever a transfer is in
flight, so it reads higher than the bandwidth share and saturates before the bandwidth roof
(~0.8 of peak is the practical maximum). A simulator's simple model, not a calibration."""


def mem_busy_share(dram_active: float | None) -> float | None:
    """NVML utilization.memory as the virtual GPU would show it, from its DRAM bandwidth share."""
    return None if dram_active is None else round(min(1.0, MEM_BUSY_PER_BANDWIDTH * dram_active), 4)


def _ratio(value: float, relative_noise: float, hi: float = 1.0) -> float:
    """A 0..hi ratio with multiplicative noise (zero stays zero), rounded to keep traces short."""
    return round(clamp(value * (1.0 + relative_noise), 0.0, hi), 4)


def _rate(util: float, noise: float, peak: float) -> float:
    """Whole bytes/s from a utilisation, with a little noise, never negative nor above 95% of peak."""
    return float(math.floor(clamp(util * (1.0 + 0.05 * noise), 0.0, 0.95) * peak))


def _integrate(plan: GpuPlan, t0: float, t1: float
               ) -> tuple[tuple[list[float], float, float, float, int, float], PhasePlan, Occurrence | None]:
    """Time-average the states a GPU passes through in [t0, t1), phase by phase.

    Returns (activity, clock, power, highest limit, reasons, temperature offset), the phase
    plan at the end of the interval and its occurrence (None before the scenario starts).
    """
    pieces: list[tuple[State, float]] = []
    end_plan, end_occ = plan.before_start, None
    if t0 < 0.0:
        pieces.append((plan.before_start.weights(Occurrence(0, 0, -math.inf, 0.0), t0, min(t1, 0.0))[0]))
    t = max(t0, 0.0)
    while t < t1:
        occ = plan.schedule.locate(t)
        end = min(t1, occ.end)
        if end <= t:
            end = t1
        end_plan, end_occ = plan.plans[occ.index], occ
        pieces.extend(end_plan.weights(occ, t, end))
        t = end
    return _mix(pieces, t1 - t0), end_plan, end_occ


def _mix(pieces: list[tuple[State, float]], dt: float) -> tuple[list[float], float, float, float, int, float]:
    act = [0.0] * 12
    clock = power = temp = 0.0
    limit, reasons, top, top_w = 0.0, 0, 0, -1.0
    for state, w in pieces:
        if w <= 0.0:
            continue
        f = w / dt
        for i, v in enumerate(state.act):
            act[i] += f * v
        clock += f * state.clock_mhz
        power += f * state.power_w
        temp += f * state.temp_offset_c
        limit = max(limit, state.limit_w)
        if f >= 0.25:
            reasons |= state.reasons
        if w > top_w:
            top, top_w = state.reasons, w
    return act, clock, power, limit, reasons | top, temp

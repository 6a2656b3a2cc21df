"""Power, clocks, temperature and noise for the virtual GPUs.

The model is deliberately small and linear so that every sample stays physically consistent
(the property tests check it), and so that averaging over an interval commutes with it:

* **Power** is idle power plus a linear function of activity (GR, SM, tensor, DRAM, links)
  scaled to the TDP. A 0.75-MFU GEMM on an H100 demands about 630 W; a 0.93-MFU GEMM slightly
  more than 700 W, so it runs into the power cap as real ones do.
* **Clock**: a busy GPU runs at its maximum boost clock unless the demanded power exceeds the
  enforced limit; then the clock drops until power fits (dynamic power ~ clock squared, which
  is roughly what DVFS gives) and the ``sw_power_cap`` reason is set. A thermal phase cuts the
  clock further and sets the slowdown and thermal bits. An idle GPU drops to its idle clock.
* **Temperature** follows power to a steady state with a first-order lag.
* **Noise** is bounded, deterministic and derived from a hash, never from global state, so two
  engines with the same seed produce identical samples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

from agent.model import CLOCK_EVENT_REASONS, GpuSpec

GPU_IDLE = CLOCK_EVENT_REASONS["gpu_idle"]
SW_POWER_CAP = CLOCK_EVENT_REASONS["sw_power_cap"]
HW_SLOWDOWN = CLOCK_EVENT_REASONS["hw_slowdown"]
SW_THERMAL = CLOCK_EVENT_REASONS["sw_thermal_slowdown"]

TENSOR_MAX = 0.97
"""Tensor pipes never read above this (cuBLAS saturates at 0.90-0.95)."""
DRAM_MAX = 0.9
"""DRAM activity ceiling; about 0.8 is the practical maximum on real parts."""

# Weights of the linear power model: fraction of (TDP - idle) drawn by each activity at full.
_W_GR, _W_SM, _W_TENSOR, _W_DRAM, _W_LINK = 0.10, 0.20, 0.70, 0.30, 0.05
_THERMAL_CLOCK = 0.72
_CLOCK_BIN = 15.0
_GAP_POWER = 0.08
"""Power share of a GPU that is awake between kernels (clocks up, no work)."""

AMBIENT_C = 30.0
_TEMP_RISE_C = 52.0
_THERMAL_EXTRA_C = 16.0
TEMP_TAU_S = 20.0


class Activity(NamedTuple):
    """Interval-average activity of one GPU; link and bus fields are fractions of their peaks."""

    gr: float = 0.0
    sm: float = 0.0
    occ: float = 0.0
    tensor: float = 0.0
    fp64: float = 0.0
    fp32: float = 0.0
    fp16: float = 0.0
    dram: float = 0.0
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    link: float = 0.0
    net: float = 0.0


IDLE_ACTIVITY = Activity()


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """The per-GPU constants the physics needs, derived once from the catalogue spec."""

    tdp_w: float
    idle_w: float
    max_clock_mhz: float
    idle_clock_mhz: float
    ref_clock_mhz: float
    pcie_bytes_per_s: float
    link_bytes_per_s: float
    net_bytes_per_s: float
    mem_total_bytes: int
    power_share: float = 1.0
    """Share of the GPU's power this device stands for (a MIG instance's g/7), applied to caps."""

    @classmethod
    def from_spec(cls, spec: GpuSpec, *, pcie_bytes_per_s: float, link_bytes_per_s: float | None,
                  net_bytes_per_s: float, mem_total_bytes: int) -> "DeviceModel":
        tdp = float(spec.tdp_w or 300.0)
        max_clock = float(spec.max_clock_mhz or spec.ref_clock_mhz or 1500.0)
        return cls(
            tdp_w=tdp,
            idle_w=idle_power_w(tdp),
            max_clock_mhz=max_clock,
            idle_clock_mhz=round(max_clock * 0.175),
            ref_clock_mhz=float(spec.ref_clock_mhz or max_clock),
            pcie_bytes_per_s=pcie_bytes_per_s,
            link_bytes_per_s=float(link_bytes_per_s or 0.0),
            net_bytes_per_s=net_bytes_per_s,
            mem_total_bytes=mem_total_bytes,
        )

    def share(self, fraction: float) -> "DeviceModel":
        """A MIG instance's slice of this GPU: TDP, idle draw and any power cap times ``fraction``.

        Clocks and capping then behave as on the whole GPU (same relative load), while the
        instance's own power stays internal: NVML reports no power per MIG instance.
        """
        return dataclasses.replace(self, tdp_w=self.tdp_w * fraction, idle_w=self.idle_w * fraction,
                                   power_share=self.power_share * fraction)

    @property
    def tensor_scale(self) -> float:
        """Tensor activity per unit MFU at the unthrottled clock (>1 only if max clock < ref)."""
        return self.ref_clock_mhz / min(self.ref_clock_mhz, self.max_clock_mhz)


def idle_power_w(tdp_w: float) -> float:
    """Idle draw: 10% of TDP (70 W on a 700 W H100), at least 25 W."""
    return max(25.0, 0.1 * tdp_w)


class State(NamedTuple):
    """One steady operating point of a GPU (e.g. "computing", "waiting in NCCL", "idle")."""

    act: Activity
    clock_mhz: float
    power_w: float
    limit_w: float
    reasons: int
    temp_offset_c: float


def power_demand_w(act: Activity, dev: DeviceModel) -> float:
    """Power the activity would draw at the maximum clock, before any cap."""
    load = _W_GR * act.gr + _W_SM * act.sm + _W_TENSOR * act.tensor + _W_DRAM * act.dram + _W_LINK * act.link
    return dev.idle_w + (dev.tdp_w - dev.idle_w) * load


def make_state(act: Activity, dev: DeviceModel, *, power_cap_w: float | None = None,
               thermal: bool = False, mode: str = "active", clock_of: "State | None" = None) -> State:
    """Operating point for ``act``: ``mode`` is ``active``, ``idle`` (clocks down) or ``gap``.

    ``gap`` is an awake GPU between kernels (sub-second data-loader gaps): no work, but the
    clock stays where ``clock_of`` (the busy state) put it and no idle reason is raised.
    """
    limit = min(dev.tdp_w, power_cap_w * dev.power_share) if power_cap_w else dev.tdp_w
    if mode == "idle":
        return State(act, dev.idle_clock_mhz, dev.idle_w, limit, GPU_IDLE, 0.0)
    if mode == "gap":
        clock = clock_of.clock_mhz if clock_of is not None else dev.max_clock_mhz
        reasons = clock_of.reasons if clock_of is not None else 0
        return State(act, clock, dev.idle_w + _GAP_POWER * (dev.tdp_w - dev.idle_w), limit, reasons, 0.0)
    demand = power_demand_w(act, dev)
    clock, power, reasons = dev.max_clock_mhz, demand, 0
    if demand > limit:
        factor = math.sqrt(max(0.0, limit - dev.idle_w) / (demand - dev.idle_w))
        # DVFS steps in 15 MHz bins: a binding cap always costs at least one bin.
        clock, power, reasons = min(dev.max_clock_mhz - _CLOCK_BIN, dev.max_clock_mhz * factor), limit, SW_POWER_CAP
    temp_offset = 0.0
    if thermal:
        clock *= _THERMAL_CLOCK
        power = dev.idle_w + (power - dev.idle_w) * _THERMAL_CLOCK**2
        reasons |= HW_SLOWDOWN | SW_THERMAL
        temp_offset = _THERMAL_EXTRA_C
    return State(act, clock, power, limit, reasons, temp_offset)


def steady_temperature_c(power_w: float, dev: DeviceModel, offset_c: float = 0.0) -> float:
    """Temperature the GPU settles at under constant power."""
    span = max(1.0, dev.tdp_w - dev.idle_w)
    return AMBIENT_C + 4.0 + _TEMP_RISE_C * (power_w - dev.idle_w) / span + offset_c


def lagged_temperature_c(previous_c: float | None, target_c: float, dt_s: float) -> float:
    """First-order lag toward ``target_c`` (time constant :data:`TEMP_TAU_S`)."""
    if previous_c is None:
        return target_c
    return target_c + (previous_c - target_c) * math.exp(-dt_s / TEMP_TAU_S)


# ----------------------------------------------------------------------------- noise

_TICK = struct.Struct("<q")
_U16 = struct.Struct("<16H")


def hash_prefix(*parts: object) -> bytes:
    """Stable bytes for a tuple of names and numbers (Python's ``hash`` is salted per process)."""
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).digest()


def noise16(prefix: bytes, t: float) -> tuple[float, ...]:
    """Sixteen uniform values in [-1, 1] for ``prefix`` at time ``t`` (quantised to 1 ms)."""
    digest = hashlib.blake2b(prefix + _TICK.pack(round(t * 1000.0)), digest_size=32).digest()
    return tuple(v / 32767.5 - 1.0 for v in _U16.unpack(digest))


def unit_hash(prefix: bytes, *parts: object) -> float:
    """One uniform value in [0, 1) keyed by ``prefix`` and ``parts``."""
    digest = hashlib.blake2b(prefix + "\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def clamp(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x

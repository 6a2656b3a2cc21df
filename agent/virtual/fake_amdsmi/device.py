"""The fake driver's devices: a socket per physical GPU, a processor per partition, and their integrals.

Each processor handle (a whole GPU in SPX, one partition otherwise) owns a
:class:`~agent.virtual.fake_nvml.device.Counters` (ratio- and byte-integrals over the virtual
engine's samples, shared with the NVML fake) plus what only amdsmi reports: seconds spent power-
or thermally limited (the PPT / thermal residency accumulators), seconds of low utilisation, and
per-process graphics-engine time. Clock-event reasons map onto the residency accumulators as
PPT (power cap, power brake), socket thermal (SW thermal), HBM thermal (HW thermal) and PROCHOT
(HW slowdown). Socket readings (the gpu_metrics table) aggregate the
partitions: sums for power, energy and bus traffic, means for activity, maxima for temperature.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.model import DeviceInfo, GpuSample
from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_nvml.ctypes_io import Fail
from agent.virtual.fake_nvml.device import KEY_INDEX, Counters

if TYPE_CHECKING:
    from agent.virtual.backend import VirtualBackend

POWER_LIMIT_BITS = 0x4 | 0x80
"""Clock-event reasons that mean the package power tracker (PPT) holds the clock: SW power cap, power brake."""
SOCKET_THERMAL_BITS = 0x20
"""SW thermal slowdown: the socket thermal limit (TVIOL)."""
HBM_THERMAL_BITS = 0x40
"""HW thermal slowdown: read as the HBM thermal limit, the one thermal limit besides the socket's."""
PROCHOT_BITS = 0x8
"""HW slowdown: PROCHOT asserted."""
LIMIT_BITS = POWER_LIMIT_BITS | SOCKET_THERMAL_BITS | HBM_THERMAL_BITS | PROCHOT_BITS
LINK_WEIGHT_PATTERN = (1.30, 0.85, 1.10, 0.70, 1.20, 0.95, 0.90, 1.00)
"""Fixed, uneven shares of the fabric traffic per XGMI link (normalised over the model's links):
real collectives never load the links of a hive evenly."""


@dataclass(frozen=True, slots=True)
class Span:
    """What the latest advance of one device covered: seconds, and the seconds each limit held the clock."""

    dt: float = 0.0
    ppt_s: float = 0.0
    thermal_s: float = 0.0
    hbm_thermal_s: float = 0.0
    prochot_s: float = 0.0
    limited_s: float = 0.0


class AmdDevice:
    """One amdsmi processor: a whole GPU (SPX) or compute partition ``partition`` of GPU ``index``."""

    def __init__(self, index: int, partition: int, info: DeviceInfo, hidden: frozenset[str]) -> None:
        self.index = index
        self.partition = partition
        self.gpu = info.gpu
        self.info = info
        self.counters = Counters(info.gpu, hidden)
        self.lock = threading.Lock()
        self.ppt_s = 0.0
        self.thermal_s = 0.0
        self.hbm_thermal_s = 0.0
        self.prochot_s = 0.0
        self.limited_s = 0.0
        """Seconds with the clock below what the host asked for, for any power or thermal reason."""
        self.low_util_s = 0.0
        """Idle-engine seconds: the integral of (1 - gr_active)."""
        self.reasons_known = True
        self.process_gfx_ns: dict[int, float] = {}
        self.span = Span()

    @property
    def latest(self) -> GpuSample | None:
        return self.counters.latest

    def advance(self, backend: "VirtualBackend", now: float) -> GpuSample:
        """Bring the integrals up to ``now``; a failing virtual read is AMDSMI_STATUS_API_FAILED."""
        with self.lock:
            before = self.counters.latest
            try:
                sample = self.counters.advance(backend, now)
            except Fail:  # Counters speaks NVML codes
                raise Fail(codes.STATUS_API_FAILED) from None
            if sample is not before:
                self._integrate(sample)
            return sample

    def _integrate(self, s: GpuSample) -> None:
        dt = s.interval_s or 0.0
        self.reasons_known = s.clock_event_reasons is not None
        reasons = s.clock_event_reasons or 0
        span = Span(dt, *(dt if reasons & bits else 0.0 for bits in (
            POWER_LIMIT_BITS, SOCKET_THERMAL_BITS, HBM_THERMAL_BITS, PROCHOT_BITS, LIMIT_BITS)))
        self.ppt_s += span.ppt_s
        self.thermal_s += span.thermal_s
        self.hbm_thermal_s += span.hbm_thermal_s
        self.prochot_s += span.prochot_s
        self.limited_s += span.limited_s
        if s.gr_active is not None:
            self.low_util_s += (1.0 - s.gr_active) * dt
        self.span = span
        procs = s.processes or ()
        if procs and s.gr_active is not None:
            share_ns = s.gr_active / len(procs) * dt * 1e9
            for p in procs:
                self.process_gfx_ns[p.pid] = self.process_gfx_ns.get(p.pid, 0.0) + share_ns

    def integral(self, key: str) -> float:
        """Ratio-seconds or bytes the counters hold for a GpuSample field (``gr_active``, ``pcie_tx_bytes_per_s``)."""
        return self.counters.snapshot().totals[KEY_INDEX[key]]

    def hidden(self, key: str) -> bool:
        return key in self.counters.hidden


class AmdSocket:
    """One physical GPU: its partitions (a single device in SPX) and its XGMI links."""

    def __init__(self, index: int, devices: list[AmdDevice], link_count: int) -> None:
        self.index = index
        self.devices = devices
        self.link_count = link_count
        raw = [LINK_WEIGHT_PATTERN[i % len(LINK_WEIGHT_PATTERN)] for i in range(link_count)]
        total = sum(raw) or 1.0
        self.link_weights = tuple(w / total for w in raw)

    @property
    def primary(self) -> AmdDevice:
        return self.devices[0]

    def values(self, field: str) -> list[float] | None:
        """``field`` of every partition's latest sample; None when any partition cannot read it."""
        out = []
        for dev in self.devices:
            s = dev.latest
            v = getattr(s, field) if s is not None else None
            if v is None:
                return None
            out.append(float(v))
        return out

    def total(self, field: str) -> float | None:
        v = self.values(field)
        return sum(v) if v is not None else None

    def mean(self, field: str) -> float | None:
        v = self.values(field)
        return sum(v) / len(v) if v else None

    def peak(self, field: str) -> float | None:
        v = self.values(field)
        return max(v) if v else None

    def integral(self, key: str) -> float | None:
        """Sum of the partitions' integrals of ``key``; None when the preset hides it."""
        if any(dev.hidden(key) for dev in self.devices):
            return None
        return sum(dev.integral(key) for dev in self.devices)

    def as_of(self) -> float:
        """Wall-clock time of the newest advance of any partition (0 before the first)."""
        return max((dev.counters.last_t or 0.0) for dev in self.devices)

    def reasons_known(self) -> bool:
        return all(dev.reasons_known and dev.latest is not None for dev in self.devices)

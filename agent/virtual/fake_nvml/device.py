"""The fake driver's per-device state: cumulative hardware counters fed by the virtual engine.

A real GPU keeps free-running counters (activity cycles, bytes, energy, time spent throttled)
and every NVML reading is a view of them: GPM metrics and PCIe/NVLink/energy fields are
differences of two readings, utilisation is the last driver window. So each device here holds
*integrals*: whenever a call needs fresh data, the span since the last advance is sampled from
the :class:`~agent.virtual.backend.VirtualBackend` (which returns the average over exactly that
span) and ratio x dt / rate x dt is added. A GPM pair over [t1, t2] therefore reads exactly the
virtual sample over [t1, t2], so the NVML backend and the virtual backend agree.

A field the node's counter preset hides (``None`` in the virtual sample) is a counter the
hardware does not have: its integral never moves and the NVML calls report NOT_SUPPORTED.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from agent.backends.base import DeviceError
from agent.model import DeviceInfo, GpuSample
from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail
from agent.virtual.sampling import mem_busy_share

if TYPE_CHECKING:
    from agent.virtual.backend import VirtualBackend

ADVANCE_MIN_S = 0.005
"""Calls closer than this to the previous advance reuse it (one collector cycle = one advance)."""
PROCESS_SAMPLE_ADVANCES = 64
"""How many advances of per-process utilisation samples the driver buffer keeps."""

RATIO_KEYS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
              "fp16_active", "dram_active")
RATE_KEYS = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s")
PIPE_KEYS = ("tensor_hmma_active", "tensor_dmma_active", "tensor_imma_active", "tensor_dfma_active")
"""GPM's tensor pipe split (taken from the sample when the engine provides it)."""
TOTAL_KEYS = RATIO_KEYS + PIPE_KEYS + RATE_KEYS
"""What the integrals hold: ratio-seconds, then tensor-pipe seconds, then bytes."""
KEY_INDEX = {k: i for i, k in enumerate(TOTAL_KEYS)}
_HMMA_DTYPES = frozenset({"bf16", "fp16", "tf32", "fp8", None})
TRACKED_REASONS = (codes.REASON_SW_POWER_CAP, codes.REASON_SW_THERMAL, codes.REASON_HW_THERMAL,
                   codes.REASON_HW_POWER_BRAKE)



def memory_busy(s: GpuSample) -> float:
    """utilization.memory as a share: the sample's own busy time, else derived from its bandwidth share."""
    if s.mem_busy is not None:
        return s.mem_busy
    return mem_busy_share(s.dram_active) or 0.0

@dataclass(frozen=True, slots=True)
class Snapshot:
    """The integrals at one advance: what a GPM sample holds."""

    t: float
    totals: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ProcessUtil:
    ts_us: int
    pid: int
    sm: int
    mem: int


class Counters:
    """Integrals of one device the virtual backend samples (a whole GPU or a MIG instance)."""

    def __init__(self, gpu: str, hidden: frozenset[str]) -> None:
        self.gpu = gpu
        self.hidden = hidden
        self.lock = threading.Lock()
        self.last_t: float | None = None
        self.totals = [0.0] * len(TOTAL_KEYS)
        self.reason_ns = {bit: 0.0 for bit in TRACKED_REASONS}
        self.latest: GpuSample | None = None
        self.process_utils: deque[tuple[int, tuple[ProcessUtil, ...]]] = deque(maxlen=PROCESS_SAMPLE_ADVANCES)

    def advance(self, backend: "VirtualBackend", now: float) -> GpuSample:
        """Bring the integrals up to ``now`` (unless the last advance is within ADVANCE_MIN_S)."""
        with self.lock:
            if self.latest is not None and self.last_t is not None and now <= self.last_t + ADVANCE_MIN_S:
                return self.latest
            try:
                s = backend.sample(self.gpu, now)
            except DeviceError:
                raise Fail(codes.ERROR_UNKNOWN) from None
            dt = s.interval_s or 0.0
            totals = self.totals
            for i, key in enumerate(RATIO_KEYS):
                v = getattr(s, key)
                if v is not None:
                    totals[i] += v * dt
            for key, v in _pipe_split(s).items():
                totals[KEY_INDEX[key]] += v * dt
            for key in RATE_KEYS:
                v = getattr(s, key)
                if v is not None:
                    totals[KEY_INDEX[key]] += v * dt
            reasons = s.clock_event_reasons or 0
            for bit in TRACKED_REASONS:
                if reasons & bit:
                    self.reason_ns[bit] += dt * 1e9
            self._record_processes(s, now)
            self.latest = s
            self.last_t = now
            return s

    def _record_processes(self, s: GpuSample, now: float) -> None:
        """One utilisation sample per process for this advance, SM (or engine) time split evenly, or by the
        shares a shared GPU's holders carry."""
        procs = s.processes or ()
        util = s.sm_active if s.sm_active is not None else s.gr_active
        if not procs or util is None:
            return
        n = len(procs)
        sm = round(100.0 * util / n)
        mem = round(100.0 * memory_busy(s) / n)
        ts = int(now * 1e6)
        # A shared GPU's holders carry their own SM share (agent.virtual.sampling); the rest split it evenly.
        self.process_utils.append((ts, tuple(
            ProcessUtil(ts, p.pid, round(100.0 * p.sm_util) if p.sm_util is not None else sm, mem) for p in procs)))

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(self.last_t if self.last_t is not None else 0.0, tuple(self.totals))

    def process_samples_after(self, last_seen_us: int) -> list[ProcessUtil]:
        with self.lock:
            return [p for ts, batch in self.process_utils if ts > last_seen_us for p in batch]


def _pipe_split(s: GpuSample) -> dict[str, float]:
    """Tensor activity by pipe: the sample's own split, else by dtype (FP64 on DMMA, the rest HMMA)."""
    own = {key: getattr(s, key, None) for key in PIPE_KEYS}
    if any(v is not None for v in own.values()):
        return {k: v for k, v in own.items() if v is not None}
    if s.tensor_active is None:
        return {}
    if s.dtype in _HMMA_DTYPES:
        return {"tensor_hmma_active": s.tensor_active}
    if s.dtype == "fp64":
        return {"tensor_dmma_active": s.tensor_active}
    return {}


@dataclass(eq=False)
class NvmlDevice:
    """Anything with an NVML handle: a whole GPU, a GPU in MIG mode, or one MIG device.

    ``counters`` is None for a GPU in MIG mode: the virtual engine simulates only its instances,
    so its readings are built from theirs (or are not supported). A MIG device is one *compute
    instance*: a GPU instance split into several compute instances (the profile's
    ``mig_compute_instances``) gives one device each, all sharing the GPU instance's counters,
    memory and GPM sampling, as on a real GPU.
    """

    index: int
    """Physical index (NVML device index, minor number)."""
    gi: int
    """GPU instance id for a MIG device (as the scenario's ``mig_ids`` place it; 0 is a valid one); 0 for a
    physical GPU."""
    gpu: str
    """The virtual GPU id: ``"3"`` or ``"3/1"``."""
    info: DeviceInfo
    counters: Counters | None
    parent: "NvmlDevice | None" = None
    children: list["NvmlDevice"] = field(default_factory=list)
    slices: int = 7
    """Compute slices of a MIG device (g of ``<g>g.<N>gb``); of the whole GPU for a physical one (4 on the
    A30, else 7)."""
    mem_share: float = 1.0
    """Share of the parent's memory (and bandwidth) a MIG device has."""
    ci: int = 0
    """Compute instance id within the GPU instance (0 when it is not split)."""
    ci_slices: int | None = None
    """Compute slices of a compute instance in a split GPU instance (c of ``<c>c.<g>g.<N>gb``); None
    when the compute instance is the whole GPU instance."""

    @property
    def nvml_id(self) -> str:
        """The id the NVML backend gives this device: ``3``, ``3/1``, or ``3/1/0`` for a split GI."""
        return self.gpu if self.ci_slices is None else f"{self.gpu}/{self.ci}"

    @property
    def is_mig(self) -> bool:
        return self.parent is not None

    @property
    def mig_enabled(self) -> bool:
        return bool(self.children)

    @property
    def physical(self) -> "NvmlDevice":
        return self.parent if self.parent is not None else self

    def hidden(self, key: str) -> bool:
        """The hardware cannot read ``key`` here (preset, MIG instance, or a MIG parent's totals)."""
        if self.counters is not None:
            return key in self.counters.hidden
        return all(c.counters is None or key in c.counters.hidden for c in self.children) or key in _PARENT_UNAVAILABLE

    def advance(self, backend: "VirtualBackend", now: float) -> None:
        for c in self._sampled():
            assert c.counters is not None
            c.counters.advance(backend, now)

    def _sampled(self) -> list["NvmlDevice"]:
        """Devices with their own counters: this one, or a MIG parent's GPU instances (one per GI,
        however many compute instances share it)."""
        if self.counters is not None:
            return [self]
        return [c for c in self.children if c.ci_slices is None or c is self.first_of_gi(c.gi)]

    def first_of_gi(self, gi: int) -> "NvmlDevice | None":
        """A MIG parent's first device (compute instance) in GPU instance ``gi``."""
        return next((c for c in self.children if c.gi == gi), None)

    def latest(self) -> list[GpuSample]:
        """The last virtual sample behind this device (a MIG parent: one per instance)."""
        return [c.counters.latest for c in self._sampled() if c.counters is not None and c.counters.latest is not None]

    def snapshot(self, now: Callable[[], float]) -> Snapshot:
        """The integrals; a MIG parent's are its instances' weighted by their share of the GPU."""
        if self.counters is not None:
            return self.counters.snapshot()
        totals = [0.0] * len(TOTAL_KEYS)
        for child in self._sampled():
            assert child.counters is not None
            snap = child.counters.snapshot()
            for i, v in enumerate(snap.totals):
                key = TOTAL_KEYS[i]
                weight = child.mem_share if key == "dram_active" else child.slices / self.slices
                totals[i] += weight * v
        return Snapshot(now(), tuple(totals))


_PARENT_UNAVAILABLE = frozenset({"power_w", "energy_j", "power_limit_w", "temperature_c"} | set(RATE_KEYS))
"""Whole-GPU readings a GPU in MIG mode cannot give here: the engine only simulates its instances."""

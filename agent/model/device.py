"""A device as the collector knows it: its peaks, its identity, its counters and its current state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from agent.model.holders import HolderShare
from agent.model.sample import GpuSample, XidCount
from agent.model.terms import Vendor


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Vendor peak numbers for one GPU model (dense, boost clock), used for rooflines and MFU.

    ``estimated`` marks specs derived at run time from what the driver reports rather than
    taken from a datasheet; consumers must surface that flag rather than hide it.
    """

    key: str
    name: str
    vendor: Vendor
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype (keys from DTYPES); a missing dtype is unsupported/unknown."""
    mem_bandwidth_bytes_per_s: float | None
    memory_bytes: int | None
    tdp_w: float | None
    sm_count: int | None = None
    """SMs (NVIDIA) or compute units (AMD) of the full device the peaks refer to."""
    ref_clock_mhz: float | None = None
    """SM clock at which the tensor peaks are quoted (H100 SXM: ~1830 MHz, not the max boost)."""
    max_clock_mhz: float | None = None
    link_bandwidth_bytes_per_s: float | None = None
    """GPU-to-GPU fabric bandwidth per direction (NVLink / XGMI), when the model has one."""
    pci_device_ids: tuple[int, ...] = ()
    estimated: bool = False
    notes: str = ""

    def ridge_point(self, dtype: str) -> float | None:
        """Arithmetic intensity (FLOP/byte) above which a kernel can reach the compute roof."""
        peak = self.peak_flops.get(dtype)
        if peak is None or not self.mem_bandwidth_bytes_per_s:
            return None
        return peak / self.mem_bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """Static identity of one device as discovered by a backend."""

    gpu: str
    """Index as the trace names it: ``"3"``, or ``"3/1"`` for a MIG instance or partition."""
    uuid: str
    vendor: Vendor
    model: str
    memory_total_bytes: int | None = None
    sm_count: int | None = None
    link_count: int | None = None
    pci_device_id: int | None = None
    pci_bus_id: str | None = None
    sm_clock_max_mhz: float | None = None
    spec: GpuSpec | None = None
    """Peaks for this device (already scaled to a MIG slice / partition); ``None`` if unknown."""
    capabilities: tuple[str, ...] = ()
    """What the backend found it can read (e.g. ``gpm``, ``tensor_active``), for `doctor`."""
    partition: str | None = None
    """AMD partition modes of the GPU this device belongs to (``CPX/NPS1``); None where there are none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceCounters:
    """Monotonic per-device totals since the agent started (Prometheus counters). ``None`` until the
    device's samples first carry the reading a total is built from: a source that never gives it
    (a dcgm-exporter without NVLink rates, a GPU without power) leaves the counter absent, never 0."""

    energy_j: float | None = None
    pcie_tx_bytes: float | None = None
    pcie_rx_bytes: float | None = None
    link_tx_bytes: float | None = None
    link_rx_bytes: float | None = None
    net_tx_bytes: float | None = None
    net_rx_bytes: float | None = None
    driver_calls: float = 0.0
    """Vendor-library calls made to read this device."""
    energy_steps_refused: int = 0
    """Energy-counter steps larger than the board can draw over the time they cover (a reset or a unit
    change in the source, agent/model/bounds.py): never added to ``energy_j``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceState:
    """The collector's view of one device at snapshot time."""

    info: DeviceInfo
    up: bool
    sample: GpuSample | None = None
    """Last good sample; kept while the device is down so its age shows how stale it is."""
    last_success_ts: float | None = None
    error: str | None = None
    consecutive_failures: int = 0
    sample_errors_total: int = 0
    counters: DeviceCounters = field(default_factory=DeviceCounters)
    xid_errors: tuple[XidCount, ...] = ()
    """Critical-error events seen since the agent started; reported even while the device is down."""
    holders: tuple[HolderShare, ...] = ()
    """On a shared GPU (two holders or more), each holder's estimated share of the last interval and its
    energy since start, largest first, then ``other`` and ``unattributed`` (agent.model.holders); () else."""
    counter_sources: Mapping[str, str] = field(default_factory=dict)
    """Which source gave each field of the last good sample, where the backend names it (its
    ``counter_sources(gpu)``: a join's ``dcgm-exporter``, ``amd-exporter``, ``dcgm`` beside the vendor
    library's own); empty where it names none. What a verdict rests on is read from it
    (agent.model.counter_source)."""

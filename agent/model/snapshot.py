"""The node snapshot: everything a scrape needs, published atomically once per collection cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.model.device import DeviceState
from agent.model.mig import MigParentEnergy
from agent.model.sample import HostSample
from agent.model.verdict import Verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class NicPort:
    """One InfiniBand/RoCE port of the node, with totals since the agent started (Prometheus counters)."""

    device: str
    port: int
    link_layer: str | None = None
    active: bool = False
    rate_bytes_per_s: float | None = None
    tx_bytes: float = 0.0
    rx_bytes: float = 0.0
    events: dict[str, float] = field(default_factory=dict)
    """Totals of the fixed error and RoCE counters the port has (agent.context.host.infiniband); absent ones left out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectorHealth:
    """How the last collection cycle went; exported so a silent agent is never mistaken for idle GPUs."""

    backend: str
    cycles_total: int = 0
    last_cycle_duration_s: float | None = None
    last_cycle_success: bool = False
    last_cycle_ts: float | None = None
    interval_s: float = 1.0
    waiting_for: str | None = None
    """Set while the agent waits for its GPU driver (agent.app.driver_wait): what it waits for and why."""


SOURCE_STATES = ("up", "stale", "down")


@dataclass(frozen=True, slots=True)
class SourceState:
    """One source the agent reads beside the GPU driver (dcgm-exporter, DCGM, an inference server),
    as of the last cycle: ``up``; ``stale``, its last good read too old to use; or ``down``. Exported
    so an alert can fire on a dead source, not only on the GPUs it leaves without figures."""

    name: str
    state: str
    detail: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RejectedValues:
    """Readings of one sample field from one source that the collector dropped as physically impossible
    (agent/model/bounds.py) since the agent started, with the latest one: which GPU, the value, the bound."""

    source: str
    """The backend's name, or the source its ``counter_sources`` names for the field (``dcgm-exporter``)."""
    field: str
    """The sample field (``power_w``, ``processes.cpu_cores``), or ``energy_j_step`` for an energy-counter
    step larger than the board can draw (a reset or a unit change, never added to the energy total)."""
    count: int
    gpu: str
    value: float
    bound: str
    ts: float
    """When the latest was refused."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSnapshot:
    """Everything a scrape needs, published atomically once per cycle and never mutated."""

    ts: float
    node: str
    devices: tuple[DeviceState, ...]
    health: CollectorHealth
    expected_devices: int
    host: HostSample | None = None
    sequence: int = 0
    """Increments with every published snapshot; lets exporters cache per snapshot."""
    verdicts: tuple[Verdict, ...] = ()
    """The classifier's latest verdict per device (empty when classification is off)."""
    nics: tuple[NicPort, ...] = ()
    """The node's InfiniBand/RoCE ports (empty where there are none, or on the virtual fleet)."""
    sources: tuple[SourceState, ...] = ()
    """The side sources' states (empty where the backend reads only the driver)."""
    rejected: tuple[RejectedValues, ...] = ()
    """Readings dropped as physically impossible, by source and field (empty while none was)."""
    mig_parents: tuple[MigParentEnergy, ...] = ()
    """Each MIG parent GPU's energy its instances were not given (agent.collector.mig_energy); empty without MIG."""

    @property
    def visible_devices(self) -> int:
        return sum(1 for d in self.devices if d.up)

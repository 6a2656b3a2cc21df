"""Reading one AMD device (a whole GPU or one compute partition) per interval.

The core reading comes first: VRAM in use, a sysfs file every amdgpu device has. amdsmi keeps a
GPU's handle after the GPU is lost or reset, and reads through it fail with NOT_SUPPORTED (the
sysfs node is gone) or UNEXPECTED_SIZE (EIO while the reset runs). On any other reading
NOT_SUPPORTED means "not on this GPU" and switches the reading off for good; read first, the core
reading tells the two apart: failing that way it means the GPU, and raises
:class:`DeviceLostError` before anything else is asked. The backend then re-initialises amdsmi
and re-acquires the device, which learns its capabilities again (:meth:`AmdDevice.reset`).

Then the gpu_metrics table, once per GPU per interval and shared by its partitions
(:class:`SocketTable`); everything amdsmi itself derives from the table comes from it
(:mod:`agent.backends.amd.table`), so when the table is unavailable those readings are unknown
and their getters are not asked (they would fail the same way, or report the same N/A). Besides
the table: temp_metric (hwmon, when the table has no temperature), energy_count (the table's
counter with its resolution, asked only when the table answered), the power cap, ECC and the
process list.

Errors otherwise follow the shared policy (:mod:`agent.backends.amd.errors`): unsupported or
forbidden readings are switched off and listed for ``doctor``; a transiently failing core reading
fails the sample. Socket power, energy, PCIe and XGMI are the GPU's, so only partition 0 reports
them; the other partitions leave them unknown rather than repeat or guess a share.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agent.backends.amd import table as tbl
from agent.backends.amd import values as v
from agent.backends.amd.bindings import Bindings
from agent.backends.amd.errors import LOST_WHEN_CORE, code_of, describe, meaning
from agent.backends.amd.processes import process_list
from agent.backends.base import DeviceLostError
from agent.backends.readings import ReadingPolicy
from agent.context.sources import HostFacts, HostSource
from agent.model import DeviceInfo, GpuSample, ProcessSample

log = logging.getLogger("roofwatch.amd")

SLOW_REFRESH_S = 60.0
"""Power cap and ECC totals change rarely; re-read them this often."""
FROM_TABLE = ("gr_active", "dram_active", "power", "clocks", "pcie", "xgmi", "energy", "clock_event_reasons")
"""Capabilities amdsmi computes from the gpu_metrics table (unknown when the table is)."""


class SocketTable:
    """The metrics table of one physical GPU, read once per interval for all its partitions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Serialises amdsmi calls for one GPU: its partitions share the same sysfs tables."""
        self.table: dict[str, Any] | None = None
        self.cycle: float | None = None
        """The collector cycle (its ``now``) the table was read for."""


@dataclass(slots=True)
class _State:
    last_now: float | None = None
    table: tbl.TableState = field(default_factory=tbl.TableState)
    slow_at: float = -1e18
    power_limit_w: float | None = None
    ecc: tuple[int | None, int | None] = (None, None)


class AmdDevice:
    """One device's handle, capabilities and reading state."""

    def __init__(self, amdsmi: Any, info: DeviceInfo, handle: Any, socket: SocketTable, *, partition: int,
                 partitions: int, host: HostSource, clock: Callable[[], float] = time.monotonic,
                 node: str = "local", bindings: Bindings | None = None) -> None:
        self.amdsmi = amdsmi
        self.info = info
        self.handle = handle
        self.socket = socket
        self.partition = partition
        self.partitions = partitions
        self.node = node
        self.bindings = bindings if bindings is not None else Bindings()
        self._host = host
        self._clock = clock
        self._policy = ReadingPolicy("amdsmi", lambda: self.info.gpu, lambda: self.info.uuid, meaning, describe)
        self._state = _State()
        self._shape: frozenset[str] | None = None
        """The keys of the first metrics table read: which fields this amdsmi release has."""

    @property
    def gpu(self) -> str:
        return self.info.gpu

    @property
    def primary(self) -> bool:
        return self.partition == 0

    # ------------------------------------------------------------------ policy

    def _error(self, what: str, exc: BaseException, *, core: bool = False) -> None:
        if core and code_of(exc) in LOST_WHEN_CORE:
            raise DeviceLostError(f"amdsmi: GPU {self.gpu} ({self.info.uuid}): {describe(exc)} during {what}: "
                                  "the GPU is gone or being reset") from None
        self._policy.error(what, exc, core=core)

    def _opt(self, what: str, name: str, *args: Any, core: bool = False,
             via: Callable[..., Any] | None = None) -> Any:
        """``amdsmi.<name>(*args)`` under the error policy, as reading ``what``; None when unknown. ``via``: a
        function of (amdsmi, *args) that makes that call (and may recover what it raised away)."""
        if what in self._policy.absent:
            return None
        fn = getattr(self.amdsmi, name, None) if self.bindings.has(name) else None
        if fn is None:
            self._policy.absent[what] = f"{self._release()} has no {name}"
            return None
        try:
            return via(self.amdsmi, *args) if via is not None else fn(*args)
        except self.amdsmi.AmdSmiLibraryException as exc:
            self._error(what, exc, core=core)
            return None

    def has(self, what: str) -> bool:
        return self._policy.has(what)

    @property
    def absent(self) -> dict[str, str]:
        """Capability or reading -> why it is unavailable, for ``doctor``."""
        return {**self._derived_absent(), **self._policy.absent}

    def _derived_absent(self) -> dict[str, str]:
        """What is unknown because of the table: all it feeds when it is unavailable, or the fields
        this release's table lacks (6.2: no per-partition activity, no accumulators)."""
        reason = self._policy.absent.get("gpu_metrics")
        if reason is not None:
            return {cap: f"amdsmi computes it from the gpu_metrics table, which is {reason}" for cap in FROM_TABLE}
        out: dict[str, str] = {}
        release = self._release()
        if self._shape is not None and self.partitions > 1 and tbl.PARTITION_ACTIVITY not in self._shape:
            out["gr_active"] = f"{release} has no per-partition activity in its metrics table (xcp_stats, amdsmi 6.3+)"
        if self._shape is not None and tbl.ACCUMULATOR not in self._shape:
            out["clock_event_reasons"] = (f"{release} has no residency accumulators in its metrics table "
                                          "(amdsmi 6.3+)")
        return out

    def _release(self) -> str:
        return f"amdsmi {self.bindings.package}" if self.bindings.package else "this amdsmi package"

    # ------------------------------------------------------------------ one interval

    def read(self, now: float) -> GpuSample:
        """One sample over the span since the previous read. Raises DeviceError / DeviceLostError."""
        self._policy.failed.clear()
        values: dict[str, Any] = {}
        with self.socket.lock:
            self._memory(values)  # the core reading: a lost GPU stops here
            t = self._table(now)
            values["gr_active"], values["dram_active"] = (
                tbl.activity(t, partition=self.partition, partitions=self.partitions) if t is not None else (None, None))
            self._power(values, t)
            self._clocks_and_temperatures(values, t)
            if self.primary and t is not None:
                values["pcie_bytes_per_s"], values["pcie_replays"] = tbl.pcie(self._state.table, t)
                values.update(tbl.links(self._state.table, t, now))
            values["clock_event_reasons"] = tbl.throttle(self._state.table, t) if t is not None else None
            self._slow(values)
            procs = self._processes()
        host = self._host_facts(procs, now)
        s = self._state
        interval = now - s.last_now if s.last_now is not None and now > s.last_now else None
        s.last_now = now
        return GpuSample(
            ts=now, gpu=self.gpu, node=self.node, uuid=self.info.uuid, vendor="amd", model=self.info.model,
            interval_s=interval, sm_clock_max_mhz=self.info.sm_clock_max_mhz,
            processes=_process_samples(procs, host),
            host=host.host, net_tx_bytes_per_s=host.net_tx_bytes_per_s, net_rx_bytes_per_s=host.net_rx_bytes_per_s,
            net_congestion_per_s=host.net_congestion_per_s, net_retransmits_per_s=host.net_retransmits_per_s,
            net_link_downs=host.net_link_downs, workload=host.workload, dtype=host.dtype, attribution=host.attribution,
            **values,
        )

    def _table(self, now: float) -> dict[str, Any] | None:
        """The GPU's metrics table; partitions read in the same collector cycle share one read."""
        shared = self.socket
        if self.partitions > 1 and shared.table is not None and shared.cycle == now:
            table = shared.table
        else:
            table = self._opt("gpu_metrics", "amdsmi_get_gpu_metrics_info", self.handle)
            shared.table, shared.cycle = table, now
        if table is not None and self._shape is None:
            self._shape = frozenset(table)
        return table

    def _power(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        if not self.primary:
            return  # socket power and energy are visible on partition 0 only
        # MI300+ report the current socket power, MI200 and older the average: one of the two is N/A.
        # amdsmi_get_power_info copies these same two fields (and 7.x's socket_power is whichever is
        # known), so it has nothing to add: it is not asked.
        watts = None
        if t is not None:
            watts = v.watts(t.get("current_socket_power"))
            watts = watts if watts is not None else v.watts(t.get("average_socket_power"))
        out["power_w"] = watts
        if t is None:
            return  # amdsmi reads the energy counter from the table: it would fail the same way
        energy = self._opt("energy", "amdsmi_get_energy_count", self.handle)
        if energy is not None:
            # "power" until 6.3, then "energy_accumulator" (6.3 returns both); all ones is unmapped here
            ticks = v.counter(energy.get("energy_accumulator", energy.get("power")))
            resolution = v.bounded(energy.get("counter_resolution"), 1e-3, 1e6) or v.ENERGY_TICK_UJ
            out["energy_j"] = ticks * resolution / 1e6 if ticks is not None else None

    def _clocks_and_temperatures(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        a = self.amdsmi
        clock = hot = mem = None
        if t is not None:
            clock = tbl.clock(t, partition=self.partition, partitions=self.partitions)
            hot, mem = tbl.temperatures(t)
        if hot is None:  # hwmon: answers without the table
            hot = v.celsius(self._opt("temperature", "amdsmi_get_temp_metric", self.handle,
                                      a.AmdSmiTemperatureType.HOTSPOT, a.AmdSmiTemperatureMetric.CURRENT))
        out["sm_clock_mhz"] = clock
        out["temperature_c"] = hot
        out["memory_temperature_c"] = mem

    def _slow(self, out: dict[str, Any]) -> None:
        """Power cap (µW) and ECC totals: re-read once a minute, reported every interval.

        A refresh that did not come back (a failed read, no data, or amdsmi re-initialised under
        it) is due again the next interval, not a minute later: the error policy's "retried next
        interval" (the error matrix found it waiting 60 s). ECC found absent reports unknown from
        then on, not the totals read before it went away, which would never be refreshed again.
        """
        s, now = self._state, self._clock()
        if now - s.slow_at >= SLOW_REFRESH_S:
            retry = False
            if self.primary:
                cap = self._opt("power_cap", "amdsmi_get_power_cap_info", self.handle)
                microwatts = v.bounded((cap or {}).get("power_cap"), *v.POWER_CAP_UW)
                s.power_limit_w = microwatts / 1e6 if microwatts else None
                retry = cap is None and self.has("power_cap")
            ecc = self._opt("ecc", "amdsmi_get_gpu_total_ecc_count", self.handle)
            if ecc is not None:
                cor, unc = v.counter(ecc.get("correctable_count")), v.counter(ecc.get("uncorrectable_count"))
                s.ecc = (int(cor) if cor is not None else None, int(unc) if unc is not None else None)
            elif self.has("ecc"):
                retry = True
            else:
                s.ecc = (None, None)
            if not retry:
                s.slow_at = now
        if self.primary:
            out["power_limit_w"] = s.power_limit_w
        out["ecc_corrected_errors"], out["ecc_uncorrected_errors"] = s.ecc

    def _memory(self, out: dict[str, Any]) -> None:
        a = self.amdsmi
        used = v.nbytes(self._opt("memory", "amdsmi_get_gpu_memory_usage", self.handle, a.AmdSmiMemoryType.VRAM,
                                  core=True))
        out["mem_used_bytes"] = int(used) if used is not None else None
        out["mem_total_bytes"] = self.info.memory_total_bytes

    def _processes(self) -> list[dict[str, Any]] | None:
        # NO_PERM (a process whose /proc entry this user cannot read) comes after a filled list: kept (processes.py)
        procs = self._opt("processes", "amdsmi_get_gpu_process_list", self.handle, via=process_list)
        if procs is None:
            return None
        return [p for p in procs if isinstance(p, dict) and v.bounded(p.get("pid"), 1, 2**31) is not None]

    def _host_facts(self, procs: list[dict[str, Any]] | None, now: float) -> HostFacts:
        pids = [int(p["pid"]) for p in procs or ()]
        try:
            return self._host.facts(self.gpu, pids, now, bus_id=self.info.pci_bus_id, uuid=self.info.uuid)
        except Exception as exc:  # noqa: BLE001 - host facts are extras; never fail a GPU over them
            log.debug("host facts for GPU %s failed: %s", self.gpu, exc)
            return HostFacts(processes={})

    # ------------------------------------------------------------------ what it can read

    def capabilities(self) -> tuple[str, ...]:
        unknown = self.absent
        names = [cap for cap in ("gr_active", "dram_active") if cap not in unknown]
        if self.primary:
            names += [cap for cap in ("power", "energy", "pcie") if cap not in unknown]
            if self._state.table.links:
                names.append("xgmi")
        if self.has("gpu_metrics") or self.has("temperature"):
            names.append("temperature")
        names += [cap for cap in ("clocks", "clock_event_reasons") if cap not in unknown]
        names += [cap for cap in ("memory", "processes", "ecc") if self.has(cap)]
        return tuple(names)

    def reset(self, handle: Any) -> None:
        """A fresh handle after a loss: forget counter baselines, and what was found unavailable.

        A GPU lost in the middle of an interval may have answered NOT_SUPPORTED to a reading
        before its core reading noticed; re-learning costs one call per truly absent reading.
        """
        self.handle = handle
        self._state = _State()
        self._shape = None
        self._policy.absent.clear()

    def rebind(self, handle: Any) -> None:
        """A fresh handle for the same GPU after amdsmi was re-initialised: the GPU was not reset and
        its counters ran on, so the baselines stay and its rates go on without a gap."""
        self.handle = handle


def _process_samples(procs: list[dict[str, Any]] | None, host: HostFacts) -> tuple[ProcessSample, ...] | None:
    if procs is None:
        return None
    out = []
    for p in sorted(procs, key=lambda p: int(p["pid"])):
        pid = int(p["pid"])
        usage = p.get("memory_usage") if isinstance(p.get("memory_usage"), dict) else {}
        vram = v.nbytes(usage.get("vram_mem"))
        cus = v.bounded(p.get("cu_occupancy"), 0, v.MAX_COMPUTE_UNITS)  # amdsmi 6.4.2+
        facts = host.processes.get(pid)
        fields = facts.sample_fields() if facts else {}
        if "name" not in fields or fields.get("name") is None:
            fields["name"] = p.get("name") if isinstance(p.get("name"), str) and p.get("name") != "N/A" else None
        out.append(ProcessSample(pid=pid, used_memory_bytes=int(vram) if vram is not None else None,
                                 compute_units=int(cus) if cus is not None else None, **fields))
    return tuple(out)

"""Reading one AMD device (a whole GPU or one compute partition) per interval.

One ``amdsmi_get_gpu_metrics_info`` call is the backbone: it holds activity, power, energy,
clocks, temperatures, PCIe and XGMI accumulators and throttle residencies for the whole GPU.
The partitions of one GPU share that table, so it is read once per GPU per interval and shared
(:class:`SocketTable`); a partition takes its own activity from ``xcp_stats``. Where the table is
unsupported (older firmware), the single-purpose getters stand in.

Errors follow the NVML backend's policy (:mod:`agent.backends.amd.errors`): unsupported or
forbidden readings are switched off for good and listed for ``doctor``; a lost device raises
:class:`DeviceLostError`; a failing core reading (VRAM) fails the sample.

Socket power, energy, PCIe and XGMI are the GPU's, so only partition 0 reports them; the other
partitions leave them unknown rather than repeat or guess a share.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agent.backends.amd import values as v
from agent.backends.amd.errors import describe, meaning
from agent.backends.readings import CounterRate, ReadingPolicy
from agent.context.sources import HostFacts, HostSource
from agent.model import CLOCK_EVENT_REASONS, DeviceInfo, GpuSample, LinkTraffic, ProcessSample

log = logging.getLogger("roofwatch.amd")

SLOW_REFRESH_S = 60.0
"""Power cap and ECC totals change rarely; re-read them this often."""


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
    links: dict[int, tuple[CounterRate, CounterRate]] = field(default_factory=dict)
    residency: dict[str, float] = field(default_factory=dict)
    averages: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    slow_at: float = -1e18
    power_limit_w: float | None = None
    ecc: tuple[int | None, int | None] = (None, None)


_RESIDENCIES = (
    # (accumulator in the metrics table, clock-event reason it maps to)
    ("ppt_residency_acc", "sw_power_cap"),            # package power tracking held the clock (PVIOL)
    ("socket_thm_residency_acc", "sw_thermal_slowdown"),  # socket thermal limit (TVIOL)
    ("hbm_thm_residency_acc", "hw_thermal_slowdown"),     # HBM thermal limit
    ("prochot_residency_acc", "hw_slowdown"),             # PROCHOT asserted
)


class AmdDevice:
    """One device's handle, capabilities and reading state."""

    def __init__(self, amdsmi: Any, info: DeviceInfo, handle: Any, socket: SocketTable, *, partition: int,
                 partitions: int, host: HostSource, clock: Callable[[], float] = time.monotonic,
                 node: str = "local") -> None:
        self.amdsmi = amdsmi
        self.info = info
        self.handle = handle
        self.socket = socket
        self.partition = partition
        self.partitions = partitions
        self.node = node
        self._host = host
        self._clock = clock
        self._policy = ReadingPolicy("amdsmi", lambda: self.info.gpu, lambda: self.info.uuid, meaning, describe)
        self._state = _State()

    @property
    def gpu(self) -> str:
        return self.info.gpu

    @property
    def primary(self) -> bool:
        return self.partition == 0

    # ------------------------------------------------------------------ policy

    def _error(self, what: str, exc: BaseException, *, core: bool = False) -> None:
        self._policy.error(what, exc, core=core)

    def _opt(self, what: str, fn: Callable[..., Any], *args: Any, core: bool = False) -> Any:
        if what in self.absent:
            return None
        try:
            return fn(*args)
        except self.amdsmi.AmdSmiLibraryException as exc:
            self._error(what, exc, core=core)
            return None

    def has(self, what: str) -> bool:
        return self._policy.has(what)

    @property
    def absent(self) -> dict[str, str]:
        """Capability -> why it is unavailable, for ``doctor``."""
        return self._policy.absent

    # ------------------------------------------------------------------ one interval

    def read(self, now: float) -> GpuSample:
        """One sample over the span since the previous read. Raises DeviceError / DeviceLostError."""
        self._policy.failed.clear()
        with self.socket.lock:
            table = self._table(now)
            values: dict[str, Any] = {}
            self._activity(values, table)
            self._power(values, table)
            self._clocks_and_temperatures(values, table)
            if self.primary:
                self._pcie(values, table, now)
                self._links(values, table, now)
            self._throttle(values, table)
            self._slow(values)
            self._memory(values)
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
            return shared.table
        table = self._opt("gpu_metrics", self.amdsmi.amdsmi_get_gpu_metrics_info, self.handle)
        shared.table, shared.cycle = table, now
        return table

    def _activity(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        gfx = umc = None
        if t is not None:
            if self.partitions > 1:
                per_xcp = v.listed(t.get("xcp_stats.gfx_busy_inst"))
                if self.partition < len(per_xcp):
                    gfx = v.mean_percent(v.listed(per_xcp[self.partition]))
            else:
                gfx = v.percent(t.get("average_gfx_activity"))
            umc = v.percent(t.get("average_umc_activity"))
        if gfx is None or umc is None:
            act = self._opt("activity", self.amdsmi.amdsmi_get_gpu_activity, self.handle)
            if act is not None:
                if gfx is None and self.partitions == 1:
                    gfx = v.percent(act.get("gfx_activity"))
                if umc is None:
                    umc = v.percent(act.get("umc_activity"))
        out["gr_active"] = gfx
        out["dram_active"] = umc  # memory-controller busy share: a proxy for DRAM bandwidth use

    def _power(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        if not self.primary:
            return  # socket power and energy are visible on partition 0 only
        watts = v.first_number(t.get("current_socket_power"), t.get("average_socket_power")) if t else None
        if watts is None:
            info = self._opt("power_info", self.amdsmi.amdsmi_get_power_info, self.handle)
            if info is not None:
                watts = v.first_number(info.get("current_socket_power"), info.get("average_socket_power"),
                                       info.get("socket_power"))
        out["power_w"] = watts
        energy = self._opt("energy", self.amdsmi.amdsmi_get_energy_count, self.handle)
        if energy is not None:
            ticks = v.num(energy.get("energy_accumulator"))
            resolution = v.num(energy.get("counter_resolution")) or v.ENERGY_TICK_UJ
            out["energy_j"] = ticks * resolution / 1e6 if ticks is not None else None

    def _clocks_and_temperatures(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        a = self.amdsmi
        clock = hot = mem = None
        if t is not None:
            per_xcc = [c for c in (v.num(x) for x in v.listed(t.get("current_gfxclks"))) if c]
            if self.partitions > 1 and per_xcc:
                xccs = max(1, len(per_xcc) // self.partitions)
                mine = per_xcc[self.partition * xccs:(self.partition + 1) * xccs]
                clock = sum(mine) / len(mine) if mine else None
            clock = clock or v.num(t.get("current_gfxclk")) or (sum(per_xcc) / len(per_xcc) if per_xcc else None)
            hot = v.num(t.get("temperature_hotspot"))
            mem = v.first_number(t.get("temperature_mem"), v.max_number(v.listed(t.get("temperature_hbm"))))
        if clock is None:
            info = self._opt("clock", a.amdsmi_get_clock_info, self.handle, a.AmdSmiClkType.GFX)
            clock = v.num(info.get("clk")) if info else None
        if hot is None:
            hot = v.num(self._opt("temperature", a.amdsmi_get_temp_metric, self.handle,
                                  a.AmdSmiTemperatureType.HOTSPOT, a.AmdSmiTemperatureMetric.CURRENT))
        out["sm_clock_mhz"] = clock
        out["temperature_c"] = hot
        out["memory_temperature_c"] = mem

    def _pcie(self, out: dict[str, Any], t: dict[str, Any] | None, now: float) -> None:
        gbps = replays = None
        if t is not None:
            # pcie_bandwidth_acc adds the instantaneous GB/s once per accumulation tick, so its rise
            # over the counter's rise is the interval's average; pcie_bandwidth_inst is a whole-GB/s
            # snapshot that reads 0 for light traffic, used only until there is a baseline.
            gbps = self._accumulated_average(t, "pcie_bandwidth_acc")
            if gbps is None:
                gbps = v.num(t.get("pcie_bandwidth_inst"))
            replays = v.num(t.get("pcie_replay_count_acc"))
        if gbps is None and replays is None:
            info = self._opt("pcie", self.amdsmi.amdsmi_get_pcie_info, self.handle)
            metric = (info or {}).get("pcie_metric") or {}
            mbps = v.num(metric.get("pcie_bandwidth"))  # Mb/s
            gbps = mbps / 8e3 if mbps is not None else None
            replays = v.num(metric.get("pcie_replay_count"))
        out["pcie_bytes_per_s"] = gbps * 1e9 if gbps is not None else None
        out["pcie_replays"] = int(replays) if replays is not None else None

    def _accumulated_average(self, t: dict[str, Any], key: str) -> float | None:
        """Average of a per-tick accumulator over the interval: Δkey / Δaccumulation_counter."""
        acc, value = v.num(t.get("accumulation_counter")), v.num(t.get(key))
        s = self._state
        prev = s.averages.get(key)
        s.averages[key] = (acc, value) if acc is not None and value is not None else None
        if prev is None or acc is None or value is None:
            return None
        d_acc, d_value = acc - prev[0], value - prev[1]
        return d_value / d_acc if d_acc > 0 and d_value >= 0 else None

    def _links(self, out: dict[str, Any], t: dict[str, Any] | None, now: float) -> None:
        """XGMI per-link accumulators (KB) -> driver totals in bytes and summed rates."""
        reads, writes, status = [], [], []
        if t is not None:
            reads, writes = v.listed(t.get("xgmi_read_data_acc")), v.listed(t.get("xgmi_write_data_acc"))
            status = v.listed(t.get("xgmi_link_status"))
        elif self.has("link_metrics"):
            metrics = self._opt("link_metrics", self.amdsmi.amdsmi_get_link_metrics, self.handle) or {}
            links = v.listed(metrics.get("links"))
            reads = [link.get("read") for link in links if isinstance(link, dict)]
            writes = [link.get("write") for link in links if isinstance(link, dict)]
        traffic, rx_total, tx_total, any_rate = [], 0.0, 0.0, False
        for link in range(max(len(reads), len(writes))):
            rd = v.num(reads[link]) if link < len(reads) else None
            wr = v.num(writes[link]) if link < len(writes) else None
            if rd is None and wr is None:
                continue  # a link this GPU does not have (all-ones in the table)
            up_value = v.num(status[link]) if link < len(status) else None
            rd_rate, wr_rate = self._state.links.setdefault(link, (CounterRate(), CounterRate()))
            rx, tx = rd_rate.rate(rd, now, v.KB), wr_rate.rate(wr, now, v.KB)
            if rx is not None or tx is not None:
                any_rate = True
                rx_total += rx or 0.0
                tx_total += tx or 0.0
            traffic.append(LinkTraffic(link=link, read_bytes=rd * v.KB if rd is not None else None,
                                       write_bytes=wr * v.KB if wr is not None else None,
                                       up=None if up_value is None else up_value > 0))
        if traffic:
            out["links"] = tuple(traffic)
            out["link_rx_bytes_per_s"] = rx_total if any_rate else None
            out["link_tx_bytes_per_s"] = tx_total if any_rate else None

    def _throttle(self, out: dict[str, Any], t: dict[str, Any] | None) -> None:
        """Which limits held the clock during the interval, from the residency accumulators."""
        if t is None:
            return
        acc = v.num(t.get("accumulation_counter"))
        if acc is None:
            return
        s = self._state
        prev_acc = s.residency.get("accumulation_counter")
        s.residency["accumulation_counter"] = acc
        reasons, known = 0, False
        for key, reason in _RESIDENCIES:
            value = v.num(t.get(key))
            prev = s.residency.get(key)
            if value is None:
                continue
            s.residency[key] = value
            if prev is None or prev_acc is None or acc <= prev_acc or value < prev:
                continue
            known = True
            if value > prev:
                reasons |= CLOCK_EVENT_REASONS[reason]
        if known:
            out["clock_event_reasons"] = reasons

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
                cap = self._opt("power_cap", self.amdsmi.amdsmi_get_power_cap_info, self.handle)
                microwatts = v.num((cap or {}).get("power_cap"))
                s.power_limit_w = microwatts / 1e6 if microwatts else None
                retry = cap is None and self.has("power_cap")
            ecc = self._opt("ecc", self.amdsmi.amdsmi_get_gpu_total_ecc_count, self.handle)
            if ecc is not None:
                cor, unc = v.num(ecc.get("correctable_count")), v.num(ecc.get("uncorrectable_count"))
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
        used = self._opt("memory", a.amdsmi_get_gpu_memory_usage, self.handle, a.AmdSmiMemoryType.VRAM, core=True)
        out["mem_used_bytes"] = int(used) if v.num(used) is not None else None
        out["mem_total_bytes"] = self.info.memory_total_bytes

    def _processes(self) -> list[dict[str, Any]] | None:
        procs = self._opt("processes", self.amdsmi.amdsmi_get_gpu_process_list, self.handle)
        if procs is None:
            return None
        return [p for p in procs if isinstance(p, dict) and v.num(p.get("pid")) is not None]

    def _host_facts(self, procs: list[dict[str, Any]] | None, now: float) -> HostFacts:
        pids = [int(p["pid"]) for p in procs or ()]
        try:
            return self._host.facts(self.gpu, pids, now, bus_id=self.info.pci_bus_id, uuid=self.info.uuid)
        except Exception as exc:  # noqa: BLE001 - host facts are extras; never fail a GPU over them
            log.debug("host facts for GPU %s failed: %s", self.gpu, exc)
            return HostFacts(processes={})

    # ------------------------------------------------------------------ what it can read

    def capabilities(self) -> tuple[str, ...]:
        names = []
        table = self.has("gpu_metrics")
        if table or self.has("activity"):
            names += ["gr_active", "dram_active"]
        if self.primary:
            names += ["power", "energy"] if (table or self.has("power_info")) else []
            if table or self.has("pcie"):
                names.append("pcie")
            if self._state.links:
                names.append("xgmi")
        names += ["temperature", "clocks"] if (table or self.has("temperature")) else []
        if table:
            names.append("clock_event_reasons")
        names.append("memory")
        if self.has("processes"):
            names.append("processes")
        if self.has("ecc"):
            names.append("ecc")
        return tuple(names)

    def reset(self, handle: Any) -> None:
        """A fresh handle after a loss: forget counter baselines, keep capabilities."""
        self.handle = handle
        self._state = _State()

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
        vram = v.num(usage.get("vram_mem"))
        cus = v.num(p.get("cu_occupancy"))
        facts = host.processes.get(pid)
        fields = facts.sample_fields() if facts else {}
        if "name" not in fields or fields.get("name") is None:
            fields["name"] = p.get("name") if isinstance(p.get("name"), str) and p.get("name") != "N/A" else None
        out.append(ProcessSample(pid=pid, used_memory_bytes=int(vram) if vram is not None else None,
                                 compute_units=int(cus) if cus is not None else None, **fields))
    return tuple(out)

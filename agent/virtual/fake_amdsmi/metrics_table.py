"""The gpu_metrics table (amdsmi_gpu_metrics_t) of one socket, as the driver would export it.

The table is built as a plain dict (field -> int, list of int, or None for "the firmware leaves
this at all ones") and only then copied into the caller's ctypes structure, because every
amdsmi copy has its own structure class. Other calls that the real library answers from the
same table (activity, power, energy, violation status) read the dict, so they agree with it.

Units are the driver's: °C, W, MHz, %, energy in 15.259 µJ ticks, XGMI data in KB (1024 bytes)
per link, PCIe bandwidth in GB/s (``pcie_bandwidth_inst``, which amdsmi_get_pcie_info copies into its
"Mb/s" pcie_bandwidth as is), system_clock_counter in ns since boot, firmware_timestamp in
10 ns. Accumulators (``*_acc``, ``accumulation_counter``) count PMFW ticks of 1 ms: a
residency / busy accumulator grows by 1 (resp. by the busy %) per tick, so the real formula
``Δacc * 100 / Δaccumulation_counter`` (resp. ``Δbusy_acc / Δaccumulation_counter``) gives the
percentage over the span between two readings.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.arguments import has_field
from agent.virtual.fake_amdsmi.asic import AsicTraits
from agent.virtual.fake_amdsmi.device import (
    HBM_THERMAL_BITS,
    POWER_LIMIT_BITS,
    PROCHOT_BITS,
    SOCKET_THERMAL_BITS,
    AmdDevice,
    AmdSocket,
)

TICKS_PER_S = 1000.0
"""accumulation_counter rate (PMFW metric updates per second)."""
UPTIME_AT_START_S = 3 * 86400.0
"""Host uptime at virtual time 0: what system_clock_counter counts from."""
KB = 1024
EDGE_BELOW_HOTSPOT_C = 8.0
HBM_STACK_OFFSETS_C = (0.0, 1.0, -1.0, 2.0)
UCLK_BUSY_DRAM = 0.02
"""DRAM activity above which the memory clock runs at its maximum."""

Table = dict[str, Any]


@dataclass(frozen=True, slots=True)
class TableContext:
    """What the table depends on besides the socket's samples."""

    traits: AsicTraits
    partition: int
    """Partition id of the handle that reads it (0 = primary: socket power, energy and bus traffic)."""
    uptime_s: float
    """Host uptime at the socket's latest advance."""
    na: tuple[str, ...] = ()


def validate_na(names: Iterable[str]) -> tuple[str, ...]:
    """The profile's na_metrics, checked against the structure's field names."""
    out = []
    for name in names:
        top, _, sub = name.partition(".")
        ok = (name in codes.GPU_METRICS_FIELDS or name == "xcp_stats"
              or (top == "xcp_stats" and sub in codes.XCP_FIELDS))
        if not ok:
            raise ValueError(f"na_metrics: {name!r} is not a field of amdsmi_gpu_metrics_t")
        out.append(name)
    return tuple(out)


def _int(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def _pct(ratio: float | None) -> int | None:
    return None if ratio is None else int(round(100.0 * ratio))


def _ticks(seconds: float | None) -> int | None:
    return None if seconds is None else int(round(seconds * TICKS_PER_S))


def build_table(socket: AmdSocket, ctx: TableContext) -> Table:
    """The socket's metrics table as partition ``ctx.partition`` reads it."""
    traits = ctx.traits
    t: Table = {"_revision": traits.metrics_revision}
    _temperatures(t, socket, traits)
    _activity(t, socket, traits)
    if ctx.partition == 0:
        _power(t, socket, traits)
    _clocks(t, socket, traits)
    _throttle(t, socket, traits)
    _pcie(t, socket, traits, primary=ctx.partition == 0)
    if traits.accumulators:
        _xgmi(t, socket, traits, primary=ctx.partition == 0)
        _accumulators(t, socket, ctx)
        t["xcp_stats"] = [_xcp(dev, traits, len(socket.devices)) for dev in socket.devices]
        t["num_partition"] = len(socket.devices)
        t["vram_max_bandwidth"] = _vram_bandwidth_gbs(socket)
        t["gfxclk_lock_status"] = 0
    t["system_clock_counter"] = int(ctx.uptime_s * 1e9)
    t["firmware_timestamp"] = int(ctx.uptime_s * 1e8)
    _apply_na(t, ctx.na)
    return t


def _vram_bandwidth_gbs(socket: AmdSocket) -> int | None:
    """The socket's peak memory bandwidth (GB/s): the partitions' shares added up."""
    shares = [d.info.spec.mem_bandwidth_bytes_per_s if d.info.spec else None for d in socket.devices]
    if any(b is None for b in shares):
        return None
    return int(round(sum(b for b in shares if b is not None) / 1e9))


def _temperatures(t: Table, socket: AmdSocket, traits: AsicTraits) -> None:
    hotspot = socket.peak("temperature_c")
    mem = socket.peak("memory_temperature_c")
    t["temperature_hotspot"] = _int(hotspot)
    t["temperature_mem"] = _int(mem)
    if traits.edge_sensor and hotspot is not None:
        t["temperature_edge"] = _int(hotspot - EDGE_BELOW_HOTSPOT_C)
    if mem is not None:
        t["temperature_hbm"] = [_int(mem + off) for off in HBM_STACK_OFFSETS_C]


def _activity(t: Table, socket: AmdSocket, traits: AsicTraits) -> None:
    """Socket averages: the mean over the partitions (= over all XCCs, each partition has the same share)."""
    t["average_gfx_activity"] = _pct(socket.mean("gr_active"))
    t["average_umc_activity"] = _pct(socket.mean("dram_active"))
    for name, key in (("gfx_activity_acc", "gr_active"), ("mem_activity_acc", "dram_active")):
        total = socket.integral(key)
        if total is not None:
            t[name] = int(round(100.0 * total / len(socket.devices) * TICKS_PER_S)) % (1 << 32)


def _power(t: Table, socket: AmdSocket, traits: AsicTraits) -> None:
    """Socket power and energy: the sum of the partitions' shares, visible on partition 0 only."""
    power = socket.total("power_w")
    t["current_socket_power" if traits.current_power else "average_socket_power"] = _int(power)
    energy = socket.total("energy_j")
    if energy is not None:
        t["energy_accumulator"] = int(round(energy / (codes.ENERGY_RESOLUTION_UJ * 1e-6)))


def partition_clock(dev: AmdDevice) -> float | None:
    s = dev.latest
    return s.sm_clock_mhz if s is not None else None


def socket_clocks(socket: AmdSocket, traits: AsicTraits) -> tuple[int | None, int | None]:
    """(memory clock, SoC clock) in MHz: maximum while the DRAM / the engines are busy, else minimum."""
    umc, gfx = socket.mean("dram_active"), socket.mean("gr_active")
    uclk = None if umc is None else traits.uclk_mhz[1 if umc > UCLK_BUSY_DRAM else 0]
    socclk = None if gfx is None else traits.socclk_mhz[1 if gfx > 0.0 else 0]
    return uclk, socclk


def _clocks(t: Table, socket: AmdSocket, traits: AsicTraits) -> None:
    per_partition = [_int(partition_clock(d)) for d in socket.devices]
    known = [c for c in per_partition if c is not None]
    t["current_gfxclk"] = max(known) if known else None
    uclk, socclk = socket_clocks(socket, traits)
    t["current_uclk"] = uclk
    if traits.accumulators:
        xpp = max(1, traits.xcc_count // len(socket.devices))
        t["current_gfxclks"] = [c for c in per_partition for _ in range(xpp)][:codes.MAX_NUM_XCC]
        t["current_socclks"] = [socclk] * 4
    else:
        t["current_socclk"] = socclk
        t["average_gfxclk_frequency"] = t["current_gfxclk"]
        t["average_uclk_frequency"] = uclk
        t["average_socclk_frequency"] = socclk


def _throttle(t: Table, socket: AmdSocket, traits: AsicTraits) -> None:
    if not socket.reasons_known():
        return
    reasons = 0
    for dev in socket.devices:
        reasons |= dev.latest.clock_event_reasons or 0  # type: ignore[union-attr]
    bits = 0
    if reasons & POWER_LIMIT_BITS:
        bits |= codes.THROTTLER_PPT0
    if reasons & (SOCKET_THERMAL_BITS | PROCHOT_BITS):
        bits |= codes.THROTTLER_TEMP_HOTSPOT
    if reasons & HBM_THERMAL_BITS:
        bits |= codes.THROTTLER_TEMP_MEM
    t["throttle_status"] = 1 if bits else 0
    t["indep_throttle_status"] = bits


def pcie_rate(socket: AmdSocket) -> float | None:
    """Bytes per second over the host link, both directions (all partitions share it)."""
    tx, rx = socket.total("pcie_tx_bytes_per_s"), socket.total("pcie_rx_bytes_per_s")
    return None if tx is None or rx is None else tx + rx


def _pcie(t: Table, socket: AmdSocket, traits: AsicTraits, *, primary: bool) -> None:
    t["pcie_link_width"] = traits.pcie_width
    t["pcie_link_speed"] = traits.pcie_speed_mts // 100  # 0.1 GT/s
    if not primary or not traits.accumulators:
        return
    rate = pcie_rate(socket)
    t["pcie_bandwidth_inst"] = None if rate is None else int(round(rate / 1e9))
    tx, rx = socket.integral("pcie_tx_bytes_per_s"), socket.integral("pcie_rx_bytes_per_s")
    if tx is not None and rx is not None:
        t["pcie_bandwidth_acc"] = int(round((tx + rx) / 1e9 * TICKS_PER_S))
    for name in ("pcie_l0_to_recov_count_acc", "pcie_replay_count_acc", "pcie_replay_rover_count_acc",
                 "pcie_nak_sent_count_acc", "pcie_nak_rcvd_count_acc", "pcie_lc_perf_other_end_recovery"):
        t[name] = 0  # a healthy link: the virtual engine models no replays


def link_kb(socket: AmdSocket) -> tuple[list[int], list[int]] | None:
    """Cumulative (read, write) KB per XGMI link: the fabric rx / tx bytes spread over the links."""
    tx, rx = socket.integral("link_tx_bytes_per_s"), socket.integral("link_rx_bytes_per_s")
    if tx is None or rx is None or not socket.link_count:
        return None
    return ([int(rx * w / KB) for w in socket.link_weights], [int(tx * w / KB) for w in socket.link_weights])


def _xgmi(t: Table, socket: AmdSocket, traits: AsicTraits, *, primary: bool) -> None:
    if not socket.link_count:
        return
    t["xgmi_link_width"] = traits.xgmi_width
    t["xgmi_link_speed"] = traits.xgmi_gbps
    if not primary:
        return
    t["xgmi_link_status"] = [codes.XGMI_LINK_UP] * min(socket.link_count, codes.MAX_NUM_XGMI_LINKS)
    data = link_kb(socket)
    if data is not None:
        t["xgmi_read_data_acc"] = data[0][:codes.MAX_NUM_XGMI_LINKS]
        t["xgmi_write_data_acc"] = data[1][:codes.MAX_NUM_XGMI_LINKS]


def _accumulators(t: Table, socket: AmdSocket, ctx: TableContext) -> None:
    t["accumulation_counter"] = _ticks(ctx.uptime_s)
    if not socket.reasons_known():
        return
    t["ppt_residency_acc"] = _ticks(max(d.ppt_s for d in socket.devices))
    t["socket_thm_residency_acc"] = _ticks(max(d.thermal_s for d in socket.devices))
    t["hbm_thm_residency_acc"] = _ticks(max(d.hbm_thermal_s for d in socket.devices))
    t["prochot_residency_acc"] = _ticks(max(d.prochot_s for d in socket.devices))
    t["vr_thm_residency_acc"] = 0  # the engine models no voltage-regulator limit


def _xcp(dev: AmdDevice, traits: AsicTraits, count: int) -> dict[str, list[int | None]]:
    """One partition's XCP stats: every XCC of the partition shows the partition's own activity."""
    xpp = max(1, traits.xcc_count // count)
    s = dev.latest
    gr = s.gr_active if s is not None else None
    busy_acc = None if dev.hidden("gr_active") else int(round(100.0 * dev.integral("gr_active") * TICKS_PER_S))
    known = dev.reasons_known and s is not None
    out: dict[str, list[int | None]] = {
        "gfx_busy_inst": [_pct(gr)] * xpp,
        "gfx_busy_acc": [busy_acc] * xpp,
        "jpeg_busy": [0] * max(1, traits.jpeg_engines // count),
        "vcn_busy": [0] * max(1, traits.vcn_engines // count),
    }
    if known:
        limited = _ticks(dev.limited_s)
        out["gfx_below_host_limit_acc"] = [limited] * xpp
        out["gfx_below_host_limit_total_acc"] = [limited] * xpp
        out["gfx_below_host_limit_ppt_acc"] = [_ticks(dev.ppt_s)] * xpp
        out["gfx_below_host_limit_thm_acc"] = [_ticks(dev.thermal_s)] * xpp
    if gr is not None:
        out["gfx_low_utilization_acc"] = [_ticks(dev.low_util_s)] * xpp
    return out


def _apply_na(t: Table, names: Iterable[str]) -> None:
    for name in names:
        top, _, sub = name.partition(".")
        if top == "xcp_stats" and sub:
            for xcp in t.get("xcp_stats", ()):
                xcp.pop(sub, None)
        else:
            t.pop(name, None)


# ----------------------------------------------------------------------------- into ctypes


def _store(obj: Any, name: str, value: Any) -> None:
    """Set a scalar or array field; values are masked to the field's width, never to all ones.

    A field the caller's structure does not have (an older release's amdsmi_gpu_metrics_t) is
    skipped: that release's library had nowhere to put it either.
    """
    if value is None or not has_field(obj, name):
        return
    if isinstance(value, list):
        arr = getattr(obj, name)
        bits = 8 * ctypes.sizeof(arr._type_)
        for i, v in enumerate(value[:len(arr)]):
            if v is not None:
                arr[i] = _fit(v, bits)
        return
    size = getattr(type(obj), name).size
    setattr(obj, name, _fit(value, 8 * size))


def _fit(value: int, bits: int) -> int:
    ones = (1 << bits) - 1
    v = max(0, int(value)) & ones
    return v - 1 if v == ones else v


def write_table(struct: Any, table: Table) -> None:
    """Copy ``table`` into an amdsmi_gpu_metrics_t: everything not in the table stays all ones (N/A).

    The structure is the one the calling wrapper defines, so amdsmi 6.2's (no accumulators, no
    ``xcp_stats``) gets only the fields it has, as it did from that release's library.
    """
    ctypes.memset(ctypes.addressof(struct), 0xFF, ctypes.sizeof(struct))
    header = struct.common_header
    header.structure_size = ctypes.sizeof(struct) & 0xFFFF
    header.format_revision = 1
    header.content_revision = table.get("_revision", 7)
    for name, value in table.items():
        if name.startswith("_"):
            continue
        if name == "xcp_stats":
            if not has_field(struct, "xcp_stats"):
                continue
            for p, xcp in enumerate(value[:len(struct.xcp_stats)]):
                for field, vals in xcp.items():
                    _store(struct.xcp_stats[p], field, vals)
            continue
        _store(struct, name, value)

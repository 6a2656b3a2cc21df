"""What one device reads from its GPU's gpu_metrics table, and the baselines that turn counters into rates.

libamd_smi computes amdsmi_get_gpu_activity, amdsmi_get_clock_info, amdsmi_get_pcie_info,
amdsmi_get_link_metrics and amdsmi_get_energy_count from this same table (src/amd_smi/amd_smi.cc,
rocm_smi_lib's rsmi_dev_energy_count_get), so they know nothing the table does not: the backend
reads the table once and takes everything from it, and asks none of them when it is unavailable.

Every value goes through :mod:`agent.backends.amd.values`: "N/A", sentinels and out-of-range
numbers are unknown. Which fields exist depends on the amdsmi release (6.2's table has no
accumulators and no ``xcp_stats``); a missing key reads like "N/A".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.backends.amd import values as v
from agent.backends.readings import CounterRate
from agent.model import CLOCK_EVENT_REASONS, LinkTraffic

Table = dict[str, Any]

RESIDENCIES = (
    # (accumulator in the metrics table, clock-event reason it maps to)
    ("ppt_residency_acc", "sw_power_cap"),            # package power tracking held the clock (PVIOL)
    ("socket_thm_residency_acc", "sw_thermal_slowdown"),  # socket thermal limit (TVIOL)
    ("hbm_thm_residency_acc", "hw_thermal_slowdown"),     # HBM thermal limit
    ("prochot_residency_acc", "hw_slowdown"),             # PROCHOT asserted
)
PARTITION_ACTIVITY = "xcp_stats.gfx_busy_inst"
"""Per-partition activity: in the table from amdsmi 6.3 (gpu_metrics 1.6)."""
ACCUMULATOR = "accumulation_counter"
"""The tick counter every residency is read against: in the table from amdsmi 6.3."""


@dataclass(slots=True)
class TableState:
    """Counter baselines of one device, kept between intervals."""

    links: dict[int, tuple[CounterRate, CounterRate]] = field(default_factory=dict)
    residency: dict[str, float] = field(default_factory=dict)
    averages: dict[str, tuple[float, float] | None] = field(default_factory=dict)


def activity(t: Table, *, partition: int, partitions: int) -> tuple[float | None, float | None]:
    """(gr_active, dram_active) as 0..1 ratios. A partition's own activity is the mean of its XCCs'
    ``gfx_busy_inst``; where the table has none (6.2) it is unknown, never the whole GPU's."""
    if partitions > 1:
        per_xcp = v.listed(t.get(PARTITION_ACTIVITY))
        gfx = v.mean_percent(v.listed(per_xcp[partition])) if partition < len(per_xcp) else None
    else:
        gfx = v.percent(t.get("average_gfx_activity"))
    return gfx, v.percent(t.get("average_umc_activity"))


def clock(t: Table, *, partition: int, partitions: int) -> float | None:
    """The gfx clock in MHz: the partition's XCCs (``current_gfxclks``), else the socket's."""
    per_xcc = [c for c in (v.mhz(x) for x in v.listed(t.get("current_gfxclks"))) if c]
    mine: list[float] = []
    if partitions > 1 and per_xcc:
        xccs = max(1, len(per_xcc) // partitions)
        mine = per_xcc[partition * xccs:(partition + 1) * xccs]
    if mine:
        return sum(mine) / len(mine)
    return v.mhz(t.get("current_gfxclk")) or (sum(per_xcc) / len(per_xcc) if per_xcc else None)


def temperatures(t: Table) -> tuple[float | None, float | None]:
    """(hotspot, memory) in °C; memory is ``temperature_mem`` or the hottest HBM stack."""
    hbm = [c for c in (v.celsius(x) for x in v.listed(t.get("temperature_hbm"))) if c is not None]
    memory = v.celsius(t.get("temperature_mem"))
    return v.celsius(t.get("temperature_hotspot")), memory if memory is not None else (max(hbm) if hbm else None)


def pcie(state: TableState, t: Table) -> tuple[float | None, int | None]:
    """(bytes/s both directions, replays since driver load).

    ``pcie_bandwidth_acc`` adds the instantaneous GB/s once per accumulation tick, so its rise over
    the counter's rise is the interval's average; ``pcie_bandwidth_inst`` (whole GB/s, 0 for light
    traffic) stands in until there is a baseline. Both GB/s, as amdsmi.h documents the table.
    """
    gbps = accumulated_average(state, t, "pcie_bandwidth_acc")
    if gbps is None:
        gbps = v.bounded(t.get("pcie_bandwidth_inst"), 0.0, v.MAX_PCIE_GBPS)
    replays = v.counter(t.get("pcie_replay_count_acc"))
    return (gbps * 1e9 if gbps is not None else None), (int(replays) if replays is not None else None)


def accumulated_average(state: TableState, t: Table, key: str) -> float | None:
    """Average of a per-tick accumulator over the interval: Δkey / Δaccumulation_counter."""
    acc, value = v.counter(t.get(ACCUMULATOR)), v.counter(t.get(key))
    prev = state.averages.get(key)
    state.averages[key] = (acc, value) if acc is not None and value is not None else None
    if prev is None or acc is None or value is None:
        return None
    d_acc, d_value = acc - prev[0], value - prev[1]
    average = d_value / d_acc if d_acc > 0 and d_value >= 0 else None
    return v.bounded(average, 0.0, v.MAX_PCIE_GBPS)


def links(state: TableState, t: Table, now: float) -> dict[str, Any]:
    """XGMI per-link accumulators (KB) -> driver totals in bytes and summed rates; {} without links."""
    reads, writes = v.listed(t.get("xgmi_read_data_acc")), v.listed(t.get("xgmi_write_data_acc"))
    status = v.listed(t.get("xgmi_link_status"))
    traffic, rx_total, tx_total, any_rate = [], 0.0, 0.0, False
    for link in range(max(len(reads), len(writes))):
        rd = v.counter(reads[link]) if link < len(reads) else None
        wr = v.counter(writes[link]) if link < len(writes) else None
        if rd is None and wr is None:
            continue  # a link this GPU does not have (all ones in the table)
        up_value = v.bounded(status[link], 0, 1) if link < len(status) else None
        rd_rate, wr_rate = state.links.setdefault(link, (CounterRate(), CounterRate()))
        rx, tx = rd_rate.rate(rd, now, v.KB), wr_rate.rate(wr, now, v.KB)
        if rx is not None or tx is not None:
            any_rate = True
            rx_total += rx or 0.0
            tx_total += tx or 0.0
        traffic.append(LinkTraffic(link=link, read_bytes=rd * v.KB if rd is not None else None,
                                   write_bytes=wr * v.KB if wr is not None else None,
                                   up=None if up_value is None else up_value > 0))
    if not traffic:
        return {}
    return {"links": tuple(traffic), "link_rx_bytes_per_s": rx_total if any_rate else None,
            "link_tx_bytes_per_s": tx_total if any_rate else None}


def throttle(state: TableState, t: Table) -> int | None:
    """Which limits held the clock during the interval: the residency accumulators that rose."""
    acc = v.counter(t.get(ACCUMULATOR))
    if acc is None:
        return None
    prev_acc = state.residency.get(ACCUMULATOR)
    state.residency[ACCUMULATOR] = acc
    reasons, known = 0, False
    for key, reason in RESIDENCIES:
        value = v.counter(t.get(key))
        prev = state.residency.get(key)
        if value is None:
            continue
        state.residency[key] = value
        if prev is None or prev_acc is None or acc <= prev_acc or value < prev:
            continue
        known = True
        if value > prev:
            reasons |= CLOCK_EVENT_REASONS[reason]
    return reasons if known else None

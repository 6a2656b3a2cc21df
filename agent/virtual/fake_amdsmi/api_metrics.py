"""C functions answered from the gpu_metrics table: the table itself, activity, violation status.

The real library reads the driver's gpu_metrics file for these, so they report socket values on
every partition (activity is the mean over all XCCs; per-partition activity is only in
``xcp_stats[p].gfx_busy_inst``), and what the table leaves at all ones they report as unknown.

More of libamd_smi is computed from that table than its names say: amdsmi_get_gpu_activity,
amdsmi_get_clock_info, amdsmi_get_pcie_info, amdsmi_get_link_metrics and (through rocm_smi's
rsmi_dev_energy_count_get) amdsmi_get_energy_count each call amdsmi_get_gpu_metrics_info first
and return its failure (src/amd_smi/amd_smi.cc and rocm_smi/src/rocm_smi.cc, ROCm 6.2 and 6.3);
amdsmi_get_power_info leaves its socket-power fields unknown. :meth:`MetricsFunctions._derived`
is that inner call: where the firmware has no table, none of them can stand in for it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import Fail, has_field, out_struct, put
from agent.virtual.fake_amdsmi.metrics_table import TICKS_PER_S, Table, write_table
from agent.virtual.fake_nvml.symbols import c_function


def _or(table: Table, name: str, missing: int) -> int:
    value = table.get(name)
    return missing if value is None else value


def _percent(delta_s: float, span_s: float) -> int:
    """What amdsmi computes from two readings: Δresidency ticks x 100 // Δaccumulation ticks."""
    ticks = int(round(span_s * TICKS_PER_S))
    return int(round(delta_s * TICKS_PER_S)) * 100 // ticks if ticks > 0 else codes.UINT64_MAX


def _active(percent: int) -> int:
    return codes.UINT8_MAX if percent == codes.UINT64_MAX else int(percent > 0)


TABLE_SYMBOL = "amdsmi_get_gpu_metrics_info"


class MetricsFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    def _derived(self, dev: AmdDevice) -> Table:
        """The table as libamd_smi's own amdsmi_get_gpu_metrics_info call inside another function gets
        it: that function fails with the table's NOT_SUPPORTED / NO_PERM (a forced status only fails
        the one function it was forced on)."""
        if TABLE_SYMBOL in self.profile.not_supported:
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        if TABLE_SYMBOL in self.profile.no_permission:
            raise Fail(codes.STATUS_NO_PERM)
        self._fresh(dev)
        return self._table(dev)

    @c_function("amdsmi_get_gpu_metrics_info", handle=True)
    def _c_gpu_metrics(self, dev: AmdDevice, out: Any) -> None:
        struct = out_struct(out)
        self._fresh(dev)
        write_table(struct, self._table(dev))

    @c_function("amdsmi_get_gpu_activity", handle=True)
    def _c_activity(self, dev: AmdDevice, out: Any) -> None:
        usage = out_struct(out)
        table = self._derived(dev)
        usage.gfx_activity = _or(table, "average_gfx_activity", codes.UINT16_MAX)
        usage.umc_activity = _or(table, "average_umc_activity", codes.UINT16_MAX)
        usage.mm_activity = _or(table, "average_mm_activity", codes.UINT16_MAX)

    @c_function("amdsmi_get_violation_status", handle=True)
    def _c_violation_status(self, dev: AmdDevice, out: Any) -> None:
        """The accumulators now, and percentages over the latest advance (the collector's interval).

        The real library reads the table twice 100 ms apart; the fake uses the span its counters
        last advanced over instead, so it never sleeps and the percentage covers the same
        interval as the other readings.
        """
        status = out_struct(out)
        table = self._derived(dev)
        now = self._now()
        if not self.traits.accumulators or table.get("accumulation_counter") is None:
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        ctypes.memset(ctypes.addressof(status), 0xFF, ctypes.sizeof(status))
        socket = self._socket_of(dev)
        status.reference_timestamp = int(now * 1e6)
        status.violation_timestamp = _or(table, "firmware_timestamp", codes.UINT64_MAX)
        status.acc_counter = table["accumulation_counter"]
        for field, name in (("acc_prochot_thrm", "prochot_residency_acc"), ("acc_ppt_pwr", "ppt_residency_acc"),
                            ("acc_socket_thrm", "socket_thm_residency_acc"), ("acc_vr_thrm", "vr_thm_residency_acc"),
                            ("acc_hbm_thrm", "hbm_thm_residency_acc")):
            setattr(status, field, _or(table, name, codes.UINT64_MAX))
        if socket.reasons_known():
            span = max(d.span.dt for d in socket.devices)
            worst = {name: max(getattr(d.span, name) for d in socket.devices)
                     for name in ("ppt_s", "thermal_s", "hbm_thermal_s", "prochot_s")}
            per = {"ppt_pwr": _percent(worst["ppt_s"], span), "socket_thrm": _percent(worst["thermal_s"], span),
                   "hbm_thrm": _percent(worst["hbm_thermal_s"], span),
                   "prochot_thrm": _percent(worst["prochot_s"], span), "vr_thrm": _percent(0.0, span)}
            for name, percent in per.items():
                setattr(status, f"per_{name}", percent)
                setattr(status, f"active_{name}", _active(percent))
        self._violation_xcp(status, table, dev)

    def _violation_xcp(self, status: Any, table: Table, dev: AmdDevice) -> None:
        """The per-partition, per-XCC arrays (MI300+): accumulators from the table, percentages per span."""
        socket = self._socket_of(dev)
        xcps = table.get("xcp_stats") or []
        mine = xcps[dev.partition] if dev.partition < len(xcps) else {}
        below = mine.get("gfx_below_host_limit_acc") or [None]
        if below[0] is not None:
            put(status, "acc_gfx_clk_below_host_limit", below[0])  # amdsmi 6.4+
        for p, (xcp, part) in enumerate(zip(xcps, socket.devices)):
            s = part.latest
            if s is None:
                continue
            span = part.span
            rows = {
                ("acc_gfx_clk_below_host_limit_pwr", "per_gfx_clk_below_host_limit_pwr",
                 "active_gfx_clk_below_host_limit_pwr"): ("gfx_below_host_limit_ppt_acc", span.ppt_s),
                ("acc_gfx_clk_below_host_limit_thm", "per_gfx_clk_below_host_limit_thm",
                 "active_gfx_clk_below_host_limit_thm"): ("gfx_below_host_limit_thm_acc", span.thermal_s),
                ("acc_gfx_clk_below_host_limit_total", "per_gfx_clk_below_host_limit_total",
                 "active_gfx_clk_below_host_limit_total"): ("gfx_below_host_limit_total_acc", span.limited_s),
                ("acc_low_utilization", "per_low_utilization", "active_low_utilization"): (
                    "gfx_low_utilization_acc", (1.0 - s.gr_active) * span.dt if s.gr_active is not None else None),
            }
            for (acc_f, per_f, active_f), (table_f, delta) in rows.items():
                values = xcp.get(table_f)
                if values is None or delta is None or not has_field(status, acc_f):  # per-XCC arrays: 7.0+
                    continue
                percent = _percent(delta, span.dt)
                for j, v in enumerate(values[:codes.MAX_NUM_XCC]):
                    if v is None:
                        continue
                    getattr(status, acc_f)[p][j] = v
                    getattr(status, per_f)[p][j] = percent
                    getattr(status, active_f)[p][j] = _active(percent)

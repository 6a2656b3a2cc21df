"""Power, energy, temperature and clock C functions.

Socket power and energy are the sum of the partitions' shares and only partition 0 reports them
(the others read all ones), as on a partitioned MI300X. Units as amdsmi.h: power in W
(power_info), power caps in µW, energy in 15.259 µJ ticks with a ns timestamp, temperatures in
°C, clocks in MHz.

As in libamd_smi, energy, the current clock and the socket power come from the gpu_metrics table
(:meth:`~agent.virtual.fake_amdsmi.api_metrics.MetricsFunctions._derived`): amdsmi_get_energy_count
and amdsmi_get_clock_info fail with it, amdsmi_get_power_info reports its socket power unknown.
Temperatures come from hwmon and do not need the table. Field widths follow the caller's
structure: a 16-bit table value of all ones copied into a 32-bit field stays 0xFFFF (clock_info's
``clk`` reads 65535 MHz when the table has no clock), and amdsmi 7.x sets an unsupported
``socket_power`` to UINT32_MAX, which its package does not map to "N/A".
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import Fail, out_struct, put, set_value, value
from agent.virtual.fake_amdsmi.metrics_table import HBM_STACK_OFFSETS_C
from agent.virtual.fake_nvml.symbols import c_function

MIN_CAP_FRACTION = 0.25
"""Lowest power cap the firmware accepts, as a share of the default (what scenarios may set)."""
EMERGENCY_ABOVE_CRITICAL_C = 5


def _known(v: Any) -> Any:
    if v is None:
        raise Fail(codes.STATUS_NOT_SUPPORTED)
    return v


class PowerFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    def _socket_limit_w(self, dev: AmdDevice) -> float | None:
        return self._socket_of(dev).total("power_limit_w")

    @c_function("amdsmi_get_power_info", handle=True)
    def _c_power_info(self, dev: AmdDevice, out: Any) -> int | None:
        return self._power_info(dev, out_struct(out))

    @c_function("amdsmi_get_power_info_v2", handle=True)
    def _c_power_info_v2(self, dev: AmdDevice, sensor: Any, out: Any) -> int | None:
        """amdsmi 6.4 only (its package calls this one); sensor 0 is the socket, the only one there is."""
        return self._power_info(dev, out_struct(out))

    def _power_info(self, dev: AmdDevice, info: Any) -> int | None:
        """Socket power from the table (unknown without it); the status is the power-cap read's."""
        try:
            table = self._derived(dev)
        except Fail:
            table = {}
            self._fresh(dev)
        current, average = table.get("current_socket_power"), table.get("average_socket_power")
        info.current_socket_power = codes.UINT16_MAX if current is None else current
        info.average_socket_power = codes.UINT16_MAX if average is None else average
        info.gfx_voltage = info.soc_voltage = info.mem_voltage = codes.UINT16_MAX  # not in the v1.5+ table
        if self.release.at_least(7, 0):  # 6.4's struct has the field, but only 7.0 fills it (CHANGELOG 7.0.0)
            reading = current if current is not None else average
            put(info, "socket_power", codes.UINT32_MAX if reading is None else reading)
        limit = self._socket_limit_w(dev)
        info.power_limit = codes.UINT16_MAX if limit is None else round(limit)
        return codes.STATUS_NOT_SUPPORTED if limit is None else None

    @c_function("amdsmi_get_power_cap_info", handle=True)
    def _c_power_cap_info(self, dev: AmdDevice, sensor: Any, out: Any) -> None:
        info = out_struct(out)
        self._fresh(dev)
        limit = _known(self._socket_limit_w(dev))
        default = self.spec.tdp_w or limit
        info.power_cap = round(limit * 1e6)
        info.default_power_cap = round(default * 1e6)
        info.dpm_cap = 0
        info.min_power_cap = round(MIN_CAP_FRACTION * default * 1e6)
        info.max_power_cap = round(default * 1e6)

    @c_function("amdsmi_get_energy_count", handle=True)
    def _c_energy_count(self, dev: AmdDevice, energy: Any, resolution: Any, timestamp: Any) -> None:
        """rocm_smi's rsmi_dev_energy_count_get: the table's accumulator as it is (all ones where the
        table has none, e.g. on partitions other than 0), never mapped to an error."""
        table = self._derived(dev)
        ticks = table.get("energy_accumulator")
        set_value(energy, codes.UINT64_MAX if ticks is None else ticks)
        set_value(resolution, codes.ENERGY_RESOLUTION_UJ)
        set_value(timestamp, table["system_clock_counter"])

    @c_function("amdsmi_get_temp_metric", handle=True)
    def _c_temp_metric(self, dev: AmdDevice, sensor: Any, metric: Any, out: Any) -> None:
        kind, what = value(sensor), value(metric)
        self._fresh(dev)
        table = self._table(dev)
        traits = self.traits
        if kind == codes.TEMP_HOTSPOT:
            current, critical = table.get("temperature_hotspot"), traits.hotspot_critical_c
        elif kind == codes.TEMP_EDGE:
            current, critical = table.get("temperature_edge"), traits.hotspot_critical_c - 10
            if not traits.edge_sensor:
                raise Fail(codes.STATUS_NOT_SUPPORTED)
        elif kind == codes.TEMP_VRAM:
            current, critical = table.get("temperature_mem"), traits.mem_critical_c
        elif codes.TEMP_HBM_0 <= kind <= codes.TEMP_HBM_3:
            stacks = table.get("temperature_hbm") or [None] * len(HBM_STACK_OFFSETS_C)
            current, critical = stacks[kind - codes.TEMP_HBM_0], traits.mem_critical_c
        else:
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        if what == codes.TEMP_CURRENT:
            set_value(out, _known(current))
        elif what == codes.TEMP_CRITICAL:
            set_value(out, critical)
        elif what == codes.TEMP_EMERGENCY:
            set_value(out, critical + EMERGENCY_ABOVE_CRITICAL_C)
        else:
            raise Fail(codes.STATUS_NOT_SUPPORTED)

    @c_function("amdsmi_get_clock_info", handle=True)
    def _c_clock_info(self, dev: AmdDevice, clock_type: Any, out: Any) -> None:
        """The socket's current clock from the table (16 bits: 0xFFFF when unknown), its range from
        pp_dpm. GFX and MEM in every release; SOC only from amdsmi 6.4 (6.2/6.3 answer INVAL)."""
        kind = value(clock_type)
        info = out_struct(out)
        table = self._derived(dev)
        if kind == codes.CLK_TYPE_GFX:
            clk = table.get("current_gfxclk")
            low, high = self.traits.gfx_min_mhz, int(dev.info.sm_clock_max_mhz or 0) or codes.UINT32_MAX
        elif kind == codes.CLK_TYPE_MEM:
            clk, (low, high) = table.get("current_uclk"), self.traits.uclk_mhz
        elif kind == codes.CLK_TYPE_SOC and self.release.at_least(6, 4):
            clk = table.get("current_socclk") or (table.get("current_socclks") or [None])[0]
            low, high = self.traits.socclk_mhz
        else:
            raise Fail(codes.STATUS_INVAL)
        info.clk = codes.UINT16_MAX if clk is None else clk
        info.min_clk, info.max_clk = low, high
        info.clk_locked = 0
        info.clk_deep_sleep = codes.UINT8_MAX if clk is None else int(clk < low)

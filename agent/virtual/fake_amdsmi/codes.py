"""Constants of amdsmi.h that the fake needs (values as the installed amdsmi_wrapper defines them).

Only numbers cross the fake's "C" boundary, so these are kept here instead of being read from a
loaded wrapper copy; tests check that they agree with the real package.
"""

from __future__ import annotations

# amdsmi_status_t
STATUS_SUCCESS = 0
STATUS_INVAL = 1
STATUS_NOT_SUPPORTED = 2
STATUS_API_FAILED = 7
STATUS_TIMEOUT = 8
STATUS_NO_PERM = 10
STATUS_OUT_OF_RESOURCES = 15
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
STATUS_INSUFFICIENT_SIZE = 41
STATUS_UNEXPECTED_SIZE = 42
"""What rocm_smi makes of EIO (ErrnoToRsmiStatus): a sysfs read of a GPU in reset."""

STATUS_STRINGS: dict[int, bytes] = {
    STATUS_SUCCESS: b"AMDSMI_STATUS_SUCCESS: Call succeeded",
    STATUS_INVAL: b"AMDSMI_STATUS_INVAL: Invalid parameters",
    STATUS_NOT_SUPPORTED: b"AMDSMI_STATUS_NOT_SUPPORTED: Command not supported",
    STATUS_API_FAILED: b"AMDSMI_STATUS_API_FAILED: API call failed",
    STATUS_TIMEOUT: b"AMDSMI_STATUS_TIMEOUT: Timeout in API call",
    STATUS_NO_PERM: b"AMDSMI_STATUS_NO_PERM: Permission Denied",
    STATUS_OUT_OF_RESOURCES: b"AMDSMI_STATUS_OUT_OF_RESOURCES: Not enough memory",
    STATUS_NOT_FOUND: b"AMDSMI_STATUS_NOT_FOUND: Device Not found",
    STATUS_NOT_INIT: b"AMDSMI_STATUS_NOT_INIT: Device not initialized",
    STATUS_DRIVER_NOT_LOADED: b"AMDSMI_STATUS_DRIVER_NOT_LOADED: Driver not loaded",
    STATUS_INSUFFICIENT_SIZE: b"AMDSMI_STATUS_INSUFFICIENT_SIZE: Insufficient size for operation",
    STATUS_UNEXPECTED_SIZE: b"AMDSMI_STATUS_UNEXPECTED_SIZE: An unexpected amount of data was read",
}
"""What amdsmi_status_code_to_string hands back (other codes: an unknown-error text)."""

PROCESSOR_TYPE_AMD_GPU = 1

# amdsmi_clk_type_t
CLK_TYPE_GFX = 0
CLK_TYPE_SOC = 3
CLK_TYPE_MEM = 4

# amdsmi_temperature_type_t
TEMP_EDGE = 0
TEMP_HOTSPOT = 1
TEMP_VRAM = 2
TEMP_HBM_0 = 3
TEMP_HBM_3 = 6

# amdsmi_temperature_metric_t
TEMP_CURRENT = 0
TEMP_CRITICAL = 5
TEMP_EMERGENCY = 7

# amdsmi_memory_type_t
MEM_TYPE_VRAM = 0
MEM_TYPE_VIS_VRAM = 1
MEM_TYPE_GTT = 2

VRAM_TYPE_HBM2E = 3
VRAM_TYPE_HBM3 = 4
LINK_TYPE_XGMI = 2
XGMI_LINK_UP = 1
CARD_FORM_FACTOR_OAM = 1

INIT_AMD_GPUS = 2

AMD_VENDOR_ID = 0x1002

MAX_NUM_XGMI_LINKS = 8
MAX_NUM_XCC = 8
MAX_NUM_XCP = 8

UINT8_MAX = 0xFF
UINT16_MAX = 0xFFFF
UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF

ENERGY_RESOLUTION_UJ = 15.259
"""Microjoules per energy_accumulator tick (the counter_resolution amdsmi_get_energy_count reports)."""

GPU_METRICS_FIELDS: tuple[str, ...] = (
    "temperature_edge", "temperature_hotspot", "temperature_mem", "temperature_vrgfx", "temperature_vrsoc",
    "temperature_vrmem", "average_gfx_activity", "average_umc_activity", "average_mm_activity",
    "average_socket_power", "energy_accumulator", "system_clock_counter", "average_gfxclk_frequency",
    "average_socclk_frequency", "average_uclk_frequency", "average_vclk0_frequency", "average_dclk0_frequency",
    "average_vclk1_frequency", "average_dclk1_frequency", "current_gfxclk", "current_socclk", "current_uclk",
    "current_vclk0", "current_dclk0", "current_vclk1", "current_dclk1", "throttle_status", "current_fan_speed",
    "pcie_link_width", "pcie_link_speed", "gfx_activity_acc", "mem_activity_acc", "temperature_hbm",
    "firmware_timestamp", "voltage_soc", "voltage_gfx", "voltage_mem", "indep_throttle_status",
    "current_socket_power", "vcn_activity", "gfxclk_lock_status", "xgmi_link_width", "xgmi_link_speed",
    "pcie_bandwidth_acc", "pcie_bandwidth_inst", "pcie_l0_to_recov_count_acc", "pcie_replay_count_acc",
    "pcie_replay_rover_count_acc", "xgmi_read_data_acc", "xgmi_write_data_acc", "current_gfxclks",
    "current_socclks", "current_vclk0s", "current_dclk0s", "jpeg_activity", "pcie_nak_sent_count_acc",
    "pcie_nak_rcvd_count_acc", "accumulation_counter", "prochot_residency_acc", "ppt_residency_acc",
    "socket_thm_residency_acc", "vr_thm_residency_acc", "hbm_thm_residency_acc", "num_partition",
    "pcie_lc_perf_other_end_recovery", "vram_max_bandwidth", "xgmi_link_status",
)
"""Top-level fields of amdsmi_gpu_metrics_t (besides common_header and xcp_stats)."""

XCP_FIELDS: tuple[str, ...] = (
    "gfx_busy_inst", "jpeg_busy", "vcn_busy", "gfx_busy_acc", "gfx_below_host_limit_acc",
    "gfx_below_host_limit_ppt_acc", "gfx_below_host_limit_thm_acc", "gfx_low_utilization_acc",
    "gfx_below_host_limit_total_acc",
)
"""Fields of amdsmi_gpu_xcp_metrics_t (one per partition in xcp_stats)."""

# SMU throttler bits behind indep_throttle_status (kernel amdgpu_smu.h).
THROTTLER_PPT0 = 1 << 0
THROTTLER_TEMP_HOTSPOT = 1 << 33
THROTTLER_TEMP_MEM = 1 << 34

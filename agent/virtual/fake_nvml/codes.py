"""The C-side constants of libnvidia-ml: return codes, field ids, event bits, struct versions.

The fake is the *C library*, so it must not take these from pynvml (that would hide a binding
that disagrees with the driver). They are copied from nvml.h; the tests check them against the
real pynvml module, which is where a mistake would show.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- nvmlReturn_t
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_ALREADY_INITIALIZED = 5
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

ERROR_STRINGS: dict[int, bytes] = {
    0: b"Success",
    1: b"Uninitialized",
    2: b"Invalid Argument",
    3: b"Not Supported",
    4: b"Insufficient Permissions",
    5: b"Already Initialized",
    6: b"Not Found",
    7: b"Insufficient Size",
    8: b"Insufficient External Power",
    9: b"Driver Not Loaded",
    10: b"Timeout",
    11: b"Interrupt Request Issue",
    12: b"NVML Shared Library Not Found",
    13: b"Function Not Found",
    14: b"Corrupted infoROM",
    15: b"GPU is lost",
    16: b"GPU requires restart",
    17: b"The operating system has blocked the request.",
    18: b"RM has detected an NVML/RM version mismatch.",
    19: b"In use by another client",
    20: b"Insufficient Memory",
    21: b"No data",
    22: b"The requested vGPU operation is not available because ECC is enabled",
    23: b"Ran out of critical resources, other than memory",
    24: b"The requested frequency is not supported",
    25: b"The provided version is invalid/unsupported",
    26: b"The requested functionality has been deprecated",
    27: b"The system is not ready for the request",
    28: b"No GPUs were found",
    29: b"Resource not in correct state to perform requested operation",
    999: b"Unknown Error",
}
"""nvmlErrorString texts; unknown codes give ``Unknown Error``.

Codes up to 18 and 20 match the strings pynvml itself carries; the others are close paraphrases
(pynvml asks the library for them, e.g. when printing NVMLError_ArgumentVersionMismatch).
"""

# ----------------------------------------------------------------------------- misc enums
VALUE_TYPE_DOUBLE = 0
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3
VALUE_TYPE_SIGNED_LONG_LONG = 4

CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO = 0, 1, 2, 3
TEMPERATURE_GPU = 0
UINT_MAX = 0xFFFFFFFF
ULL_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

# ----------------------------------------------------------------------------- struct versions
MEMORY_V2 = 0x02000028
TEMPERATURE_V1 = 0x0100000C
PROCESSES_UTILIZATION_INFO_V1 = 0x01000018
GPM_METRICS_GET_VERSION = 1
GPM_SUPPORT_VERSION = 1
GPM_METRIC_MAX = 477

# ----------------------------------------------------------------------------- field ids
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_CLOCKS_EVENT_SW_POWER_CAP = 74  # NVML_FI_DEV_PERF_POLICY_POWER
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX = 138
FI_NVLINK_DATA_RX = 139
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_POWER_AVERAGE = 185
FI_POWER_INSTANT = 186
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_CLOCKS_EVENT_SW_THERMAL = 269  # R580.82 on; 251-253 on R575 to R580.76 (profile.clock_event_trio)
FI_CLOCKS_EVENT_HW_THERMAL = 270
FI_CLOCKS_EVENT_HW_POWER_BRAKE = 271

# ----------------------------------------------------------------------------- events
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
SUPPORTED_EVENTS = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
"""What nvmlDeviceGetSupportedEventTypes reports on a data-centre GPU (only XID and DBE are ever sent)."""

XID_GPU_LOST = 79
"""GPU has fallen off the bus: sent at the start of every ``lost`` fault window."""
XID_DBE = 48
XID_ROW_REMAP = 63
XID_ROW_REMAP_FAILURE = 64

# ----------------------------------------------------------------------------- clock event reasons
REASON_SW_POWER_CAP = 0x4
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80

# nvmlPcieUtilCounter_t
PCIE_UTIL_TX_BYTES = 0
PCIE_UTIL_RX_BYTES = 1

"""What a given driver and GPU model expose: symbols and field ids by driver version, architecture, clocks.

NVML grows with the driver: a backend written against today's pynvml meets hosts whose
libnvidia-ml lacks newer symbols (pynvml then raises ``NVMLError_FunctionNotFound``) or newer
field ids (the entry fails with INVALID_ARGUMENT inside a successful batch). These gates are the
ones the NVML backend has to survive in production; the scenario's
:class:`~agent.virtual.profiles.NvmlProfile` picks the driver, this module says what that driver
and the node's GPU model can do.

Every gate is taken from the ``nvml.h`` NVIDIA ships with each driver release (the
``src/nvml.h`` of github.com/NVIDIA/nvidia-settings, tagged per release): the first release
that declares a symbol, and each release's field-id table (``NVML_FI_MAX``). One renumbering
matters: R575.51 to R580.76 declared the clocks-event time fields SW/HW thermal and power brake
as 251-253 (moving the power-smoothing fields to 256-273); R580.82 moved them to 269-271 and
put power smoothing back at 251-268, where R570 had it. So the same id means a different
counter on different drivers, and the fake answers each id as that driver would.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.virtual.profiles import NvmlProfile

ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER, ARCH_BLACKWELL = 7, 8, 9, 10
ARCH_UNKNOWN = 0xFFFFFFFF

_ARCH_BY_PREFIX: tuple[tuple[str, int, tuple[int, int]], ...] = (
    # Order matters: "a100" before "a10".
    ("a100", ARCH_AMPERE, (8, 0)),
    ("a10", ARCH_AMPERE, (8, 6)),
    ("l40s", ARCH_ADA, (8, 9)),
    ("l4", ARCH_ADA, (8, 9)),
    ("gh200", ARCH_HOPPER, (9, 0)),
    ("h100", ARCH_HOPPER, (9, 0)),
    ("h200", ARCH_HOPPER, (9, 0)),
    ("b200", ARCH_BLACKWELL, (10, 0)),
)

_MEMORY_CLOCK_MHZ: tuple[tuple[str, int], ...] = (
    ("a100-sxm-40gb", 1215), ("a100-pcie-40gb", 1215), ("a100", 1593),
    ("a10", 6251), ("l40s", 9001), ("l4", 6251),
    ("h100-pcie", 1593), ("h100", 2619), ("gh200", 2619), ("h200", 3201), ("b200", 3996),
)
"""Maximum memory clock nvidia-smi shows per model (approximate; nothing derives from it)."""

GPM_SYMBOLS = frozenset({
    "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
})
GATES: tuple[tuple[int, frozenset[str]], ...] = (
    (450, frozenset({"nvmlDeviceGetComputeRunningProcesses_v2"})),
    (470, frozenset({"nvmlDeviceGetMPSComputeRunningProcesses_v2"})),
    (510, frozenset({"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2",
                     "nvmlDeviceGetMPSComputeRunningProcesses_v3"})),
    (520, GPM_SYMBOLS),
    (525, frozenset({"nvmlGpmMigSampleGet"})),
    (535, frozenset({"nvmlDeviceGetCurrentClocksEventReasons"})),
    (550, frozenset({"nvmlDeviceGetProcessesUtilizationInfo"})),
    (565, frozenset({"nvmlDeviceGetTemperatureV"})),
)
"""(first driver major whose nvml.h declares them, symbols): older drivers do not export these.

The process-list and temperature gates are what users of pynvml meet in the field: pynvml's
nvmlDeviceGetComputeRunningProcesses calls only ``_v3`` (FunctionNotFound on R470, use the
``_v2`` symbol there), and nvmlDeviceGetTemperatureV appeared with R565. The MPS client list has the
same history one branch later: ``_v2`` from R470 (none before), ``_v3`` from R510.
"""

DriverVersion = tuple[int, ...]

FIELD_ID_LIMITS: tuple[tuple[DriverVersion, int], ...] = (
    ((0,), 161), ((520,), 167), ((525,), 197), ((550,), 200), ((555,), 223), ((560,), 230), ((565,), 231),
    ((570,), 269), ((575,), 274), ((580, 119), 289), ((580, 142), 296), ((580, 159), 303), ((590,), 289),
    ((610,), 303),
)
"""(first driver, NVML_FI_MAX): field ids at or above the limit are unknown to that driver.

From each release's nvml.h. Later R535 and R550 releases declare 226-227 (reset status) while
leaving 197-225 undeclared; the fake treats that gap as unknown before R555 (see
:func:`field_known`).
"""

GPM_METRIC_LIMITS: tuple[tuple[DriverVersion, int], ...] = (((0,), 98), ((575,), 210), ((590,), 333), ((610,), 477))
"""(first driver, NVML_GPM_METRIC_MAX): GPM metric ids at or above the limit are unknown to that driver.

From the nvml.h each binding or SDK copies: nvidia-ml-py 12.535 to 12.570 stop at 98, 12.575 and 13.580 at 210,
NVIDIA/DCGM 4.6.0's ``sdk/nvidia/nvml/dcgm_nvml.h`` at 333 (the first to declare the cumulative metrics 248-260,
"since reboot"), nvidia-ml-py 13.615.71 at 477. Which driver branch first has 248-260 is not documented: the fake
assumes R590 (after R580, whose binding stops at 210; DCGM 4.6 needs a driver that has them). An unknown id fails
its own entry with INVALID_ARGUMENT, as an unknown field id does (an assumption too: nvml.h says only "Nonzero
NVML_ERROR_? enum on error")."""
PCIE_BYTES_FIELDS_SINCE: DriverVersion = (555,)
"""Fields 197/198 (PCIe TX/RX byte counters) are declared from R555 on."""
CLOCK_EVENT_IDS_R575: DriverVersion = (575,)
CLOCK_EVENT_IDS_R580_82: DriverVersion = (580, 82)
"""Where the clocks-event time fields SW thermal / HW thermal / HW power brake live: 251-253 from
R575 until R580.76, 269-271 from R580.82 on; no driver before R575 has them."""
CLOCK_EVENT_TRIO_R575 = (251, 252, 253)
CLOCK_EVENT_TRIO = (269, 270, 271)
POWER_SMOOTHING_FIELDS = 18
"""NVML_FI_PWR_SMOOTHING_*: 251-268 on R570 and from R580.82, 256-273 on R575 to R580.76."""
PCIE_COUNTER_WRAP = 2**32
"""Fields 197/198 are "PCIe transmit/receive bytes. Value can be wrapped." (nvml.h). nvml.h gives
no width; the values reported in the field (nvidia-smi pci --getCounters) stay below 2**32, so
the fake wraps them at 32 bits. Checking this on a GPU is listed in docs/nvidia.md."""


@dataclass(frozen=True, slots=True)
class ModelTraits:
    """Per-model facts the catalogue does not hold."""

    architecture: int
    compute_capability: tuple[int, int]
    memory_clock_mhz: int
    hbm: bool

    @property
    def gpm_capable(self) -> bool:
        """GPM needs Hopper or newer."""
        return self.architecture != ARCH_UNKNOWN and self.architecture >= ARCH_HOPPER


def model_traits(key: str) -> ModelTraits:
    """Architecture, compute capability and memory clock of catalogue model ``key``."""
    arch, cc = ARCH_UNKNOWN, (0, 0)
    for prefix, a, c in _ARCH_BY_PREFIX:
        if key.startswith(prefix):
            arch, cc = a, c
            break
    mem_clock = next((mhz for prefix, mhz in _MEMORY_CLOCK_MHZ if key.startswith(prefix)), 1000)
    hbm = not key.startswith(("a10", "l4")) or key.startswith("a100")
    return ModelTraits(arch, cc, mem_clock, hbm)


def driver_tuple(profile: NvmlProfile) -> DriverVersion:
    """The driver version as numbers: ``"580.95.05"`` -> (580, 95, 5)."""
    return tuple(int(part) for part in profile.driver_version.split("."))


def missing_symbols(profile: NvmlProfile) -> frozenset[str]:
    """C symbols the profile's driver version does not export."""
    major = profile.driver_major
    out: set[str] = set()
    for since, symbols in GATES:
        if major < since:
            out |= symbols
    return frozenset(out)


def nvml_version(profile: NvmlProfile) -> str:
    """nvmlSystemGetNVMLVersion: the CUDA major of the driver, then the driver version ("12.550.54.15")."""
    return f"{profile.cuda_driver_version // 1000}.{profile.driver_version}"


def field_id_limit(profile: NvmlProfile) -> int:
    """NVML_FI_MAX of the profile's driver."""
    version = driver_tuple(profile)
    return [limit for since, limit in FIELD_ID_LIMITS if version >= since][-1]


def clock_event_trio(profile: NvmlProfile) -> tuple[int, int, int] | None:
    """The ids this driver gives the SW thermal / HW thermal / HW power brake time fields, or None."""
    version = driver_tuple(profile)
    if version >= CLOCK_EVENT_IDS_R580_82:
        return CLOCK_EVENT_TRIO
    if version >= CLOCK_EVENT_IDS_R575:
        return CLOCK_EVENT_TRIO_R575
    return None


def power_smoothing_ids(profile: NvmlProfile) -> range:
    """The NVML_FI_PWR_SMOOTHING_* ids of this driver (empty before R570)."""
    version = driver_tuple(profile)
    if version < (570,):
        return range(0)
    first = 256 if CLOCK_EVENT_IDS_R575 <= version < CLOCK_EVENT_IDS_R580_82 else 251
    return range(first, first + POWER_SMOOTHING_FIELDS)


def gpm_metric_limit(profile: NvmlProfile) -> int:
    """NVML_GPM_METRIC_MAX of the profile's driver (:data:`GPM_METRIC_LIMITS`)."""
    version = driver_tuple(profile)
    return [limit for since, limit in GPM_METRIC_LIMITS if version >= since][-1]


def field_known(profile: NvmlProfile, field_id: int) -> bool:
    """Whether this driver's nvml.h declares ``field_id`` at all (unknown ids fail the entry with
    INVALID_ARGUMENT; known ones the device cannot read fail with NOT_SUPPORTED)."""
    if field_id < 0 or field_id >= field_id_limit(profile):
        return False
    if 197 <= field_id <= 225:
        return driver_tuple(profile) >= PCIE_BYTES_FIELDS_SINCE
    return True

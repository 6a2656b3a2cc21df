"""What a given driver and GPU model expose: symbols by driver version, architecture, clocks.

NVML grows with the driver: a backend written against today's pynvml meets hosts whose
libnvidia-ml lacks newer symbols (pynvml then raises ``NVMLError_FunctionNotFound``) or newer
field ids (the field fails with NOT_SUPPORTED). These gates are the ones the NVML backend has to
survive in production; the scenario's :class:`~agent.virtual.profiles.NvmlProfile` picks the
driver, this module says what that driver and the node's GPU model can do.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.virtual.fake_nvml import codes
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
    "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
})
GATES: tuple[tuple[int, frozenset[str]], ...] = (
    (450, frozenset({"nvmlDeviceGetComputeRunningProcesses_v2"})),
    (510, frozenset({"nvmlDeviceGetComputeRunningProcesses_v3"})),
    (520, GPM_SYMBOLS),
    (535, frozenset({"nvmlDeviceGetCurrentClocksEventReasons"})),
    (550, frozenset({"nvmlDeviceGetProcessesUtilizationInfo"})),
    (565, frozenset({"nvmlDeviceGetTemperatureV"})),
)
"""(first driver major that has them, symbols): older drivers do not export these.

The process-list and temperature gates are what users of pynvml meet in the field: pynvml's
nvmlDeviceGetComputeRunningProcesses calls only ``_v3`` (FunctionNotFound on R470, use the
``_v2`` wrapper there), and nvmlDeviceGetTemperatureV appeared with R565.
"""

PCIE_BYTES_FIELDS_SINCE = 555
"""Fields 197/198 (PCIe TX/RX byte counters) read NOT_SUPPORTED on older drivers."""


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


def field_gated(profile: NvmlProfile, field_id: int) -> bool:
    """True when this driver does not know ``field_id`` (it fails with NOT_SUPPORTED)."""
    if field_id in (codes.FI_PCIE_TX_BYTES, codes.FI_PCIE_RX_BYTES):
        return profile.driver_major < PCIE_BYTES_FIELDS_SINCE
    return False

"""What this amdsmi package offers, found once when the backend starts, so no call site guesses.

The amdsmi wrapper is not one API: each ROCm release ships its own, generated from that
release's amdsmi.h, and roofwatch accepts 6.2 through 7.0 (docs/amd.md, "Versions"). Audited
against the 6.2.4, 6.3.3, 6.4.4 and 7.0.2 packages, the backend meets these differences:

* functions: ``amdsmi_get_gpu_kfd_info`` exists from 6.3 (without it a partition's id is its PCI
  function number); ``amdsmi_get_rocm_version`` from 6.4; ``amdsmi_get_power_info`` calls the C
  ``amdsmi_get_power_info_v2`` in 6.4 only (the backend does not ask it: it copies the table's
  socket power);
* keys: ``amdsmi_get_energy_count`` says ``power`` in 6.2, both ``power`` and ``energy_accumulator``
  in 6.3, ``energy_accumulator`` from 6.4; ``amdsmi_get_gpu_asic_info`` has ``num_compute_units``
  from 6.3; ``amdsmi_get_gpu_vram_info`` has ``vram_max_bandwidth`` from 6.4;
  ``amdsmi_get_gpu_process_list`` has ``cu_occupancy`` from 6.4.2; ``amdsmi_get_power_info`` has
  ``socket_power`` from 7.0; ``amdsmi_get_lib_version`` has a ``year`` until 6.3;
* the metrics table: 6.2's has no accumulators (``accumulation_counter``, the residencies) and no
  per-partition ``xcp_stats``, so throttle reasons and a partition's own activity are unknown there.

Keys and table fields are read with ``.get`` and judged where they are used; the functions are
looked up here. A required one missing is :class:`BackendUnavailable` naming it; an optional one
missing is recorded, read as unknown, and reported by ``doctor``, never an AttributeError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.backends.base import BackendUnavailable

MINIMUM = (6, 2)
"""The oldest amdsmi package (= ROCm release) the backend is tested with."""
NEWEST_TESTED = (7, 0)

REQUIRED = ("amdsmi_init", "amdsmi_shut_down", "amdsmi_get_processor_handles", "amdsmi_get_gpu_device_uuid",
            "amdsmi_get_gpu_device_bdf", "amdsmi_get_gpu_asic_info", "amdsmi_get_gpu_memory_total",
            "amdsmi_get_gpu_memory_usage", "AmdSmiException", "AmdSmiLibraryException", "AmdSmiInitFlags",
            "AmdSmiMemoryType")
"""Without these no GPU can be listed or read: discovery would have nothing to stand on."""

OPTIONAL: dict[str, str] = {
    # name: what is unknown (or what stands in) without it
    "amdsmi_get_gpu_kfd_info": "partition ids are taken from the PCI function number",
    "amdsmi_get_gpu_compute_partition": "the compute partition mode is unknown",
    "amdsmi_get_gpu_memory_partition": "the memory partition mode (NPS) is unknown",
    "amdsmi_get_clock_info": "the maximum gfx clock is unknown",
    "amdsmi_get_gpu_vram_info": "an unknown model gets no memory-bandwidth estimate",
    "amdsmi_get_gpu_driver_info": "the amdgpu driver version is unknown",
    "amdsmi_get_lib_version": "the libamd_smi version is unknown",
    "amdsmi_get_rocm_version": "the ROCm version is unknown (amdsmi 6.4+)",
    "amdsmi_get_gpu_metrics_info": "activity, clocks, PCIe, XGMI, energy and throttle reasons are unknown",
    "amdsmi_get_energy_count": "energy is unknown",
    "amdsmi_get_temp_metric": "the temperature is read from the metrics table only",
    "amdsmi_get_power_cap_info": "the power cap is unknown",
    "amdsmi_get_gpu_total_ecc_count": "ECC counts are unknown",
    "amdsmi_get_gpu_process_list": "processes are unknown",
}
"""Every other amdsmi function the backend and doctor use."""

_DIST_VERSION = re.compile(r"^Version:\s*(\S+)", re.MULTILINE)
_SETUP_VERSION = re.compile(r"""version\s*=\s*["']([^"']+)""")


@dataclass(frozen=True, slots=True)
class Bindings:
    """The optional amdsmi functions one package lacks, and its version when it can be told."""

    package: str | None = None
    missing: tuple[str, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)
    """Missing function -> what is unknown without it (for ``doctor``)."""

    def has(self, name: str) -> bool:
        return name not in self.missing

    @property
    def version(self) -> tuple[int, ...] | None:
        return version_tuple(self.package)


def detect(amdsmi: Any) -> Bindings:
    """Look every function up once. Raises :class:`BackendUnavailable` when a required one is missing."""
    version = package_version(amdsmi)
    lacking = [name for name in REQUIRED if getattr(amdsmi, name, None) is None]
    if lacking:
        raise BackendUnavailable(f"amdsmi {version or '(unknown version)'} lacks {', '.join(lacking)}: "
                                 f"roofwatch needs amdsmi {'.'.join(map(str, MINIMUM))} or newer")
    missing = tuple(name for name in OPTIONAL if not callable(getattr(amdsmi, name, None)))
    return Bindings(version, missing, {name: OPTIONAL[name] for name in missing})


def package_version(amdsmi: Any) -> str | None:
    """The amdsmi package's version: the ``amdsmi-*.dist-info`` pip writes beside it, else the
    ``setup.py`` ROCm ships inside it (``/opt/rocm/share/amd_smi``); None when neither says."""
    origin = getattr(amdsmi, "__file__", None)
    if not origin:
        return None
    package = Path(origin).parent
    for dist in sorted(package.parent.glob("amdsmi-*.dist-info")):
        metadata = dist / "METADATA"
        if metadata.exists():
            found = _DIST_VERSION.search(metadata.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(1)
    setup = package / "setup.py"
    if setup.exists():
        found = _SETUP_VERSION.search(setup.read_text(encoding="utf-8", errors="replace"))
        if found:
            return found.group(1)
    return None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"6.2.4"`` -> (6, 2, 4); ``"6.2.2.post0"`` -> (6, 2, 2); None for anything else."""
    if not text:
        return None
    parts = re.findall(r"\d+", text.split("+")[0])[:3]
    return tuple(int(p) for p in parts) if len(parts) >= 2 else None

"""DCGM directly, through NVIDIA's DCGM Python bindings: profiling counters for GPUs without GPM.

Used as a companion of the NVML backend (:func:`dcgm_join`): NVML reads each GPU as always, and
for whole GPUs without GPM (A100, A10, L4, L40S, V100, T4) DCGM's profiling fields fill SM, tensor,
DRAM, FP-pipe, engine and PCIe/NVLink activity, joined by UUID (agent.backends.profiling).
Modules: ``bindings`` (finding and importing the bindings), ``errors`` (status codes -> Meaning),
``fields`` (field ids, units, blanks), ``source`` (connection, watches, reads, reconnects).
"""

from __future__ import annotations

from typing import Callable, Sequence

from agent.backends.base import Backend
from agent.backends.dcgm.bindings import DEFAULT_BINDINGS_PATHS, DcgmModules, load_bindings
from agent.backends.dcgm.source import DcgmSource
from agent.backends.profiling import ProfilingJoin
from agent.model import DeviceInfo


def dcgm_join(backend: Backend, *, mode: str, host: str, paths: Sequence[str], interval_s: float,
              load: Callable[[Sequence[str]], DcgmModules] = load_bindings) -> Backend:
    """``backend`` with DCGM profiling joined in (``mode`` auto/on), or unchanged (off).

    ``on`` makes a DCGM that cannot start an error; ``auto`` logs it and carries on with NVML alone."""
    if mode == "off":
        return backend

    def open_source(devices: Sequence[DeviceInfo]) -> DcgmSource:
        return DcgmSource(load(paths), devices, host=host, interval_s=interval_s)

    return ProfilingJoin(backend, open_source, label="DCGM", required=mode == "on")


__all__ = ["DEFAULT_BINDINGS_PATHS", "DcgmModules", "DcgmSource", "dcgm_join", "load_bindings"]

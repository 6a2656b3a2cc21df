"""A fake libnvidia-ml.so, in Python, driven by the virtual GPU engine.

The real pynvml runs unchanged on top of it, so the NVML backend can be tested (and demoed)
without a GPU, including the parts that are hard to reach on hardware: old drivers without GPM,
NoPermission containers, unsupported fields, lost GPUs, hangs and XID events::

    from agent.virtual.backend import VirtualBackend
    from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml

    nvml = load_pynvml(FakeNvmlLibrary(VirtualBackend("demo")))
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)

Modules: ``library`` (shared state, handles, faults, dispatch), ``api_system``, ``api_device``,
``api_mig``, ``api_fields``, ``api_gpm``, ``api_events`` (the C functions by area), ``symbols`` (how a method
becomes an exported symbol), ``device`` (cumulative counters), ``gpm`` (metric table), ``events``
(XID schedule and delivery), ``profile`` (driver/model gates), ``ctypes_io`` (argument
marshalling), ``codes`` (nvml.h constants), ``loader`` (private pynvml copies).
"""

from agent.virtual.fake_nvml.library import FakeNvmlLibrary
from agent.virtual.fake_nvml.loader import load_pynvml

__all__ = ["FakeNvmlLibrary", "load_pynvml"]

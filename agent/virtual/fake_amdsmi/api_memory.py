"""Memory C functions: VRAM, CPU-visible VRAM and GTT totals and usage, per processor.

Each partition owns 1/N of the VRAM (its DeviceInfo) and reports its own processes' usage.
VRAM and VIS_VRAM are the same on MI300-class parts (the whole VRAM is CPU-visible); GTT is
host memory the driver maps for the GPU: a fixed pool, with a small per-process use.
"""

from __future__ import annotations

from typing import Any

from agent.virtual.devices import GIB, MIB
from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.device import AmdDevice
from agent.virtual.fake_amdsmi.arguments import Fail, out_struct, set_value, value
from agent.virtual.fake_nvml.symbols import c_function

GTT_TOTAL_BYTES = 256 * GIB
GTT_PER_PROCESS_BYTES = 8 * MIB
"""Host memory each GPU process maps (queues, signals, staging)."""


class MemoryFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @staticmethod
    def _total(dev: AmdDevice, kind: int) -> int:
        """Static: the size of memory type ``kind`` (reading it takes no sample)."""
        if kind in (codes.MEM_TYPE_VRAM, codes.MEM_TYPE_VIS_VRAM):
            if dev.info.memory_total_bytes is None:
                raise Fail(codes.STATUS_NOT_SUPPORTED)
            return dev.info.memory_total_bytes
        if kind == codes.MEM_TYPE_GTT:
            return GTT_TOTAL_BYTES
        raise Fail(codes.STATUS_INVAL)

    def _used(self, dev: AmdDevice, kind: int) -> int:
        self._total(dev, kind)  # validates the type
        self._fresh(dev)
        s = self._sample(dev)
        if kind == codes.MEM_TYPE_GTT:
            return GTT_PER_PROCESS_BYTES * len(s.processes or ())
        if s.mem_used_bytes is None:
            raise Fail(codes.STATUS_NOT_SUPPORTED)
        return s.mem_used_bytes

    @c_function("amdsmi_get_gpu_memory_total", handle=True)
    def _c_memory_total(self, dev: AmdDevice, kind: Any, out: Any) -> None:
        set_value(out, self._total(dev, value(kind)))

    @c_function("amdsmi_get_gpu_memory_usage", handle=True)
    def _c_memory_usage(self, dev: AmdDevice, kind: Any, out: Any) -> None:
        set_value(out, self._used(dev, value(kind)))

    @c_function("amdsmi_get_gpu_vram_usage", handle=True)
    def _c_vram_usage(self, dev: AmdDevice, out: Any) -> None:
        usage = out_struct(out)
        usage.vram_used = self._used(dev, codes.MEM_TYPE_VRAM) // MIB  # MB (MiB)
        usage.vram_total = self._total(dev, codes.MEM_TYPE_VRAM) // MIB

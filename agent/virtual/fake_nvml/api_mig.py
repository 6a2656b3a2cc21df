"""MIG C functions: the mode, MIG device handles (one per compute instance), their ids and parent.

A MIG device handle stands for one compute instance (nvml.h: "A MIG device handle is an NVML
abstraction which maps to a MIG compute instance"). A GPU instance that is not split has one,
compute instance 0; a split one has one per compute instance, all with the same GPU instance id.
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail, set_value, target, value, write_pointer
from agent.virtual.fake_nvml.device import NvmlDevice
from agent.virtual.fake_nvml.symbols import c_function


class MigFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""

    @c_function("nvmlDeviceGetMigMode", handle=True)
    def _c_mig_mode(self, dev: NvmlDevice, current: Any, pending: Any) -> None:
        if not self.mig_capable:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        if dev.is_mig:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        mode = 1 if dev.mig_enabled else 0
        set_value(current, mode)
        set_value(pending, mode)

    @c_function("nvmlDeviceGetMaxMigDeviceCount", handle=True)
    def _c_max_mig_count(self, dev: NvmlDevice, out: Any) -> None:
        if dev.is_mig:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        set_value(out, self.mig_slices if dev.mig_enabled else 0)  # "zero if MIG is not supported or enabled"

    @c_function("nvmlDeviceGetMigDeviceHandleByIndex", handle=True)
    def _c_mig_handle(self, dev: NvmlDevice, index: Any, out: Any) -> None:
        if not self.mig_capable:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        i = value(index)
        if dev.is_mig or not 0 <= i < self.mig_slices or target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        if i >= len(dev.children):
            raise Fail(codes.ERROR_NOT_FOUND)
        write_pointer(out, self._handle_address(dev.children[i]))

    @c_function("nvmlDeviceIsMigDeviceHandle", handle=True)
    def _c_is_mig(self, dev: NvmlDevice, out: Any) -> None:
        set_value(out, 1 if dev.is_mig else 0)

    @c_function("nvmlDeviceGetGpuInstanceId", handle=True)
    def _c_gpu_instance_id(self, dev: NvmlDevice, out: Any) -> None:
        if not dev.is_mig:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        set_value(out, dev.gi)

    @c_function("nvmlDeviceGetComputeInstanceId", handle=True)
    def _c_compute_instance_id(self, dev: NvmlDevice, out: Any) -> None:
        if not dev.is_mig:
            raise Fail(codes.ERROR_NOT_SUPPORTED)
        set_value(out, dev.ci)

    @c_function("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle=True)
    def _c_parent_handle(self, dev: NvmlDevice, out: Any) -> None:
        if dev.parent is None or target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        write_pointer(out, self._handle_address(dev.parent))

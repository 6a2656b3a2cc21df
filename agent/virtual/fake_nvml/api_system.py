"""System-level C functions: init/shutdown reference counting, versions, enumeration.

The real library counts nvmlInit calls and only tears down on the matching last nvmlShutdown;
every call outside that returns NVML_ERROR_UNINITIALIZED. Backends that re-initialise after a
lost GPU depend on exactly that, so it is kept.
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail, set_value, target, value, write_pointer, write_string
from agent.virtual.fake_nvml.profile import nvml_version
from agent.virtual.fake_nvml.symbols import c_function


class SystemFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""
    @c_function("nvmlInitWithFlags", needs_init=False)
    def _c_init_with_flags(self, flags: Any = 0) -> int | None:
        if not self.profile.driver_loaded or not self.is_nvidia:
            return codes.ERROR_DRIVER_NOT_LOADED
        with self._lock:
            self._refcount += 1
        return None

    @c_function("nvmlInit", "nvmlInit_v2", needs_init=False)
    def _c_init(self) -> int | None:
        return self._c_init_with_flags(0)

    @c_function("nvmlShutdown", needs_init=False)
    def _c_shutdown(self) -> int | None:
        with self._wake:
            if self._refcount == 0:
                return codes.ERROR_UNINITIALIZED
            self._refcount -= 1
            if self._refcount == 0:
                self._wake.notify_all()  # event waits end: the library is gone
        return None

    @c_function("nvmlErrorString", needs_init=False)
    def _c_error_string(self, result: Any) -> bytes:
        return codes.ERROR_STRINGS.get(value(result), b"Unknown Error")

    @c_function("nvmlSystemGetDriverVersion")
    def _c_driver_version(self, buffer: Any, length: Any) -> None:
        write_string(buffer, length, self.profile.driver_version)

    @c_function("nvmlSystemGetNVMLVersion")
    def _c_nvml_version(self, buffer: Any, length: Any) -> None:
        write_string(buffer, length, nvml_version(self.profile))

    @c_function("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
    def _c_cuda_version(self, out: Any) -> None:
        set_value(out, self.profile.cuda_driver_version)

    @c_function("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")
    def _c_count(self, out: Any) -> None:
        set_value(out, len(self.physical))

    @c_function("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2")
    def _c_handle_by_index(self, index: Any, out: Any) -> None:
        i = value(index)
        if not 0 <= i < len(self.physical) or target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        write_pointer(out, self._handle_address(self.physical[i]))

    @c_function("nvmlDeviceGetHandleByUUID")
    def _c_handle_by_uuid(self, uuid: Any, out: Any) -> None:
        raw = uuid if isinstance(uuid, bytes) else getattr(target(uuid), "value", None)
        if not isinstance(raw, bytes) or target(out) is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        dev = self._by_uuid.get(raw.decode(errors="replace"))
        if dev is None:
            raise Fail(codes.ERROR_NOT_FOUND)
        write_pointer(out, self._handle_address(dev))

"""The two per-process NVML reads in one driver call each instead of two.

pynvml's wrappers of ``nvmlDeviceGetComputeRunningProcesses_v3`` and
``nvmlDeviceGetProcessUtilization`` first call the driver with no buffer to learn the count, then
call again to fetch. The process list is NVML's slowest per-device read (milliseconds on a busy
GPU), and both run every interval on every GPU, so the second call is a real cost. These readers
keep a buffer sized by the last answer (with pynvml's own head room, count x 2 + 5) and call the
driver once; when the list outgrew the buffer the driver says so (INSUFFICIENT_SIZE with the new
count), the buffer grows and the call is repeated, exactly as pynvml would have done.

They use pynvml's ``_nvmlGetFunctionPointer`` and struct types. Where a pynvml lacks them, the
public wrapper is used instead (two calls), so nothing depends on them being there. The same
reader serves the ``_v2`` symbol of drivers before R510, which nvidia-ml-py 12.535 has no
wrapper for (the struct is the same in both: pid, used memory, GPU and compute instance ids).
The MPS client list (``nvmlDeviceGetMPSComputeRunningProcesses_v3``, ``_v2`` on R470 to R505) has the
same signature and struct, so the same reader serves it (``mps=True``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from agent.backends.nvml.structs import plain

ProcessMemory = tuple[int, "int | None"]
"""(pid, used GPU memory in bytes or None when the driver cannot say)."""


def _head_room(count: int) -> int:
    return count * 2 + 5


class _SizedRead:
    """One NVML function that fills a caller-sized array of structs."""

    def __init__(self, nvml: Any, symbol: str, struct_name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._nvml = nvml
        self._symbol = symbol
        self._struct = getattr(nvml, struct_name, None) if struct_name else None
        self._wrap = wrap
        self._fn: Callable[..., int] | None = None
        self._buffer: Any = None
        self._size = 0

    @property
    def direct(self) -> bool:
        """Whether this pynvml lets us call the driver function ourselves."""
        return isinstance(self._struct, type) and callable(getattr(self._nvml, "_nvmlGetFunctionPointer", None))

    def _function(self) -> Callable[..., int]:
        if self._fn is None:
            self._fn = self._wrap(self._nvml._nvmlGetFunctionPointer(self._symbol))
        return self._fn

    def _ensure(self, size: int) -> None:
        if size > self._size:
            self._size = size
            self._buffer = (self._struct * size)()

    def call(self, make_args: Callable[[Any, Any], tuple[Any, ...]], count: ctypes.c_uint) -> int:
        """Call once with the buffer; on INSUFFICIENT_SIZE grow it to the count the driver gave
        and call again. Returns the final NVML return code (``count`` holds the entries)."""
        fn = self._function()
        self._ensure(_head_room(0))
        for _ in range(3):  # a list that keeps outgrowing the buffer is a race; give up after three
            count.value = self._size
            ret = fn(*make_args(self._buffer, count))
            if ret != self._nvml.NVML_ERROR_INSUFFICIENT_SIZE:
                return ret
            self._ensure(_head_room(count.value))
        return ret

    def entries(self, count: ctypes.c_uint) -> list[Any]:
        return [self._buffer[i] for i in range(count.value)]


COMPUTE_PROCESSES = "nvmlDeviceGetComputeRunningProcesses"
MPS_PROCESSES = "nvmlDeviceGetMPSComputeRunningProcesses"
"""The two process lists' pynvml names without a version suffix (the unversioned wrapper calls ``_v3``)."""


class ComputeProcesses:
    """``nvmlDeviceGetComputeRunningProcesses_v3`` (or ``_v2``), or with ``mps`` the MPS client list, as
    [(pid, used bytes)]."""

    def __init__(self, nvml: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]], *, version: int = 3,
                 struct: str | None = "c_nvmlProcessInfo_v3_t", mps: bool = False) -> None:
        """``struct``: the pynvml struct to read into (:class:`~agent.backends.nvml.bindings.Bindings`
        picks one this release has); ``version`` 2 reads the symbol of drivers before R510; ``mps`` the
        MPS clients' list instead of every compute context."""
        self._nvml = nvml
        name = MPS_PROCESSES if mps else COMPUTE_PROCESSES
        self._wrapper = f"{name}{'_v2' if version == 2 else ''}"
        self._read = _SizedRead(nvml, f"{name}_v{version}", struct or "", wrap)

    def __call__(self, handle: Any) -> list[ProcessMemory]:
        nvml = self._nvml
        if not self._read.direct:
            wrapper = getattr(nvml, self._wrapper, None)
            if wrapper is None:  # neither the wrapper nor the means to call the symbol: an absent reading
                raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in wrapper(handle)]
        count = ctypes.c_uint(0)
        ret = self._read.call(lambda buffer, n: (handle, ctypes.byref(n), buffer), count)
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        not_available = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        out = []
        for entry in self._read.entries(count):
            used = plain(entry, "usedGpuMemory")
            out.append((int(plain(entry, "pid")), None if used == not_available else int(used)))
        return out


class ProcessUtilization:
    """``nvmlDeviceGetProcessUtilization`` since a timestamp, as [(pid, timestamp µs, SM %)]."""

    def __init__(self, nvml: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self._nvml = nvml
        self._read = _SizedRead(nvml, "nvmlDeviceGetProcessUtilization", "c_nvmlProcessUtilizationSample_t", wrap)

    def __call__(self, handle: Any, since_us: int) -> list[tuple[int, int, int]]:
        nvml = self._nvml
        if not self._read.direct:
            return [(int(s.pid), int(s.timeStamp), int(s.smUtil))
                    for s in nvml.nvmlDeviceGetProcessUtilization(handle, since_us)]
        count = ctypes.c_uint(0)
        stamp = ctypes.c_ulonglong(since_us)
        ret = self._read.call(lambda buffer, n: (handle, buffer, ctypes.byref(n), stamp), count)
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        return [(int(plain(s, "pid")), int(plain(s, "timeStamp")), int(plain(s, "smUtil")))
                for s in self._read.entries(count)]

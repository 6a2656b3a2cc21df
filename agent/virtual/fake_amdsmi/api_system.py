"""Library-level C functions: init/shut_down reference counting, versions, status strings, enumeration.

From 6.4 amdsmi counts amdsmi_init calls and tears down only on the matching last
amdsmi_shut_down (its documentation: "requires the same number of inits as shutdowns"); 6.2 and 6.3
keep one flag instead (amd_smi.cc at rocm-6.2.2 and on the 6.3 branch): a second init does nothing,
the first shut_down tears down, and a shut_down without init succeeds. Everything else returns
AMDSMI_STATUS_NOT_INIT outside an init. Enumeration is two-level: one
socket per physical GPU, and under it one processor per compute partition (a single one in
SPX). The processor list is the one the first amdsmi_init took (:mod:`.handles`): a GPU lost
since is still listed, one lost at that init is not.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.arguments import (
    Fail,
    out_struct,
    put,
    pointer_value,
    set_value,
    value,
    write_handles,
    write_pointer,
    write_pointer_field,
    write_string,
)
from agent.virtual.fake_nvml.symbols import c_function

_LIB_VERSIONS = {(6, 2): (24, 6, 3), (6, 3): (24, 7, 1), (6, 4): (25, 3, 0), (7, 0): (26, 0, None),
                 (7, 1): (26, 1, None)}
"""ROCm release -> libamd_smi (year, major, minor) as amd-smi version prints it. 6.2: amdsmi.h at tag
rocm-6.2.2 (24.6.3); 6.3: 24.7 (the ROCm 6.3 branch); 6.4 dropped the year from the version
(CHANGELOG 6.4.0) and 7.0 prints 26.0.x (CHANGELOG 7.0.0); None: the ROCm patch release."""


def lib_version(rocm_version: str | tuple[int, ...]) -> tuple[int, int, int]:
    """amdsmi_version_t (year or major, major or minor, release) of the libamd_smi of ``rocm_version``."""
    parts = [int(p) for p in (rocm_version.split(".") if isinstance(rocm_version, str) else rocm_version)] + [0, 0]
    known = _LIB_VERSIONS.get((parts[0], parts[1]))
    if known is None:
        return parts[0] + 19, parts[1], parts[2]
    first, second, third = known
    return first, second, parts[2] if third is None else third


class SystemFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_init", needs_init=False)
    def _c_init(self, flags: Any = codes.INIT_AMD_GPUS) -> int | None:
        if not self.is_amd:
            return codes.STATUS_DRIVER_NOT_LOADED  # no amdgpu on this node
        counted = self.release.at_least(6, 4)
        with self._lock:
            first = self._refcount == 0
            self._refcount = self._refcount + 1 if counted else 1
        if first:
            self.handles.initialise(self._vt())
        return None

    @c_function("amdsmi_shut_down", needs_init=False)
    def _c_shut_down(self) -> int | None:
        counted = self.release.at_least(6, 4)
        with self._lock:
            if self._refcount == 0:
                return codes.STATUS_NOT_INIT if counted else None
            self._refcount = self._refcount - 1 if counted else 0
        return None

    @c_function("amdsmi_status_code_to_string", needs_init=False)
    def _c_status_string(self, status: Any, out: Any) -> None:
        text = codes.STATUS_STRINGS.get(value(status), b"An unknown error occurred")
        write_pointer(out, ctypes.addressof(self._static_string(text)))

    @c_function("amdsmi_get_lib_version", needs_init=False)
    def _c_lib_version(self, out: Any) -> None:
        """Until 6.4 the version leads with a ``year`` (24.6.3.0) and amdsmi must be initialised; from
        6.4 it is major.minor.release (25.3.0) and answers before amdsmi_init (CHANGELOG 6.4.0)."""
        if not self.release.at_least(6, 4) and not self._initialised():
            raise Fail(codes.STATUS_NOT_INIT)
        version = out_struct(out)
        chosen = "rocm_version" in self.profile.model_fields_set  # a scenario's own rocm_version wins
        rocm = self.profile.rocm_version if chosen else (self.release.version or self.profile.rocm_version)
        numbers = lib_version(rocm)
        if self.release.at_least(6, 4):  # 6.4 keeps the year field (deprecated) but numbers without it
            put(version, "year", numbers[0])
            version.major, version.minor, version.release = numbers
        else:
            version.year, version.major, version.minor, version.release = (*numbers, 0)
        build = ".".join(str(v) for v in numbers).encode()
        write_pointer_field(version, "build", ctypes.addressof(self._static_string(build)))

    @c_function("amdsmi_get_socket_handles")
    def _c_socket_handles(self, count: Any, handles: Any) -> None:
        write_handles(count, handles, [self._socket_address(s) for s in self.sockets])

    @c_function("amdsmi_get_processor_handles")
    def _c_processor_handles(self, socket: Any, count: Any, handles: Any) -> None:
        sock = self._decode_socket(pointer_value(socket))
        if sock is None:
            raise Fail(codes.STATUS_INVAL)
        write_handles(count, handles, self.handles.listed(sock))

    @c_function("amdsmi_get_socket_info")
    def _c_socket_info(self, socket: Any, length: Any, buffer: Any) -> None:
        sock = self._decode_socket(pointer_value(socket))
        if sock is None:
            raise Fail(codes.STATUS_INVAL)
        bus_id = sock.primary.info.pci_bus_id or f"0000:{sock.index:02x}:00.0"
        write_string(buffer, length, bus_id.rsplit(".", 1)[0])  # the socket: domain:bus:device

    @c_function("amdsmi_get_processor_type", handle=True)
    def _c_processor_type(self, dev: Any, out: Any) -> None:
        set_value(out, codes.PROCESSOR_TYPE_AMD_GPU)

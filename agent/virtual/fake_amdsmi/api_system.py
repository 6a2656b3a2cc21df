"""Library-level C functions: init/shut_down reference counting, versions, status strings, enumeration.

amdsmi counts amdsmi_init calls and tears down only on the matching last amdsmi_shut_down;
everything else returns AMDSMI_STATUS_NOT_INIT outside that. Enumeration is two-level: one
socket per physical GPU, and under it one processor per compute partition (a single one in
SPX). A GPU inside a ``lost`` window is missing from its socket's processor list.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_amdsmi.arguments import (
    Fail,
    out_struct,
    pointer_value,
    set_value,
    value,
    write_handles,
    write_pointer,
    write_pointer_field,
    write_string,
)
from agent.virtual.fake_nvml.symbols import c_function

_LIB_VERSIONS = {(6, 3): (25, 1), (6, 4): (25, 3), (7, 0): (26, 0), (7, 1): (26, 1)}
"""ROCm release -> amdsmi library (major, minor) as amd-smi version prints them."""


def lib_version(rocm_version: str) -> tuple[int, int, int]:
    """amdsmi_version_t (major, minor, release) of the libamd_smi shipped with ``rocm_version``."""
    parts = [int(p) for p in rocm_version.split(".")] + [0, 0]
    major, minor = _LIB_VERSIONS.get((parts[0], parts[1]), (parts[0] + 19, parts[1]))
    return major, minor, parts[2]


class SystemFunctions:
    """Mixin of :class:`~agent.virtual.fake_amdsmi.library.FakeAmdSmiLibrary`: uses its state and helpers."""

    @c_function("amdsmi_init", needs_init=False)
    def _c_init(self, flags: Any = codes.INIT_AMD_GPUS) -> int | None:
        if not self.is_amd:
            return codes.STATUS_DRIVER_NOT_LOADED  # no amdgpu on this node
        with self._lock:
            self._refcount += 1
        return None

    @c_function("amdsmi_shut_down", needs_init=False)
    def _c_shut_down(self) -> int | None:
        with self._lock:
            if self._refcount == 0:
                return codes.STATUS_NOT_INIT
            self._refcount -= 1
        return None

    @c_function("amdsmi_status_code_to_string", needs_init=False)
    def _c_status_string(self, status: Any, out: Any) -> None:
        text = codes.STATUS_STRINGS.get(value(status), b"An unknown error occurred")
        write_pointer(out, ctypes.addressof(self._static_string(text)))

    @c_function("amdsmi_get_lib_version")
    def _c_lib_version(self, out: Any) -> None:
        version = out_struct(out)
        version.major, version.minor, version.release = lib_version(self.profile.rocm_version)
        build = ".".join(str(v) for v in lib_version(self.profile.rocm_version)).encode()
        write_pointer_field(version, "build", ctypes.addressof(self._static_string(build)))

    @c_function("amdsmi_get_socket_handles")
    def _c_socket_handles(self, count: Any, handles: Any) -> None:
        write_handles(count, handles, [self._socket_address(s) for s in self.sockets])

    @c_function("amdsmi_get_processor_handles")
    def _c_processor_handles(self, socket: Any, count: Any, handles: Any) -> None:
        sock = self._decode_socket(pointer_value(socket))
        if sock is None:
            raise Fail(codes.STATUS_INVAL)
        vt = self._vt()
        write_handles(count, handles, [self._handle_address(d, vt) for d in sock.devices if not self._lost_now(d, vt)])

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

"""Argument helpers with amdsmi status codes.

The shared :mod:`agent.virtual.fake_nvml.ctypes_io` helpers fail with NVML's numbers (2 for a
NULL out-parameter, 7 for a short buffer), which mean NOT_SUPPORTED and API_FAILED to amdsmi;
these wrappers translate them and add what amdsmi needs on top (handle arrays, NULL pointers).
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.virtual.fake_amdsmi import codes
from agent.virtual.fake_nvml import ctypes_io
from agent.virtual.fake_nvml.ctypes_io import Fail, pointer_value, target, value

__all__ = ["Fail", "pointer_value", "target", "value", "out_struct", "set_value", "write_string",
           "write_pointer_field", "write_pointer", "is_null", "write_handles", "has_field", "put"]

_NVML_TO_AMDSMI = {2: codes.STATUS_INVAL, 7: codes.STATUS_INSUFFICIENT_SIZE}


def _translated(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Fail as failure:
        raise Fail(_NVML_TO_AMDSMI.get(failure.code, codes.STATUS_API_FAILED)) from None


def out_struct(arg: Any) -> Any:
    """The structure an out-parameter points at; NULL is AMDSMI_STATUS_INVAL."""
    obj = target(arg)
    if is_null(obj):
        raise Fail(codes.STATUS_INVAL)
    return obj


def set_value(out: Any, number: int | float) -> None:
    _translated(ctypes_io.set_value, out, number)


def write_string(buffer: Any, length: Any, text: str) -> None:
    _translated(ctypes_io.write_string, buffer, length, text)


def write_pointer(out: Any, address: int) -> None:
    _translated(ctypes_io.write_pointer, out, address)


def write_pointer_field(struct: Any, name: str, address: int) -> None:
    ctypes_io.write_pointer_field(struct, name, address)


def is_null(arg: Any) -> bool:
    """None, 0, or a NULL ``POINTER(...)()`` (arrays are never NULL, even empty ones)."""
    if arg is None or (isinstance(arg, int) and arg == 0):
        return True
    return isinstance(arg, ctypes._Pointer) and not arg


def write_handles(count: Any, handles: Any, addresses: list[int]) -> None:
    """The amdsmi enumeration contract: NULL list -> ``*count`` = how many; else fill up to ``*count``."""
    n = target(count)
    if is_null(n):
        raise Fail(codes.STATUS_INVAL)
    out = target(handles)
    if is_null(out):
        n.value = len(addresses)
        return
    room = n.value if not hasattr(out, "__len__") else min(n.value, len(out))
    k = min(room, len(addresses))
    for i in range(k):
        out[i] = addresses[i]
    n.value = k


def has_field(struct: Any, name: str) -> bool:
    """Whether this release's structure has field ``name`` (older wrappers define fewer)."""
    return any(f[0] == name for f in getattr(type(struct), "_fields_", ()))


def put(struct: Any, name: str, data: Any) -> bool:
    """``struct.name = data`` if the structure has that field; False when it has not.

    The fake serves the wrappers of several releases, each with its own layout of the same
    structure (amdsmi 6.2's amdsmi_asic_info_t has no num_of_compute_units, 7.0's strings are 256
    bytes, 6.x's 32 or 64). Text goes into a char array cut to its size, NUL included; a number
    into a number field; a value of the other kind is not written (returns False).
    """
    if not has_field(struct, name):
        return False
    current = getattr(struct, name)
    if isinstance(data, str):
        if not isinstance(current, bytes):
            return False
        size = getattr(type(struct), name).size
        setattr(struct, name, data.encode()[:size - 1])
        return True
    if isinstance(current, bytes):
        return False
    setattr(struct, name, data)
    return True

"""Reading and writing the ctypes arguments pynvml hands to a C function.

pynvml calls the fake exactly as it calls libnvidia-ml: ``byref(x)`` out-parameters, ctypes
arrays, ``c_uint(...)`` values, bare Python ints, opaque handle pointers and string buffers.
Each helper here accepts every form one argument can take, so the C functions in
:mod:`agent.virtual.fake_nvml.library` read like their C prototypes.

Handles are written as raw pointer values into the caller's ``POINTER(...)`` object, so the fake
never needs the handle *types* of the pynvml copy that calls it (each copy has its own).
"""

from __future__ import annotations

import ctypes
from typing import Any


class Fail(Exception):
    """Raised inside a C function to return ``code`` (keeps the functions free of if-chains)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def target(arg: Any) -> Any:
    """The ctypes object behind an argument: ``byref(x)`` -> x; an object -> itself; NULL -> None."""
    if arg is None:
        return None
    obj = getattr(arg, "_obj", None)  # CArgObject from byref()
    return obj if obj is not None else arg


def value(arg: Any) -> int:
    """An integer argument passed as a Python int, a ``c_uint(...)`` or ``byref`` of one."""
    if isinstance(arg, int):
        return arg
    obj = target(arg)
    return int(obj.value)


def pointer_value(arg: Any) -> int:
    """The address an opaque handle argument holds (0 for NULL / None)."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg
    obj = target(arg)
    return ctypes.cast(obj, ctypes.c_void_p).value or 0


def write_pointer(out: Any, address: int) -> None:
    """Store ``address`` in the handle the caller passed by reference (``byref(c_nvmlDevice_t())``)."""
    obj = target(out)
    if obj is None:
        raise Fail(2)
    ctypes.c_void_p.from_buffer(obj).value = address


def write_pointer_field(struct: Any, name: str, address: int) -> None:
    """Store ``address`` in pointer field ``name`` of a structure (e.g. nvmlEventData_t.device)."""
    offset = getattr(type(struct), name).offset
    ctypes.c_void_p.from_buffer(struct, offset).value = address


def set_value(out: Any, number: int | float) -> None:
    """``*out = number`` for a scalar out-parameter; NULL is an invalid argument."""
    obj = target(out)
    if obj is None:
        raise Fail(2)
    obj.value = number


def write_string(buffer: Any, length: Any, text: str) -> None:
    """Copy ``text`` NUL-terminated into a ``create_string_buffer``; too small -> INSUFFICIENT_SIZE."""
    buf = target(buffer)
    if buf is None:
        raise Fail(2)
    data = text.encode()
    if len(data) + 1 > value(length) or len(data) + 1 > ctypes.sizeof(buf):
        raise Fail(7)
    ctypes.memmove(buf, data + b"\0", len(data) + 1)


def is_null(arg: Any) -> bool:
    return arg is None or (isinstance(arg, int) and arg == 0)

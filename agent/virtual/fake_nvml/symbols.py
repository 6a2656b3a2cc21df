"""Exported C symbols: how a Python method becomes something pynvml can treat as a C function.

pynvml fetches each symbol with ``getattr(nvmlLib, name)``, caches it, sometimes sets
``fn.restype`` on it, and calls it with ctypes arguments. So an exported symbol is a small
callable *object* (attribute assignment must work, which a bound method refuses), and the method
behind it is tagged with :func:`c_function` to say which symbol names it serves and whether its
first argument is a device handle (for handle checks and per-GPU call counts).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Protocol


class _Dispatcher(Protocol):
    def _dispatch(self, fn: "CFunction", args: tuple[Any, ...]) -> Any: ...


Method = Callable[..., Any]


def c_function(*names: str, handle: bool = False, needs_init: bool = True) -> Callable[[Method], Method]:
    """Tag a method as the implementation of C symbols ``names``.

    ``handle``: the first argument is an nvmlDevice_t (checked, and the call counted per GPU);
    the method then receives the resolved device instead. ``needs_init``: fails with
    NVML_ERROR_UNINITIALIZED outside nvmlInit/nvmlShutdown.
    """
    def mark(method: Method) -> Method:
        method._c_symbols = (names, handle, needs_init)  # type: ignore[attr-defined]
        return method
    return mark


class CFunction:
    """One exported symbol of the fake library; calls go through the library's dispatcher."""

    def __init__(self, library: _Dispatcher, name: str, impl: Callable[..., Any], *, handle: bool,
                 needs_init: bool) -> None:
        self.name = name
        self.impl = impl
        self.handle = handle
        self.needs_init = needs_init
        self._library = library
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._library._dispatch(self, args)

    def __repr__(self) -> str:
        return f"<fake C function {self.name}>"


def collect(obj: Any) -> dict[str, tuple[Callable[..., Any], bool, bool]]:
    """Symbol name -> (bound method, handle, needs_init) for every tagged method of ``obj``."""
    out: dict[str, tuple[Callable[..., Any], bool, bool]] = {}
    for cls in reversed(type(obj).__mro__):
        for attr_name, attr in vars(cls).items():
            tag = getattr(attr, "_c_symbols", None)
            if tag is None:
                continue
            names, handle, needs_init = tag
            for name in names:
                out[name] = (getattr(obj, attr_name), handle, needs_init)
    return out

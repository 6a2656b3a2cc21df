"""Count NVML library calls per thread, so each device's sample can report what it cost.

The collector reads every device in its own worker thread, so a thread-local counter reset at
the start of ``sample`` and read at its end is exactly "NVML calls per device per interval",
with no locking on the hot path. Only the library's functions (``nvml*``, or ``amdsmi_*`` for the
AMD backend) are counted; constants, structs and exception classes pass straight through.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable


class CountingNvml:
    """A thin proxy over a pynvml module that counts the calls each thread makes."""

    def __init__(self, module: Any, prefix: str = "nvml") -> None:
        """``prefix``: which callables are library calls (``nvml``; ``amdsmi_`` for the AMD backend)."""
        self.module = module
        self._prefix = prefix
        self._local = threading.local()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        """First lookup of a name: wrap it if it is a library call, then keep it on the instance,
        so every later call finds it by plain attribute lookup (this runs per call otherwise)."""
        target = getattr(self.module, name)
        if not (name.startswith(self._prefix) and callable(target)) or isinstance(target, type):
            return target
        with self._lock:
            wrapped = self.__dict__.get(name) or self._wrap(target)
            self.__dict__[name] = wrapped
        return wrapped

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Count calls of a library function reached some other way (a raw driver function pointer)."""
        return self._wrap(fn)

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            local.count = getattr(local, "count", 0) + 1
            return fn(*args, **kwargs)

        return counted

    def reset(self) -> None:
        self._local.count = 0

    @property
    def count(self) -> int:
        """Calls made by the current thread since its last :meth:`reset`."""
        return getattr(self._local, "count", 0)

"""Run an exporter over the fake NVIDIA driver, and account for what the fake itself costs.

``python -m benchmarks.launch PROBE_FILE roofwatch ARGS...`` runs ``roofwatch ARGS``;
``python -m benchmarks.launch PROBE_FILE nvitop ARGS...`` runs ``nvitop-exporter ARGS`` with the
same fake libnvidia-ml (playing the same virtual node) in place of the real one.

The fake driver is Python and runs in the exporter's process, where the real driver's C code
would run in microseconds. So every call into it is timed on the calling thread's CPU clock, and
on ``SIGUSR1`` the process writes ``{"seq", "driver_cpu_s", "calls"}`` to PROBE_FILE: the parent
subtracts the driver's share from the process's CPU, for both exporters alike.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agent.virtual.fake_nvml.library import FakeNvmlLibrary

_spent: dict[int, float] = {}
"""CPU seconds spent inside the fake driver, per thread (each thread writes only its own key)."""
_libraries: list[FakeNvmlLibrary] = []


def _account_driver_time() -> None:
    """Wrap the fake's single entry point (every C function goes through ``_dispatch``)."""
    original = FakeNvmlLibrary._dispatch
    original_init = FakeNvmlLibrary.__init__

    def timed(self: FakeNvmlLibrary, fn: Any, args: tuple[Any, ...]) -> Any:
        start = time.thread_time()
        try:
            return original(self, fn, args)
        finally:
            key = threading.get_ident()
            _spent[key] = _spent.get(key, 0.0) + time.thread_time() - start

    def remembered(self: FakeNvmlLibrary, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _libraries.append(self)

    FakeNvmlLibrary._dispatch = timed  # type: ignore[method-assign]
    FakeNvmlLibrary.__init__ = remembered  # type: ignore[method-assign]


def _install_probe(path: Path) -> None:
    seq = [0]

    def dump(_signum: int, _frame: object) -> None:
        seq[0] += 1
        calls = sum(sum(lib.calls.values()) for lib in _libraries)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps({"seq": seq[0], "driver_cpu_s": sum(_spent.values()), "calls": calls}))
        os.replace(partial, path)

    signal.signal(signal.SIGUSR1, dump)


def _run_nvitop(args: list[str]) -> int:
    """nvitop-exporter imports ``pynvml`` by name: give it a copy bound to the fake driver."""
    from agent.backends.virtual import VirtualBackend
    from agent.virtual.fake_nvml import load_pynvml

    sys.modules["pynvml"] = load_pynvml(FakeNvmlLibrary(VirtualBackend("demo")))
    from nvitop_exporter.cli import main as nvitop_main

    sys.argv = ["nvitop-exporter", *args]
    return nvitop_main()


def main(argv: list[str]) -> int:
    probe, which, *args = argv
    _account_driver_time()
    _install_probe(Path(probe))
    if which == "roofwatch":
        from agent.app.cli import main as roofwatch_main

        return roofwatch_main(args)
    if which == "nvitop":
        return _run_nvitop(args)
    raise SystemExit(f"unknown exporter {which!r}: roofwatch or nvitop")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

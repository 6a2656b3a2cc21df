"""DCGM for the simulated node of ``nvml-virtual``: the fake bindings over a fake host engine.

The engine reads a twin of the node the fake NVML plays (agent.virtual.fake_dcgm), so NVML and
DCGM describe the same GPUs doing the same things, as on a real node where both read one driver.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from agent.backends.dcgm.bindings import DcgmModules, load_bindings


def virtual_loader(virtual: Any, **engine_options: Any) -> Callable[[Sequence[str]], DcgmModules]:
    """A bindings loader that also makes the loaded bindings use a fake libdcgm for ``virtual``'s node."""
    from agent.virtual.fake_dcgm import FakeDcgmLibrary, FakeHostEngine, install

    def load(paths: Sequence[str]) -> DcgmModules:
        modules = load_bindings(paths)
        install(modules.structs, FakeDcgmLibrary(FakeHostEngine(virtual, **engine_options)))
        return modules

    return load

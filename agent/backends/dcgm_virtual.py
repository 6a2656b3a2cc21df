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

    options = {**node_options(virtual), **engine_options}

    def load(paths: Sequence[str]) -> DcgmModules:
        modules = load_bindings(paths)
        install(modules.structs, FakeDcgmLibrary(FakeHostEngine(virtual, **options)))
        return modules

    return load


def node_options(virtual: Any) -> dict[str, Any]:
    """The host engine's options from the node's ``dcgm`` block of the scenario (agent.virtual.profiles.DcgmProfile):
    its release and which fields it offers, so a scenario can play a node whose DCGM gives only the cumulative
    counters."""
    scenario = getattr(getattr(virtual, "engine", None), "scenario", None)
    node = next((n for n in getattr(scenario, "nodes", ()) if n.name == getattr(virtual, "node", None)), None)
    profile = getattr(node, "dcgm", None)
    if profile is None:
        return {}
    return {"version": profile.version, "cumulative": profile.cumulative, "ratios": profile.ratios}

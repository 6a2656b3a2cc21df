"""A node with a fake DCGM: the fake bindings over a fake libdcgm and nv-hostengine, on a hand-moved clock.

The engine plays a full-counters twin of the virtual node (agent.virtual.fake_dcgm.engine); a
second twin on the same scenario and clock (``reference``) gives the values DCGM must report.
"""

from __future__ import annotations

from typing import Any

from agent.backends.dcgm import DcgmSource, load_bindings
from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_dcgm import BINDINGS_DIR, FakeDcgmLibrary, FakeHostEngine, install
from agent.virtual.fake_dcgm.engine import full_counters_twin
from tests.fake_nvml_rig import START, scenario
from tests.nvml_harness import ManualClock

A100 = "a100-sxm-80gb"


class DcgmRig:
    def __init__(self, model: str = A100, gpus: int = 2, **engine: Any) -> None:
        self.scenario = scenario(model, gpus)
        self.clock = ManualClock()
        self.virtual = VirtualBackend(self.scenario, clock=self.clock, start_time=START)
        self.engine = FakeHostEngine(self.virtual, **engine)
        self.lib = FakeDcgmLibrary(self.engine)
        self.modules = load_bindings([str(BINDINGS_DIR)])
        install(self.modules.structs, self.lib)
        self.reference = full_counters_twin(VirtualBackend(self.scenario, clock=self.clock, start_time=START))

    def source(self, **kw: Any) -> DcgmSource:
        kw.setdefault("interval_s", 1.0)
        return DcgmSource(self.modules, self.engine.devices, wall=self.clock, clock=self.clock, **kw)

    def step(self, seconds: float = 1.0) -> float:
        self.clock.t += seconds
        return self.clock.t

    def uuid(self, gpu: str) -> str:
        return next(d.uuid for d in self.engine.devices if d.gpu == gpu)

"""The real AMD backend over a real amdsmi package over the fake libamd_smi, on a hand-moved clock.

Shared by the AMD backend tests. ``Rig(scenario, package=...)`` loads the amdsmi release whose
package directory is given (default: the installed one); a twin virtual backend on the same
scenario and clock gives the simulation's truth to compare with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.backends.amd import AmdBackend
from agent.backends.base import DeviceError
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi
from agent.virtual.scenario import parse_scenario
from tests.nvml_harness import T0, ManualClock


def scenario(gpus: int = 2, workloads: list | None = None, **node: Any) -> Any:
    workloads = workloads if workloads is not None else [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "process": "vllm", "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus]
    return parse_scenario({"name": "t", "seed": 11, "nodes": [
        {"name": "n1", "model": "mi300x", "gpus": gpus, "workloads": workloads, **node}]})


CPX = dict(gpus=1, amd={"compute_partition": "CPX", "memory_partition": "NPS1"}, workloads=[
    {"job": "a", "gpus": ["0/0"], "phases": [{"kind": "compute", "mfu": 0.4, "duration_s": 3600}]},
    {"job": "b", "gpus": ["0/3"], "phases": [{"kind": "memory", "mbu": 0.5, "duration_s": 3600}]},
])


class Rig:
    def __init__(self, scen: Any, package: Path | None = None) -> None:
        self.clock = ManualClock()
        start = T0 - 100.0
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=start)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=start)
        self.library = FakeAmdSmiLibrary(self.virtual)
        self.amdsmi = load_amdsmi(self.library, package)
        self.backend = AmdBackend(self.amdsmi, host=SimulatedHost(self.library), clock=self.clock,
                                  wall=self.clock, sleep=self.clock.advance)
        self.devices = {d.gpu: d for d in self.backend.discover()}

    def cycle(self, seconds: float = 1.0) -> dict[str, Any]:
        """Advance and read every device, as one collector cycle; devices that fail map to the exception."""
        self.clock.advance(seconds)
        now = self.clock()
        out: dict[str, Any] = {}
        for gpu in self.devices:
            try:
                out[gpu] = self.backend.sample(gpu, now)
            except DeviceError as exc:
                out[gpu] = exc
        return out

    def truth(self, gpu: str, since: float) -> Any:
        """The twin's average over the same span the last cycle covered."""
        self.twin._slots[gpu].last_t = since - self.twin.start_time
        return self.twin.sample(gpu, self.clock())

    def close(self) -> None:
        self.backend.close()
        self.library.close()
        self.virtual.close()


@pytest.fixture
def rig():
    """``rig(scenario=None, package=None)``: a started Rig, closed after the test."""
    made: list[Rig] = []

    def make(scen: Any = None, package: Path | None = None) -> Rig:
        made.append(Rig(scen if scen is not None else scenario(), package))
        return made[-1]

    yield make
    for r in made:
        r.close()

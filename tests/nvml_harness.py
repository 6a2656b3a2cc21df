"""A virtual node behind the fake NVIDIA driver and the real NVML backend, on a hand-driven clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.backends.nvml import NvmlBackend
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.virtual import VirtualBackend
from agent.virtual.clock import ManualClock as _ManualClock
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from agent.virtual.scenario import parse_scenario
from tests.wheels import NVIDIA_ML_PY, module_file

__all__ = ["NVIDIA_ML_PY", "ManualClock", "Rig", "T0", "release_pynvml", "scenario"]

T0 = 1_800_000_000.0


def release_pynvml(version: str) -> Path:
    """The pynvml.py of nvidia-ml-py ``version`` (downloaded once; a failure to download fails the test)."""
    return module_file("nvidia-ml-py", version, "pynvml.py")


class ManualClock(_ManualClock):
    """The shared hand-driven clock, starting at the harness's T0 unless told otherwise."""

    def __init__(self, t: float = T0) -> None:
        super().__init__(t)


def scenario(model: str = "h100-sxm", gpus: int = 2, **node: Any) -> Any:
    """A one-node scenario: GPU 0 trains (compute), GPU 1 decodes (memory); extra node keys as given."""
    workloads = node.pop("workloads", [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][: gpus])
    return parse_scenario({"name": "t", "seed": 7, "nodes": [
        {"name": "n1", "model": model, "gpus": gpus, "workloads": workloads, **node}]})


class Rig:
    """The pieces of one fake node: the simulation, the fake driver, the pynvml copy, the backend."""

    def __init__(self, scen: Any, *, events: bool = False, start_offset_s: float = 100.0,
                 pynvml: str | Path | None = None, node: str | None = None) -> None:
        """``pynvml``: the pynvml.py of the nvidia-ml-py release to run (default the installed one); ``node``:
        the scenario's node to play (default its first)."""
        self.clock = ManualClock()
        self.virtual = VirtualBackend(scen, node=node, clock=self.clock, start_time=self.clock() - start_offset_s)
        self.library = FakeNvmlLibrary(self.virtual)
        self.nvml = load_pynvml(self.library, pynvml)
        self.events = events
        self._backend: NvmlBackend | None = None

    def backend(self) -> NvmlBackend:
        if self._backend is None:
            self._backend = NvmlBackend(self.nvml, host=SimulatedHost(self.library), events=self.events,
                                        clock=self.clock, wall=self.clock, sleep=self.clock.advance)
        return self._backend

    def step(self, seconds: float = 1.0) -> float:
        self.clock.advance(seconds)
        return self.clock()

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        self.library.close()
        self.virtual.close()

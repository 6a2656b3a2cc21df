"""A fake node behind the fake libnvidia-ml, shared by the test_fake_nvml*.py files.

The fake is set up from a scenario and a hand-moved clock; a twin virtual backend on the same
scenario and clock gives the samples that what NVML reports is compared with.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from agent.virtual.scenario import parse_scenario
from tests.nvml_harness import T0, ManualClock

START = T0 - 100.0  # the scenario started 100 s before the test's "now"


def scenario(model: str = "h100-sxm", gpus: int = 2, **node: Any) -> Any:
    workloads = node.pop("workloads", [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus])
    return parse_scenario({"name": "t", "seed": 11, "nodes": [
        {"name": "n1", "model": model, "gpus": gpus, "workloads": workloads, **node}]})


class Rig:
    """A fake node: the virtual backend behind the fake driver, its pynvml copy, and a twin backend
    (same scenario and clock) whose samples are the reference for what NVML must report."""

    def __init__(self, scen: Any, **lib_kw: Any) -> None:
        self.clock = ManualClock()  # at T0
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.lib = FakeNvmlLibrary(self.virtual, **lib_kw)
        self.nvml = load_pynvml(self.lib)

    def init(self) -> Any:
        self.nvml.nvmlInit()
        return self.nvml

    def step(self, seconds: float) -> float:
        self.clock.t += seconds
        return self.clock.t


@pytest.fixture
def rig() -> Any:
    r = Rig(scenario())
    r.init()
    yield r
    r.lib.close()


def address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0

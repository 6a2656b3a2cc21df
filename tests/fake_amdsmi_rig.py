"""A fake node behind the fake libamd_smi.so, shared by the test_fake_amdsmi*.py files.

The fake is set up from a scenario and a hand-moved clock; a twin virtual backend on the same
scenario and clock gives the samples that what amdsmi reports is compared with.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_amdsmi import FakeAmdSmiLibrary, load_amdsmi
from agent.virtual.scenario import parse_scenario, resolve_scenario
from tests.nvml_harness import T0, ManualClock

START = T0 - 100.0  # the scenario started 100 s before the test's "now"


def scenario(model: str = "mi300x", gpus: int = 2, **node: Any) -> Any:
    workloads = node.pop("workloads", [
        {"job": "train", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.45, "duration_s": 3600}]},
        {"job": "decode", "gpus": [1], "process": "vllm",
         "phases": [{"kind": "memory", "mbu": 0.6, "duration_s": 3600}]},
    ][:gpus])
    return parse_scenario({"name": "t", "seed": 5, "nodes": [
        {"name": "n1", "model": model, "gpus": gpus, "workloads": workloads, **node}]})


CPX = scenario(gpus=2, amd={"compute_partition": "CPX", "memory_partition": "NPS4"}, workloads=[
    {"job": "a", "gpus": ["0/0"], "phases": [{"kind": "compute", "mfu": 0.4, "duration_s": 3600}]},
    {"job": "b", "gpus": ["0/3"], "process": "vllm", "phases": [{"kind": "memory", "mbu": 0.5, "duration_s": 3600}]},
])


class Rig:
    """A fake node: the virtual backend behind the fake library, its amdsmi copy, and a twin backend
    (same scenario and clock) whose samples are the reference for what amdsmi must report."""

    def __init__(self, scen: Any = "mi300x", **lib_kw: Any) -> None:
        scen = resolve_scenario(scen) if isinstance(scen, str) else scen
        self.clock = ManualClock()  # at T0
        self.virtual = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.twin = VirtualBackend(scen, clock=self.clock, start_time=START)
        self.lib = FakeAmdSmiLibrary(self.virtual, **lib_kw)
        self.smi = load_amdsmi(self.lib)
        self.infos = {d.gpu: d for d in self.twin.discover()}

    def init(self) -> Any:
        self.smi.amdsmi_init()
        return self.smi

    def step(self, seconds: float) -> None:
        self.clock.t += seconds

    def handles(self) -> list[Any]:
        return self.smi.amdsmi_get_processor_handles()

    def twin_samples(self, *gpus: str) -> dict[str, Any]:
        return {g: self.twin.sample(g, self.clock.t) for g in gpus}

    def code(self, fn: Any, *args: Any) -> int:
        """The status a call fails with (it must fail)."""
        with pytest.raises(self.smi.AmdSmiLibraryException) as failure:
            fn(*args)
        return failure.value.get_error_code()


@pytest.fixture
def rig() -> Any:
    r = Rig()
    r.init()
    yield r
    r.lib.close()

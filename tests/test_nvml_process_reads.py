"""The per-process NVML reads: one driver call each in steady state, pynvml's answers always."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.backends.nvml.process_reads import ComputeProcesses, ProcessUtilization
from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from tests.nvml_harness import T0, ManualClock, scenario


class CrowdedBackend(VirtualBackend):
    """GPU 0 runs as many processes as the test says (the scenario runs one)."""

    crowd = 1

    def sample(self, gpu: str, now: float) -> Any:
        s = super().sample(gpu, now)
        if gpu != "0" or not s.processes:
            return s
        first = s.processes[0]
        used = [first.used_memory_bytes] + [None if i % 3 == 0 else 2**30 + i for i in range(1, self.crowd)]
        procs = tuple(dataclasses.replace(first, pid=first.pid + i, used_memory_bytes=used[i]) for i in range(self.crowd))
        return dataclasses.replace(s, processes=procs)


@pytest.fixture
def driver():
    clock = ManualClock(T0)
    virtual = CrowdedBackend(scenario(), clock=clock, start_time=T0 - 100)
    library = FakeNvmlLibrary(virtual)
    nvml = load_pynvml(library)
    nvml.nvmlInit()
    yield nvml, library, virtual, clock
    library.close()
    virtual.close()


def _calls(library: FakeNvmlLibrary, name: str) -> int:
    return library.calls[("0", name)]


def test_processes_match_pynvml_in_one_call_after_the_first(driver):
    nvml, library, virtual, clock = driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    read = ComputeProcesses(nvml, lambda fn: fn)
    # (processes, driver calls): the buffer starts at 5 entries, grows once for 40, never shrinks
    for crowd, calls in ((1, 1), (3, 1), (40, 2), (40, 1), (2, 1)):
        virtual.crowd = crowd
        clock.advance(1.0)
        expected = [(int(p.pid), p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        before = _calls(library, "nvmlDeviceGetComputeRunningProcesses_v3")
        got = read(handle)
        assert got == expected and len(got) == crowd
        assert _calls(library, "nvmlDeviceGetComputeRunningProcesses_v3") - before == calls, crowd
        if crowd == 40:
            assert any(used is None for _, used in got), "NOT_AVAILABLE memory is None, not 2**64 - 1"


def test_utilization_samples_match_pynvml_and_errors_are_pynvml_errors(driver):
    nvml, library, virtual, clock = driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    read = ProcessUtilization(nvml, lambda fn: fn)
    clock.advance(1.0)
    nvml.nvmlDeviceGetComputeRunningProcesses(handle)  # advances the device: one utilisation sample
    expected = [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)]
    assert read(handle, 0) == expected and expected
    newest = max(stamp for _, stamp, _ in expected)
    with pytest.raises(nvml.NVMLError_NotFound):  # nothing newer than what was seen: as pynvml raises
        read(handle, newest)


def test_counted_and_falls_back_to_the_public_wrapper(driver):
    nvml, library, virtual, clock = driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    counted = []

    def wrap(fn):
        def call(*args):
            counted.append(1)
            return fn(*args)
        return call

    assert ComputeProcesses(nvml, wrap)(handle) and counted == [1]

    class OldPynvml:
        """A pynvml without the private function-pointer helper."""

        def __getattr__(self, name):
            if name == "_nvmlGetFunctionPointer":
                raise AttributeError(name)
            return getattr(nvml, name)

    fallback = ComputeProcesses(OldPynvml(), wrap)
    assert fallback(handle) == ComputeProcesses(nvml, lambda fn: fn)(handle) and counted == [1]

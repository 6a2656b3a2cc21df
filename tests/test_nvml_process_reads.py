"""The per-process NVML reads: one driver call each in steady state, pynvml's answers always, under
every nvidia-ml-py release we accept (12.535 has neither the v3 struct name nor a _v2 wrapper)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.backends.nvml.bindings import Bindings
from agent.backends.nvml.process_reads import ComputeProcesses, ProcessUtilization
from agent.backends.virtual import VirtualBackend
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from tests.nvml_harness import NVIDIA_ML_PY, T0, ManualClock, release_pynvml, scenario


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


def _driver(release: str, **node: Any):
    clock = ManualClock(T0)
    virtual = CrowdedBackend(scenario(**node), clock=clock, start_time=T0 - 100)
    library = FakeNvmlLibrary(virtual)
    nvml = load_pynvml(library, release_pynvml(release))
    nvml.nvmlInit()
    return nvml, library, virtual, clock


@pytest.fixture(params=NVIDIA_ML_PY)
def driver(request):
    made = _driver(request.param)
    yield made
    made[1].close()
    made[2].close()


def _struct(nvml: Any) -> str | None:
    return Bindings.detect(nvml).process_struct


def _calls(library: FakeNvmlLibrary, name: str) -> int:
    return library.calls[("0", name)]


def test_processes_match_pynvml_in_one_call_after_the_first(driver):
    nvml, library, virtual, clock = driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    read = ComputeProcesses(nvml, lambda fn: fn, struct=_struct(nvml))
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

    assert ComputeProcesses(nvml, wrap, struct=_struct(nvml))(handle) and counted == [1]

    class OldPynvml:
        """A pynvml without the private function-pointer helper."""

        def __getattr__(self, name):
            if name == "_nvmlGetFunctionPointer":
                raise AttributeError(name)
            return getattr(nvml, name)

    fallback = ComputeProcesses(OldPynvml(), wrap, struct=_struct(nvml))
    assert fallback(handle) == ComputeProcesses(nvml, lambda fn: fn, struct=_struct(nvml))(handle) and counted == [1]


@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_drivers_before_r510_are_read_through_the_v2_symbol_in_one_call(release):
    """R470 has no _v3 symbol; nvidia-ml-py 12.535 has no _v2 wrapper: the reader calls the symbol."""
    nvml, library, virtual, clock = _driver(release, nvml={"driver_version": "470.82.01"})
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(nvml.NVMLError_FunctionNotFound):
            ComputeProcesses(nvml, lambda fn: fn, struct=_struct(nvml))(handle)
        read = ComputeProcesses(nvml, lambda fn: fn, version=2, struct=_struct(nvml))
        virtual.crowd = 3
        clock.advance(1.0)
        read(handle)  # sizes the buffer
        clock.advance(1.0)
        before = _calls(library, "nvmlDeviceGetComputeRunningProcesses_v2")
        got = read(handle)
        assert len(got) == 3 and _calls(library, "nvmlDeviceGetComputeRunningProcesses_v2") - before == 1
        truth = [(p.pid, p.used_memory_bytes) for p in library.latest_sample("0").processes]
        assert got == truth
    finally:
        library.close()
        virtual.close()

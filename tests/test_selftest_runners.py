"""The selftest's runners without a GPU: choosing a library, finding the CUDA device that is NVML's GPU,
and the phase loops of the CUDA runner over stand-in GPU operations that take real time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent.diagnostics.selftest.cuda_phases import CudaRunner, Kernel
from agent.diagnostics.selftest.phases import STARVED_BURST_S, STARVED_LOADER_S, phase
from agent.diagnostics.selftest.runner import RunnerUnavailable, cuda_index, load_library, parse_bus_id
from agent.model import DeviceInfo


def _importer(available: dict[str, Any]):
    def load(name: str) -> Any:
        value = available.get(name)
        if value is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
        if isinstance(value, Exception):
            raise value
        return value
    return load


def test_without_torch_or_cupy_it_says_what_to_install():
    with pytest.raises(RunnerUnavailable) as caught:
        load_library("auto", _importer({}))
    message = str(caught.value)
    assert "neither torch nor cupy is installed" in message
    assert "pip install torch" in message and "pip install cupy-cuda12x" in message


def test_auto_takes_torch_first_then_cupy_and_keeps_why_torch_was_passed_over():
    torch, cupy = object(), object()
    assert load_library("auto", _importer({"torch": torch, "cupy": cupy})).module is torch
    chosen = load_library("auto", _importer({"torch": OSError("libcudart.so.12: cannot open"), "cupy": cupy}))
    assert chosen.name == "cupy" and "libcudart.so.12" in chosen.problems[0]
    with pytest.raises(RunnerUnavailable, match="cupy is not installed"):
        load_library("cupy", _importer({"torch": torch}))


def test_nvml_and_cuda_bus_ids_compare_by_domain_bus_and_device():
    assert parse_bus_id("00000000:18:00.0") == parse_bus_id("0000:18:00.0") == (0, 0x18, 0)
    assert parse_bus_id("0001:9A:1F.3") == (1, 0x9A, 0x1F)
    assert parse_bus_id("not a bus") is None and parse_bus_id(None) is None


def test_the_cuda_device_is_matched_by_bus_id_not_by_index():
    gpu = DeviceInfo(gpu="1", uuid="GPU-x", vendor="nvidia", model="H100", pci_bus_id="00000000:9A:00.0")
    index, how = cuda_index(gpu, [(0, 0x9A, 0), (0, 0x18, 0)])  # CUDA ordered them differently
    assert index == 0 and "PCI bus id" in how
    with pytest.raises(RunnerUnavailable, match="not among the 1 CUDA device"):
        cuda_index(gpu, [(0, 0x18, 0)])
    assert cuda_index(gpu, [None, None])[0] == 1  # no bus ids from the library: NVML's index, in bus order


class _Event:
    def __init__(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


class FakeOps:
    """GPU operations whose calls take real time, so the loops' accounting can be checked."""

    library = "fake"
    gemm_dtype = "bf16"

    def __init__(self) -> None:
        self.calls = 0
        self.released = 0

    def _work(self, seconds: float, **what: Any) -> Kernel:
        def call() -> None:
            time.sleep(seconds)
            self.calls += 1
        return Kernel(call, **what)

    def fp8_problem(self) -> str | None:
        return "no fp8 on this fake"

    def gemm(self, dtype: str) -> Kernel:
        return self._work(0.002, flops=1e9, detail=f"{dtype} matmul")

    def copy(self) -> Kernel:
        raise RuntimeError("CUDA out of memory")

    def tiny(self) -> Kernel:
        return self._work(0.001, kernels=10, detail="graph")

    def record(self) -> _Event:
        return _Event()

    def elapsed(self, start: _Event, end: _Event) -> float:
        return end.t - start.t

    def synchronize(self) -> None:
        pass

    def waited_step(self, work: Kernel, calls: int, lateness_s: float) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            work.call()
        time.sleep(lateness_s / 20)
        return time.perf_counter() - started

    def release(self) -> None:
        self.released += 1


class Window:
    def __init__(self) -> None:
        self.began = self.ended = None
        self.reports: list[tuple[int, float]] = []

    def now(self) -> float:
        return time.time()

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def begin(self) -> None:
        self.began = self.now()

    def end(self) -> None:
        self.ended = self.now()

    def report(self, *, step: int, step_time_s: float) -> None:
        self.reports.append((step, step_time_s))


def test_a_steady_phase_counts_every_call_it_times():
    ops = FakeOps()
    runner, window = CudaRunner("fake", ops), Window()
    measured = runner.run(phase("gemm_bf16"), 0.3, window)
    timed_calls = ops.calls - 8  # the warm-up and the calibration calls are not in the phase
    assert measured.flops == pytest.approx(timed_calls * 1e9) and measured.dtype == "bf16"
    assert 0.3 <= measured.seconds <= window.ended - window.began + 0.01
    assert ops.released == 1


@pytest.mark.slow
def test_the_starved_loop_measures_the_duty_its_slow_loader_allows():
    measured = CudaRunner("fake", FakeOps()).run(phase("starved"), 1.5, Window())
    assert measured.duty == pytest.approx(STARVED_BURST_S / STARVED_LOADER_S, abs=0.15)
    assert measured.flops and measured.seconds >= 1.5


def test_the_stream_wait_loop_reports_every_step_it_times():
    window = Window()
    measured = CudaRunner("fake", FakeOps()).run(phase("stream_wait"), 0.5, window)
    assert [s for s, _ in window.reports] == list(range(len(measured.steps))) and len(measured.steps) >= 3
    assert [t for _, t in window.reports] == list(measured.steps)


def test_fp8_skips_with_the_libraries_reason_and_a_failing_phase_still_releases_its_memory():
    ops = FakeOps()
    runner = CudaRunner("fake", ops)
    assert runner.skip_reason(phase("gemm_fp8")) == "no fp8 on this fake"
    assert runner.skip_reason(phase("copy")) is None
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.run(phase("copy"), 0.1, Window())
    assert ops.released == 1


@pytest.mark.slow
def test_on_a_gpu_node_the_backend_the_library_and_the_runner_are_wired_to_the_gpu_asked_for(monkeypatch):
    """The real path with its two outside pieces stood in: NVML by the fake driver, torch by FakeOps."""
    from agent.app.config import Settings
    from agent.backends import registry
    from agent.backends.nvml_virtual import VirtualNvmlBackend
    from agent.backends.options import BackendOptions
    from agent.backends.virtual import VirtualBackend
    from agent.diagnostics.selftest import selftest as selftest_module
    from agent.diagnostics.selftest.phases import parse_phases
    from agent.diagnostics.selftest.runner import Library

    opened: dict[str, Any] = {}

    def open_nvml(settings: Any, reports: Any) -> Any:
        opened["settings"], opened["reports"] = settings, reports
        return VirtualNvmlBackend(VirtualBackend("demo"))  # GPU 6 of the demo node: an idle notebook

    def open_runner(library: Library, device: DeviceInfo) -> CudaRunner:
        opened["device"] = device.gpu
        return CudaRunner(library.name, FakeOps())

    monkeypatch.setattr(registry, "open_nvml", open_nvml)
    monkeypatch.setattr(selftest_module, "load_library", lambda choice: Library("torch", object()))
    monkeypatch.setattr(selftest_module, "open_cuda_runner", open_runner)
    settings = BackendOptions.of(Settings(backend="nvml"))
    summary = selftest_module.run_selftest(selftest_module.Options(gpu=6, phases=parse_phases("idle"), phase_seconds=4.0,
                                                                   settings=settings))
    assert opened["settings"] is settings  # the settings the command built, handed to the backend
    assert opened["device"] == "6" and opened["reports"].gpu == "6"
    assert summary.runner == "torch" and summary.device.gpu == "6" and not summary.virtual
    assert summary.results[0].verdict == "idle" and summary.exit_code == 0, summary.text()


def test_the_stream_wait_report_reaches_a_real_nodes_host_as_a_workload_source():
    from agent.context.local_host import LocalHost
    from agent.diagnostics.selftest.sampler import PhaseReports

    reports = PhaseReports("0")
    host = LocalHost(workloads=[reports])
    assert host.facts("0", [], time.time()).workload is None
    reports.step(4, 1.2)
    workload = host.facts("0", [], time.time()).workload
    assert (workload.job, workload.rank, workload.world_size, workload.step, workload.step_time_s) == \
        ("roofwatch-selftest", 0, 2, 4, 1.2)
    assert host.facts("1", [], time.time()).workload is None  # only the GPU under test reports

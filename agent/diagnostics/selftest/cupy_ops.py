"""The selftest's GPU operations over CuPy (``pip install cupy-cuda12x``).

CuPy has no bfloat16, so its GEMM runs in fp16 (the same dense tensor-core peak as bf16 on
Ampere and Hopper) and says so in the report; it has no fp8 matmul, so that phase is skipped with
the reason. The copy is a plain ``cudaMemcpyAsync`` device-to-device; the late peer is a
one-thread ``clock64`` spin kernel, like ``torch.cuda._sleep``.
"""

from __future__ import annotations

from typing import Any

from agent.diagnostics.selftest.cuda_phases import Kernel
from agent.diagnostics.selftest.runner import RunnerUnavailable, cuda_index, parse_bus_id
from agent.model import DeviceInfo

GEMM_N = 8192
COPY_BYTES = 1 << 30
TINY_ELEMENTS = 1 << 16
TINY_PER_GRAPH = 512

_SPIN = r"""
extern "C" __global__ void roofwatch_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


class CupyOps:
    def __init__(self, cupy: Any, device: DeviceInfo) -> None:
        self.cp = cupy
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - cupy raises its own CUDARuntimeError
            raise RunnerUnavailable(f"cupy {cupy.__version__} cannot reach a CUDA GPU: {exc}") from None
        buses = [parse_bus_id(cupy.cuda.Device(i).pci_bus_id) for i in range(count)]
        index, how = cuda_index(device, buses)
        self.dev = cupy.cuda.Device(index)
        self.dev.use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        major, minor = divmod(int(self.dev.compute_capability), 10)
        name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        self.library = (f"cupy {cupy.__version__} (CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}) on {how}, "
                        f"{name}, compute capability {major}.{minor}")
        self.gemm_dtype = "fp16"
        self._held: list[Any] = []
        self._spin: Any = None
        self._spin_rate: float | None = None
        self._streams: tuple[Any, Any] | None = None

    def fp8_problem(self) -> str | None:
        return "cupy has no fp8 matmul; install torch (pip install torch) to run this phase"

    def gemm(self, dtype: str, n: int = GEMM_N) -> Kernel:
        cp = self.cp
        with self.stream:
            a = cp.full((n, n), 0.01, dtype=cp.float16)
            b = cp.full((n, n), 0.01, dtype=cp.float16)
            c = cp.empty((n, n), dtype=cp.float16)
        self._held += [a, b, c]

        def call() -> None:
            with self._current():
                cp.matmul(a, b, out=c)

        return Kernel(call, flops=2.0 * n * n * n, detail=f"{n}^3 fp16 matmul (cupy has no bf16)")

    def copy(self) -> Kernel:
        cp = self.cp
        free, _ = cp.cuda.runtime.memGetInfo()
        size = min(COPY_BYTES, max(1 << 26, free // 8))
        with self.stream:
            src = cp.ones(size, dtype=cp.uint8)
            dst = cp.empty_like(src)
        self._held += [src, dst]
        runtime = cp.cuda.runtime

        def call() -> None:
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, size, runtime.memcpyDeviceToDevice,
                                cp.cuda.get_current_stream().ptr)

        return Kernel(lambda: self._on_stream(call), bytes=2.0 * size,
                      detail=f"{size / 2**30:.2f} GiB cudaMemcpyAsync device-to-device")

    def tiny(self) -> Kernel:
        cp = self.cp
        with self.stream:
            x = cp.zeros(TINY_ELEMENTS, dtype=cp.float32)
            x += 1.0  # compile the elementwise kernel before capturing
        self.stream.synchronize()
        self._held.append(x)
        try:
            capture = cp.cuda.Stream(non_blocking=True)
            with capture:
                capture.begin_capture()
                for _ in range(TINY_PER_GRAPH):
                    x += 1.0
                graph = capture.end_capture()
            self._held.append(graph)
            return Kernel(lambda: graph.launch(self.stream), kernels=TINY_PER_GRAPH,
                          detail=f"graph of {TINY_PER_GRAPH} elementwise kernels on {TINY_ELEMENTS} floats")
        except Exception as exc:  # noqa: BLE001 - without graphs, eager launches (the report says so)
            def eager() -> None:
                with self.stream:
                    for _ in range(64):
                        x.__iadd__(1.0)

            return Kernel(eager, kernels=64, detail=f"64 eager elementwise kernels (CUDA graphs failed: {exc})")

    def record(self) -> Any:
        event = self.cp.cuda.Event()
        event.record(self.stream)
        return event

    def elapsed(self, start: Any, end: Any) -> float:
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(start, end) / 1000.0

    def synchronize(self) -> None:
        self.stream.synchronize()

    def waited_step(self, work: Kernel, calls: int, lateness_s: float) -> float:
        cp = self.cp
        if self._streams is None:
            self._streams = (cp.cuda.Stream(non_blocking=True), self.stream)
        peer, compute = self._streams
        start, end, arrived = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event(disable_timing=True)
        cycles = cp.int64(int(lateness_s * self._cycles_per_s()))
        start.record(compute)
        with peer:  # a RawKernel launches on the current stream
            self._spin_kernel()((1,), (1,), (cycles,))
        arrived.record(peer)
        for _ in range(calls):
            work.call()
        compute.wait_event(arrived)
        end.record(compute)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1000.0

    def release(self) -> None:
        self._held.clear()
        self.stream.synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()

    # ------------------------------------------------------------------ helpers

    def _current(self) -> Any:
        return self.stream

    def _on_stream(self, fn: Any) -> None:
        with self.stream:
            fn()

    def _spin_kernel(self) -> Any:
        if self._spin is None:
            self._spin = self.cp.RawKernel(_SPIN, "roofwatch_spin")
        return self._spin

    def _cycles_per_s(self) -> float:
        if self._spin_rate is None:
            cycles = 50_000_000
            start = self.record()
            with self.stream:
                self._spin_kernel()((1,), (1,), (self.cp.int64(cycles),))
            end = self.record()
            self._spin_rate = cycles / max(1e-6, self.elapsed(start, end))
        return self._spin_rate

"""The selftest's GPU operations over PyTorch (``pip install torch``, a CUDA build).

Sizes are fixed where the counters need them large (8192^3 matmuls fill every SM of any current
GPU; a 1 GiB copy is far beyond any L2) and small where they must stay small (the tiny kernels'
256 KiB fits in L2). Private torch APIs used: ``torch._scaled_mm`` (fp8; its signature changed in
2.4, both forms handled) and ``torch.cuda._sleep`` (a one-thread spin kernel, the late peer).
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


class TorchOps:
    def __init__(self, torch: Any, device: DeviceInfo) -> None:
        self.torch = torch
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise RunnerUnavailable(f"torch {torch.__version__} ({build}) sees no CUDA GPU; install a CUDA build "
                                    "(pip install torch) and check the driver with nvidia-smi")
        count = torch.cuda.device_count()
        buses = [_bus(torch.cuda.get_device_properties(i)) for i in range(count)]
        index, how = cuda_index(device, buses)
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        self.stream = torch.cuda.current_stream(self.device)
        self.capability = torch.cuda.get_device_capability(self.device)
        self.library = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {how}, "
                        f"{torch.cuda.get_device_name(self.device)}, compute capability "
                        f"{self.capability[0]}.{self.capability[1]}")
        self.gemm_dtype = "bf16"
        self._held: list[Any] = []
        self._spin_rate: float | None = None
        self._streams: tuple[Any, Any] | None = None

    # ------------------------------------------------------------------ kernels

    def fp8_problem(self) -> str | None:
        if self.capability < (8, 9):
            return (f"fp8 matrix math needs compute capability 8.9 or newer (Ada, Hopper); this GPU is "
                    f"{self.capability[0]}.{self.capability[1]}")
        if not hasattr(self.torch, "_scaled_mm") or not hasattr(self.torch, "float8_e4m3fn"):
            return f"torch {self.torch.__version__} has no torch._scaled_mm (fp8 matmul needs torch 2.1 or newer)"
        try:
            self.gemm("fp8", n=64).call()
            self.synchronize()
        except Exception as exc:  # noqa: BLE001 - any refusal is the reason to skip, reported as is
            return f"torch._scaled_mm refused a small fp8 matmul: {type(exc).__name__}: {exc}"
        finally:
            self.release()
        return None

    def gemm(self, dtype: str, n: int = GEMM_N) -> Kernel:
        t = self.torch
        flops = 2.0 * n * n * n
        if dtype == "fp8":
            a = t.randn(n, n, device=self.device, dtype=t.bfloat16).to(t.float8_e4m3fn)
            b = t.randn(n, n, device=self.device, dtype=t.bfloat16).to(t.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
            one = t.ones((), device=self.device, dtype=t.float32)
            self._held += [a, b, one]

            def call() -> Any:
                try:
                    return t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16, use_fast_accum=True)
                except TypeError:  # torch before 2.4: scales optional, no fast-accumulation switch
                    return t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16)

            return Kernel(call, flops=flops, detail=f"{n}^3 fp8 matmul (torch._scaled_mm)")
        torch_dtype = {"bf16": t.bfloat16, "fp16": t.float16}[dtype]
        a = t.randn(n, n, device=self.device, dtype=torch_dtype)
        b = t.randn(n, n, device=self.device, dtype=torch_dtype)
        c = t.empty(n, n, device=self.device, dtype=torch_dtype)
        self._held += [a, b, c]
        return Kernel(lambda: t.matmul(a, b, out=c), flops=flops, detail=f"{n}^3 {dtype} matmul")

    def copy(self) -> Kernel:
        t = self.torch
        free, _ = t.cuda.mem_get_info(self.device)
        size = min(COPY_BYTES, max(1 << 26, free // 8))
        src = t.empty(size, device=self.device, dtype=t.uint8).fill_(1)
        dst = t.empty_like(src)
        self._held += [src, dst]
        return Kernel(lambda: dst.copy_(src), bytes=2.0 * size,
                      detail=f"{size / 2**30:.2f} GiB device-to-device copy")

    def tiny(self) -> Kernel:
        t = self.torch
        x = t.zeros(TINY_ELEMENTS, device=self.device, dtype=t.float32)
        self._held.append(x)
        try:
            side = t.cuda.Stream(self.device)
            side.wait_stream(self.stream)
            with t.cuda.stream(side):  # warm-up on a side stream, as torch's graph docs ask
                for _ in range(3):
                    x.add_(1.0)
            self.stream.wait_stream(side)
            graph = t.cuda.CUDAGraph()
            with t.cuda.graph(graph):
                for _ in range(TINY_PER_GRAPH):
                    x.add_(1.0)
            self._held.append(graph)
            return Kernel(graph.replay, kernels=TINY_PER_GRAPH,
                          detail=f"graph of {TINY_PER_GRAPH} elementwise kernels on {TINY_ELEMENTS} floats")
        except Exception as exc:  # noqa: BLE001 - without graphs, eager launches (the report says so)
            def eager() -> None:
                for _ in range(64):
                    x.add_(1.0)

            return Kernel(eager, kernels=64, detail=f"64 eager elementwise kernels (CUDA graphs failed: {exc})")

    # ------------------------------------------------------------------ timing and streams

    def record(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.torch.cuda.current_stream(self.device))
        return event

    def elapsed(self, start: Any, end: Any) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def waited_step(self, work: Kernel, calls: int, lateness_s: float) -> float:
        t = self.torch
        if self._streams is None:
            self._streams = (t.cuda.Stream(self.device), t.cuda.Stream(self.device))
        peer, compute = self._streams
        cycles = int(lateness_s * self._cycles_per_s())
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        arrived = t.cuda.Event()
        start.record(compute)
        with t.cuda.stream(peer):
            t.cuda._sleep(cycles)  # the late peer: one thread spinning, as a collective kernel waits
            arrived.record(peer)
        with t.cuda.stream(compute):
            for _ in range(calls):
                work.call()
            compute.wait_event(arrived)
            end.record(compute)
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def _cycles_per_s(self) -> float:
        if self._spin_rate is None:
            t = self.torch
            cycles = 50_000_000
            start = self.record()
            t.cuda._sleep(cycles)
            end = self.record()
            self._spin_rate = cycles / max(1e-6, self.elapsed(start, end))
        return self._spin_rate

    def release(self) -> None:
        self._held.clear()
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()


def _bus(props: Any) -> tuple[int, int, int] | None:
    """(domain, bus, device) from torch's device properties (fields added in torch 2.x), else None."""
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, str):
        return parse_bus_id(bus)
    if bus is None:
        return None
    return int(getattr(props, "pci_domain_id", 0) or 0), int(bus), int(getattr(props, "pci_device_id", 0) or 0)

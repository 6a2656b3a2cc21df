"""The phases on a real GPU, written once over a small ops interface that torch and cupy each implement.

Every timed loop measures itself with CUDA events recorded on the stream that does the work,
so the FLOP/s and bytes/s it reports are what the GPU did, not what Python thought it launched.
Loops keep one batch in flight while waiting for the previous one, so the queue never drains and
the GPU is busy the whole phase (apart from the phases whose point is that it is not).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from agent.diagnostics.selftest.phases import (
    STARVED_BURST_S,
    STARVED_LOADER_S,
    STREAM_WAIT_COMPUTE_S,
    Phase,
    lateness,
)
from agent.diagnostics.selftest.runner import Measured, PhaseWindow

BATCH_S = 0.05
"""GPU time per launched batch: long enough to hide the launch loop, short enough to stop on time."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One launchable unit of work and what one call of it does."""

    call: Callable[[], Any]
    flops: float = 0.0
    bytes: float = 0.0
    kernels: int = 0
    detail: str = ""


class Event(Protocol):
    def synchronize(self) -> None: ...


class GpuOps(Protocol):
    """What a GPU library gives the phases; torch_ops and cupy_ops implement it."""

    library: str
    """``torch 2.4.1 (CUDA 12.4) on cuda:0 ...``: printed in the report."""
    gemm_dtype: str

    def fp8_problem(self) -> str | None: ...
    def gemm(self, dtype: str) -> Kernel: ...
    def copy(self) -> Kernel: ...
    def tiny(self) -> Kernel: ...
    def record(self) -> Event: ...
    def elapsed(self, start: Event, end: Event) -> float: ...
    def synchronize(self) -> None: ...
    def waited_step(self, work: Kernel, calls: int, lateness_s: float) -> float: ...
    def release(self) -> None: ...


class CudaRunner:
    """:class:`~agent.diagnostics.selftest.runner.PhaseRunner` over torch or cupy."""

    def __init__(self, name: str, ops: GpuOps) -> None:
        self.name = name
        self.ops = ops

    def describe(self) -> str:
        return self.ops.library

    def skip_reason(self, phase: Phase) -> str | None:
        return self.ops.fp8_problem() if phase.name == "gemm_fp8" else None

    def run(self, phase: Phase, seconds: float, window: PhaseWindow) -> Measured:
        try:
            return getattr(self, "_" + phase.name)(seconds, window)
        finally:
            self.ops.release()

    def close(self) -> None:
        self.ops.release()

    # ------------------------------------------------------------------ phases

    def _idle(self, seconds: float, window: PhaseWindow) -> Measured:
        self.ops.synchronize()
        window.begin()
        window.wait(seconds)
        window.end()
        return Measured(seconds=seconds, detail="nothing launched", source="wall clock")

    def _gemm_bf16(self, seconds: float, window: PhaseWindow) -> Measured:
        return self._steady(self.ops.gemm(self.ops.gemm_dtype), seconds, window, dtype=self.ops.gemm_dtype)

    def _gemm_fp8(self, seconds: float, window: PhaseWindow) -> Measured:
        return self._steady(self.ops.gemm("fp8"), seconds, window, dtype="fp8")

    def _copy(self, seconds: float, window: PhaseWindow) -> Measured:
        return self._steady(self.ops.copy(), seconds, window)

    def _tiny_kernels(self, seconds: float, window: PhaseWindow) -> Measured:
        return self._steady(self.ops.tiny(), seconds, window)

    def _starved(self, seconds: float, window: PhaseWindow) -> Measured:
        """Matmul bursts gated on a producer thread that sleeps per batch, as a slow loader would."""
        work = self.ops.gemm(self.ops.gemm_dtype)
        calls = max(1, round(STARVED_BURST_S / self._seconds_per_call(work)))
        batches: queue.Queue[int] = queue.Queue(maxsize=1)
        stop = threading.Event()

        def loader() -> None:
            while not stop.is_set():
                time.sleep(STARVED_LOADER_S)  # the slow host side: decoding, augmenting, reading
                try:
                    batches.put(1, timeout=STARVED_LOADER_S)
                except queue.Full:
                    continue

        thread = threading.Thread(target=loader, name="selftest-loader", daemon=True)
        bursts: list[tuple[Event, Event]] = []
        window.begin()
        start = window.now()
        thread.start()
        try:
            while window.now() - start < seconds:
                try:
                    batches.get(timeout=STARVED_LOADER_S)
                except queue.Empty:
                    continue
                first = self.ops.record()
                for _ in range(calls):
                    work.call()
                bursts.append((first, self.ops.record()))
            self.ops.synchronize()
        finally:
            stop.set()
            thread.join(timeout=2.0)
        wall = window.now() - start
        window.end()
        busy = sum(self.ops.elapsed(a, b) for a, b in bursts)
        return Measured(seconds=wall, flops=work.flops * calls * len(bursts), duty=busy / wall if wall else None,
                        dtype=self.ops.gemm_dtype, detail=f"{len(bursts)} batches of {calls} x {work.detail}, "
                        f"loader sleeping {STARVED_LOADER_S:g} s per batch")

    def _stream_wait(self, seconds: float, window: PhaseWindow) -> Measured:
        """Each step: a little compute on stream B, then B waits on stream A's spin kernel (the late peer)."""
        work = self.ops.gemm(self.ops.gemm_dtype)
        calls = max(1, round(STREAM_WAIT_COMPUTE_S / self._seconds_per_call(work)))
        steps: list[float] = []
        window.begin()
        start = window.now()
        while window.now() - start < seconds:
            took = self.ops.waited_step(work, calls, lateness(len(steps)))
            window.report(step=len(steps), step_time_s=took)
            steps.append(took)
        window.end()
        return Measured(seconds=sum(steps), flops=work.flops * calls * len(steps), steps=tuple(steps),
                        dtype=self.ops.gemm_dtype, detail=f"{len(steps)} steps of {calls} x {work.detail} then a wait "
                                                          "on the other stream")

    # ------------------------------------------------------------------ helpers

    def _seconds_per_call(self, work: Kernel) -> float:
        """GPU time of one call, after a warm-up (clocks up, libraries' heuristics chosen)."""
        for _ in range(3):
            work.call()
        self.ops.synchronize()
        first = self.ops.record()
        for _ in range(5):
            work.call()
        last = self.ops.record()
        last.synchronize()
        return max(1e-7, self.ops.elapsed(first, last) / 5)

    def _steady(self, work: Kernel, seconds: float, window: PhaseWindow, *, dtype: str | None = None) -> Measured:
        """``work`` back to back for ``seconds``, one batch always queued behind the one running."""
        per_batch = max(1, round(BATCH_S / self._seconds_per_call(work)))
        window.begin()
        start = window.now()
        first = self.ops.record()
        pending: Event | None = None
        calls = 0
        while window.now() - start < seconds:
            for _ in range(per_batch):
                work.call()
            calls += per_batch
            mark = self.ops.record()
            if pending is not None:
                pending.synchronize()
            pending = mark
        last = self.ops.record()
        last.synchronize()
        window.end()
        gpu_s = self.ops.elapsed(first, last)
        return Measured(seconds=gpu_s, flops=work.flops * calls or None, bytes=work.bytes * calls or None,
                        kernels=work.kernels * calls or None, dtype=dtype, detail=f"{calls} x {work.detail}")

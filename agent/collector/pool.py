"""The threads that call the backend: a bounded pool of daemon workers, and the back-off of a failing device.

Why a pool of its own: a hung driver call must cost one worker, never the agent's exit or one thread per
cycle (agent.collector's package docstring says what each device is promised).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import queue
import threading
from typing import Callable

from agent.model import GpuSample


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential retry delay for a failing device: first retry after ``initial_s``, doubling."""

    initial_s: float = 1.0
    max_s: float = 60.0

    def delay(self, consecutive_failures: int) -> float:
        exponent = max(0, consecutive_failures - 1)
        return min(self.max_s, self.initial_s * (2.0 ** min(exponent, 30)))


MAX_WORKERS = 16
"""Default bound on sampling threads, whatever the device count."""


class WorkerPool:
    """``size`` daemon threads running backend calls from one queue, all started at the first call.

    All at once rather than as the queue grows: a pool that grew under a busy moment and never
    shrank would change the agent's thread count long after start, and a thread count that
    returns to its baseline is how a leak is told from a load.

    Not a ThreadPoolExecutor: executor threads are joined at interpreter exit, so one driver
    call hung forever would keep the agent from ever exiting on SIGTERM. A daemon thread
    stuck in a driver call dies with the process. A job cancelled before a worker takes it is
    skipped.
    """

    def __init__(self, size: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[cf.Future[GpuSample], Callable[[], GpuSample]] | None] = queue.SimpleQueue()
        self._size, self._name = size, name
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, call: Callable[[], GpuSample]) -> cf.Future[GpuSample]:
        future: cf.Future[GpuSample] = cf.Future()
        with self._lock:
            while len(self._threads) < self._size:
                thread = threading.Thread(target=self._loop, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._jobs.put((future, call))
        return future

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the collector thread
                    future.set_exception(exc)

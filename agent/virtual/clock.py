"""A hand-driven clock, for running the virtual fleet faster than real time.

The virtual backend, the NVML backend and the collector all take their clocks as arguments;
given this one, a test or a benchmark plays hours of a node in seconds (and the backend's probe
sleep just moves it on).
"""

from __future__ import annotations

import threading


class ManualClock:
    """Wall and monotonic time in one, moved only by its owner (and by the backend's probe sleep)."""

    def __init__(self, t: float) -> None:
        self.t = t
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds

"""Token buckets per client, so one runaway or hostile reporter cannot take the agent's CPU.

A workload report costs a JSON parse and a pydantic validation (tens of microseconds). A job
reports once per step, a few to a few hundred times a second, and the client library already
backs off on 429. The default rate therefore sits far above any honest loop and far below what
would show up on a GPU node's CPU. The number of clients tracked is bounded (least recently
seen forgotten first), so the limiter's own memory cannot grow without bound either.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Hashable


class RateLimiter:
    """``rate_per_s`` requests a second per client, in bursts of up to ``burst``."""

    def __init__(self, rate_per_s: float, burst: float | None = None, *, max_clients: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.rate_per_s = rate_per_s
        self.burst = burst if burst is not None else max(1.0, 2.0 * rate_per_s)
        self.max_clients = max(1, max_clients)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def check(self, client: Hashable) -> float | None:
        """Take one token for ``client``: None when allowed, else the seconds until the next one."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)
            allowed = tokens >= 1.0
            if allowed:
                tokens -= 1.0
            self._buckets[client] = (tokens, now)  # most recently seen last
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return None if allowed else (1.0 - tokens) / self.rate_per_s

    def __len__(self) -> int:
        return len(self._buckets)

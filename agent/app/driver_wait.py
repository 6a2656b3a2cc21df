"""Waiting in process for a GPU driver that is not there yet.

On a fresh node the agent often starts before the driver: the GPU operator's driver container
is still compiling its module, or ``nvidia-persistenced`` has not loaded it. Exiting at once
turns that into a crash loop. systemd gives up after 5 starts in 10 minutes, and Kubernetes
backs off for up to 5 minutes between restarts, so metrics arrive minutes after the driver
does. With ``driver_wait_s`` set, the agent serves its HTTP endpoint at once and says on
``/healthz`` and in its log what it is waiting for. It retries with back-off (1 s, doubling
to 30 s) and starts collecting as soon as the driver answers. It gives up with the usual
one-line error once the wait is over.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from agent.backends.base import BackendUnavailable
from agent.collector import Backoff
from agent.model import CollectorHealth, NodeSnapshot, SourceState

log = logging.getLogger("roofwatch.driver")

WAITABLE_BACKENDS = frozenset({"auto", "nvml", "amd"})
"""The virtual backends cannot be missing a driver; their errors are configuration errors."""

T = TypeVar("T")


@dataclass
class DriverWait(Generic[T]):
    """Retries ``attempt`` (open the backend and discover its GPUs) until it succeeds or
    ``wait_s`` has passed, and meanwhile provides the snapshot the HTTP server serves.

    ``what`` names what is waited for in the log, ``/healthz`` and the page; ``source``, where the GPUs come
    from a neighbour (a dcgm-exporter: agent.app.source_wait), is its name in ``roofwatch_source_up``, down
    while waited for."""

    attempt: Callable[[], T]
    node: str
    backend: str
    wait_s: float
    interval_s: float
    expected_devices: int = 0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    reason: str = ""
    attempts: int = 0
    what: str = "the GPU driver"
    source: str | None = None
    _started: float = field(init=False)
    _snapshot: NodeSnapshot = field(init=False)

    def __post_init__(self) -> None:
        self._started = self.monotonic()
        self._snapshot = self._waiting_snapshot()

    @property
    def snapshot(self) -> NodeSnapshot:
        return self._snapshot

    @property
    def waited_s(self) -> float:
        return self.monotonic() - self._started

    @property
    def expired(self) -> bool:
        return self.waited_s >= self.wait_s

    def next_delay_s(self) -> float:
        """The collector's device back-off between attempts, never past the end of the wait."""
        delay = Backoff(initial_s=self.first_delay_s, max_s=self.max_delay_s).delay(self.attempts)
        return max(0.0, min(delay, self.wait_s - self.waited_s))

    def failed(self, error: BackendUnavailable) -> None:
        """Record a failed attempt (the first one too: the agent's own start)."""
        self.attempts += 1
        reason = " ".join(str(error).split())
        if reason != self.reason:  # once per distinct reason, not once per retry
            log.warning(f"waiting for {self.what}", extra={"reason": reason, "wait_s": self.wait_s})
        else:
            log.debug(f"{self.what} still missing", extra={"attempt": self.attempts})
        self.reason = reason
        self._snapshot = self._waiting_snapshot()

    def try_once(self) -> T | None:
        """One attempt: the opened value, or None after recording why it failed."""
        try:
            opened = self.attempt()
        except BackendUnavailable as exc:
            self.failed(exc)
            return None
        found = "GPU driver found" if self.source is None else f"{self.source} answers"
        log.info(found, extra={"waited_s": round(self.waited_s, 1), "attempts": self.attempts + 1})
        return opened

    def give_up_message(self) -> str:
        return f"{self.reason} (still no GPU driver after waiting driver_wait_s={self.wait_s:g} s)"

    def _waiting_snapshot(self) -> NodeSnapshot:
        now = self.clock()
        health = CollectorHealth(
            backend=self.backend, cycles_total=self.attempts, last_cycle_success=False,
            last_cycle_ts=now, interval_s=self.interval_s,
            waiting_for=f"{self.what}: {self.reason}" if self.reason else self.what,
        )
        sources = (SourceState(self.source, "down", self.reason or "not read yet"),) if self.source else ()
        return NodeSnapshot(ts=now, node=self.node, devices=(), health=health, sources=sources,
                            expected_devices=self.expected_devices, sequence=self.attempts)

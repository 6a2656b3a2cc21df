"""Waiting for a neighbour that serves the GPUs: a dcgm-exporter or an AMD Device Metrics Exporter that starts late.

In a DaemonSet the agent and the node's exporter start in no fixed order, and DCGM takes tens of seconds to
come up. ``run --backend dcgm-exporter`` used to exit at start when the exporter did not answer yet
("connection refused"), which under Kubernetes or systemd is a crash loop with minutes of back-off. Now the
agent serves at once (``/healthz`` 200 and ``/readyz`` 503, both saying what it waits for and why; the
source ``down`` in ``roofwatch_source_up``), and opens its collector as soon as the exporter answers.

The attempts run on a thread of their own, never on the main thread: a read of an exporter that accepts and
never answers lasts its whole deadline (up to 30 s), and the main thread must stay free for SIGTERM and
SIGHUP. They are spaced 1 s, doubling, up to the exporter's own read interval: the agent has the GPUs'
readings within one read interval of the exporter's first answer. There is no limit to the wait: a neighbour
that is not there yet is not a reason to stop, and the probes and ``doctor`` say what is missing.

Only a neighbour that does not answer is waited for. Any other reason the backend cannot open (no URL set,
an exporter that refuses the agent's credentials with 401 or 403, more devices than ``max_devices`` allows)
is a configuration error: the agent exits 1 with it, as before.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable

from agent.app.driver_wait import DriverWait
from agent.backends.base import BackendUnavailable
from agent.backends.exporter_backend import ExporterNotAnswering
from agent.model import NodeSnapshot

log = logging.getLogger("roofwatch.driver")

SOURCE_BACKENDS = frozenset({"dcgm-exporter", "amd-exporter"})
"""Backends whose GPUs a neighbour serves: waited for without limit, off the main thread."""


class _Fatal(Exception):
    """The backend cannot open for a reason waiting does not cure (a configuration error)."""


class SourceWait:
    """Opens the collector over a neighbour that may not answer yet, on a background thread, retrying with
    back-off; meanwhile :attr:`snapshot` is the waiting snapshot the HTTP server serves."""

    def __init__(self, attempt: Callable[[], Any], *, what: str, source: str, node: str, interval_s: float,
                 retry_max_s: float, expected_devices: int = 0, notify: Callable[[], None] = lambda: None) -> None:
        """``attempt``: open the backend and its collector (raises ExporterNotAnswering while the neighbour does
        not answer); ``what``: the neighbour as shown (``dcgm-exporter at http://...``, no credentials);
        ``retry_max_s``: the longest pause between attempts (the exporter's read interval); ``notify``: called
        from the thread when a collector is ready or the wait failed for good."""
        self._attempt, self._notify = attempt, notify
        self.wait = DriverWait(attempt=self._classified, node=node, backend=source, wait_s=math.inf,
                               interval_s=interval_s, expected_devices=expected_devices,
                               first_delay_s=min(1.0, retry_max_s), max_delay_s=max(retry_max_s, 0.05), what=what,
                               source=source)
        self.fatal: str | None = None
        self._opened: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> NodeSnapshot:
        return self.wait.snapshot

    def _classified(self) -> Any:
        try:
            return self._attempt()
        except ExporterNotAnswering as exc:
            raise BackendUnavailable(exc.why) from None  # waited for: the reason is what /healthz shows
        except BackendUnavailable as exc:
            raise _Fatal(str(exc)) from None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="roofwatch-source-wait", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                opened = self.wait.try_once()
            except _Fatal as exc:
                self.fatal = str(exc)
                self._notify()
                return
            except Exception as exc:  # noqa: BLE001 - a bug must end the agent with a line, not a silent thread
                log.exception("opening the source failed")
                self.fatal = f"opening {self.wait.what} failed: {exc}"
                self._notify()
                return
            if opened is not None:
                with self._lock:
                    stopped = self._stop.is_set()
                    if not stopped:
                        self._opened = opened
                if stopped:
                    _close(opened)
                    return
                self._notify()
                return
            self._stop.wait(self.wait.next_delay_s())

    def take(self) -> Any:
        """The collector opened over the neighbour, once (None before it answers)."""
        with self._lock:
            opened, self._opened = self._opened, None
        return opened

    def stop(self) -> None:
        """Stop retrying; a collector opened meanwhile and not taken is closed."""
        self._stop.set()
        _close(self.take())


def _close(opened: Any) -> None:
    if opened is None:
        return
    try:
        stop = getattr(opened, "stop", None)
        if stop is not None:
            stop(timeout=1.0)
        else:
            opened.close()
    except Exception:  # noqa: BLE001 - shutting down
        log.debug("closing an unused collector failed", exc_info=True)

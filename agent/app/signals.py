"""What the signal handlers asked for, and the main thread's wait for it.

Two ways a signal has been lost or has hung the agent, both caught by CI:

* CPython runs Python signal handlers only in the main thread, and only between bytecodes. The
  kernel delivers a process-directed signal to any thread that does not block it, so SIGTERM
  landing on an HTTP thread while the main thread sat in an untimed wait was never handled.
  Here the main thread waits in ``select`` on a pipe that ``signal.set_wakeup_fd`` writes to
  from whichever thread took the signal, and in slices of ``SIGNAL_CHECK_S`` besides.
* A handler that takes a lock can deadlock the thread it interrupted: ``Event.set()`` takes the
  same non-reentrant lock that ``Event.wait()`` holds between bytecodes, so a SIGTERM landing
  there hung the agent for good, its log saying ``stopping`` and nothing more. A handler here
  only counts the request and writes a byte to a non-blocking pipe: no lock, no logging (a log
  line written from a handler can also re-enter the stream the main thread is writing).
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable

SIGNAL_CHECK_S = 0.25
"""The longest one slice of the wait lasts: a backstop should the wake-up byte ever be missed."""


class SignalRequests:
    """Requests (``"stop"``, ``"reload"``) raised by signal handlers and taken by the main thread.

    ``raised`` is written only by the handlers and ``taken`` only by the main thread, so the two
    never race over one counter; a request is pending while it has been raised more often than
    taken."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._raised: dict[str, int] = {}
        self._taken: dict[str, int] = {}
        self._last_signal: dict[str, int] = {}
        self._previous_wakeup_fd: int | None = None

    def install(self, requests: dict[int, str]) -> None:
        """Route each signal to its request (main thread only, as ``signal.signal`` requires), and let a
        signal taken by any thread wake the main thread's wait at once."""
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum, request in requests.items():
            signal.signal(signum, self._handler(request))

    def _handler(self, request: str) -> Callable[[int, object], None]:
        def handle(signum: int, _frame: object) -> None:
            self._last_signal[request] = signum
            self.raise_request(request)
        return handle

    def raise_request(self, request: str) -> None:
        """What a handler does: count the request and wake the wait. Safe at any bytecode boundary."""
        self._raised[request] = self._raised.get(request, 0) + 1
        try:
            os.write(self._write_fd, b"!")
        except OSError:  # the pipe is full: a wake-up is already waiting to be read
            pass

    def pending(self, request: str) -> bool:
        return self._raised.get(request, 0) > self._taken.get(request, 0)

    def signal_name(self, request: str) -> str | None:
        """The signal that last raised ``request`` (``SIGTERM``), for the log line the main thread writes."""
        signum = self._last_signal.get(request)
        return signal.Signals(signum).name if signum is not None else None

    def take(self, request: str) -> bool:
        """True (and the request marked handled) when ``request`` was raised since it was last taken."""
        raised = self._raised.get(request, 0)
        if raised <= self._taken.get(request, 0):
            return False
        self._taken[request] = raised
        return True

    def wait(self, timeout: float | None = None, requests: tuple[str, ...] = ("stop", "reload")) -> bool:
        """Wait until one of ``requests`` is pending (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not any(self.pending(r) for r in requests):
            slice_s = SIGNAL_CHECK_S if deadline is None else min(SIGNAL_CHECK_S, deadline - time.monotonic())
            if slice_s <= 0:
                return False
            readable, _, _ = select.select([self._read_fd], [], [], slice_s)
            if readable:
                self._drain()
        return True

    def _drain(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Give the wake-up fd back to whoever had it, and close the pipe."""
        if self._previous_wakeup_fd is not None:
            try:
                signal.set_wakeup_fd(self._previous_wakeup_fd)
            except ValueError:  # not the main thread any more: nothing to restore there
                pass
            self._previous_wakeup_fd = None
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass

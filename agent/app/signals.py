"""Waiting in the main thread for a flag that a signal handler sets.

CPython runs Python signal handlers only in the main thread, and only between bytecodes. The
kernel, though, delivers a process-directed signal to any thread that does not block it. When
SIGTERM lands on an HTTP handler thread while the main thread sits in an untimed
``Event.wait()``, the main thread is never interrupted, the handler never runs and the agent
ignores the signal for as long as the wait lasts (forever). CI caught exactly that with 16
scrapers connected. Waiting in short slices lets the main thread reach the bytecode boundary
where the pending handler runs.
"""

from __future__ import annotations

import threading
import time

SIGNAL_CHECK_S = 0.25
"""The longest a signal can wait for its handler: short for a stop, long enough to cost nothing."""


def wait_in_main_thread(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)`` that still lets the main thread run signal handlers promptly."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        slice_s = SIGNAL_CHECK_S if deadline is None else min(SIGNAL_CHECK_S, deadline - time.monotonic())
        if slice_s <= 0:
            return event.is_set()
        if event.wait(slice_s):
            return True

"""Reads share a vendor library; a re-initialisation has it alone, or is given up.

Shutting a library down and initialising it again (amdsmi_shut_down/amdsmi_init,
nvmlShutdown/nvmlInit) invalidates what other threads hold: amdsmi frees the processor objects
the handles point at, and NVML answers UNINITIALIZED to every call in between. The collector
reads every device on its own worker thread, so reads take the gate shared and a
re-initialisation takes it exclusively; otherwise one GPU's library error would fail the reads of
the others that happened to be in flight (the NVML error matrix caught exactly that).

The gate prefers readers: a re-initialisation waits for the reads in flight to end and gives up
after ``timeout_s`` rather than stall the other GPUs, because a read hung in the driver (the
collector abandons it at its deadline, the thread stays blocked) may never end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class LibraryGate:
    """A shared/exclusive lock for one vendor library, with a deadline on the exclusive side."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._restarting = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._restarting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def restarting(self, timeout_s: float) -> Iterator[bool]:
        """Yields True with the library to itself, or False when the reads in flight did not end in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._readers or self._restarting:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            alone = not self._readers and not self._restarting
            if alone:
                self._restarting = True
        try:
            yield alone
        finally:
            if alone:
                with self._cond:
                    self._restarting = False
                    self._cond.notify_all()

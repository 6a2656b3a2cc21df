"""The one error policy every vendor backend applies to a device's readings.

A reading that fails is judged by what its error *means* (:class:`Meaning`), decided per vendor:

* absent (unsupported, no permission): switched off for good, remembered with its reason for
  ``doctor``, never asked for again, so an old driver costs nothing per interval;
* no new data: unknown this interval;
* device lost: :class:`DeviceLostError`, the collector marks the device down and the backend
  re-acquires it with back-off;
* library broken: :class:`LibraryError`, the backend re-initialises its library;
* anything else: unknown this interval, unless it is the device's core reading, which fails the
  whole sample with :class:`DeviceError`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from agent.backends.base import DeviceError, DeviceLostError, Meaning

log = logging.getLogger("roofwatch.readings")


@dataclass(slots=True)
class CounterRate:
    """A cumulative driver counter turned into a rate between two reads.

    No rate on the first read, or when the counter went backwards (driver reload, GPU reset,
    wrap): an unknown interval is better than a huge negative one.
    """

    value: float | None = None
    t: float | None = None

    def rate(self, value: float | None, t: float, scale: float = 1.0) -> float | None:
        prev_value, prev_t = self.value, self.t
        self.value, self.t = value, t
        if value is None or prev_value is None or prev_t is None or t <= prev_t or value < prev_value:
            return None
        return (value - prev_value) * scale / (t - prev_t)


class LibraryError(DeviceError):
    """The vendor library itself must be re-initialised (not initialised, driver changed underneath)."""


class ReadingPolicy:
    """Absent capabilities and transient failures of one device, and what to raise for the rest."""

    def __init__(self, vendor: str, gpu: Callable[[], str], uuid: Callable[[], str],
                 meaning: Callable[[BaseException], Meaning], describe: Callable[[BaseException], str]) -> None:
        """``vendor`` prefixes messages (``NVML``, ``amdsmi``); ``gpu``/``uuid`` name the device as it is
        now (a re-acquired device keeps its id); ``meaning``/``describe`` are the vendor's."""
        self.vendor = vendor
        self._gpu, self._uuid = gpu, uuid
        self._meaning, self._describe = meaning, describe
        self.absent: dict[str, str] = {}
        """Capability -> why it is unavailable ("not supported", "no permission", ...)."""
        self.failed: dict[str, str] = {}
        """Readings that failed transiently in the last interval (for logs and doctor)."""

    def error(self, what: str, exc: BaseException, *, core: bool = False) -> None:
        """Apply the policy to ``exc`` raised while reading ``what``; raises for lost / broken / core."""
        kind, text, gpu = self._meaning(exc), self._describe(exc), self._gpu()
        if kind is Meaning.ABSENT:
            if what not in self.absent:
                log.info("GPU %s: %s unavailable (%s); not asking again", gpu, what, text)
            self.absent[what] = text
            return
        if kind is Meaning.NO_DATA:
            return
        if kind is Meaning.DEVICE_LOST:
            raise DeviceLostError(f"{self.vendor}: GPU {gpu} ({self._uuid()}): {text} during {what}") from None
        if kind is Meaning.LIBRARY:
            raise LibraryError(f"{self.vendor}: {text} during {what} on GPU {gpu}") from None
        if core:
            raise DeviceError(f"{self.vendor}: GPU {gpu}: {what} failed: {text}") from None
        self.failed[what] = text

    def has(self, what: str) -> bool:
        return what not in self.absent

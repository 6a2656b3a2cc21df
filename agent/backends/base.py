"""The one small interface every telemetry source implements.

Shaped for the awkward parts of real vendor libraries:

* **Two-sample metrics** (NVML GPM, cumulative byte and energy counters): ``sample`` is called
  once per interval and the backend keeps whatever it read last time, returning rates over the
  span since its previous call. The first call may leave such fields ``None``.
* **Failures are per device**: ``sample`` raises :class:`DeviceError` (or the subclass
  :class:`DeviceLostError`) for one device, and the collector marks that device down while the
  others keep reporting. After a failure the collector keeps calling ``sample`` on a back-off
  schedule; the backend re-acquires handles or re-initialises its library inside that call, so
  a device that vanished can come back without a restart.
* **Events** (optional): a backend may offer ``device_events(gpu) -> tuple[XidCount, ...]``,
  the critical-error events seen so far. It must answer from memory, since the collector calls
  it on every cycle, also for devices that are down (a GPU that fell off the bus is exactly
  when its last XID matters).
* **Hangs**: the collector calls ``sample`` from worker threads with a deadline and never calls
  the same device twice concurrently, so a backend must be safe to call for *different* devices
  from different threads (NVML is thread-safe; the AMD backend serialises the calls for one physical GPU, whose partitions share
  one metrics table).
"""

from __future__ import annotations

import enum
from typing import Protocol, Sequence, runtime_checkable

from agent.model import DeviceInfo, GpuSample


class Meaning(enum.Enum):
    """What a vendor library's error code means for the agent; each backend maps its own codes."""

    ABSENT = "absent"
    """This device or driver cannot do it: stop asking (capability probed away)."""
    NO_DATA = "no_data"
    """Nothing new since the last read (sample APIs); not a failure."""
    DEVICE_LOST = "device_lost"
    """The device is gone or needs a reset: mark it down, re-acquire its handle with back-off."""
    LIBRARY = "library"
    """The library itself is unusable (not initialised, driver changed underneath): re-initialise."""
    FAILED = "failed"
    """Anything else: this read failed, try again next interval."""


def value_code(exc: BaseException) -> int | None:
    """The integer status a ctypes binding's exception carries as ``.value`` (pynvml's NVMLError,
    DCGM's DCGMError), or None for any other exception."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def meaning_in(table: dict[int, Meaning], exc: BaseException) -> Meaning:
    """What ``exc`` means by a vendor's code ``table``; an unknown code, or no code, is a failed read."""
    code = value_code(exc)
    return Meaning.FAILED if code is None else table.get(code, Meaning.FAILED)


class BackendError(Exception):
    """Base for errors a backend raises on purpose, with a message meant for a person."""


class BackendUnavailable(BackendError):
    """The source cannot start at all here: library missing, driver not loaded, no devices.

    The message says what is missing and how to fix it; the CLI prints it without a traceback.
    """


class DeviceError(BackendError):
    """Reading one device failed this interval; the device is marked down and retried."""


class DeviceLostError(DeviceError):
    """The device is gone (fell off the bus, needs a reset); retried with back-off."""


@runtime_checkable
class Backend(Protocol):
    """A source of per-GPU samples for one node."""

    name: str
    """Short name used in metrics and logs: ``virtual``, ``nvml``, ``amd``."""

    def discover(self) -> Sequence[DeviceInfo]:
        """Enumerate devices once at start. Raises :class:`BackendUnavailable` if there are none."""
        ...

    def sample(self, gpu: str, now: float) -> GpuSample:
        """Read one device; ``now`` is the wall-clock time the collector stamps on this cycle.

        Returns a sample whose ``ts`` is ``now`` and whose ``interval_s`` is the span the ratios
        average over. Raises :class:`DeviceError` for a device-level failure.
        """
        ...

    def close(self) -> None:
        """Release library handles; called once at shutdown, possibly while a call hangs."""
        ...

    # Optional, looked up with getattr by the collector:
    #   device_info(gpu) -> DeviceInfo: the device's identity now, asked when a device comes up. A GPU
    #     lost when the agent started is listed with a placeholder identity until it is first read.
    #   device_events(gpu), nic_ports(), warm_samples(...): see the collector and the virtual backend.
    #   counter_sources(gpu) -> dict[str, str]: which source gave each counter field of the GPU's latest
    #     sample (``nvml``, ``dcgm-exporter``), for doctor; offered where a sample may mix sources
    #     (agent.backends.dcgm_exporter).

"""A MIG parent GPU's energy counter, read once per collection cycle for all of its instances.

NVML gives no power or energy per MIG instance (``nvmlDeviceGetTotalEnergyConsumption`` on a MIG device handle
answers NOT_SUPPORTED), only the board's counter on the parent handle. Every instance's sample carries that
counter (``GpuSample.parent_energy_j``) so the collector can split the board's step over them
(agent.collector.mig_energy). The collector reads every device of a cycle with the same ``now``, so the first
instance of a parent to be read calls the driver and its siblings take the same answer: one NVML call per parent
GPU per cycle, not one per instance.
"""

from __future__ import annotations

import threading
from typing import Any


class ParentEnergy:
    """The board energy counter (mJ) of one GPU in MIG mode, shared by the NvmlDevices of its instances."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._lock = threading.Lock()
        self._at: float | None = None
        self._value: int | None = None
        self._error: BaseException | None = None

    def read(self, now: float) -> int:
        """The counter in mJ for the cycle stamped ``now``: read from the driver by the first caller, the same
        answer (or the same NVML error) for the others. Raises the driver's NVMLError."""
        with self._lock:
            if self._at != now:
                self._at = now
                try:
                    self._value, self._error = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)), None
                except self._nvml.NVMLError as exc:
                    self._value, self._error = None, exc
            error, value = self._error, self._value
        if error is not None:
            raise error
        assert value is not None
        return value

    @staticmethod
    def joules(mj: int | None) -> float | None:
        """A reading in J (NVML counts mJ); None stays unknown."""
        return mj / 1000.0 if mj is not None else None

    def reset(self, handle: Any) -> None:
        """A fresh parent handle after the GPU was lost and found again: the next read asks the driver."""
        with self._lock:
            self._handle, self._at = handle, None

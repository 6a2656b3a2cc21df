"""nvmlDeviceGetFieldValues: a batch of counters, each entry with its own return code.

The batch call itself succeeds while single entries fail, which is exactly the case a backend
reading energy, PCIe bytes and ECC in one call has to handle per field: an id this driver's
nvml.h does not declare fails with INVALID_ARGUMENT (the same id may be another counter on
another driver, see :mod:`agent.virtual.fake_nvml.profile`); a field this device cannot read, or
a ``failing_fields`` entry of the profile, fails with NOT_SUPPORTED.
"""

from __future__ import annotations

from typing import Any

from agent.virtual.fake_nvml import codes
from agent.virtual.fake_nvml.ctypes_io import Fail, target, value
from agent.virtual.fake_nvml.device import KEY_INDEX, NvmlDevice
from agent.virtual.fake_nvml.events import EccState, ecc_state
from agent.virtual.fake_nvml.profile import (
    ARCH_BLACKWELL,
    PCIE_COUNTER_WRAP,
    clock_event_trio,
    field_known,
    power_smoothing_ids,
)
from agent.virtual.fake_nvml.symbols import c_function

ULL, UINT = codes.VALUE_TYPE_UNSIGNED_LONG_LONG, codes.VALUE_TYPE_UNSIGNED_INT
_TRIO_REASONS = (codes.REASON_SW_THERMAL, codes.REASON_HW_THERMAL, codes.REASON_HW_POWER_BRAKE)
"""What the driver's clocks-event time trio counts, in its order (ids vary by driver)."""
_LATENCY_US = 3


class _Unsupported(Exception):
    """One field entry fails with ``code`` (the batch goes on)."""

    def __init__(self, code: int = codes.ERROR_NOT_SUPPORTED) -> None:
        super().__init__(code)
        self.code = code


class FieldFunctions:
    """Mixin of :class:`~agent.virtual.fake_nvml.library.FakeNvmlLibrary`: uses its state and helpers."""

    @c_function("nvmlDeviceGetFieldValues", handle=True)
    def _c_field_values(self, dev: NvmlDevice, count: Any, values: Any) -> None:
        n = value(count)
        array = target(values)
        if n <= 0 or array is None:
            raise Fail(codes.ERROR_INVALID_ARGUMENT)
        now = self._fresh(dev)
        ts_us = int(now * 1e6)
        ecc: list[EccState] = []  # computed once, on first use
        for i in range(n):
            entry = array[i]
            entry.timestamp = ts_us
            entry.latencyUsec = _LATENCY_US
            try:
                kind, number = self._field(dev, int(entry.fieldId), int(entry.scopeId), ecc)
            except _Unsupported as failure:
                entry.nvmlReturn = failure.code
                entry.valueType = ULL
                entry.value.ullVal = 0
                continue
            entry.nvmlReturn = codes.SUCCESS
            entry.valueType = kind
            if kind == UINT:
                entry.value.uiVal = int(number)
            else:
                entry.value.ullVal = int(number)

    def _field(self, dev: NvmlDevice, field_id: int, scope: int, ecc: list[EccState]) -> tuple[int, int]:
        """(valueType, value) of one field, or raises _Unsupported."""
        if not field_known(self.profile, field_id):
            raise _Unsupported(codes.ERROR_INVALID_ARGUMENT)
        if field_id in self.profile.failing_fields:
            raise _Unsupported()
        reason = self._reason_bit(field_id)
        if reason is not None:
            if dev.counters is None or dev.is_mig:
                raise _Unsupported()
            with dev.counters.lock:
                return ULL, int(dev.counters.reason_ns[reason])
        if field_id in power_smoothing_ids(self.profile):
            if self.traits.architecture != ARCH_BLACKWELL or dev.is_mig:
                raise _Unsupported()
            return UINT, 1  # enabled / profile numbers: small integers, never nanoseconds
        if field_id in (codes.FI_POWER_AVERAGE, codes.FI_POWER_INSTANT):
            if scope != 0:  # 0 = GPU; module and memory power scopes are not modelled
                raise _Unsupported()
            return UINT, round(self._reading(dev, "power_w") * 1000.0)
        if field_id == codes.FI_TOTAL_ENERGY:
            if dev.mig_enabled:  # the board's counter, as nvmlDeviceGetTotalEnergyConsumption gives it
                try:
                    return ULL, round(self._board_energy_j(dev) * 1000.0)
                except Fail as fail:
                    raise _Unsupported(fail.code) from None
            return ULL, round(self._reading(dev, "energy_j") * 1000.0)
        if field_id in (codes.FI_PCIE_TX_BYTES, codes.FI_PCIE_RX_BYTES):
            key = "pcie_tx_bytes_per_s" if field_id == codes.FI_PCIE_TX_BYTES else "pcie_rx_bytes_per_s"
            return ULL, (self.profile.pcie_counter_start + int(self._total(dev, key))) % PCIE_COUNTER_WRAP
        if field_id in (codes.FI_NVLINK_DATA_TX, codes.FI_NVLINK_DATA_RX):
            return ULL, self._nvlink_kib(dev, field_id, scope)
        if field_id == codes.FI_NVLINK_LINK_COUNT:
            links = self._link_count(dev)
            if not links:
                raise _Unsupported()
            return UINT, links
        if field_id == codes.FI_MEMORY_TEMP:
            if not self.traits.hbm:
                raise _Unsupported()
            return UINT, round(self._reading(dev, "temperature_c") + 3.0)
        if field_id in (codes.FI_ECC_SBE_VOL_TOTAL, codes.FI_ECC_DBE_VOL_TOTAL, codes.FI_REMAPPED_COR,
                        codes.FI_REMAPPED_UNC, codes.FI_REMAPPED_PENDING, codes.FI_REMAPPED_FAILURE):
            return self._ecc_field(dev, field_id, ecc)
        raise _Unsupported()

    def _reason_bit(self, field_id: int) -> int | None:
        """The clocks-event reason a time field counts on this driver, else None."""
        if field_id == codes.FI_CLOCKS_EVENT_SW_POWER_CAP:
            return codes.REASON_SW_POWER_CAP
        trio = clock_event_trio(self.profile)
        if trio is not None and field_id in trio:
            return _TRIO_REASONS[trio.index(field_id)]
        return None

    def _reading(self, dev: NvmlDevice, field: str) -> float:
        if dev.counters is None or dev.hidden(field):
            raise _Unsupported()
        v = getattr(self._sample(dev), field)
        if v is None:
            raise _Unsupported()
        return float(v)

    def _total(self, dev: NvmlDevice, key: str) -> float:
        if dev.counters is None or dev.hidden(key):
            raise _Unsupported()
        with dev.counters.lock:
            return dev.counters.totals[KEY_INDEX[key]]

    def _nvlink_kib(self, dev: NvmlDevice, field_id: int, scope: int) -> int:
        links = self._link_count(dev)
        if not links:
            raise _Unsupported()
        key = "link_tx_bytes_per_s" if field_id == codes.FI_NVLINK_DATA_TX else "link_rx_bytes_per_s"
        total = self._total(dev, key)
        if scope == codes.UINT_MAX:
            return int(total // 1024)
        if scope >= links:
            raise _Unsupported(codes.ERROR_INVALID_ARGUMENT)
        return int(total / links // 1024)

    def _ecc_field(self, dev: NvmlDevice, field_id: int, ecc: list[EccState]) -> tuple[int, int]:
        if dev.is_mig:
            raise _Unsupported()
        if not ecc:
            vt = self._vt()
            ecc.append(ecc_state(dev.index, self._xid_events(), vt, self._last_reset(dev.index, vt)))
        state = ecc[0]
        if field_id == codes.FI_ECC_SBE_VOL_TOTAL:
            return ULL, 0
        if field_id == codes.FI_ECC_DBE_VOL_TOTAL:
            return ULL, state.dbe_volatile
        if field_id == codes.FI_REMAPPED_COR:
            return UINT, state.remapped_correctable
        if field_id == codes.FI_REMAPPED_UNC:
            return UINT, 0
        if field_id == codes.FI_REMAPPED_PENDING:
            return UINT, int(state.remap_pending)
        return UINT, int(state.remap_failure)

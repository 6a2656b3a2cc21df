"""One ``nvmlDeviceGetFieldValues`` call per interval for every classic counter that allows it.

Batching matters: a field read costs microseconds inside one call, while separate getters cost
a driver round trip each (``POWER_AVERAGE`` via nvmlDeviceGetPowerUsage is milliseconds). The
batch call succeeds even when single fields fail, so each entry's own return code is checked:
a field the device cannot read (NOT_SUPPORTED) or whose id this driver does not know
(INVALID_ARGUMENT: ids grow with every release) is dropped for good at the probe; a field that
fails later fails alone, and its value is simply unknown for that interval.

Field ids are the driver's, not pynvml's: one id can name different counters on different
drivers. The clocks-event time fields for SW thermal, HW thermal and HW power brake were
251-253 from R575 to R580.76 and are 269-271 from R580.82, where R575 keeps power-smoothing
settings; so which ids are asked for is decided from the driver version (:func:`fields_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.backends.nvml.bindings import union_member
from agent.backends.nvml.errors import INVALID_ARGUMENT, Meaning, meaning_of_code
from agent.backends.nvml.structs import plain, plain_union

ALL_LINKS = 0xFFFFFFFF
"""scopeId that sums an NVLink field over every link."""


@dataclass(frozen=True, slots=True)
class Field:
    key: str
    field_id: int
    scope: int = 0


FIELDS: tuple[Field, ...] = (
    Field("power_instant_mw", 186),  # NVML_FI_DEV_POWER_INSTANT, scope GPU
    Field("energy_mj", 83),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    Field("pcie_tx_bytes", 197),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES (driver 555+)
    Field("pcie_rx_bytes", 198),
    Field("nvlink_tx_kib", 138, ALL_LINKS),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    Field("nvlink_rx_kib", 139, ALL_LINKS),
    Field("memory_temp_c", 82),  # NVML_FI_DEV_MEMORY_TEMP
    Field("ecc_sbe_volatile", 3),  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    Field("ecc_dbe_volatile", 4),  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    Field("remapped_cor", 142),  # NVML_FI_DEV_REMAPPED_COR
    Field("remapped_unc", 143),
    Field("remapped_pending", 144),
    Field("remapped_failure", 145),
    Field("throttle_sw_power_cap_ns", 74),  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP (= PERF_POLICY_POWER)
)
"""Fields every driver numbers the same (unknown ones fail alone and are dropped at the probe)."""

CLOCK_EVENT_TRIO = ("throttle_sw_thermal_ns", "throttle_hw_thermal_ns", "throttle_hw_power_brake_ns")
"""NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, _HW_THERM_SLOWDOWN, _HW_POWER_BRAKE_SLOWDOWN."""
TRIO_IDS: tuple[tuple[tuple[int, ...], tuple[int, int, int]], ...] = (
    ((580, 82), (269, 270, 271)),
    ((575,), (251, 252, 253)),
)
"""(first driver, ids of the trio), newest first, from each release's nvml.h."""

CLOCK_EVENT_FIELDS: dict[str, str] = {
    "throttle_sw_power_cap_ns": "sw_power_cap",
    "throttle_sw_thermal_ns": "sw_thermal_slowdown",
    "throttle_hw_thermal_ns": "hw_thermal_slowdown",
    "throttle_hw_power_brake_ns": "hw_power_brake_slowdown",
}
"""Accumulated clocks-event time fields -> CLOCK_EVENT_REASONS names."""

_DECODE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def parse_driver(version: str | None) -> tuple[int, ...] | None:
    """``"580.95.05"`` -> (580, 95, 5); None when the driver did not say or said something else."""
    try:
        return tuple(int(part) for part in (version or "").split(".")) or None
    except ValueError:
        return None


def fields_for(driver_version: str | None) -> tuple[tuple[Field, ...], dict[str, str]]:
    """The fields to ask this driver for, and the keys left out with why (for doctor)."""
    version = parse_driver(driver_version)
    ids = next((trio for since, trio in TRIO_IDS if version is not None and version >= since), None)
    if ids is not None:
        return FIELDS + tuple(Field(key, fid) for key, fid in zip(CLOCK_EVENT_TRIO, ids)), {}
    why = (f"not in driver {driver_version}: NVML counts it from R575 (ids 251-253; 269-271 from R580.82)"
           if version is not None else "driver version unknown, and these ids name other counters on other drivers")
    return FIELDS, {key: why for key in CLOCK_EVENT_TRIO}


def decode(entry: Any) -> float | int | None:
    """The value of one ``c_nvmlFieldValue_t``, read from the union member its valueType names
    (None for a type this pynvml's union does not have)."""
    member = _DECODE.get(plain(entry, "valueType"))
    value = plain(entry, "value")
    if member is None or not union_member(type(value), member):
        return None
    return plain_union(value, member)


def gone_for_good(code: int) -> bool:
    """A field answer that will not change while this driver runs: unsupported, or an unknown id."""
    return code == INVALID_ARGUMENT or meaning_of_code(code) is Meaning.ABSENT


class FieldBatch:
    """The fields one device can read, fetched together."""

    def __init__(self, nvml: Any, fields: tuple[Field, ...] = FIELDS) -> None:
        self._nvml = nvml
        self.fields = fields
        self._request = [(f.field_id, f.scope) for f in fields]

    def read(self, handle: Any) -> tuple[dict[str, float | int], dict[str, int]]:
        """(values by key, failed fields by key -> return code). Raises if the call itself fails."""
        if not self.fields:
            return {}, {}
        entries = self._nvml.nvmlDeviceGetFieldValues(handle, self._request)
        values: dict[str, float | int] = {}
        failed: dict[str, int] = {}
        for spec, entry in zip(self.fields, entries):
            code = plain(entry, "nvmlReturn")
            if code != 0:
                failed[spec.key] = code
                continue
            value = decode(entry)
            if value is not None:
                values[spec.key] = value
        return values, failed

    def drop_absent(self, failed: dict[str, int]) -> tuple[str, ...]:
        """Stop asking for fields that failed as unsupported or unknown; returns their keys."""
        gone = tuple(k for k, code in failed.items() if gone_for_good(code))
        if gone:
            self.fields = tuple(f for f in self.fields if f.key not in gone)
            self._request = [(f.field_id, f.scope) for f in self.fields]
        return gone

    def has(self, key: str) -> bool:
        return any(f.key == key for f in self.fields)


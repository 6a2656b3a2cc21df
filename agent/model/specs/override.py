"""Peaks a person gives for a model the catalogue lacks (the ``specs:`` section of the config).

Why: an uncatalogued GPU still gets verdicts (activity ratios need no peak) but no MFU, achieved
FLOP/s or ridge point. Rather than guess, the agent says so (``roofwatch doctor``) and takes the
dense datasheet numbers from the config, keyed by the exact name the driver reports
(``nvmlDeviceGetName`` / amdsmi ``market_name``). An override wins over the catalogue and over a
run-time estimate, so it can also fill in an entry whose peaks are unknown (MI308X).

The overrides are process-wide: the backend registry installs them from the settings before it
discovers devices, and every spec resolution (agent.model.specs.lookup.resolve_spec) reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.model import GpuSpec, Vendor
from agent.model.specs.datasheet import datasheet_spec

OVERRIDE_FIELDS: dict[str, str] = {
    "bf16_tflops": "dense BF16 tensor peak, TFLOP/s", "fp16_tflops": "dense FP16 tensor peak (default: BF16)",
    "fp8_tflops": "dense FP8 tensor peak", "tf32_tflops": "dense TF32 tensor peak",
    "fp32_tflops": "FP32 (non-tensor) peak", "fp64_tflops": "FP64 peak",
    "mem_bandwidth_tbs": "peak DRAM bandwidth, TB/s", "memory_gib": "memory size, GiB",
    "tdp_w": "maximum board power, W", "sm_count": "SMs / compute units", "ref_clock_mhz": "clock the peaks are quoted at, MHz",
}
"""The keys a ``specs:`` entry may hold, in datasheet units, and what each means."""


_overrides: dict[str, GpuSpec] = {}


def _key(name: str) -> str:
    return " ".join(name.split()).lower()


def override_spec(name: str, values: Mapping[str, float | int | str | None]) -> GpuSpec:
    """One override in datasheet units -> a GpuSpec keyed ``override:<name>``; ValueError names a bad field."""
    unknown = sorted(set(values) - set(OVERRIDE_FIELDS) - {"vendor"})
    if unknown:
        raise ValueError(f"specs[{name!r}]: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(OVERRIDE_FIELDS)}")
    numbers: dict[str, float] = {}
    for field, value in values.items():
        if field == "vendor" or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            raise ValueError(f"specs[{name!r}].{field}: must be a positive number, got {value!r}")
        numbers[field] = float(value)
    vendor: Vendor = "amd" if (values.get("vendor") or name).strip().lower().startswith("amd") else "nvidia"
    sms = numbers.get("sm_count")
    return datasheet_spec(
        f"override:{'-'.join(_key(name).split())}", name, vendor,
        bf16=numbers.get("bf16_tflops"), fp16=numbers.get("fp16_tflops"), fp8=numbers.get("fp8_tflops"),
        tf32=numbers.get("tf32_tflops"), fp32=numbers.get("fp32_tflops"), fp64=numbers.get("fp64_tflops"),
        hbm_tbs=numbers.get("mem_bandwidth_tbs"), mem_gib=numbers.get("memory_gib"), tdp=numbers.get("tdp_w"),
        sms=int(sms) if sms else None, ref=numbers.get("ref_clock_mhz"), max_clk=None,
        notes="From the specs: section of the agent's config, not from the catalogue.")


def set_overrides(specs: Mapping[str, GpuSpec]) -> None:
    """Replace the process-wide overrides (keyed by driver name, case- and space-insensitive)."""
    _overrides.clear()
    _overrides.update({_key(name): spec for name, spec in specs.items()})


def override_for(name: str | None) -> GpuSpec | None:
    """The configured spec for exactly this driver name, or None."""
    return _overrides.get(_key(name)) if name else None

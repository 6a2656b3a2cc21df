"""The model's vocabulary: value ranges, vendors, precisions, workload classes and clock-event bits.

One place for the closed sets every layer agrees on, so a class name or a precision means the
same thing to a backend, the classifier, an exporter and a trace reader.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
"""A fraction in 0..1 (utilisation, duty cycle)."""


NonNegative = Annotated[float, Field(ge=0.0)]


NonNegativeInt = Annotated[int, Field(ge=0)]


Vendor = Literal["nvidia", "amd"]


Dtype = Literal["fp8", "bf16", "fp16", "tf32", "fp32", "fp64"]


DTYPES: tuple[str, ...] = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")


WORKLOAD_CLASSES: tuple[str, ...] = (
    "idle",
    "compute_bound",
    "memory_bound",
    "input_starved",
    "communication_jittered",
    "latency_bound",
    "unknown",
)


WorkloadClass = Literal[
    "idle",
    "compute_bound",
    "memory_bound",
    "input_starved",
    "communication_jittered",
    "latency_bound",
    "unknown",
]


# Clock-event reason bits (NVML ``nvmlClocksEventReason*``); AMD backends translate into these.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


THROTTLE_REASON_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""Bits that mean the clock is held below what the workload asks for."""


DEFAULT_PORT = 9477
"""The agent's HTTP port unless ``listen`` says otherwise: the settings' default (agent.app.config), and where
``roofwatch top`` (agent.views.top_source) looks when given no address; both read it here, below them."""

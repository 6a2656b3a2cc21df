"""doctor: readings the agent would drop as physically impossible, named with the GPU, the value and the bound.

A source that hands the agent 1e308 W, a -1e308 °C temperature or a 1e308 MHz clock (a unit switched, a
garbled counter, a hostile exporter) has that value dropped by the collector (agent/model/bounds.py) and
counted in ``roofwatch_source_rejected_values_total``; the series says *that* it happens, this check says
*what*: one read of every GPU through the same backend and the same bounds, a warning per value refused.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from agent.diagnostics.findings import Finding
from agent.model import DeviceInfo
from agent.model.bounds import bound_sample

CHECK = "physical bounds"
MOST = 16
"""Findings at most, then one line counting the rest: a source wrong on every field of 128 GPUs is one fault."""


def _value(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else "a number past 1e308"


def _source(backend: Any, gpu: str, field: str) -> str:
    try:
        return getattr(backend, "counter_sources", lambda _: {})(gpu).get(field.split(".")[0]) or backend.name
    except Exception:  # noqa: BLE001 - which source is an extra; the backend's name stands in
        return str(getattr(backend, "name", "the backend"))


def bounds_findings(backend: Any, devices: Sequence[DeviceInfo], now: float | None = None) -> list[Finding]:
    """A warning per reading outside its bound in one sample of each GPU (a GPU that cannot be read is
    another check's finding); nothing when every reading is plausible."""
    found: list[Finding] = []
    for info in devices:
        try:
            sample = backend.sample(info.gpu, time.time() if now is None else now)
        except Exception:  # noqa: BLE001 - a failed read is reported by the backend's own checks
            continue
        for rejection in bound_sample(sample, info.spec)[1]:
            source = _source(backend, info.gpu, rejection.field)
            found.append(Finding(
                CHECK, "warn", f"{source} reports {rejection.field} = {_value(rejection.value)}, outside "
                               f"{rejection.bound}", f"{rejection.field} of this GPU: the agent drops it (unknown, "
                               "never 0) and counts it in roofwatch_source_rejected_values_total",
                f"check {source}'s version and units (a unit switch, a garbled counter); the value is a fault in the "
                "source, not a measurement", gpu=info.gpu))
    if len(found) > MOST:
        rest = len(found) - MOST
        found = found[:MOST] + [Finding(CHECK, "warn", f"and {rest} more reading{'s' if rest != 1 else ''} outside "
                                                       "their bounds")]
    return found

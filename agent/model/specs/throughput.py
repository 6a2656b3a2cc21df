"""Run-time estimates against the peaks: achieved FLOP/s from tensor activity, and the clock credit."""

from __future__ import annotations

import math

from agent.model import GpuSpec


def achieved_flops(spec: GpuSpec, dtype: str, tensor_active: float | None,
                   sm_clock_mhz: float | None) -> float | None:
    """OFU-style FLOP/s estimate: tensor_active x peak(dtype) x min(1, clock / ref clock).

    The clock ratio is capped at 1 (and activity clamped to 0..1) so an estimate never exceeds the
    peak; an unknown clock or reference clock gives ratio 1. None when the dtype peak or the
    activity is unknown: unknown must not read as zero.
    """
    peak = spec.peak_flops.get(dtype)
    if peak is None or tensor_active is None or not math.isfinite(tensor_active):
        return None
    return min(1.0, max(0.0, tensor_active)) * peak * clock_factor(sm_clock_mhz, spec.ref_clock_mhz)


def clock_factor(sm_clock_mhz: float | None, ref_clock_mhz: float | None) -> float:
    """min(1, clock / the clock the peaks are quoted at): boost above it is not credited.

    1 when either clock is unknown, so an unknown clock never shrinks an estimate to zero.
    """
    usable_ref = ref_clock_mhz is not None and math.isfinite(ref_clock_mhz) and ref_clock_mhz > 0
    if sm_clock_mhz is None or not math.isfinite(sm_clock_mhz) or not usable_ref:
        return 1.0
    return min(1.0, max(0.0, sm_clock_mhz / ref_clock_mhz))  # type: ignore[operator]

"""The throttled flag (classification.md §2.7): clocks held down while the GPU is busy, beside any class.

A flag, never a class, so it is judged apart from the class rules and its reasons are appended to
whichever class is published. Without clock-event reasons the flag is unknown; the one cap the other
counters show is power, so a busy GPU at its power limit with a low clock reads likely power-capped.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.classifier.thresholds import Thresholds
from agent.classifier.wording import pct
from agent.model import CLOCK_EVENT_REASONS, THROTTLE_REASON_MASK, WindowFeatures
from agent.model.verdict import Check, Reason

_HARD_THROTTLE = (CLOCK_EVENT_REASONS["hw_slowdown"] | CLOCK_EVENT_REASONS["hw_thermal_slowdown"]
                  | CLOCK_EVENT_REASONS["hw_power_brake_slowdown"])
"""Reasons that cut clocks hard (roughly halve them), making a throttle severe at any ratio."""


@dataclass(frozen=True, slots=True)
class Throttle:
    """The flag, its severity, the likely power cap without clock-event reasons, and the reasons for them."""

    throttled: bool = False
    severe: bool = False
    likely: bool = False
    reasons: tuple[Reason, ...] = ()


def throttle(f: WindowFeatures, t: Thresholds) -> Throttle:
    """The throttled flag (§7.3): clocks held down by a throttle reason while the GPU is busy."""
    if f.duty is None or f.duty < t.throttle_duty or f.clock_ratio is None:
        return Throttle()
    clock = Check("clock_ratio", f.clock_ratio, t.throttle_clock, "below", "throttle_clock")
    if not f.throttle_known:
        capped = _likely_power_capped(f, t, clock)
        return Throttle(likely=bool(capped), reasons=capped)
    if f.throttle_fraction < t.throttle_fraction or f.clock_ratio >= t.throttle_clock:
        return Throttle()
    severe = f.clock_ratio < t.throttle_severe_clock or bool(f.throttle_bits & _HARD_THROTTLE)
    names = [name.replace("_", " ") for name, bit in CLOCK_EVENT_REASONS.items()
             if bit & THROTTLE_REASON_MASK and f.throttle_bits & bit]
    why = (f"clock at {pct(f.clock_ratio)} of the peak's reference clock, held down by "
           f"{' and '.join(names) or 'a throttle reason'} in {pct(f.throttle_fraction)} of busy samples")
    share = Check("throttle_fraction", f.throttle_fraction, t.throttle_fraction, "above", "throttle_fraction")
    return Throttle(True, severe, False, (Reason(why, (clock, share)),))


def _likely_power_capped(f: WindowFeatures, t: Thresholds, clock: Check) -> tuple[Reason, ...]:
    """Without clock-event reasons the flag is unknown; the one cap the other counters show is power:
    board power at its enforced limit while the busy GPU's clock sits well below the peaks' clock."""
    if f.power_basis != "limit" or f.power_ratio is None or f.power_ratio < t.power_capped_ratio or not clock.holds:
        return ()
    power = Check("power_ratio", f.power_ratio, t.power_capped_ratio, "above", "power_capped_ratio")
    return (Reason(f"likely power-capped: power at {pct(f.power_ratio)} of its limit and the clock at "
                   f"{pct(f.clock_ratio)} of the peaks' reference clock while busy; the source exports no clock-event "
                   "reasons to confirm it", (power, clock)),)

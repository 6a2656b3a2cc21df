"""Rates from NVML byte counters that wrap.

nvml.h documents the PCIe byte fields (NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES, ids 197/198)
as "Value can be wrapped" and gives no width. The values the driver reports stay below 2**32,
so the counter is read as 32 bits wide: a reading below the previous one, both under 2**32, is
one wrap, and the rate is taken across it. A counter that goes back from above 2**32 cannot be
a 32-bit wrap; it was reset, and that interval's rate is unknown.

A 32-bit byte counter wraps every 4 GiB, so it cannot show more than 4 GiB per interval: two
wraps between reads look like one. That is why GPM's own PCIe rate, where the GPU has GPM,
always wins over a rate from these counters (agent.backends.nvml.device).
"""

from __future__ import annotations

from dataclasses import dataclass

WRAP_32 = 2**32


@dataclass(slots=True)
class WrappingRate:
    """A cumulative counter that wraps at ``wrap``, turned into a rate between two reads."""

    wrap: int = WRAP_32
    value: int | None = None
    t: float | None = None

    def rate(self, value: int | None, t: float) -> float | None:
        """Units per second since the previous read; None on the first read, after a reset, or
        when time did not move forward."""
        prev_value, prev_t = self.value, self.t
        self.value, self.t = value, t
        if value is None or prev_value is None or prev_t is None or t <= prev_t:
            return None
        delta = value - prev_value
        if delta < 0:
            if prev_value >= self.wrap or value >= self.wrap:
                return None  # wider than the wrap: it went back, so it was reset
            delta += self.wrap
        return delta / (t - prev_t)

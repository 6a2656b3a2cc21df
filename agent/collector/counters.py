"""The totals since start of one device: energy, PCIe, fabric and network bytes, driver calls.

Kept apart from the collection loop because it is arithmetic over two samples and nothing else: the
exporters publish these as counters, so a step must never be negative or larger than the hardware allows.
"""

from __future__ import annotations

import math

from agent.model import DeviceCounters, GpuSample
from agent.model.bounds import Bound


def counter_step(previous_j: float | None, current_j: float, bound: Bound | None) -> tuple[float, bool]:
    """One step of a cumulative energy counter (J), and whether ``bound`` refused it: 0 for a first reading
    (no base yet) and for a counter that went back (a driver reload or a wrap: a restart, never negative
    energy); 0, refused, for a step past what the board can draw over the time it covers. The one rule for
    a GPU's own counter and a MIG parent's (agent.collector.mig_energy)."""
    delta = current_j - previous_j if previous_j is not None else 0.0
    if not delta > 0:  # also NaN
        return 0.0, False
    if bound is not None and not bound.admits(delta):
        return 0.0, True
    return delta, False


def accumulate_counters(counters: DeviceCounters, previous: GpuSample | None, sample: GpuSample, *,
                        energy_bound: Bound | None = None) -> DeviceCounters:
    """Advance the monotonic per-device totals by one interval.

    Energy prefers the driver's own cumulative counter (exact, survives our sampling gaps) and
    falls back to power x interval. A counter that goes backwards (driver reload, wrap) adds
    nothing for that interval rather than a negative or huge step; so does a step ``energy_bound``
    does not admit (more than the board can draw over the time the step covers: a reset or a unit
    change in the source), which is counted in ``energy_steps_refused``.
    """
    dt = sample.interval_s or 0.0
    energy_step: float | None = None
    refused = counters.energy_steps_refused
    if sample.energy_j is not None:
        energy_step, was_refused = counter_step(previous.energy_j if previous is not None else None,
                                                sample.energy_j, energy_bound)
        refused += was_refused
    elif sample.power_w is not None:
        energy_step = sample.power_w * dt

    def step(rate: float | None) -> float | None:  # None: no reading, so the total stays absent
        return None if rate is None else rate * dt if math.isfinite(rate) and rate > 0 else 0.0

    def add(total: float | None, amount: float | None) -> float | None:
        return total if amount is None else (total or 0.0) + amount

    return DeviceCounters(
        energy_j=add(counters.energy_j, energy_step),
        pcie_tx_bytes=add(counters.pcie_tx_bytes, step(sample.pcie_tx_bytes_per_s)),
        pcie_rx_bytes=add(counters.pcie_rx_bytes, step(sample.pcie_rx_bytes_per_s)),
        link_tx_bytes=add(counters.link_tx_bytes, step(sample.link_tx_bytes_per_s)),
        link_rx_bytes=add(counters.link_rx_bytes, step(sample.link_rx_bytes_per_s)),
        net_tx_bytes=add(counters.net_tx_bytes, step(sample.net_tx_bytes_per_s)),
        net_rx_bytes=add(counters.net_rx_bytes, step(sample.net_rx_bytes_per_s)),
        driver_calls=counters.driver_calls + (sample.driver_calls or 0),
        energy_steps_refused=refused,
    )

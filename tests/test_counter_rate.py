"""Cumulative driver counters (NVML PCIe/NVLink bytes, AMD XGMI and PCIe accumulators) as rates:
a reset or wrap gives an unknown interval, never a negative or absurd rate."""

from __future__ import annotations

import pytest

from agent.backends.readings import CounterRate


def test_rate_between_reads_in_the_counters_unit_times_scale():
    rate = CounterRate()
    assert rate.rate(1000.0, 10.0) is None, "no rate from one read"
    assert rate.rate(3000.0, 12.0, scale=1024.0) == pytest.approx(2000.0 * 1024 / 2.0)


@pytest.mark.parametrize(("first", "second"), [
    (5_000_000.0, 1_000.0),        # reset: driver reload or GPU reset starts the counter again
    (2.0**64 - 10, 5.0),           # wrap at the top of a 64-bit counter
    (2.0**32 - 100, 50.0),         # wrap of a 32-bit accumulator
])
def test_a_counter_that_goes_back_gives_no_rate_then_recovers(first, second):
    rate = CounterRate()
    rate.rate(first, 1.0)
    assert rate.rate(second, 2.0) is None, "unknown for the interval that holds the reset or wrap"
    assert rate.rate(second + 300.0, 3.0) == pytest.approx(300.0), "counting resumes from the new base"


def test_unknown_values_and_a_clock_that_does_not_advance():
    rate = CounterRate()
    rate.rate(100.0, 5.0)
    assert rate.rate(None, 6.0) is None, "an unreadable counter is unknown, not zero"
    assert rate.rate(200.0, 7.0) is None, "and the next read starts over"
    assert rate.rate(300.0, 7.0) is None, "no time passed: no rate (the wall clock jumped back or stood)"
    assert rate.rate(500.0, 6.0) is None, "time went backwards"
    assert rate.rate(700.0, 8.0) == pytest.approx(100.0)
